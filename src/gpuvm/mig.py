"""MIG layouts: the profiles each GPU model offers, and a runbook layout expanded to one per GPU.

A layout is a name — `all-disabled`, `all-enabled`, `all-<profile>` (as many of that profile as
fit one GPU) — or NVIDIA mig-parted entries (`device-filter`, `devices`, `mig-enabled`,
`mig-devices`), given inline or as one config of a mig-parted file (runbook/mig_parted.py). As in
mig-parted, a GPU with MIG enabled gets exactly the instances listed (none for `all-enabled`):
instances made by hand are replaced. GPUs no entry names are left as they are.

Profile tables follow NVIDIA's MIG user guide. A GPU has 7 compute slices and 8 memory slices
(A30: 4 and 4); a profile `Ng.Mgb` takes N compute slices and its share of memory.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Iterable, Sequence

from gpuvm.runbook.model import MigDevices


class MigLayoutError(ValueError):
    """A layout that does not fit the GPUs found; the step adds the guest and runbook line."""


@dataclass(frozen=True)
class Profile:
    name: str  # "3g.40gb"
    compute: int  # compute slices
    memory: int  # memory slices
    max_count: int  # most instances of this profile on one GPU


@dataclass(frozen=True)
class GpuModel:
    name: str
    compute_slices: int
    memory_slices: int
    profiles: dict[str, Profile]


def _model(name: str, compute: int, memory: int, *profiles: tuple[str, int, int, int]) -> GpuModel:
    return GpuModel(name, compute, memory, {p[0]: Profile(*p) for p in profiles})


A100_80GB = _model("A100 80GB", 7, 8, ("1g.10gb", 1, 1, 7), ("1g.20gb", 1, 2, 4), ("2g.20gb", 2, 2, 3),
                   ("3g.40gb", 3, 4, 2), ("4g.40gb", 4, 4, 1), ("7g.80gb", 7, 8, 1))
A100_40GB = _model("A100 40GB", 7, 8, ("1g.5gb", 1, 1, 7), ("1g.10gb", 1, 2, 4), ("2g.10gb", 2, 2, 3),
                   ("3g.20gb", 3, 4, 2), ("4g.20gb", 4, 4, 1), ("7g.40gb", 7, 8, 1))
H100_80GB = GpuModel("H100 80GB", 7, 8, A100_80GB.profiles)  # the same profiles as the A100 80GB
A30_24GB = _model("A30 24GB", 4, 4, ("1g.6gb", 1, 1, 4), ("2g.12gb", 2, 2, 2), ("4g.24gb", 4, 4, 1))


# mig-parted's `device-filter` names GPUs by PCI id (`0x20B510DE`: device 20b5, vendor 10de NVIDIA);
# the MIG model each denotes (pci.ids). An id not listed here matches no GPU.
DEVICE_MODELS = {0x20B0: A100_40GB, 0x20B1: A100_40GB, 0x20F1: A100_40GB, 0x20B2: A100_80GB, 0x20B5: A100_80GB,
                 0x2330: H100_80GB, 0x2331: H100_80GB, 0x20B7: A30_24GB}


def filtered(device_filter: Sequence[str], gpu_name: str) -> bool:
    """Whether a GPU (by its nvidia-smi name) is one of the models a mig-parted device-filter names."""
    model = gpu_model(gpu_name)
    named = [DEVICE_MODELS.get(int(pci_id[2:6], 16)) for pci_id in device_filter if pci_id[6:].lower() == "10de"]
    return model is not None and any(m is model for m in named)


def gpu_model(gpu_name: str) -> GpuModel | None:
    """The MIG model of a GPU by its nvidia-smi name ("NVIDIA A100 80GB PCIe", "A100-SXM4-40GB")."""
    name = gpu_name.upper()
    if "A100" in name:
        return A100_80GB if "80GB" in name else A100_40GB
    if "H100" in name and ("80GB" in name or "PCIE" in name) and "94GB" not in name and "NVL" not in name:
        return H100_80GB
    if "A30" in name:
        return A30_24GB
    return None


@dataclass(frozen=True)
class GpuLayout:
    """What one GPU should be: MIG on or off, and its GPU instances (largest first)."""

    enabled: bool
    profiles: tuple[str, ...] = ()


def canonical(profiles: Iterable[str], model: GpuModel | None) -> tuple[str, ...]:
    """Profiles largest first (the order to create them in, so big instances get placed first)."""
    def key(name: str) -> tuple[int, int, str]:
        p = model.profiles.get(name) if model else None
        return (-p.compute, -p.memory, name) if p else (0, 0, name)

    return tuple(sorted(profiles, key=key))


def describe(profiles: Sequence[str]) -> str:
    """("3g.40gb", "3g.40gb", "1g.10gb") → "3g.40gb x2, 1g.10gb x1"; () → "none"."""
    if not profiles:
        return "none"
    return ", ".join(f"{name} x{count}" for name, count in Counter(profiles).items())


def select(devices: str | Sequence[int], indices: Sequence[int]) -> list[int]:
    """The GPU indices `devices` ("all" or a list) names, checked against those present."""
    if devices == "all":
        return list(indices)
    missing = [i for i in devices if i not in indices]
    if missing:
        found = ", ".join(map(str, indices)) or "none"
        raise MigLayoutError(f"GPU {', '.join(map(str, missing))} not found (GPUs present: {found})")
    return list(dict.fromkeys(devices))


def expand(layout: str | Sequence[MigDevices], gpus: dict[int, str]) -> dict[int, GpuLayout]:
    """Each named GPU's desired layout; `gpus` maps index → nvidia-smi name. Raises MigLayoutError."""
    if isinstance(layout, str):
        return {index: _named(layout, index, name) for index, name in sorted(gpus.items())}
    wanted: dict[int, GpuLayout] = {}
    for entry in layout:
        indices = select(entry.devices, sorted(gpus))
        if entry.device_filter is not None:  # mig-parted: the entry is for GPUs of these models only
            indices = [i for i in indices if filtered(entry.device_filter, gpus[i])]
        for index in indices:
            if index in wanted:
                raise MigLayoutError(f"GPU {index} is named by two entries")
            if not entry.mig_enabled and entry.mig_devices:
                raise MigLayoutError("mig-devices are given but mig-enabled is false")
            wanted[index] = _enabled(entry.mig_devices, index, gpus[index]) if entry.mig_enabled else GpuLayout(False)
    return wanted


def _named(layout: str, index: int, gpu_name: str) -> GpuLayout:
    """all-disabled, all-enabled (no instances, as in mig-parted) or all-<profile> (as many as fit)."""
    if layout == "all-disabled":
        return GpuLayout(False)
    if layout == "all-enabled":
        return _enabled({}, index, gpu_name)
    profile = layout.removeprefix("all-")
    known = _model_of(index, gpu_name).profiles.get(profile)
    return _enabled({profile: known.max_count if known else 1}, index, gpu_name)


def _model_of(index: int, gpu_name: str) -> GpuModel:
    model = gpu_model(gpu_name)
    if model is None:
        raise MigLayoutError(f"GPU {index} ({gpu_name}) has no known MIG profiles (MIG needs an A100, A30 or H100)")
    return model


def _enabled(counts: dict[str, int], index: int, gpu_name: str) -> GpuLayout:
    """MIG on with these instances, checked against the GPU model's profiles and slices."""
    model = _model_of(index, gpu_name)
    for name, count in counts.items():
        if name not in model.profiles:
            raise MigLayoutError(f"profile {name} is not a MIG profile of GPU {index} ({gpu_name}); "
                                 f"its profiles are {', '.join(model.profiles)}")
        if count > model.profiles[name].max_count:
            raise MigLayoutError(f"{count} x {name} on GPU {index}: "
                                 f"at most {model.profiles[name].max_count} fit one {model.name}")
    profiles = canonical([name for name, count in counts.items() for _ in range(count)], model)
    compute = sum(model.profiles[name].compute for name in profiles)
    memory = sum(model.profiles[name].memory for name in profiles)
    if compute > model.compute_slices or memory > model.memory_slices:
        raise MigLayoutError(f"GPU {index}: {describe(profiles)} needs {compute} compute and {memory} memory slices; "
                             f"a {model.name} has {model.compute_slices} and {model.memory_slices}")
    return GpuLayout(True, profiles)
