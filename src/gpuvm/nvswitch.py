"""HGX boards with NVSwitch: how gpuvm recognises one, and what NVIDIA supports on it under vSphere.

NVIDIA AI Enterprise, "NVIDIA NVSwitch" (PAGE below), for the HGX A100, H100, H800, H200, B200 and
B300 8-GPU baseboards: only time-sliced vGPUs are supported, MIG-backed vGPUs are not; GPU
passthrough is not supported on systems with NVSwitch under VMware vSphere; on HGX B200 and B300
with vSphere, NVSwitch needs the Fabric Manager CRX component (in NVIDIA AI Enterprise Infra 8.2,
not in 9.0). resolve() checks the first two at plan time (`check_nvswitch`: an input error naming
the host, its GPUs and the rule) and notes the third, which vCenter cannot show.

A host is an NVSwitch system when, in the device list vCenter reports (`hardware.pciDevice`, no
SSH needed):
- an NVIDIA NVSwitch is among its PCI functions: pci.ids names 10de:1af1 "GA100 [A100 NVSwitch]"
  and 10de:22a3 "GH100 [H100 NVSwitch]" (HGX H100 and H200 boards carry the latter); or
- its GPUs are B200s (10de:2901 "GB100 [B200]", 10de:2909 "GB100 [HGX B200 168GB]"), which come on
  NVSwitch baseboards only; pci.ids names no Blackwell NVSwitch function, so the GPU is the sign.
Where the ESXi shell is given, `nvidia-smi topo -m` shows it too (`TopoMatrix.switched`, read by the
esxi.topology step): every pair of GPUs joined by all of a GPU's NVLinks (NV12 on A100, NV18 on
H100/H200/B200), as only a switch joins them; direct links share a GPU's links among its peers.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from gpuvm.desired import Desired, Nvlink
from gpuvm.errors import listed
from gpuvm.pci import NVIDIA, unsigned16
from gpuvm.plan import Note
from gpuvm.runbook.model import Runbook
from gpuvm.runbook.vms import DynamicGpus, Gpus, PassthroughGpus, VgpuGpus
from gpuvm.vgpu_profiles import vgpu_profile
from gpuvm.vsphere.facts import HostFacts, Inventory

PAGE = "https://docs.nvidia.com/ai-enterprise/release-9/latest/infra-software/vgpu/features/nvswitch.html"
NVSWITCHES = {0x1AF1: "GA100 [A100 NVSwitch]", 0x22A3: "GH100 [H100 NVSwitch]"}  # pci.ids
SWITCHED_ONLY = {0x2901: "GB100 [B200]", 0x2909: "GB100 [HGX B200 168GB]"}  # GPUs only on NVSwitch boards
FABRIC_MANAGER_CRX = set(SWITCHED_ONLY)  # B200 (B300 has no pci.ids entry yet)
RULE = ("NVIDIA supports only time-sliced vGPU on HGX boards with NVSwitch under VMware vSphere: "
        f"no GPU passthrough, no MIG-backed vGPU (NVIDIA AI Enterprise, \"NVIDIA NVSwitch\": {PAGE})")


@dataclass(frozen=True)
class NvswitchBoard:
    host: str
    gpus: tuple[str, ...]  # the NVIDIA GPUs' addresses
    sign: str  # what shows the NVSwitch: the device list, else the ESXi shell's `nvidia-smi topo -m`
    fabric_manager: bool  # vSphere needs NVIDIA's Fabric Manager CRX component on it (B200, B300)

    def refusal(self, what: str, gpus: list[str] | tuple[str, ...]) -> str:
        return (f"{what} of GPU(s) {listed(gpus, 8)} is refused: {self.host} is an HGX board with NVSwitch "
                f"({self.sign}); {RULE}")


def nvswitch_board(facts: HostFacts, nvlink: Nvlink | None = None) -> NvswitchBoard | None:
    """`nvlink`: what the host's ESXi shell showed (esxi.topology), if read."""
    gpus = tuple(sorted(d.id for d in facts.gpus))
    switches = [d for d in facts.pci if unsigned16(d.vendor_id) == NVIDIA and unsigned16(d.device_id) in NVSWITCHES]
    only = [d for d in facts.gpus if unsigned16(d.device_id) in SWITCHED_ONLY]
    if switches:
        d = switches[0]
        name = NVSWITCHES[unsigned16(d.device_id)]
        sign = f"{len(switches)} NVSwitch function(s), the first {d.id} {d.pci_id} {name}"
    elif only:
        name = SWITCHED_ONLY[unsigned16(only[0].device_id)]
        sign = f"its GPUs are {only[0].pci_id} {name}, made for NVSwitch boards only"
    elif nvlink is not None and nvlink.switched:
        sign = f"{nvlink.source} shows every pair of its GPUs joined by NV12 or more"
    else:
        return None
    fabric = any(unsigned16(d.device_id) in FABRIC_MANAGER_CRX for d in facts.gpus)
    return NvswitchBoard(facts.name, gpus, sign, fabric)


def check_nvswitch(rb: Runbook, inventory: Inventory, desired: Desired, shells: Mapping[str, Nvlink]) -> None:
    """The rules above, for every runbook host that is an NVSwitch board and the VMs on it: the
    first broken one is an InputError; the Fabric Manager CRX a plan note. `shells`: what ESXi
    shells showed, by host."""
    for i, host in enumerate(rb.hosts):
        board = nvswitch_board(inventory.hosts[host.name], shells.get(host.name))
        if board is None:
            continue
        chosen = [a for a in desired.hosts[host.name].passthrough if a in board.gpus]
        if chosen:
            raise rb.error(("hosts", i, "passthrough"), board.refusal("GPU passthrough", chosen))
        if host.mig == "all" or host.mig:
            raise rb.error(("hosts", i, "mig"), board.refusal("MIG mode (for MIG-backed vGPU)",
                                                              board.gpus if host.mig == "all" else
                                                              [board.gpus[n] for n in host.mig if n < len(board.gpus)]))
        vms = [(j, vm) for j, vm in enumerate(rb.vms) if vm.host == host.name and vm.state != "absent"]
        for j, vm in vms:
            if refused := _refused(board, vm.gpus):
                raise rb.error(("vms", j) + refused[0], f"VM {vm.name}: {refused[1]}")
        if board.fabric_manager and any(isinstance(vm.gpus, VgpuGpus) for _, vm in vms):
            desired.notes.append(Note(host.name, "resolve", f"{host.name} is an HGX B200/B300 board: under vSphere "
                                      "its NVSwitch needs NVIDIA's Fabric Manager CRX component (NVIDIA AI Enterprise "
                                      f"Infra 8.2, not in 9.0; {PAGE}), which gpuvm neither installs nor checks"))


def _refused(board: NvswitchBoard, gpus: Gpus | None) -> tuple[tuple[str, ...], str] | None:
    """Where a VM's `gpus` breaks the rules on `board`, and why; None where it keeps them."""
    if isinstance(gpus, PassthroughGpus):
        return ("gpus",), board.refusal("GPU passthrough", gpus.addresses or board.gpus)
    if isinstance(gpus, DynamicGpus):
        return ("gpus",), board.refusal("dynamic DirectPath", board.gpus)
    profile = vgpu_profile(gpus.profile) if isinstance(gpus, VgpuGpus) else None
    if profile and profile.slices:
        return ("gpus", "profile"), board.refusal(f"MIG-backed vGPU {profile.name}", board.gpus)
    return None
