"""The NVIDIA vGPU manager from a bare ESXi host, through the real CLI: the simulator offers no vGPU
type on a host without it and the ESXi shell's stand-in (testbed/bin/esxcli) installs it pending
until the reboot; gpusim learns what the host booted with from the reboot hook."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpusim import Simulator
from gpuvm.cli.main import app
from gpuvm.steps import esxi_vgpu_manager
from tests.integration.test_reboot_kills import intents
from tests.integration.vcenter import guest_ssh, raw_state, reboot_hook, use_simulator

pytestmark = pytest.mark.integration
VERSION = "535.154.02"
BUNDLE_NAME = f"NVD-AIE-800_{VERSION}-1OEM.800.1.0.20613240_23032893.zip"
BARE = {"component": None, "installed": None, "running": None}


def gpuvm(*args: str):
    return CliRunner().invoke(app, list(args), catch_exceptions=False)


def runbook(bed, path: Path, sha256: str) -> Path:
    ssh = f"{{address: {bed.host('esx-01').address}, user: root, key_file: {bed.client_key}}}"
    path.write_text(f"""\
vcenter: {{user: administrator@vsphere.local, password_env: GPUVM_VCENTER_PASSWORD}}
ssh: {{known_hosts: {bed.known_hosts_file}}}
hosts:
  - name: esx-01
    ssh: {ssh}
    graphics: shared_direct
    nvidia_host_driver: {{bundle: /tmp/{BUNDLE_NAME}, version: {VERSION}, sha256: "{sha256}"}}
    allow_maintenance: true
    allow_reboot: true
vms:
  - {{name: esx-01-vm1, host: esx-01, cpus: 8, memory_gb: 32, gpus: {{mode: vgpu, profile: grid_a100d-4c}}}}
""")
    return path


@pytest.fixture
def bare_host(testbed, tmp_path, monkeypatch):
    """esx-01 without a vGPU manager, in gpusim and in its ESXi shell; the bundle in the shell's /tmp."""
    before = testbed.state("esx-01")["vgpu_manager"]
    testbed.set_state("esx-01", "vgpu_manager", BARE)
    bundle = testbed.host_dir("esx-01") / "tmp" / BUNDLE_NAME
    bundle.write_bytes(b"PK\x03\x04 NVIDIA host driver stand-in")
    try:
        with Simulator(hosts=1, vms_per_host=1, vgpu_manager={"esx-01": "none"},
                       on_reboot=reboot_hook(testbed, vms_per_host=1)) as sim:
            use_simulator(monkeypatch, sim, tmp_path / "state")
            yield sim, bundle, hashlib.sha256(bundle.read_bytes()).hexdigest()
    finally:
        bundle.unlink(missing_ok=True)
        testbed.set_state("esx-01", "vgpu_manager", before)


def test_bare_host_gets_the_manager_with_its_reboot_then_nothing_to_do(bare_host, testbed, tmp_path):
    sim, bundle, sha256 = bare_host
    lab = runbook(testbed, tmp_path / "runbook.yaml", sha256)
    planned = json.loads(gpuvm("plan", str(lab), "--json").output)["changes"]
    install = [c for c in planned if c["step"] == "esxi.vgpu_manager"]
    assert [(c["field"], c["before"], c["after"], c["disruption"]) for c in install] == [
        ("installed", "none", VERSION, "host-reboot")]
    assert any(c["step"] == "host.reboot" and c["target"] == "esx-01" for c in planned)
    assert any(c["step"] == "vm.hardware" and "grid_a100d-4c" in str(c["after"]) for c in planned)

    tampered = runbook(testbed, tmp_path / "tampered.yaml", "0" * 64)  # refused before any VM stops
    before = raw_state(sim)
    refused = gpuvm("apply", str(tampered), "--yes", "--allow-host-reboot")
    assert refused.exit_code == 4 and f"has sha256 {sha256}" in refused.output, refused.output
    assert f"{bundle.name} has sha256" in refused.output and "0" * 64 in refused.output  # the file, both digests
    assert testbed.state("esx-01")["vgpu_manager"]["installed"] is None
    assert raw_state(sim) == before, "a refused install rebooted or changed the host"

    applied = gpuvm("apply", str(lab), "--yes", "--allow-host-reboot")
    assert applied.exit_code == 0, applied.output
    assert testbed.state("esx-01")["vgpu_manager"]["running"] == VERSION
    state = raw_state(sim)
    assert state["esx-01"]["vgpu_types"] > 0 and state["esx-01-vm1"]["power"] == "poweredOn"
    assert [p.rsplit(".", 1)[-1] for p in state["esx-01-vm1"]["pci"]] == ["VmiopBackingInfo:grid_a100d-4c"]

    again = gpuvm("plan", str(lab), "--detailed-exitcode")
    assert again.exit_code == 0, again.output
    assert gpuvm("verify", str(lab)).exit_code == 0


def test_a_bundle_replaced_after_its_check_is_refused_at_the_install(bare_host, testbed, tmp_path, monkeypatch):
    """Issue 33, point 6: the bundle passes esxi.vgpu_manager's check, then is replaced before host.reboot
    installs it (VMs stopped, host in maintenance mode). The install checks the file it installs:
    refused naming the host, the file and both digests; nothing installed, no reboot, the host's run
    undone (out of maintenance mode, its VM as it was, no intent left), no copy left on the host."""
    sim, bundle, sha256 = bare_host
    swapped = b"PK\x03\x04 not the bundle that was checked"
    check = esxi_vgpu_manager.check_bundle

    def check_then_replace(ctx, target, action):
        check(ctx, target, action)
        bundle.write_bytes(swapped)  # between the check and the install

    monkeypatch.setattr(esxi_vgpu_manager, "check_bundle", check_then_replace)
    before = raw_state(sim)
    refused = gpuvm("apply", str(runbook(testbed, tmp_path / "runbook.yaml", sha256)), "--yes", "--allow-host-reboot")
    output = " ".join(refused.output.split())
    assert refused.exit_code == 4, refused.output
    found = hashlib.sha256(swapped).hexdigest()
    assert (f"host esx-01: NVIDIA host driver bundle /tmp/{BUNDLE_NAME} has sha256 {found}, "
            f"the runbook's nvidia_host_driver.sha256 is {sha256}: not installed") in output, refused.output
    assert testbed.state("esx-01")["vgpu_manager"]["installed"] is None
    after = raw_state(sim)
    assert after["esx-01"]["booted"] == before["esx-01"]["booted"] and after["esx-01"]["maintenance"] is False
    assert after["esx-01-vm1"]["power"] == before["esx-01-vm1"]["power"]
    assert intents() == {}
    assert [p.name for p in bundle.parent.iterdir() if p.name.startswith("gpuvm-install.")] == []


def test_the_manager_a_host_runs_is_read_and_refuses_a_guest_driver_it_does_not_load(testbed, tmp_path, monkeypatch):
    """Issue 35: no nvidia_host_driver in the runbook; the ESXi shell says the host runs vGPU 17 (R550).
    A vGPU guest driver of R570 is refused at plan time naming both versions (exit 2); one of R535, the
    branch before R550, is one NVIDIA allows and plans."""
    before = testbed.state("esx-01")["vgpu_manager"]
    testbed.set_state("esx-01", "vgpu_manager", {"component": "NVD-AIE-800", "installed": "550.54.16-1OEM.800.1.0",
                                                 "running": "550.54.16"})
    path = tmp_path / "runbook.yaml"

    def plan(guest_driver: str):
        path.write_text(f"""\
vcenter: {{user: administrator@vsphere.local, password_env: GPUVM_VCENTER_PASSWORD}}
ssh: {{known_hosts: {testbed.known_hosts_file}}}
hosts:
  - {{name: esx-01, graphics: shared_direct, ssh: {{address: {testbed.host('esx-01').address}, user: root, key_file: {testbed.client_key}}}}}
vms:
  - {{name: esx-01-vm1, host: esx-01, gpus: {{mode: vgpu, profile: grid_a100d-4c}}}}
guests:
  driver: {{version: {guest_driver}, kind: vgpu, sha256: "{'a' * 64}"}}
  hosts:
    - {{vm: esx-01-vm1, ssh: {guest_ssh(testbed, 'gpu-vm-01')}}}
""")
        return gpuvm("plan", str(path))

    try:
        with Simulator(hosts=1, vms_per_host=1) as sim:
            use_simulator(monkeypatch, sim, tmp_path / "state")
            refused = plan("570.124.06")
            assert refused.exit_code == 2, refused.output
            said = " ".join(refused.output.split())
            assert "runbook.yaml:8: guests.driver.version: esxi.vgpu_manager: host esx-01 runs vGPU manager " \
                   "550.54.16 (read in its ESXi shell); VM 'esx-01-vm1': guest driver 570.124.06 (vGPU 18, R570) " \
                   "does not load on the host's vGPU manager 550.54.16 (vGPU 17, R550)" in said, refused.output
            allowed = plan("535.154.05")
            assert allowed.exit_code == 0, allowed.output
            assert "guest.driver" in allowed.output and "535.154.05" in allowed.output
    finally:
        testbed.set_state("esx-01", "vgpu_manager", before)
