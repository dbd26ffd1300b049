"""Inputs that passed `validate` and failed later (issue 22, item 9): errors about a file never
echo its content, and every file a runbook points at is a regular file of bounded size."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpuvm.cli.main import app

HASH = "$6$Zx9sAltSalt$VeryLongSecretPasswordHashThatMustNeverBePrinted0123456789"
SNAPSHOT = Path(__file__).parents[1] / "fixtures" / "inventory" / "lab.json"
VALID = Path(__file__).parents[1] / "fixtures" / "bad_runbooks" / "130-bool-timeout.yaml"


def gpuvm(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


@pytest.mark.parametrize("content", [
    f"root:{HASH}:19000:0:99999:7:::\ndaemon:*:19000:0:99999:7:::\n",  # /etc/shadow's shape
    f"root: {HASH}\n",
    f"password: {HASH}\npassword: {HASH}x\n",  # a duplicate key: YAML's message quotes both values
    f"vcenter: {{user: admin, '{HASH}': 1}}\nhosts: []\nvms: []\n",
])
def test_an_error_about_a_secret_file_never_prints_its_content(tmp_path, content):
    secret = tmp_path / "shadow"
    secret.write_text(content)
    runbook = tmp_path / "lab.yaml"
    runbook.symlink_to(secret)
    result = gpuvm("validate", runbook)
    assert result.exit_code == 2, result.output
    assert re.search(r"lab\.yaml:\d+: ", result.output), result.output  # still names line and field
    assert "Zx9sAltSalt" not in result.output and "VeryLongSecret" not in result.output, result.output
    assert "19000" not in result.output


def _clone_runbook(tmp_path: Path, key: Path) -> Path:
    runbook = tmp_path / "rb.yaml"
    runbook.write_text(f"""\
hosts: [{{name: esx-01}}]
vms:
  - name: vm1
    host: esx-01
    template: ubuntu-gpu
    cloud_init:
      ssh_public_key_file: {key}
""")
    return runbook


def _sparse(path: Path, size: int) -> None:
    path.touch()
    os.truncate(path, size)


def _in_thread(call, seconds: float = 10):
    """call() run aside, so that a read that blocks for ever fails the test instead of hanging it."""
    import threading

    outcome: dict[str, object] = {}

    def run():
        try:
            outcome["value"] = call()
        except BaseException as e:  # noqa: BLE001 - handed to the test
            outcome["error"] = e

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), "the read blocked"
    return outcome


@pytest.mark.parametrize("make, message", [
    (lambda p: os.mkfifo(p), r"not a regular file \(a FIFO"),
    (lambda p: p.symlink_to("/dev/zero"), r"not a regular file \(a character device"),
    (lambda p: _sparse(p, 64 << 20), r"larger than 64 KB"),
    (lambda p: p.mkdir(), r"Is a directory"),
])
def test_the_cloud_init_key_file_is_a_small_regular_file(tmp_path, make, message):
    from gpuvm.errors import InputError
    from gpuvm.resolve import _guestinfo
    from gpuvm.runbook.loader import load_runbook

    key = tmp_path / "key.pub"
    make(key)
    rb = load_runbook(_clone_runbook(tmp_path, key))
    outcome = _in_thread(lambda: _guestinfo(rb, 0, rb.vms[0]))
    error = outcome.get("error")
    assert isinstance(error, InputError), outcome
    assert re.search(r"rb\.yaml:7: vms\[0\]\.cloud_init\.ssh_public_key_file: .*" + message, str(error)), str(error)


def test_a_snapshot_that_is_a_fifo_is_refused_not_waited_on(tmp_path, monkeypatch):
    monkeypatch.setenv("GPUVM_VCENTER_PASSWORD", "unused-secret")
    monkeypatch.setenv("GPUVM_STATE_DIR", str(tmp_path / "state"))
    os.mkfifo(tmp_path / "inventory.json")
    runbook = tmp_path / "rb.yaml"
    runbook.write_text(VALID.read_text().replace("ssh: {connect_timeout: true}\n", ""))
    outcome = _in_thread(lambda: gpuvm("plan", runbook, "--snapshot", tmp_path / "inventory.json"))
    result = outcome["value"]
    assert result.exit_code == 2 and "inventory.json: not a regular file (a FIFO" in result.output, result.output


@pytest.mark.parametrize("make, message", [
    (lambda p: p.symlink_to("/dev/zero"), r"not a regular file \(a character device"),
    (lambda p: os.mkfifo(p), r"not a regular file \(a FIFO"),
    (lambda p: _sparse(p, (1 << 30) + 1), r"larger than 1024 MB"),
])
def test_a_benchmark_upload_is_a_bounded_regular_file(tmp_path, make, message):
    make(tmp_path / "data.bin")
    runbook = tmp_path / "rb.yaml"
    runbook.write_text("benchmarks:\n  runs:\n    - name: probe\n      kind: command\n      command: 'echo x=1'\n"
                       "      pattern: 'x=([0-9]+)'\n      upload: {data.bin: data.bin}\n")
    outcome = _in_thread(lambda: gpuvm("bench", "run", runbook, "--local", "--dry-run"))
    result = outcome["value"]
    assert result.exit_code == 2, result.output
    assert re.search(r"rb\.yaml:7: benchmarks\.runs\[0\]\.upload\.data\.bin: .*" + message, " ".join(result.output.split())), result.output


@pytest.mark.parametrize("make, message", [
    (lambda p: p.symlink_to("/dev/zero"), r"not a regular file \(a character device"),
    (lambda p: os.mkfifo(p), r"not a regular file \(a FIFO"),
    (lambda p: _sparse(p, 1 << 20), r"larger than 64 KB"),
])
def test_a_guest_ssh_key_file_is_a_small_regular_file(tmp_path, make, message):
    from gpuvm.errors import InputError
    from gpuvm.remote import RemoteOptions, build_cluster
    from gpuvm.runbook.loader import load_runbook

    make(tmp_path / "id_ed25519")
    runbook = tmp_path / "rb.yaml"
    runbook.write_text("hosts: [{name: esx-01}]\nvms: [{name: vm1, host: esx-01}]\nguests:\n  hosts:\n"
                       "    - vm: vm1\n      ssh: {address: 10.0.0.1, key_file: id_ed25519}\n")
    rb = load_runbook(runbook)
    error = _in_thread(lambda: build_cluster(rb, tmp_path / "state", RemoteOptions())).get("error")
    assert isinstance(error, InputError), error  # found before any connection tries to load the key
    assert re.search(r"rb\.yaml:6: guests\.hosts\[0\]\.ssh\.key_file: .*" + message, str(error)), str(error)
