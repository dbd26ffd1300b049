"""VM hardware versions (vmx-NN) and the version each passthrough feature needs.

A leaf (types only from `gpuvm.desired`): capacity checks a VM's version against it at plan time,
`vm.version` reads the runbook's `hardware_version` with it.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gpuvm.desired import DesiredDevice

# Minimum VM hardware version per device kind, from VMware's documentation:
# - classic DirectPath: "verify that the virtual machine is using hardware version 7 or later"
#   (vSphere 6.5 Client SDK, "Add a PCI Device to a Virtual Machine");
# - vGPU: "compatible with ESXi 6.0 and later" (vmx-11); several vGPUs in one VM: "compatible with
#   ESXi 6.7 Update 2 and later" (vmx-15) (vSphere 6.7 VM administration, "Configure NVIDIA GRID vGPU");
# - dynamic DirectPath: "verify that the virtual hardware version is 17" (vSphere 7.0 Host Client,
#   "Add a PCI Device to a Virtual Machine").
# - large MMIO (64-bit MMIO, GPUs mapping more than 16 GB): EFI and pciPassthru.use64bitMMIO, "ESXi 6.0
#   Update 1 and later" (VMware KB 2142307 "VMDirectPath I/O: Requirements for Platforms and Devices";
#   Dell KB 000199172): gpuvm asks for vmx-11, the compatibility level of ESXi 6.0.
# vmx-N ↔ ESXi release: vSphere Automation API, Hardware.Version. The one table: vm.version and the
# hardware_version error read it, gpusim's neededVersion mirrors it.
MIN_HW_VERSION = {"classic": (7, "classic DirectPath", "ESXi 4.0"), "vgpu": (11, "vGPU", "ESXi 6.0"),
                  "mmio": (11, "64-bit MMIO (large GPU BARs)", "ESXi 6.0 U1"),
                  "vgpus": (15, "more than one vGPU", "ESXi 6.7 U2"), "dynamic": (17, "dynamic DirectPath", "ESXi 7.0")}


def hw_version(text: str | None) -> int | None:
    """17 for "vmx-17"; None for anything else (an empty or unknown version)."""
    m = re.fullmatch(r"vmx-(\d+)", text or "")
    return int(m[1]) if m else None


def needed_hw_version(devices: Sequence[DesiredDevice], extra_config: dict[str, str]) -> tuple[int, str, str] | None:
    """The highest (version, feature, release) the VM's devices and settings need; None: nothing."""
    kinds = {d.kind for d in devices}
    if sum(1 for d in devices if d.kind == "vgpu") > 1:
        kinds.add("vgpus")
    if extra_config.get("pciPassthru.use64bitMMIO", "").upper() == "TRUE":
        kinds.add("mmio")
    return max((MIN_HW_VERSION[k] for k in kinds), default=None)
