"""`gpuvm apply` refuses, before touching anything, what the simulated vCenter would refuse later
(capacity, exclusivity, hardware version; issue 9, item 5). The cases seen in the field."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
from pyVmomi import vim
from typer.testing import CliRunner

from gpusim import Simulator
from gpuvm.cli.main import app
from tests.integration.test_simulator import GPU_IDS, gpu_vm_spec, ok
from tests.integration.vcenter import pyvmomi, raw_state, use_simulator

pytestmark = pytest.mark.integration
HEAD = "vcenter: {user: administrator@vsphere.local, password_env: GPUVM_VCENTER_PASSWORD}\n"


@pytest.fixture
def start(monkeypatch, tmp_path):
    started = []

    def start(**kwargs) -> Simulator:
        sim = Simulator(hosts=1, vms_per_host=2, **kwargs).start()
        started.append(sim)
        use_simulator(monkeypatch, sim, tmp_path / "state")
        return sim

    yield start
    for sim in started:
        sim.stop()


def apply(tmp_path: Path, runbook: str):
    path = tmp_path / "rb.yaml"
    path.write_text(HEAD + textwrap.dedent(runbook))
    return CliRunner().invoke(app, ["apply", str(path), "--yes", "--allow-power-off", "--allow-host-reboot"])


def test_vgpus_on_gpus_held_by_another_running_vm_are_refused(start, tmp_path):
    sim = start(gpu="h100-80", rebind=True)
    with pyvmomi(sim) as si:
        view = si.RetrieveContent().viewManager.CreateContainerView(si.RetrieveContent().rootFolder, [vim.ManagedEntity], True)
        host = next(o for o in view.view if o.name == "esx-01")
        other = next(o for o in view.view if o.name == "esx-01-vm2")
        host.configManager.pciPassthruSystem.UpdatePassthruConfig(
            [vim.host.PciPassthruConfig(id=i, passthruEnabled=True) for i in GPU_IDS])
        spec = gpu_vm_spec(host, GPU_IDS[0], mmio_gb=1024)
        spec.deviceChange += [gpu_vm_spec(host, i).deviceChange[0] for i in GPU_IDS[1:]]
        ok(other.ReconfigVM_Task(spec))
        ok(other.PowerOnVM_Task())
        view.DestroyView()
    before = raw_state(sim)
    result = apply(tmp_path, """
        hosts: [{name: esx-01, graphics: shared_direct}]
        vms: [{name: esx-01-vm1, host: esx-01, gpus: {mode: vgpu, profile: grid_h100-80c, count: 5}}]
        """)
    assert result.exit_code == 2, result.output
    assert ("vms[0].gpus: VM esx-01-vm1 on host esx-01: vGPU 1 of 5 (grid_h100-80c) fits on no GPU: GPU 0000:17:00.0 "
            "is passthrough (held by esx-01-vm2)") in " ".join(result.output.split())
    assert raw_state(sim) == before


def test_dynamic_directpath_on_a_vmx13_vm_is_refused(start, tmp_path):
    sim = start(vm_version="vmx-13")
    before = raw_state(sim)
    result = apply(tmp_path, """
        hosts: [{name: esx-01, passthrough: [{model: A100}], allow_maintenance: true, allow_reboot: true}]
        vms: [{name: esx-01-vm1, host: esx-01, gpus: {mode: dynamic, count: 1}}]
        """)
    assert result.exit_code == 2, result.output
    assert ("VM esx-01-vm1 on host esx-01: dynamic DirectPath needs hardware version vmx-17 or later (compatible with "
            "ESXi 7.0 and later) but the VM is vmx-13: set hardware_version: vmx-17 to have gpuvm upgrade it") \
        in " ".join(result.output.split())
    assert raw_state(sim) == before


def test_hardware_version_upgrade_is_planned_before_the_devices_and_needs_the_power_off_flag(start, tmp_path):
    """hardware_version: vmx-17 lets gpuvm upgrade the running vmx-13 VM (UpgradeVM_Task, VM off) before
    vm.hardware adds the dynamic DirectPath GPU; refused up front without --allow-power-off."""
    sim = start(vm_version="vmx-13", vm_power="on")
    path = tmp_path / "rb.yaml"
    path.write_text(HEAD + textwrap.dedent("""
        hosts: [{name: esx-01, passthrough: [{model: A100}], allow_maintenance: true, allow_reboot: true}]
        vms:
          - {name: esx-01-vm1, host: esx-01, gpus: {mode: dynamic, count: 1}, hardware_version: vmx-11}
        """))
    low = CliRunner().invoke(app, ["plan", str(path)])
    assert low.exit_code == 2, low.output
    assert ("vms[0].hardware_version: VM esx-01-vm1 on host esx-01: dynamic DirectPath needs hardware version vmx-17 "
            "or later (compatible with ESXi 7.0 and later); hardware_version vmx-11 is older") in " ".join(low.output.split())
    path.write_text(path.read_text().replace("vmx-11", "vmx-17"))
    planned = CliRunner().invoke(app, ["plan", str(path), "--json"])
    assert planned.exit_code == 0, planned.output
    changes = [(c["step"], c["field"], c["after"], c["disruption"]) for c in json.loads(planned.output)["changes"]
               if c["target"] == "esx-01-vm1"]
    assert ("vm.version", "hardware_version", "vmx-17", "vm-power-off") in changes, changes
    assert [c[0] for c in changes].index("vm.version") < [c[0] for c in changes].index("vm.hardware")
    before = raw_state(sim)
    refused = CliRunner().invoke(app, ["apply", str(path), "--yes", "--allow-host-reboot"])
    assert refused.exit_code != 0 and "--allow-power-off" in refused.output, refused.output
    assert raw_state(sim) == before
    result = apply(tmp_path, path.read_text().removeprefix(HEAD))
    assert result.exit_code == 0, result.output
    vm = raw_state(sim)["esx-01-vm1"]
    assert vm["version"] == "vmx-17" and vm["power"] == "poweredOn", vm
    assert any("DynamicBackingInfo" in p for p in vm["pci"]), vm
    again = CliRunner().invoke(app, ["plan", str(path), "--detailed-exitcode"])
    assert again.exit_code == 0, again.output


def test_mig_backed_vgpu_without_known_mig_mode_is_said_and_refused_at_power_on(start, tmp_path):
    """gpuvm cannot read MIG mode from vCenter: the plan says so; gpusim, like ESXi, refuses the power-on."""
    start(gpu="a100-40")
    result = apply(tmp_path, """
        hosts: [{name: esx-01, graphics: shared_direct, allow_maintenance: true, allow_reboot: true}]
        vms: [{name: esx-01-vm1, host: esx-01, gpus: {mode: vgpu, profile: grid_a100-3-20c}}]
        """)
    output = " ".join(result.output.split())
    assert "vGPU grid_a100-3-20c is MIG-backed: it powers on only on a GPU of esx-01 in MIG mode" in output
    assert result.exit_code == 4, output
    assert "17:00.0 is not in MIG mode" in output  # the fault text, from gpusim


def test_moving_a_host_from_passthrough_to_vgpu_releases_the_gpus_gpuvm_enabled(start, tmp_path):
    """Issue 9, item 7: the GPUs gpuvm passed through are turned back off once the runbook gives the
    host to vGPU, in the same apply that moves the VM; a GPU enabled by hand is left alone."""
    sim = start(gpu="h100-80")
    result = apply(tmp_path, """
        hosts: [{name: esx-01, passthrough: [{address: "0000:17:00.0"}, {address: "0000:31:00.0"}],
                 allow_maintenance: true, allow_reboot: true}]
        vms: [{name: esx-01-vm1, host: esx-01, firmware: efi, gpus: {mode: passthrough, count: 2}, power: on}]
        """)
    assert result.exit_code == 0, result.output
    with pyvmomi(sim) as si:  # a third GPU passed through by hand, outside gpuvm
        view = si.RetrieveContent().viewManager.CreateContainerView(si.RetrieveContent().rootFolder, [vim.HostSystem], True)
        view.view[0].configManager.pciPassthruSystem.UpdatePassthruConfig(
            [vim.host.PciPassthruConfig(id=GPU_IDS[2], passthruEnabled=True)])
        view.DestroyView()
    vgpu = """
        hosts: [{name: esx-01, graphics: shared_direct, allow_maintenance: true, allow_reboot: true}]
        vms: [{name: esx-01-vm1, host: esx-01, firmware: efi, gpus: {mode: vgpu, profile: grid_h100-80c, count: 2},
               power: on}]
        """
    result = apply(tmp_path, vgpu)
    assert result.exit_code == 0, result.output
    state = raw_state(sim)["esx-01"]
    passthru = {i: (enabled, active) for i, enabled, active in state["passthru"] if i in GPU_IDS}
    assert passthru == {GPU_IDS[0]: (False, False), GPU_IDS[1]: (False, False), GPU_IDS[2]: (True, True),
                        GPU_IDS[3]: (False, False)}  # b1 was enabled by hand: kept, and noted in the plan
    assert f"GPU {GPU_IDS[2]} is passthrough-enabled, unused, and not selected" in " ".join(result.output.split())
    assert raw_state(sim)["esx-01-vm1"]["power"] == "poweredOn"
    assert raw_state(sim)["esx-01-vm1"]["pci"] == ["vim.vm.device.VirtualPCIPassthrough.VmiopBackingInfo:grid_h100-80c"] * 2
    path = tmp_path / "rb.yaml"
    verify = CliRunner().invoke(app, ["verify", str(path)])
    assert verify.exit_code == 0, verify.output


DYNAMIC_FIRST = """
    hosts: [{name: esx-01, passthrough: [{model: A100}], allow_maintenance: true, allow_reboot: true}]
    vms:
      - {name: esx-01-vm2, host: esx-01, gpus: {mode: dynamic, count: 2}}
      - {name: esx-01-vm1, host: esx-01, gpus: {mode: passthrough, count: 1, addresses: ["0000:17:00.0"]}}
    """


def assigned(sim) -> dict[str, list[str]]:
    with pyvmomi(sim) as si:
        content = si.RetrieveContent()
        view = content.viewManager.CreateContainerView(content.rootFolder, [vim.VirtualMachine], True)
        out = {vm.name: sorted(getattr(d.backing, "assignedId", None) or getattr(d.backing, "id", "")
                               for d in vm.config.hardware.device if isinstance(d, vim.vm.device.VirtualPCIPassthrough))
               for vm in view.view}
        view.DestroyView()
        return out


def test_dynamic_and_classic_on_one_host_converge(start, tmp_path):
    """Issue 11, item 13: a VM naming 17:00.0 and a dynamic x2 VM on one host. Seen: the dynamic VM
    powered on first took 17:00.0, the other failed, every apply again. Now VMs that name their GPUs
    power on first; a dynamic VM already holding a named GPU is powered off for it (refused up
    front without --allow-power-off), and one re-run converges."""
    sim = start()
    assert apply(tmp_path, DYNAMIC_FIRST).exit_code == 0
    now = assigned(sim)
    assert now["esx-01-vm1"] == ["0000:17:00.0"] and "0000:17:00.0" not in now["esx-01-vm2"]
    with pyvmomi(sim) as si:  # break it as a person could: vm1 off, vm2 restarted first, takes 17:00.0
        content = si.RetrieveContent()
        view = content.viewManager.CreateContainerView(content.rootFolder, [vim.VirtualMachine], True)
        vms = {vm.name: vm for vm in view.view}
        for name in ("esx-01-vm1", "esx-01-vm2"):
            ok(vms[name].PowerOffVM_Task())
        ok(vms["esx-01-vm2"].PowerOnVM_Task())
        view.DestroyView()
    assert "0000:17:00.0" in assigned(sim)["esx-01-vm2"]
    path = tmp_path / "rb.yaml"
    refused = CliRunner().invoke(app, ["apply", str(path), "--yes"])
    assert refused.exit_code == 2 and "esx-01-vm2" in refused.output and "--allow-power-off" in refused.output
    again = CliRunner().invoke(app, ["apply", str(path), "--yes", "--allow-power-off"])
    assert again.exit_code == 0, again.output
    now = assigned(sim)
    assert now["esx-01-vm1"] == ["0000:17:00.0"] and len(now["esx-01-vm2"]) == 2 and "0000:17:00.0" not in now["esx-01-vm2"]
    assert CliRunner().invoke(app, ["verify", str(path)]).exit_code == 0


def test_a_device_a_template_holds_is_kept_and_ownership_lives_on_the_host(start, tmp_path, monkeypatch):
    """Issue 21, item 5: gpuvm records the passthrough it enables on the host (`gpuvm.owned`, seen by
    every machine: no state directory involved), and releases none that a template in vCenter holds."""
    from gpuvm.runbook.vcenters import VCenter
    from gpuvm.vsphere.inventory import read_inventory
    from gpuvm.vsphere.session import Session, resolve_target

    def owned():
        with Session(resolve_target(VCenter(password_env="GPUVM_VCENTER_PASSWORD"))) as session:
            return read_inventory(session).hosts["esx-01"].owned

    sim = start(gpu="h100-80")
    result = apply(tmp_path, """
        hosts: [{name: esx-01, passthrough: [{address: "0000:17:00.0"}, {address: "0000:31:00.0"}],
                 allow_maintenance: true, allow_reboot: true}]
        vms: [{name: esx-01-vm1, host: esx-01, firmware: efi, gpus: {mode: passthrough, count: 1}, power: on}]
        """)
    assert result.exit_code == 0, result.output
    assert owned().passthrough == GPU_IDS[:2]
    with pyvmomi(sim) as si:  # an operator keeps a template that passes 31:00.0 through
        view = si.RetrieveContent().viewManager.CreateContainerView(si.RetrieveContent().rootFolder, [vim.ManagedEntity], True)
        host = next(o for o in view.view if o.name == "esx-01")
        template = next(o for o in view.view if o.name == "esx-01-vm2")
        ok(template.ReconfigVM_Task(gpu_vm_spec(host, GPU_IDS[1])))
        template.MarkAsTemplate()
        view.DestroyView()
    monkeypatch.setenv("GPUVM_STATE_DIR", str(tmp_path / "another-machine"))  # no journal of the first apply
    result = apply(tmp_path, """
        hosts: [{name: esx-01, graphics: shared_direct, allow_maintenance: true, allow_reboot: true}]
        vms: [{name: esx-01-vm1, host: esx-01, firmware: efi, gpus: {mode: vgpu, profile: grid_h100-80c, count: 1},
               power: on}]
        """)
    assert result.exit_code == 0, result.output
    passthru = {i: (enabled, active) for i, enabled, active in raw_state(sim)["esx-01"]["passthru"] if i in GPU_IDS}
    assert passthru[GPU_IDS[0]] == (False, False) and passthru[GPU_IDS[1]] == (True, True), passthru
    assert owned().passthrough == [GPU_IDS[1]]
    verify = CliRunner().invoke(app, ["verify", str(tmp_path / "rb.yaml")])
    assert verify.exit_code == 0, verify.output
    with pyvmomi(sim) as si:  # the operator turns 31:00.0 off (as a reinstall would) ...
        view = si.RetrieveContent().viewManager.CreateContainerView(si.RetrieveContent().rootFolder, [vim.ManagedEntity], True)
        host = next(o for o in view.view if o.name == "esx-01")
        host.configManager.pciPassthruSystem.UpdatePassthruConfig(
            [vim.host.PciPassthruConfig(id=GPU_IDS[1], passthruEnabled=False)])
        view.DestroyView()
    assert CliRunner().invoke(app, ["verify", str(tmp_path / "rb.yaml")]).exit_code == 5  # the record is stale
    result = apply(tmp_path, (tmp_path / "rb.yaml").read_text().removeprefix(HEAD))
    assert result.exit_code == 0, result.output
    assert owned().passthrough == []  # ... and gpuvm no longer owns it: on again by hand, it is not released
    assert CliRunner().invoke(app, ["verify", str(tmp_path / "rb.yaml")]).exit_code == 0
