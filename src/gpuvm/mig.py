"""MIG layouts: the profiles each GPU offers, and a runbook layout expanded to one per GPU.

A layout is a name — `all-disabled`, `all-enabled`, `all-<profile>` (as many of that profile as
fit one GPU) — or NVIDIA mig-parted entries (`device-filter`, `devices`, `mig-enabled`,
`mig-devices`), given inline or as one config of a mig-parted file (runbook/mig_parted.py). As in
mig-parted, a GPU with MIG enabled gets exactly the instances listed (none for `all-enabled`):
instances made by hand are replaced. GPUs no entry names are left as they are.

A GPU's profiles are what its driver lists (`nvidia-smi mig -lgip`: `reported_model`); the
built-in table below is for planning without the GPU (vGPU capacity from vCenter's device names,
a guest whose driver lists nothing while MIG is off). A GPU has 7 compute slices and 8 memory
slices (A30, RTX PRO 6000: 4 and 4); a profile `Ng.Mgb` takes N compute slices and its share of
memory; `+me`, `+me.all`, `-me` and `+gfx` variants take the same slices with other engines.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from typing import Iterable, Mapping, Sequence

from gpuvm.parsers.nvidia_smi import GpuInstanceProfile
from gpuvm.runbook.guests import MigDevices


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


# (profile, compute slices, memory slices, most per GPU). Sources: NVIDIA's MIG user guide,
# "Supported MIG Profiles" (docs.nvidia.com/datacenter/tesla/mig-user-guide/supported-mig-profiles.html),
# one table per GPU; the counts agree with mig-parted's deployments/systemd/config-default.yaml
# (`all-<profile>` configs); tests/unit/test_mig_profiles.py checks each row against a real `-lgip`.
A100_80GB = _model("A100 80GB", 7, 8, ("1g.10gb", 1, 1, 7), ("1g.10gb+me", 1, 1, 1), ("1g.20gb", 1, 2, 4),
                   ("2g.20gb", 2, 2, 3), ("3g.40gb", 3, 4, 2), ("4g.40gb", 4, 4, 1), ("7g.80gb", 7, 8, 1))
A100_40GB = _model("A100 40GB", 7, 8, ("1g.5gb", 1, 1, 7), ("1g.5gb+me", 1, 1, 1), ("1g.10gb", 1, 2, 4),
                   ("2g.10gb", 2, 2, 3), ("3g.20gb", 3, 4, 2), ("4g.20gb", 4, 4, 1), ("7g.40gb", 7, 8, 1))
H100_80GB = GpuModel("H100 80GB", 7, 8, A100_80GB.profiles)  # the same profiles as the A100 80GB
A30_24GB = _model("A30 24GB", 4, 4, ("1g.6gb", 1, 1, 4), ("1g.6gb+me", 1, 1, 1), ("2g.12gb", 2, 2, 2),
                  ("2g.12gb+me", 2, 2, 1), ("4g.24gb", 4, 4, 1))
# the guide's "H100-SXM5/PCIE 94GB" table; H100 NVL is this GPU
H100_94GB = _model("H100 94GB", 7, 8, ("1g.12gb", 1, 1, 7), ("1g.12gb+me", 1, 1, 1), ("1g.24gb", 1, 2, 4),
                   ("2g.24gb", 2, 2, 3), ("3g.47gb", 3, 4, 2), ("4g.47gb", 4, 4, 1), ("7g.94gb", 7, 8, 1))
# the guide's "H200" table: H200 SXM5 141GB and H200 NVL
H200_141GB = _model("H200 141GB", 7, 8, ("1g.18gb", 1, 1, 7), ("1g.18gb+me", 1, 1, 1), ("1g.35gb", 1, 2, 4),
                    ("2g.35gb", 2, 2, 3), ("3g.71gb", 3, 4, 2), ("4g.71gb", 4, 4, 1), ("7g.141gb", 7, 8, 1))
# the guide's "B200" table (B200 180GB)
B200_180GB = _model("B200 180GB", 7, 8, ("1g.23gb", 1, 1, 7), ("1g.23gb+me", 1, 1, 1), ("1g.45gb", 1, 2, 4),
                    ("2g.45gb", 2, 2, 3), ("3g.90gb", 3, 4, 2), ("4g.90gb", 4, 4, 1), ("7g.180gb", 7, 8, 1))
# the guide's "RTX PRO 6000" table (Server, Workstation and Max-Q editions, 96GB): a quarter of the
# GPU per slice; +gfx adds graphics APIs, +me.all takes every media engine, -me none
RTX_PRO_6000 = _model("RTX PRO 6000 96GB", 4, 4, ("1g.24gb", 1, 1, 4), ("1g.24gb+me", 1, 1, 1),
                      ("1g.24gb+gfx", 1, 1, 4), ("1g.24gb+me.all", 1, 1, 1), ("1g.24gb-me", 1, 1, 4),
                      ("2g.48gb", 2, 2, 2), ("2g.48gb+gfx", 2, 2, 2), ("2g.48gb+me.all", 2, 2, 1),
                      ("2g.48gb-me", 2, 2, 2), ("4g.96gb", 4, 4, 1), ("4g.96gb+gfx", 4, 4, 1))
MODELS = (A100_80GB, A100_40GB, H100_80GB, A30_24GB, H100_94GB, H200_141GB, B200_180GB, RTX_PRO_6000)

# mig-parted's `device-filter` names GPUs by PCI id (`0x20B510DE`: device 20b5, vendor 10de NVIDIA);
# the MIG model each denotes, as mig-parted's config-default.yaml groups them (pci.ids names the
# parts: A100/A800, H100/H800, H100 NVL/H800 NVL, H200 SXM/NVL, B200, RTX PRO 6000 Blackwell
# Server Edition). An id not listed here matches no GPU.
DEVICE_MODELS = {0x20B0: A100_40GB, 0x20B1: A100_40GB, 0x20F1: A100_40GB, 0x20F6: A100_40GB,
                 0x20B2: A100_80GB, 0x20B5: A100_80GB, 0x20F3: A100_80GB, 0x20F5: A100_80GB,
                 0x2330: H100_80GB, 0x2331: H100_80GB, 0x2322: H100_80GB, 0x2324: H100_80GB, 0x20B7: A30_24GB,
                 0x2321: H100_94GB, 0x233A: H100_94GB, 0x2335: H200_141GB, 0x233B: H200_141GB,
                 0x2901: B200_180GB, 0x2BB5: RTX_PRO_6000}


def filtered(device_filter: Sequence[str], gpu_name: str) -> bool:
    """Whether a GPU (by its nvidia-smi name) is one of the models a mig-parted device-filter names."""
    model = gpu_model(gpu_name)
    named = [DEVICE_MODELS.get(int(pci_id[2:6], 16)) for pci_id in device_filter if pci_id[6:].lower() == "10de"]
    return model is not None and any(m is model for m in named)


def _has(word: str, name: str) -> bool:
    return re.search(rf"\b{word}\b", name) is not None  # "H200" is not in "GH200", nor "B200" in "GB200"


def gpu_model(gpu_name: str) -> GpuModel | None:
    """The MIG model of a GPU by its name, as nvidia-smi ("NVIDIA A100 80GB PCIe", "NVIDIA H200 NVL")
    or pci.ids as vCenter ("GH100 [H200 SXM 141GB]") writes it; None: not in the table."""
    name = gpu_name.upper()
    if "A100" in name:
        return A100_80GB if "80GB" in name else A100_40GB
    if _has("H100", name) and ("NVL" in name or "94GB" in name):
        return H100_94GB
    if _has("H100", name) and ("80GB" in name or "PCIE" in name):
        return H100_80GB
    if _has("H200", name):
        return H200_141GB
    if _has("B200", name):
        return B200_180GB
    if "RTX PRO 6000" in name:
        return RTX_PRO_6000
    if "A30" in name:
        return A30_24GB
    return None


_PROFILE_NAME = re.compile(r"^(\d)g\.\d+gb(?:[+-][a-z.]+)?$")


def reported_model(gpu_name: str, rows: Sequence[GpuInstanceProfile]) -> GpuModel:
    """The MIG model a GPU lists (`nvidia-smi mig -lgip` rows of one GPU): a profile's compute slices
    from its name, its memory slices from its share of the whole-GPU profile's memory, its most
    instances from Total. Raises MigLayoutError when the rows do not describe a whole GPU."""
    compute: dict[str, int] = {}
    for row in rows:
        if not (m := _PROFILE_NAME.match(row.profile)):
            raise MigLayoutError(f"profile {row.profile!r} is not a MIG profile name (<N>g.<M>gb)")
        compute[row.profile] = int(m[1])
    if not rows:
        raise MigLayoutError("no MIG profiles listed")
    whole = max(rows, key=lambda r: (compute[r.profile], r.memory_gib))
    slices = compute[whole.profile]
    if whole.memory_gib <= 0 or any(compute[r.profile] * r.total > slices for r in rows):
        raise MigLayoutError(f"no profile spans the whole GPU ({', '.join(r.profile for r in rows)})")
    memory = 8 if slices == 7 else slices  # the guide: 7 compute, 8 memory slices; 4-slice GPUs: 4 and 4
    return GpuModel(gpu_name, slices, memory, {
        r.profile: Profile(r.profile, compute[r.profile], max(1, round(r.memory_gib / whole.memory_gib * memory)), r.total)
        for r in rows})


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


def expand(layout: str | Sequence[MigDevices], gpus: dict[int, str],
           reported: Mapping[int, GpuModel] | None = None) -> dict[int, GpuLayout]:
    """Each named GPU's desired layout; `gpus` maps index → nvidia-smi name, `reported` index → the
    profiles that GPU lists (else the built-in table's, by name). Raises MigLayoutError."""
    models = {index: model_for(name, (reported or {}).get(index)) for index, name in gpus.items()}
    if isinstance(layout, str):
        return {index: _named(layout, index, name, models[index]) for index, name in sorted(gpus.items())}
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
            wanted[index] = (_enabled(entry.mig_devices, index, gpus[index], models[index]) if entry.mig_enabled
                             else GpuLayout(False))
    return wanted


def model_for(gpu_name: str, reported: GpuModel | None) -> GpuModel | None:
    """The profiles the GPU listed, else the table's for its name (None: neither)."""
    return reported or gpu_model(gpu_name)


def _named(layout: str, index: int, gpu_name: str, model: GpuModel | None) -> GpuLayout:
    """all-disabled, all-enabled (no instances, as in mig-parted) or all-<profile> (as many as fit)."""
    if layout == "all-disabled":
        return GpuLayout(False)
    if layout == "all-enabled":
        return _enabled({}, index, gpu_name, model)
    profile = layout.removeprefix("all-")
    known = _known(index, gpu_name, model).profiles.get(profile)
    return _enabled({profile: known.max_count if known else 1}, index, gpu_name, model)


def _known(index: int, gpu_name: str, model: GpuModel | None) -> GpuModel:
    if model is None:
        raise MigLayoutError(f"GPU {index} ({gpu_name}) has no known MIG profiles: `nvidia-smi mig -lgip` lists "
                             f"none, and it is not a GPU of gpuvm's table ({', '.join(m.name for m in MODELS)})")
    return model


def _enabled(counts: dict[str, int], index: int, gpu_name: str, model: GpuModel | None) -> GpuLayout:
    """MIG on with these instances, checked against the GPU model's profiles and slices."""
    model = _known(index, gpu_name, model)
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
