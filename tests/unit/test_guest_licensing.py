"""NVIDIA vGPU licensing, pure parts: License Status as nvidia-smi -q prints it, gridd.conf's
FeatureType, which guests need a licence and which FeatureType, the token kept secret, and the
check `bench run` makes before measuring."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from gpuvm.errors import DriftError, InputError
from gpuvm.executors.base import CommandResult
from gpuvm.executors.fake import FakeExecutor
from gpuvm.licensing import (Licence, feature_type, licence_problem, read_licence, read_token, refuse_unlicensed,
                             wanted_licence, with_feature_type)
from gpuvm.parsers.nvidia_smi_q import license_state, parse_nvidia_smi_q
from gpuvm.runbook.loader import load_runbook
from gpuvm.secrets import redact
from gpuvm.untrusted import UntrustedValueError

TOOLS = Path(__file__).parent.parent / "fixtures" / "tools"
NOW = datetime(2026, 11, 25, 12, 0, 0, tzinfo=UTC)


def test_nvidia_smi_q_of_a_licensed_vgpu_guest():
    [gpu] = parse_nvidia_smi_q((TOOLS / "nvidia_smi_q_vgpu_licensed.txt").read_text()).gpus
    assert (gpu.name, gpu.licensed_product, gpu.license_status) == \
        ("NVIDIA A100-40C", "NVIDIA Virtual Compute Server", "Licensed (Expiry: 2025-3-19 7:29:4 GMT)")


def test_a_data_centre_driver_prints_no_licensed_product():
    gpus = parse_nvidia_smi_q((TOOLS / "nvidia_smi_q_a100_470.txt").read_text()).gpus
    assert gpus and all(g.license_status is None and g.licensed_product is None for g in gpus)


@pytest.mark.parametrize("status, expected", [
    ("Licensed (Expiry: 2025-3-19 7:29:4 GMT)", (True, datetime(2025, 3, 19, 7, 29, 4, tzinfo=UTC))),
    ("Licensed (Expiry: 2023-11-13 19:46:56 GMT)", (True, datetime(2023, 11, 13, 19, 46, 56, tzinfo=UTC))),
    ("Licensed", (True, None)),  # older drivers print no expiry
    ("Licensed (Expiry: 2025-13-40 7:29:4 GMT)", (True, None)),  # no such date: no expiry to trust
    ("Unlicensed (Restricted)", (False, None)),
    ("Unlicensed (Unrestricted)", (False, None)),
    ("N/A", (False, None)),
])
def test_license_status(status, expected):
    assert license_state(status) == expected


def smi(*statuses: str) -> str:
    blocks = "".join(f"GPU 00000000:0{i}:00.0\n    vGPU Software Licensed Product\n        Product Name : NVIDIA Virtual "
                     f"Compute Server\n        License Status : {s}\n" for i, s in enumerate(statuses))
    return "==============NVSMI LOG==============\nDriver Version : 535.216.01\n" + blocks


def answering(text: str, code: int = 0) -> FakeExecutor:
    return FakeExecutor("gpu-vm-01", {"nvidia-smi -q": CommandResult("nvidia-smi -q", code, text, "")})


def test_every_gpu_must_be_licensed_and_the_earliest_expiry_counts():
    two = smi("Licensed (Expiry: 2027-1-1 0:0:0 GMT)", "Licensed (Expiry: 2026-11-26 0:0:0 GMT)")
    assert read_licence(answering(two)) == Licence("Licensed (Expiry: 2026-11-26 0:0:0 GMT)", True,
                                                   datetime(2026, 11, 26, tzinfo=UTC))
    one_not = smi("Licensed (Expiry: 2027-1-1 0:0:0 GMT)", "Unlicensed (Restricted)")
    assert read_licence(answering(one_not)) == Licence("Unlicensed (Restricted)", False, None)
    assert read_licence(answering("", 9)) == Licence(None, False, None)  # no driver
    assert read_licence(FakeExecutor("gpu-vm-01")) == Licence(None, False, None)  # no nvidia-smi (exit 127)


def test_a_hostile_licence_status_is_refused():
    with pytest.raises(UntrustedValueError, match=r"answered 'Licensed\\x1b\]0;pwned\\x07' as a licence status"):
        read_licence(answering(smi("Licensed\x1b]0;pwned\x07")))


@pytest.mark.parametrize("licence, problem", [
    (Licence("Licensed (Expiry: 2026-12-25 0:0:0 GMT)", True, datetime(2026, 12, 25, tzinfo=UTC)), None),
    (Licence("Licensed", True, None), None),
    (Licence("Licensed (Expiry: 2026-11-25 18:0:0 GMT)", True, datetime(2026, 11, 25, 18, tzinfo=UTC)),
     "Licensed (Expiry: 2026-11-25 18:0:0 GMT): the licence ends within 1 day"),
    (Licence("Unlicensed (Restricted)", False, None), "unlicensed (License Status: Unlicensed (Restricted))"),
    (Licence(None, False, None), "unlicensed (License Status: none reported by nvidia-smi -q)"),
])
def test_licence_problem(licence, problem):
    assert licence_problem(licence, 86400, NOW) == problem


@pytest.mark.parametrize("text, value, written", [
    (None, None, "FeatureType=1\n"),
    ("# template\nFeatureType=0\nEnableUI=FALSE\n", "0", "# template\nFeatureType=1\nEnableUI=FALSE\n"),
    ("FeatureType = \"4\"  # vCS\n#FeatureType=2\nFeatureType=2\n", "2", "FeatureType=1\n#FeatureType=2\n"),
    ("ServerAddress=nls.example\n", None, "ServerAddress=nls.example\nFeatureType=1\n"),
    ("FeatureType=$(reboot)\n", "(unreadable)", "FeatureType=1\n"),
])
def test_gridd_conf_feature_type(text, value, written):
    assert feature_type(text) == value
    assert with_feature_type(text or "", 1) == written


def runbook(tmp_path, vms: str, licensing: str = "{token_file: nls.tok}", token: str = "eyJhbGciOi.token-text.sig\n"):
    (tmp_path / "nls.tok").write_text(token)
    (tmp_path / "runbook.yaml").write_text(
        f"hosts: [{{name: esx-01}}]\nvms: {vms}\nguests:\n  licensing: {licensing}\n  hosts:\n"
        "    - {vm: vm1, ssh: {address: 10.0.0.1}}\n")
    return load_runbook(tmp_path / "runbook.yaml")


@pytest.mark.parametrize("gpus, licensing, feature", [
    ("{mode: vgpu, profile: grid_a100-40c}", "{token_file: nls.tok}", 1),
    ("{mode: vgpu, profile: grid_a100-40c}", "{token_file: nls.tok, passthrough: vcs}", 1),  # vGPU: always 1
    ("{mode: passthrough, count: 1}", "{token_file: nls.tok}", None),  # a data-centre driver: no licence
    ("{mode: passthrough, count: 1}", "{token_file: nls.tok, passthrough: vcs}", 4),
    ("{mode: dynamic, count: 1}", "{token_file: nls.tok, passthrough: vws}", 2),
    (None, "{token_file: nls.tok, passthrough: vcs}", None),  # no GPU, nothing to license
])
def test_which_guests_are_licensed_and_how(tmp_path, gpus, licensing, feature):
    book = runbook(tmp_path, f"[{{name: vm1, host: esx-01{', gpus: ' + gpus if gpus else ''}}}]", licensing)
    want = wanted_licence(book, book.guests.hosts[0])
    assert (want.feature_type if want else None) == feature
    if want:
        assert want.token_file == tmp_path / "nls.tok" and want.min_validity == 86400


def test_the_token_is_a_secret_once_read(tmp_path):
    token = "eyJhbGciOiJSUzI1NiJ9.a-token-nobody-may-see.c2ln"
    book = runbook(tmp_path, "[{name: vm1, host: esx-01, gpus: {mode: vgpu, profile: grid_a100-40c}}]", token=token)
    want = wanted_licence(book, book.guests.hosts[0])
    assert read_token(want) == token.encode()
    assert token not in redact(f"journal line with {token} in it")


def test_a_missing_token_names_the_runbook_field(tmp_path):
    book = runbook(tmp_path, "[{name: vm1, host: esx-01, gpus: {mode: vgpu, profile: grid_a100-40c}}]")
    (tmp_path / "nls.tok").unlink()
    with pytest.raises(InputError, match=r"runbook.yaml:\d+: guests.licensing.token_file: .*nls.tok"):
        read_token(wanted_licence(book, book.guests.hosts[0]))


def test_bench_refuses_only_the_licensed_guests_that_lack_a_licence(tmp_path):
    book = runbook(tmp_path, "[{name: vm1, host: esx-01, gpus: {mode: vgpu, profile: grid_a100-40c}}]")
    refuse_unlicensed(book, {"vm1": answering(smi("Licensed (Expiry: 2027-1-1 0:0:0 GMT)"))}, NOW)
    refuse_unlicensed(book, {}, NOW)  # not taking part
    with pytest.raises(DriftError, match=r"refusing to benchmark.*--allow-unlicensed\):\n  vm1: unlicensed "
                                         r"\(License Status: Unlicensed \(Restricted\)\)") as refused:
        refuse_unlicensed(book, {"vm1": answering(smi("Unlicensed (Restricted)"))}, NOW)
    assert refused.value.exit_code == 5


def test_the_vgpu_playbook_licenses_every_guest_as_vgpu():
    book = load_runbook(Path(__file__).parents[2] / "playbooks" / "vgpu-from-bare-esxi.yaml")
    book.check_references()
    wants = [wanted_licence(book, guest) for guest in book.guests.hosts]
    assert [w.feature_type if w else None for w in wants] == [1, 1]
