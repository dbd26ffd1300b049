"""gpusim's newer GPU hosts (`-gpu h200-hgx`, `h100-nvl`, `l40s`) read back through gpuvm's own
inventory (PCI ids, NUMA nodes, vGPU types), and NVIDIA's NVSwitch rules against the HGX host at
plan time: passthrough and MIG-backed vGPU refused (exit 2, naming host, GPUs, rule and NVIDIA's
page), time-sliced vGPU planned."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from pyVmomi import vim
from typer.testing import CliRunner

from gpusim import Simulator
from gpuvm.cli.main import app
from gpuvm.nvswitch import PAGE
from gpuvm.vsphere.facts import Inventory
from tests.integration.vcenter import pyvmomi, use_simulator

pytestmark = pytest.mark.integration
HEAD = "vcenter: {user: administrator@vsphere.local, password_env: GPUVM_VCENTER_PASSWORD}\n"
HGX_GPUS = ["0000:18:00.0", "0000:2a:00.0", "0000:3a:00.0", "0000:5d:00.0",
            "0000:9a:00.0", "0000:ab:00.0", "0000:ba:00.0", "0000:db:00.0"]


def gpuvm(tmp_path: Path, runbook: str, *args: str):
    path = tmp_path / "rb.yaml"
    path.write_text(HEAD + textwrap.dedent(runbook))
    return CliRunner().invoke(app, [args[0], str(path), *args[1:]])


def host_facts(tmp_path: Path):
    saved = tmp_path / "inv.json"
    result = gpuvm(tmp_path, "hosts: [{name: esx-01}]\n", "inventory", "--save", str(saved))
    assert result.exit_code == 0, result.output
    return Inventory.model_validate_json(saved.read_text()).hosts["esx-01"]


@pytest.mark.parametrize("gpu, pci_id, nodes, profiles", [
    ("h200-hgx", "10de:2335", [0, 0, 0, 0, 1, 1, 1, 1], {"nvidia_h200x-141c", "nvidia_h200x-1-18cme"}),
    ("h100-nvl", "10de:2321", [0, 0, 1, 1], {"nvidia_h100l-94c", "nvidia_h100l-3-47c", "nvidia_h100l-1-12cme"}),
    ("l40s", "10de:26b9", [0, 0, 1, 1], {"nvidia_l40s-48q", "nvidia_l40s-48c"}),
])
def test_each_model_reads_back_with_its_ids_nodes_and_vgpu_types(monkeypatch, tmp_path, gpu, pci_id, nodes,
                                                                  profiles):
    with Simulator(hosts=1, vms_per_host=1, gpu=gpu) as sim:
        use_simulator(monkeypatch, sim, tmp_path / "state")
        facts = host_facts(tmp_path)
    assert {d.pci_id for d in facts.gpus} == {pci_id} and [d.numa_node for d in facts.gpus] == nodes
    assert profiles <= set(facts.vgpu_profiles)
    switches = [d.id for d in facts.pci if d.pci_id == "10de:22a3"]
    assert switches == (["0000:05:00.0", "0000:06:00.0", "0000:07:00.0", "0000:08:00.0"] if gpu == "h200-hgx" else [])


def test_nvswitch_rules_on_the_hgx_host_at_plan_time(monkeypatch, tmp_path):
    with Simulator(hosts=1, vms_per_host=1, gpu="h200-hgx") as sim:
        use_simulator(monkeypatch, sim, tmp_path / "state")
        passthrough = gpuvm(tmp_path, """
            hosts: [{name: esx-01, passthrough: [{id: '10de:2335'}]}]
            vms: [{name: esx-01-vm1, host: esx-01, firmware: efi, gpus: {mode: passthrough, count: 8}}]
            """, "plan")
        mig_backed = gpuvm(tmp_path, """
            hosts: [{name: esx-01, graphics: shared_direct}]
            vms: [{name: esx-01-vm1, host: esx-01, gpus: {mode: vgpu, profile: nvidia_h200x-3-71c}}]
            """, "plan")
        time_sliced = gpuvm(tmp_path, """
            hosts: [{name: esx-01, graphics: shared_direct, allow_maintenance: true, allow_reboot: true}]
            vms: [{name: esx-01-vm1, host: esx-01, gpus: {mode: vgpu, profile: nvidia_h200x-70c, count: 2}}]
            """, "plan")
        applied = gpuvm(tmp_path, (tmp_path / "rb.yaml").read_text().removeprefix(HEAD), "apply", "--yes",
                        "--allow-host-reboot")
        with pyvmomi(sim) as si:  # gpusim placed both (its profile names read as gpuvm reads them) and powered on
            content = si.RetrieveContent()
            view = content.viewManager.CreateContainerView(content.rootFolder, [vim.VirtualMachine], True)
            power = next(v for v in view.view if v.name == "esx-01-vm1").runtime.powerState
            view.DestroyView()
    rule = ("is refused: esx-01 is an HGX board with NVSwitch (4 NVSwitch function(s), the first 0000:05:00.0 "
            "10de:22a3 GH100 [H100 NVSwitch]); NVIDIA supports only time-sliced vGPU on HGX boards with NVSwitch "
            f"under VMware vSphere: no GPU passthrough, no MIG-backed vGPU (NVIDIA AI Enterprise, \"NVIDIA NVSwitch\": {PAGE})")
    assert passthrough.exit_code == 2 and "Traceback" not in passthrough.output
    assert (f"hosts[0].passthrough: GPU passthrough of GPU(s) {', '.join(HGX_GPUS)} {rule}"
            in " ".join(passthrough.output.split()))
    assert mig_backed.exit_code == 2, mig_backed.output
    assert (f"vms[0].gpus.profile: VM esx-01-vm1: MIG-backed vGPU nvidia_h200x-3-71c of GPU(s) {', '.join(HGX_GPUS)} "
            f"{rule}") in " ".join(mig_backed.output.split())
    assert time_sliced.exit_code == 0, time_sliced.output
    assert time_sliced.output.count("vGPU nvidia_h200x-70c") == 2
    assert applied.exit_code == 0 and power == "poweredOn", applied.output


def test_four_passed_through_l40s_power_on_with_the_mmio_their_memory_needs(monkeypatch, tmp_path):
    """Seen: gpuvm sized the MMIO window of GPUs it had no table row for at 1 GB; ESXi (gpusim) refuses
    such a VM at power-on. Now from the PCI id, else from what vCenter reports of the GPU's memory."""
    with Simulator(hosts=1, vms_per_host=1, gpu="l40s", rebind=True) as sim:
        use_simulator(monkeypatch, sim, tmp_path / "state")
        result = gpuvm(tmp_path, """
            hosts: [{name: esx-01, passthrough: [{model: L40S}], allow_maintenance: true, allow_reboot: true}]
            vms: [{name: esx-01-vm1, host: esx-01, firmware: efi, gpus: {mode: passthrough, count: 4}}]
            """, "apply", "--yes", "--allow-power-off", "--allow-host-reboot")
        assert result.exit_code == 0, result.output
        with pyvmomi(sim) as si:
            content = si.RetrieveContent()
            view = content.viewManager.CreateContainerView(content.rootFolder, [vim.VirtualMachine], True)
            vm = next(v for v in view.view if v.name == "esx-01-vm1")
            power, extra = vm.runtime.powerState, {o.key: o.value for o in vm.config.extraConfig}
            view.DestroyView()
    assert power == "poweredOn" and extra["pciPassthru.64bitMMIOSizeGB"] == "512"
