"""MIG profiles as the GPU lists them (`nvidia-smi mig -lgip`, real outputs in tests/fixtures/tools,
sources in its README), the built-in table checked against them, and guest.mig reading them."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import pytest

from gpuvm import mig
from gpuvm.errors import InputError, RemoteCommandError
from gpuvm.executors.base import CommandResult
from gpuvm.executors.fake import FakeExecutor, ok
from gpuvm.mig import GpuLayout, MigLayoutError
from gpuvm.parsers.nvidia_smi import parse_created_instances, parse_gpu_instance_profiles
from gpuvm.remote import RemoteOptions, build_cluster
from gpuvm.runbook.loader import load_runbook
from gpuvm.steps import guest_mig
from gpuvm.steps.base import Context

TOOLS = Path(__file__).resolve().parents[1] / "fixtures" / "tools"
H200 = "NVIDIA H200"


def rows(fixture: str):
    return parse_gpu_instance_profiles((TOOLS / fixture).read_text())


def h200() -> mig.GpuModel:
    return mig.reported_model(H200, rows("nvidia_smi_mig_lgip_h200.txt"))


# -- the real outputs parse ---------------------------------------------------------------------

@pytest.mark.parametrize("fixture, expected", [
    ("nvidia_smi_mig_lgip_h200.txt", {"1g.18gb": (19, 7, 16.0), "1g.18gb+me": (20, 1, 16.0), "1g.35gb": (15, 4, 32.5),
                                      "2g.35gb": (14, 3, 32.5), "3g.71gb": (9, 2, 69.75), "4g.71gb": (5, 1, 69.75),
                                      "7g.141gb": (0, 1, 140.0)}),
    ("nvidia_smi_mig_lgip_h100_nvl.txt", {"1g.12gb": (19, 7, 10.62), "1g.12gb+me": (20, 1, 10.62), "1g.24gb": (15, 4, 21.5),
                                          "2g.24gb": (14, 3, 21.5), "3g.47gb": (9, 2, 46.12), "4g.47gb": (5, 1, 46.12),
                                          "7g.94gb": (0, 1, 92.62)}),
    ("nvidia_smi_mig_lgip_rtx_pro_6000.txt", {
        "1g.24gb": (14, 4, 23.62), "1g.24gb+me": (21, 1, 23.62), "1g.24gb+gfx": (47, 4, 23.62), "1g.24gb+me.all": (65, 1, 23.62),
        "1g.24gb-me": (67, 4, 23.62), "2g.48gb": (5, 2, 47.38), "2g.48gb+gfx": (35, 2, 47.38), "2g.48gb+me.all": (64, 1, 47.38),
        "2g.48gb-me": (66, 2, 47.38), "4g.96gb": (0, 1, 95.12), "4g.96gb+gfx": (32, 1, 95.12)}),
    ("nvidia_smi_mig_lgip_b200_first_rows.txt", {"1g.23gb": (19, 7, 22.0), "1g.23gb+me": (20, 1, 22.0),
                                                 "1g.45gb": (15, 4, 44.25), "2g.45gb": (14, 3, 44.25)}),
])
def test_real_outputs_parse(fixture, expected):
    assert {r.profile: (r.profile_id, r.total, r.memory_gib) for r in rows(fixture)} == expected


# -- the built-in table agrees with what the GPUs list ---------------------------------------------

@pytest.mark.parametrize("fixture, name, table", [
    ("nvidia_smi_mig_lgip.txt", "NVIDIA A100 80GB PCIe", mig.A100_80GB),
    ("nvidia_smi_mig_lgip_h200.txt", H200, mig.H200_141GB),
    ("nvidia_smi_mig_lgip_h100_nvl.txt", "NVIDIA H100 NVL", mig.H100_94GB),
    ("nvidia_smi_mig_lgip_rtx_pro_6000.txt", "NVIDIA RTX PRO 6000 Blackwell Server Edition", mig.RTX_PRO_6000),
])
def test_table_rows_are_what_the_gpu_lists(fixture, name, table):
    assert mig.gpu_model(name) is table
    listed = mig.reported_model(name, rows(fixture))
    assert (listed.compute_slices, listed.memory_slices, listed.profiles) == (table.compute_slices, table.memory_slices,
                                                                              table.profiles)


def test_b200_table_row_agrees_with_the_rows_we_have():
    listed = rows("nvidia_smi_mig_lgip_b200_first_rows.txt")
    assert [(r.profile, r.total) for r in listed] == [(r.profile, mig.B200_180GB.profiles[r.profile].max_count) for r in listed]


@pytest.mark.parametrize("name, model", [
    ("NVIDIA H200", "H200 141GB"), ("NVIDIA H200 NVL", "H200 141GB"), ("GH100 [H200 SXM 141GB]", "H200 141GB"),
    ("NVIDIA GH200 480GB", None), ("NVIDIA H100 NVL", "H100 94GB"), ("GH100 [H100 NVL]", "H100 94GB"),
    ("NVIDIA B200", "B200 180GB"), ("NVIDIA GB200", None), ("NVIDIA RTX PRO 6000 Blackwell Server Edition", "RTX PRO 6000 96GB"),
    ("NVIDIA L40S", None),
])
def test_gpu_model_by_name(name, model):
    found = mig.gpu_model(name)
    assert (found.name if found else None) == model


@pytest.mark.parametrize("pci_id, name", [
    ("0x233510DE", "NVIDIA H200"), ("0x233B10DE", "NVIDIA H200 NVL"), ("0x232110DE", "NVIDIA H100 NVL"),
    ("0x290110DE", "NVIDIA B200"), ("0x2BB510DE", "NVIDIA RTX PRO 6000 Blackwell Server Edition"),
])
def test_device_filter_ids(pci_id, name):
    assert mig.filtered([pci_id], name)
    assert not mig.filtered(["0x20B510DE"], name)  # an A100 80GB's id


# -- layouts against the profiles a GPU lists -------------------------------------------------------

def test_h200_all_3g_71gb_is_two_per_gpu():
    assert mig.expand("all-3g.71gb", {0: H200, 1: H200}, {0: h200(), 1: h200()}) == {
        i: GpuLayout(True, ("3g.71gb", "3g.71gb")) for i in (0, 1)}


def test_h200_refuses_a_profile_it_does_not_list():
    with pytest.raises(MigLayoutError, match=r"^profile 3g\.40gb is not a MIG profile of GPU 0 \(NVIDIA H200\); its profiles "
                                             r"are 1g\.18gb, 1g\.18gb\+me, 1g\.35gb, 2g\.35gb, 3g\.71gb, 4g\.71gb, 7g\.141gb$"):
        mig.expand("all-3g.40gb", {0: H200}, {0: h200()})


def test_what_the_gpu_lists_wins_over_the_table():
    listed = [r for r in rows("nvidia_smi_mig_lgip_h200.txt")]
    fewer = [type(r)(r.gpu, r.profile, r.profile_id, 4, 4, r.memory_gib) if r.profile == "1g.18gb" else r for r in listed]
    assert mig.expand("all-1g.18gb", {0: H200}, {0: mig.reported_model(H200, fewer)}) == {0: GpuLayout(True, ("1g.18gb",) * 4)}
    # a GPU the table does not know plans from its own list
    h20 = mig.reported_model("NVIDIA H20", rows("nvidia_smi_mig_lgip_h100_nvl.txt"))
    assert mig.expand("all-2g.24gb", {0: "NVIDIA H20"}, {0: h20}) == {0: GpuLayout(True, ("2g.24gb",) * 3)}


@pytest.mark.parametrize("counts, fits", [
    ({"1g.24gb+gfx": 4}, True), ({"2g.48gb": 1, "1g.24gb-me": 2}, True), ({"1g.24gb+me.all": 1, "1g.24gb": 3}, True),
    ({"2g.48gb": 2, "1g.24gb": 1}, False), ({"4g.96gb+gfx": 1, "1g.24gb": 1}, False),
])
def test_rtx_pro_6000_variants(counts, fits):
    model = mig.reported_model("NVIDIA RTX PRO 6000 Blackwell Server Edition", rows("nvidia_smi_mig_lgip_rtx_pro_6000.txt"))
    entry = [mig.MigDevices.model_validate({"devices": [0], "mig-enabled": True, "mig-devices": counts})]
    if fits:
        assert sorted(mig.expand(entry, {0: model.name}, {0: model})[0].profiles) == sorted(p for p, n in counts.items()
                                                                                           for _ in range(n))
    else:
        with pytest.raises(MigLayoutError, match=r"needs \d compute and \d memory slices; a .* has 4 and 4"):
            mig.expand(entry, {0: model.name}, {0: model})


@pytest.mark.parametrize("fixture, message", [
    ("nvidia_smi_mig_lgip_b200_first_rows.txt", r"no profile spans the whole GPU \(1g\.23gb, 1g\.23gb\+me, 1g\.45gb, 2g\.45gb\)"),
])
def test_reported_model_refuses_a_partial_list(fixture, message):
    with pytest.raises(MigLayoutError, match=message):
        mig.reported_model("NVIDIA B200", rows(fixture))


def test_unknown_gpu_without_a_list_is_refused():
    with pytest.raises(MigLayoutError, match=r"GPU 0 \(NVIDIA L40S\) has no known MIG profiles: `nvidia-smi mig -lgip` lists "
                                             r"none, and it is not a GPU of gpuvm's table \(A100 80GB, .*H200 141GB"):
        mig.expand("all-enabled", {0: "NVIDIA L40S"})


# -- guest.mig reads the list ----------------------------------------------------------------------

RUNBOOK = """
hosts:
  - {{name: esx-01, ssh: {{address: 10.0.0.11, user: root}}}}
vms: [{{name: gpu-vm-01, host: esx-01}}]
guests:
  hosts: [{{vm: gpu-vm-01, ssh: {{address: 10.0.0.13, user: gpuadmin}}, mig: {layout}}}]
"""
QUERY = re.compile("--query-gpu")


def fake_cluster(tmp_path, fake: FakeExecutor, layout: str = "all-enabled"):
    path = tmp_path / "rb.yaml"
    if not path.exists():
        path.write_text(textwrap.dedent(RUNBOOK).format(layout=layout))
    return build_cluster(load_runbook(path), tmp_path, RemoteOptions(executor_factory=lambda name, access: fake))


def observe(tmp_path, layout: str, responses: dict):
    fake = FakeExecutor("gpu-vm-01", responses)
    (tmp_path / "rb.yaml").unlink(missing_ok=True)
    c = fake_cluster(tmp_path, fake, layout)
    target = c.targets["gpu-vm-01"]
    return target, guest_mig.observe(Context(cluster=c), target), fake


def test_guest_plans_from_the_h200s_list(tmp_path):
    lgip = (TOOLS / "nvidia_smi_mig_lgip_h200.txt").read_text()
    target, fact, fake = observe(tmp_path, "all-3g.71gb", {QUERY: ok("", f"0, {H200}, Disabled, Disabled\n"),
                                                          "nvidia-smi mig -lgip": ok("", lgip)})
    assert [r.profile for r in fact[0].profiles] == ["1g.18gb", "1g.18gb+me", "1g.35gb", "2g.35gb", "3g.71gb", "4g.71gb", "7g.141gb"]
    assert fake.calls[-1].sudo
    assert [(c.field, c.after) for c in guest_mig.plan(target, fact)] == [("mig.mode", "Enabled"), ("gpu instances", "3g.71gb x2")]
    target, fact, _ = observe(tmp_path, "all-3g.40gb", {QUERY: ok("", f"0, {H200}, Disabled, Disabled\n"),
                                                       "nvidia-smi mig -lgip": ok("", lgip)})
    with pytest.raises(InputError, match=r"guest gpu-vm-01: layout all-3g\.40gb: profile 3g\.40gb is not a MIG profile of GPU 0 "
                                         r"\(NVIDIA H200\); its profiles are 1g\.18gb, 1g\.18gb\+me, "):
        guest_mig.plan(target, fact)


def test_guest_without_a_list_plans_from_the_table(tmp_path):
    target, fact, _ = observe(tmp_path, "all-3g.71gb", {
        QUERY: ok("", f"0, {H200}, Disabled, Disabled\n"),
        "nvidia-smi mig -lgip": CommandResult("", 6, "No MIG-enabled devices found.\n", "")})
    assert fact[0].profiles == ()
    assert [c.after for c in guest_mig.plan(target, fact)] == ["Enabled", "3g.71gb x2"]


def test_guest_disabling_mig_reads_no_list(tmp_path):
    _, _, fake = observe(tmp_path, "all-disabled", {QUERY: ok("", f"0, {H200}, Enabled, Enabled\n"),
                                                   "nvidia-smi mig -lgi": ok("", "No GPU instances found: Not Found\n")})
    assert not any("-lgip" in line for line in fake.commands)


@pytest.mark.parametrize("answer, message", [
    (ok("", "GPU instance profiles: none\n"), r"^gpu-vm-01: guest\.mig: could not parse the output of `nvidia-smi mig -lgip`: "
                                               r"expected a boxed table titled 'GPU instance profiles:'"),
    (ok("", (TOOLS / "nvidia_smi_mig_lgip_b200_first_rows.txt").read_text()),
     r"^gpu-vm-01: guest\.mig: `sudo -n nvidia-smi mig -lgip`: GPU 0: no profile spans the whole GPU"),
    (ok("", (TOOLS / "nvidia_smi_mig_lgip_h200.txt").read_text().replace("19     7/7", "19     7of7")),
     r"^gpu-vm-01: guest\.mig: could not parse the output of `nvidia-smi mig -lgip`: expected rows"),
    (CommandResult("", 4, "Insufficient Permissions\n", ""), r"^gpu-vm-01: guest\.mig: `sudo -n nvidia-smi mig -lgip` exited 4: "
                                                            r"Insufficient Permissions$"),
])
def test_guest_refuses_a_list_it_cannot_read(tmp_path, answer, message):
    with pytest.raises(RemoteCommandError, match=message):
        observe(tmp_path, "all-3g.71gb", {QUERY: ok("", f"0, {H200}, Disabled, Disabled\n"), "nvidia-smi mig -lgip": answer})


# -- the test bed's stand-in nvidia-smi lists what the real GPUs list ---------------------------------

STANDIN = Path(__file__).resolve().parents[2] / "testbed" / "bin"


def standin(tmp_path, gpu_name: str | None, *args: str):
    import json
    import subprocess
    import sys

    sys.path.insert(0, str(STANDIN))
    try:
        import _gpuvm_fake as fake
    finally:
        sys.path.remove(str(STANDIN))
    if not (tmp_path / "state.json").exists():
        state = fake.default_state("guest", "g1", gpus=1)
        state["gpus"][0]["name"] = gpu_name or state["gpus"][0]["name"]
        (tmp_path / "state.json").write_text(json.dumps(state))
    return subprocess.run([sys.executable, str(STANDIN / "nvidia-smi"), *args], capture_output=True, text=True,
                          env={"GPUVM_FAKE_STATE": str(tmp_path), "PATH": "/usr/bin:/bin"})


@pytest.mark.parametrize("gpu_name, fixture", [(None, "nvidia_smi_mig_lgip.txt"), (H200, "nvidia_smi_mig_lgip_h200.txt")])
def test_standin_lists_what_the_real_gpu_lists(tmp_path, gpu_name, fixture):
    assert standin(tmp_path, gpu_name, "mig", "-lgip").stdout == (TOOLS / fixture).read_text()


def test_standin_h200_makes_its_own_profiles(tmp_path):
    assert standin(tmp_path, H200, "-i", "0", "-mig", "1").returncode == 0
    made = standin(tmp_path, H200, "mig", "-i", "0", "-cgi", "3g.71gb,3g.71gb", "-C")
    assert [c.profile for c in parse_created_instances(made.stdout)] == ["3g.71gb"] * 4
    more = standin(tmp_path, H200, "mig", "-i", "0", "-cgi", "1g.18gb", "-C")
    assert more.returncode == 2 and "Insufficient Resources" in more.stdout
    assert [(r.profile, r.free) for r in parse_gpu_instance_profiles(standin(tmp_path, H200, "mig", "-lgip").stdout)][4] == ("3g.71gb", 0)


def test_guest_apply_reads_back_instances_of_a_gpu_the_table_does_not_know(tmp_path):
    """An H20 (not in gpuvm's table) with the profiles it lists: what nvidia-smi made is compared as a
    set of instances, not in an order only the table knows."""
    made: list[str] = []
    lgi = ("+-------------------------------------------------------+\n| GPU instances:                                        |\n"
           "| GPU   Name             Profile  Instance   Placement  |\n|                          ID       ID       Start:Size |\n"
           "|=======================================================|\n")
    responses = {
        QUERY: ok("", "0, NVIDIA H20, Enabled, Enabled\n"),
        "nvidia-smi mig -lgip": ok("", (TOOLS / "nvidia_smi_mig_lgip_h100_nvl.txt").read_text()),
        re.compile(r"mig -lgi( |$)"): lambda call: ok("", lgi + "".join(
            f"|   0  MIG {p:<13}{9:>5}{i + 1:>9}{0:>11}:1".ljust(56) + "|\n+" + "-" * 55 + "+\n" for i, p in enumerate(made)))
        if made else CommandResult("", 6, "No GPU instances found: Not Found\n", ""),
        re.compile(r"-cgi (\S+) -C"): lambda call: (made.extend(re.search(r"-cgi (\S+)", call.command)[1].split(",")), ok("", ""))[1],
    }
    target, fact, fake = observe(tmp_path, '[{devices: all, mig-enabled: true, mig-devices: {"1g.12gb": 1, "2g.24gb": 1}}]', responses)
    changes = guest_mig.plan(target, fact)
    assert [c.after for c in changes] == ["2g.24gb x1, 1g.12gb x1"]
    guest_mig.apply(Context(cluster=fake_cluster(tmp_path, fake)), target, changes)
    assert made == ["2g.24gb", "1g.12gb"]


@pytest.mark.parametrize("layout", ["all-1g.24gb+gfx", "all-1g.24gb-me", "all-2g.48gb+me.all", "all-1g.18gb+me"])
def test_runbook_names_variant_layouts(tmp_path, layout):
    assert fake_cluster(tmp_path, FakeExecutor("gpu-vm-01"), layout).targets["gpu-vm-01"].mig == layout


def test_runbook_refuses_a_layout_that_is_no_profile(tmp_path):
    with pytest.raises(InputError, match=r"'all-1g\.24gb\+' is not a named MIG layout"):
        fake_cluster(tmp_path, FakeExecutor("gpu-vm-01"), "all-1g.24gb+")
