"""HGX boards with NVSwitch (gpuvm.nvswitch): recognised from vCenter's device list and from
`nvidia-smi topo -m`; at plan time, GPU passthrough and MIG-backed vGPU on one are refused (exit 2,
naming host, GPUs, rule and NVIDIA's page), time-sliced vGPU plans."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from gpuvm.engine import make_plan
from gpuvm.errors import InputError
from gpuvm.nvswitch import PAGE, nvswitch_board
from gpuvm.parsers.nvidia_topo import parse_topo_matrix
from gpuvm.runbook.loader import load_runbook
from gpuvm.steps.esxi_topology import GpuLinks
from gpuvm.vsphere.facts import HostFacts, PciDevice
from tests.unit.factories import inventory, r750xa, vm

FIXTURES = Path(__file__).parent.parent / "fixtures" / "tools"
HGX_GPUS = ["0000:18:00.0", "0000:2a:00.0", "0000:3a:00.0", "0000:5d:00.0",
            "0000:9a:00.0", "0000:ab:00.0", "0000:ba:00.0", "0000:db:00.0"]


def hgx(gpu: tuple[int, str] = (0x2335, "GH100 [H200 SXM 141GB]"), switches: bool = True) -> HostFacts:
    """An 8-GPU HGX host as gpusim's `-gpu h200-hgx` models it: 4 GPUs per NUMA node, 4 NVSwitches."""
    pci = [PciDevice(id=a, vendor_id=0x10DE, device_id=gpu[0], device_name=gpu[1], class_id=0x0302,
                     numa_node=n // 4, passthru_capable=True) for n, a in enumerate(HGX_GPUS)]
    pci += [PciDevice(id=f"0000:0{n}:00.0", vendor_id=0x10DE, device_id=0x22A3, device_name="GH100 [H100 NVSwitch]",
                      class_id=0x0680, numa_node=0) for n in range(5, 9) if switches]
    return r750xa(pci=pci, vgpu_profiles=["nvidia_h200x-141c", "nvidia_h200x-70c", "nvidia_h200x-3-71c"])


def plan(tmp_path: Path, host_extra: str, vms: str, host: HostFacts | None = None, facts=None):
    path = tmp_path / "rb.yaml"
    path.write_text("hosts:\n  - name: esx-01\n    graphics: shared_direct\n" + textwrap.indent(host_extra, "    ")
                    + "vms:\n" + textwrap.indent(textwrap.dedent(vms), "  "))
    return make_plan(load_runbook(path), inventory([host or hgx()], [vm("vm1")]), facts=facts)


@pytest.mark.parametrize("host, sign", [
    (hgx(), "4 NVSwitch function(s), the first 0000:05:00.0 10de:22a3 GH100 [H100 NVSwitch]"),
    (hgx((0x2901, "GB100 [B200]"), switches=False), "its GPUs are 10de:2901 GB100 [B200], made for NVSwitch boards only"),
])
def test_an_nvswitch_board_is_recognised_from_the_device_list(host, sign):
    board = nvswitch_board(host)
    assert board is not None and board.sign == sign and board.gpus == tuple(HGX_GPUS)
    assert board.fabric_manager == (host.gpus[0].device_id == 0x2901)


def test_pcie_cards_and_sxm_gpus_without_switches_are_no_nvswitch_board():
    assert nvswitch_board(r750xa()) is None
    assert nvswitch_board(hgx(switches=False)) is None  # a 4-GPU HGX H100/H200 has no NVSwitch


def test_nvswitch_seen_in_nvidia_smi_topo():
    """8 x H100 SXM5 (NV18 between every pair) is switched; R750xa's bridged A100 pairs (NV12 to one
    peer, SYS to the rest) are not."""
    assert parse_topo_matrix((FIXTURES / "nvidia_smi_topo_m_hgx_h100.txt").read_text()).switched()
    assert not parse_topo_matrix((FIXTURES / "nvidia_smi_topo_m_r750xa.txt").read_text()).switched()
    four = "\tGPU0\tGPU1\tGPU2\tGPU3\tCPU Affinity\n" + "".join(
        f"GPU{i}\t" + "\t".join(" X " if i == j else "NV6" for j in range(4)) + "\t0-31\n" for i in range(4))
    assert not parse_topo_matrix(four).switched()  # 4-GPU HGX H100: direct links, 6 to each peer


@pytest.mark.parametrize("host_extra, vms, where, what", [
    ("passthrough: [{id: '10de:2335'}]\n", "- {name: vm1, host: esx-01}\n", "hosts[0].passthrough",
     "GPU passthrough of GPU(s) " + ", ".join(HGX_GPUS)),
    ("", "- {name: vm1, host: esx-01, firmware: efi, gpus: {mode: passthrough, count: 1, addresses: ['0000:9a:00.0']}}\n",
     "vms[0].gpus", "VM vm1: GPU passthrough of GPU(s) 0000:9a:00.0"),
    ("", "- {name: vm1, host: esx-01, firmware: efi, gpus: {mode: dynamic, count: 2}}\n",
     "vms[0].gpus", "VM vm1: dynamic DirectPath of GPU(s) 0000:18:00.0"),
    ("", "- {name: vm1, host: esx-01, gpus: {mode: vgpu, profile: nvidia_h200x-3-71c}}\n",
     "vms[0].gpus.profile", "VM vm1: MIG-backed vGPU nvidia_h200x-3-71c of GPU(s) 0000:18:00.0"),
    ("ssh: {address: 10.0.0.1}\nmig: [0, 1]\n", "- {name: vm1, host: esx-01}\n",
     "hosts[0].mig", "MIG mode (for MIG-backed vGPU) of GPU(s) 0000:18:00.0, 0000:2a:00.0 is refused"),
])
def test_passthrough_and_mig_backed_vgpu_on_an_nvswitch_board_are_refused(tmp_path, host_extra, vms, where, what):
    with pytest.raises(InputError) as e:
        plan(tmp_path, host_extra, vms)
    message = str(e.value)
    assert e.value.exit_code == 2 and f"rb.yaml:" in message and f"{where}: {what}" in message
    assert "esx-01 is an HGX board with NVSwitch (4 NVSwitch function(s)" in message
    assert "no GPU passthrough, no MIG-backed vGPU" in message and PAGE in message
    assert "\n" not in message


def test_time_sliced_vgpu_on_an_nvswitch_board_plans(tmp_path):
    planned, _ = plan(tmp_path, "", "- {name: vm1, host: esx-01, gpus: {mode: vgpu, profile: nvidia_h200x-70c, count: 2}}\n")
    assert [c.after for c in planned.changes if c.field == "device"] == ["vGPU nvidia_h200x-70c"] * 2
    assert not planned.notes


def test_time_sliced_vgpu_on_a_b200_board_notes_the_fabric_manager(tmp_path):
    host = hgx((0x2901, "GB100 [B200]"), switches=False).model_copy(update={"vgpu_profiles": ["nvidia_b200x-180c"]})
    planned, _ = plan(tmp_path, "", "- {name: vm1, host: esx-01, gpus: {mode: vgpu, profile: nvidia_b200x-180c}}\n", host)
    assert [n.message for n in planned.notes] == [
        "esx-01 is an HGX B200/B300 board: under vSphere its NVSwitch needs NVIDIA's Fabric Manager CRX component "
        f"(NVIDIA AI Enterprise Infra 8.2, not in 9.0; {PAGE}), which gpuvm neither installs nor checks"]


def test_a_board_the_device_list_does_not_show_is_known_by_its_esxi_shells_topology(tmp_path):
    """No NVSwitch function listed (a board pci.ids has no entry for yet), but the host's `nvidia-smi
    topo -m` shows every pair at NV18: the esxi.topology step's reading makes it an NVSwitch board."""
    shell = GpuLinks(gpus=tuple(HGX_GPUS), switched=True)
    vms = "- {name: vm1, host: esx-01, gpus: {mode: vgpu, profile: nvidia_h200x-3-71c}}\n"
    assert plan(tmp_path, "", vms, hgx(switches=False), facts={})  # the device list alone: no board
    with pytest.raises(InputError, match=r"esx-01 is an HGX board with NVSwitch \(`nvidia-smi topo -m` in the ESXi "
                                         r"shell of esx-01 shows every pair of its GPUs joined by NV12 or more\)"):
        plan(tmp_path, "", vms, hgx(switches=False), facts={("esxi.topology", "esx-01"): shell})
