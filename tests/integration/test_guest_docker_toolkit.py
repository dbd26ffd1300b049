"""Issue 35: nvidia-container-toolkit on a bed guest without NVIDIA's apt repository, through `gpuvm apply`.

The repository is a real signed apt repository made here (Packages, Release, InRelease clearsigned
with a key of this test's own), in the guest's /tmp as a local mirror (file://); the guest's apt-get
refreshes it for real (testbed/bin/apt-get) and checks its signature against the key gpuvm fetched.
An unreachable mirror and a key that did not sign it each fail the step on its own progress line,
naming the guest, the URL and the command, and leave nothing in the guest's apt sources; the mirror
and its key then give the toolkit, the runtime in `docker info`, and a re-plan with nothing to do.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
from email.utils import formatdate
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpusim import Simulator
from gpuvm.cli.main import app
from tests.integration.vcenter import guest_ssh, use_simulator

pytestmark = pytest.mark.integration
GUEST, VM = "gpu-vm-01", "esx-01-vm1"
TOOLKIT = "1.17.8-1"
LIST = "etc/apt/sources.list.d/nvidia-container-toolkit.list"
KEYRING = "etc/apt/keyrings/nvidia-container-toolkit.asc"


def gpg(home: Path, *args: str) -> bytes:
    return subprocess.run(["gpg", "--homedir", str(home), "--batch", "--quiet", "--pinentry-mode", "loopback",
                           "--passphrase", "", *args], check=True, capture_output=True).stdout


def signed_repository(mirror: Path, keys: Path) -> None:
    """A flat apt repository (`deb URL/$(ARCH) /`, as NVIDIA's) offering nvidia-container-toolkit, signed
    with a new key (mirror/gpgkey); mirror/other.asc is a key that signed nothing here."""
    arch = subprocess.run(["dpkg", "--print-architecture"], check=True, capture_output=True, text=True).stdout.strip()
    mirror.mkdir(parents=True)
    for name in ("signer", "other"):
        home = keys / name
        home.mkdir(mode=0o700, parents=True)
        gpg(home, "--quick-gen-key", f"gpuvm test {name} <{name}@test.invalid>", "ed25519", "sign", "never")
        (mirror / ("gpgkey" if name == "signer" else "other.asc")).write_bytes(gpg(home, "--armor", "--export"))
    pool = mirror / arch
    pool.mkdir(parents=True)
    deb = pool / f"nvidia-container-toolkit_{TOOLKIT}_{arch}.deb"
    deb.write_bytes(b"!<arch>\n stand-in: nothing is unpacked on the bed\n")
    (pool / "Packages").write_text(
        f"Package: nvidia-container-toolkit\nVersion: {TOOLKIT}\nArchitecture: {arch}\nMaintainer: NVIDIA <x@test.invalid>\n"
        f"Filename: ./{deb.name}\nSize: {deb.stat().st_size}\nSHA256: {hashlib.sha256(deb.read_bytes()).hexdigest()}\n"
        "Description: NVIDIA Container toolkit (test bed stand-in)\n\n")
    packages = (pool / "Packages").read_bytes()
    (pool / "Release").write_text(f"Origin: gpuvm test\nLabel: gpuvm test\nDate: {formatdate(usegmt=True)}\nSHA256:\n"
                                  f" {hashlib.sha256(packages).hexdigest()} {len(packages)} Packages\n")
    gpg(keys / "signer", "--clearsign", "--output", str(pool / "InRelease"), str(pool / "Release"))
    for name in ("signer", "other"):  # the agents gpg started for these keys: none left running
        subprocess.run(["gpgconf", "--homedir", str(keys / name), "--kill", "gpg-agent"], check=True)
    for path in [mirror, *mirror.rglob("*")]:  # apt reads file:// as its _apt user
        path.chmod(0o755 if path.is_dir() else 0o644)


@pytest.fixture
def plain_guest(testbed, tmp_path, monkeypatch):
    """gpu-vm-01 as a plain Ubuntu guest with Docker: no toolkit, no nvidia runtime, no NVIDIA source;
    the mirror in its /tmp; a simulator whose VM the guest stands for."""
    saved = testbed.state(GUEST)
    docker = {**saved["docker"], "images": {}, "running": True, "runtimes": {"runc": "runc"}}
    testbed.set_state(GUEST, "docker", docker)
    testbed.set_state(GUEST, "packages", {})
    root = testbed.host_dir(GUEST)
    mirror = root / "tmp" / "nvidia-mirror"
    signed_repository(mirror, tmp_path / "keys")
    try:
        with Simulator(hosts=1, vms_per_host=1) as sim:
            use_simulator(monkeypatch, sim, tmp_path / "state")
            yield root
    finally:
        subprocess.run(["rm", "-rf", str(mirror), str(root / LIST), str(root / KEYRING),
                        str(root / "var" / "lib" / "gpuvm-fake" / "apt")], check=False)
        for key in ("docker", "packages"):
            testbed.set_state(GUEST, key, saved.get(key, {}))


def runbook(testbed, path: Path, url: str, key: str) -> str:
    path.write_text(f"""\
vcenter: {{user: administrator@vsphere.local, password_env: GPUVM_VCENTER_PASSWORD}}
ssh: {{known_hosts: {testbed.known_hosts_file}}}
hosts: [{{name: esx-01}}]
vms: [{{name: {VM}, host: esx-01}}]
guests:
  image: {{name: gpuvm/horovod, horovod: 0.28.1, toolkit_repository: {{url: "{url}", key: "{key}"}}}}
  hosts:
    - {{vm: {VM}, ssh: {guest_ssh(testbed, GUEST)}}}
""")
    return str(path)


def gpuvm(*args: str):
    return CliRunner().invoke(app, list(args), catch_exceptions=False)


def progress_line(output: str) -> str:
    """guest.docker's last progress line for the guest (the console wraps it: joined again)."""
    events: list[str] = []
    for line in output.splitlines():
        if line.startswith(("…", "✓", "✗", "Applied", "skipped", "error:", "Plan:")) or not events:
            events.append(line)
        else:
            events[-1] += " " + line
    mine = [e for e in events if e.split()[1:3] == ["guest.docker", f"{VM}:"]]
    return " ".join(mine[-1].split()) if mine else ""


def test_a_plain_guest_gets_nvidias_repository_then_the_toolkit_and_the_runtime(testbed, plain_guest, tmp_path):
    root, mirror = plain_guest, "file:///tmp/nvidia-mirror"
    unreachable = runbook(testbed, tmp_path / "unreachable.yaml", "http://127.0.0.1:9/nvidia/$(ARCH)", f"{mirror}/gpgkey")
    failed = gpuvm("apply", unreachable, "--yes")
    assert failed.exit_code != 0, failed.output
    line = progress_line(failed.output)
    assert line.startswith(f"✗ guest.docker {VM}: failed: guest {VM}: NVIDIA's repository "
                           "http://127.0.0.1:9/nvidia/$(ARCH) is unreachable (`env DEBIAN_FRONTEND=noninteractive "
                           "apt-get update -o Dir::Etc::sourcelist=sources.list.d/nvidia-container-toolkit.list"), line
    assert "Connection refused" in line, line
    assert not (root / LIST).exists() and not (root / KEYRING).exists()  # the guest's apt works as before

    refused = runbook(testbed, tmp_path / "refused.yaml", f"{mirror}/$(ARCH)", f"{mirror}/other.asc")
    failed = gpuvm("apply", refused, "--yes")
    line = progress_line(failed.output)
    assert failed.exit_code != 0 and f"guest {VM}: NVIDIA's repository {mirror}/$(ARCH) is refused: apt does not " \
                                      "accept its signature with the runbook's key" in line, failed.output
    assert "NO_PUBKEY" in line and "apt-get update -o" in line, line
    assert not (root / LIST).exists() and "nvidia-container-toolkit" not in testbed.state(GUEST).get("packages", {})

    good = runbook(testbed, tmp_path / "runbook.yaml", f"{mirror}/$(ARCH)", f"{mirror}/gpgkey")
    planned = gpuvm("plan", good)
    assert "apt source nvidia-container-toolkit" in planned.output, planned.output
    applied = gpuvm("apply", good, "--yes")
    assert applied.exit_code == 0, applied.output
    assert progress_line(applied.output).startswith(f"✓ guest.docker {VM}: done (2 change(s))"), applied.output
    assert testbed.state(GUEST)["packages"]["nvidia-container-toolkit"] == TOOLKIT  # the mirror's, verified by apt
    assert "nvidia" in testbed.state(GUEST)["docker"]["runtimes"]
    assert (root / LIST).read_text() == ("deb [signed-by=/etc/apt/keyrings/nvidia-container-toolkit.asc] "
                                         f"{mirror}/$(ARCH) /\n")
    again = gpuvm("plan", good, "--detailed-exitcode")
    assert again.exit_code == 0, again.output
