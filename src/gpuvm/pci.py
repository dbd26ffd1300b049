"""PCI facts gpuvm relies on (pci.ids, REFERENCE §2) and the 64-bit MMIO sizing rule."""

from __future__ import annotations

NVIDIA = 0x10DE
MELLANOX = 0x15B3

# device id → (model, memory in GB); memory where vCenter reports none (config.graphicsInfo, HostFacts.gpu_memory_gb)
NVIDIA_GPUS: dict[int, tuple[str, int]] = {
    0x20F1: ("A100 PCIe 40GB", 40),
    0x20B5: ("A100 PCIe 80GB", 80),
    0x20B0: ("A100 SXM4 40GB", 40),
    0x20B2: ("A100 SXM4 80GB", 80),
    0x2331: ("H100 PCIe", 80),
    0x2330: ("H100 SXM5", 80),
    0x2339: ("H100 SXM5 94GB", 94),
    0x2321: ("H100 NVL", 94),  # pci.ids: "GH100 [H100L 94GB]"
    0x2335: ("H200 SXM", 141),
    0x233B: ("H200 NVL", 141),
    0x2901: ("B200", 180),
    0x2909: ("HGX B200 168GB", 168),
    0x26B9: ("L40S", 48),
    0x2BB5: ("RTX PRO 6000 Blackwell Server Edition", 96),
}
# PCIe cards joined by NVLink bridges in pairs (R750xa; H100 NVL's 2-way bridge): more than 2 per VM cross PCIe.
NVLINK_PAIRED = {0x20F1, 0x20B5, 0x2331, 0x2321}

MELLANOX_NICS: dict[int, str] = {0x101B: "ConnectX-6", 0x101C: "ConnectX-6 VF", 0x101D: "ConnectX-6 Dx", 0x1021: "ConnectX-7"}

GPU_CLASS = 0x03  # display controller (0x0302: 3D controller)


def unsigned16(value: int) -> int:
    """The vSphere API reports vendor/device ids as signed 16-bit numbers (Intel 0x8086 → -32634)."""
    return value & 0xFFFF


def pci_id(vendor: int, device: int) -> str:
    return f"{unsigned16(vendor):04x}:{unsigned16(device):04x}"


def gpu_memory_gb(vendor: int, device: int) -> int | None:
    if unsigned16(vendor) != NVIDIA:
        return None
    known = NVIDIA_GPUS.get(unsigned16(device))
    return known[1] if known else None


def next_power_of_two(value: int) -> int:
    power = 1
    while power < value:
        power *= 2
    return power


def mmio_size_gb(gpu_memory: list[int]) -> int:
    """64-bit MMIO window for the VM: a power of two ≥ 2× the GPUs' total memory (REFERENCE §3)."""
    return next_power_of_two(max(1, 2 * sum(gpu_memory)))
