"""slurm.conf, gres.conf and cgroup.conf as gpuvm writes them (pure): from the cluster's desired
state and what each compute guest has (`NodeHardware`).

A node's GRES (`node_gres`): with a MIG layout in the runbook, one type per MIG profile
(`gpu:3g.40gb:2`) from the layout the runbook gives (so a layout change shows in the same plan as
the MIG change), plus whole GPUs for those left without MIG; with a vGPU profile, that profile; else
the GPU model as nvidia-smi names it (`NVIDIA A100 80GB PCIe` → `a100-80gb-pcie`). Debian's Slurm
has no NVML autodetect, so gres.conf names the devices: whole GPUs a `File=` line from the guest's
/dev/nvidia<index> when present; each MIG instance, once the guest has the runbook's layout, a
`MultipleFiles=` line with its GPU's /dev/nvidia<index> and its GPU and compute instances'
/dev/nvidia-caps/nvidia-cap<minor> (Slurm's static MIG configuration). Until then (the plan that
changes the layout, before guest.mig applies it: `awaits_mig`) and for GPUs without device files, a
`Count=`, which slurmd cannot bind: apply renders gres.conf again after guest.mig. Each line with
files gets `Cores=`, Slurm's indices of the cores near its GPU, where the guest knows the GPU's
NUMA node (`observe.gpu_cores`).
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass

from gpuvm.desired.slurm import SlurmCluster
from gpuvm.mig import MigLayoutError, expand
from gpuvm.runbook.guests import MigDevices
from gpuvm.templating import environment

MAX_GRES_TYPE = 40


@dataclass(frozen=True)
class MigInstance:
    """A MIG device (a compute instance) as the guest has it."""

    gpu: int  # its GPU's index
    profile: str  # "3g.40gb"
    files: tuple[str, ...] = ()  # /dev/nvidia<gpu> and its two /dev/nvidia-caps files; () when any is missing


@dataclass(frozen=True)
class NodeHardware:
    """What a compute guest has, as its observe read it."""

    hostname: str  # its short host name (`hostname -s`): slurm.conf's NodeHostname, how slurmd finds its line
    address: str  # how gpuvm reaches it: NodeAddr
    cpus: int
    memory_mb: int  # MemTotal in MiB: at most what slurmd counts, so the node is not drained for it
    gpus: tuple[str, ...] = ()  # nvidia-smi names, by index
    devices: tuple[str, ...] = ()  # /dev/nvidia<N> present
    mig: tuple[MigInstance, ...] = ()  # MIG devices, by GPU
    cores: tuple[str, ...] = ()  # by GPU index: Slurm's core indices near it (`0-15`), "" unknown; (): none known
    threads_per_core: int = 1


@dataclass(frozen=True)
class Gres:
    type: str
    count: int
    files: tuple[str, ...] = ()
    multiple: bool = False  # one MIG instance: `MultipleFiles=` (its files make one device), else `File=`
    cores: str = ""  # gres.conf `Cores=`: the cores near the GPU(s), when known


@dataclass(frozen=True)
class NodeLine:
    name: str  # the Slurm node name: the guest's VM name, as srun --nodelist names it (gpuvm.bench.slurm)
    hostname: str
    address: str
    cpus: int
    memory_mb: int
    gres: tuple[Gres, ...]
    threads_per_core: int = 1

    @property
    def gres_field(self) -> str:
        """slurm.conf's Gres= value: `gpu:a100-80gb-pcie:4,gpu:3g.40gb:2`."""
        counts: Counter[str] = Counter()
        for g in self.gres:
            counts[g.type] += g.count
        return ",".join(f"gpu:{type_}:{count}" for type_, count in counts.items())


@dataclass(frozen=True)
class PartitionLine:
    name: str
    nodes: tuple[str, ...]
    default: bool
    max_time: str


@dataclass(frozen=True)
class SlurmFiles:
    slurm_conf: str
    gres_conf: str
    cgroup_conf: str

    def by_path(self) -> dict[str, str]:
        return {"/etc/slurm/slurm.conf": self.slurm_conf, "/etc/slurm/gres.conf": self.gres_conf,
                "/etc/slurm/cgroup.conf": self.cgroup_conf}


def gres_type(gpu_name: str) -> str:
    """A GRES type from an nvidia-smi GPU name: `NVIDIA A100 80GB PCIe` → `a100-80gb-pcie`."""
    name = re.sub(r"^nvidia[\s-]+", "", gpu_name.strip(), flags=re.IGNORECASE).lower()
    return re.sub(r"[^a-z0-9.]+", "-", name).strip("-")[:MAX_GRES_TYPE] or "gpu"


def _mig_wanted(hardware: NodeHardware, mig: str | tuple[MigDevices, ...] | None) -> dict[int, Counter[str]]:
    """GPU index → the MIG profiles the runbook gives it, for the GPUs it wants with MIG enabled."""
    layouts = expand(mig, dict(enumerate(hardware.gpus))) if mig is not None else {}
    return {index: Counter(layout.profiles) for index, layout in layouts.items() if layout.enabled}


def _mig_present(hardware: NodeHardware, gpus: dict[int, Counter[str]]) -> bool:
    """Whether the guest's MIG devices on `gpus` are exactly the runbook's."""
    return all(Counter(m.profile for m in hardware.mig if m.gpu == i) == profiles for i, profiles in gpus.items())


def awaits_mig(hardware: NodeHardware, mig: str | tuple[MigDevices, ...] | None, vgpu_profile: str | None) -> bool:
    """Whether the guest's MIG devices are not yet the runbook's layout (guest.mig makes them):
    its gres.conf lines are known only after guest.mig ran."""
    return bool(hardware.gpus) and vgpu_profile is None and not _mig_present(hardware, _mig_wanted(hardware, mig))


def node_gres(hardware: NodeHardware, mig: str | tuple[MigDevices, ...] | None,
              vgpu_profile: str | None) -> tuple[Gres, ...]:
    """The node's GRES as the runbook implies them (see the module docstring). MigLayoutError for a
    layout that does not fit the GPUs (guest.mig says so too)."""
    gpus = dict(enumerate(hardware.gpus))
    if not gpus:
        return ()
    if vgpu_profile is not None:
        return (Gres(vgpu_profile, len(gpus)),)
    wanted = _mig_wanted(hardware, mig)
    cores = dict(enumerate(hardware.cores))
    files = all(f"/dev/nvidia{i}" in hardware.devices for i in gpus if i not in wanted)
    whole: dict[tuple[str, str], list[int]] = {}  # GPUs of a model near the same cores: one line
    for index, name in gpus.items():
        if index not in wanted:
            whole.setdefault((gres_type(name), cores.get(index, "") if files else ""), []).append(index)
    gres = [Gres(type_, len(indices), tuple(f"/dev/nvidia{i}" for i in indices) if files else (), cores=near)
            for (type_, near), indices in whole.items()]
    instances = [m for m in hardware.mig if m.gpu in wanted]
    if _mig_present(hardware, wanted) and all(m.files for m in instances):
        return (*gres, *(Gres(m.profile, 1, m.files, multiple=True, cores=cores.get(m.gpu, "")) for m in instances))
    counts: Counter[str] = Counter()
    for profiles in wanted.values():
        counts.update(profiles)
    return (*gres, *(Gres(profile, count) for profile, count in counts.items()))


def render(cluster: SlurmCluster, controller: NodeHardware, nodes: dict[str, tuple[NodeHardware, tuple[Gres, ...]]]
           ) -> SlurmFiles:
    """The three files, the same on every node. `nodes`: each compute guest (VM name) → its hardware
    and GRES, in the cluster's order."""
    env = environment("slurm", trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True)
    lines = [NodeLine(name, h.hostname, h.address, h.cpus, h.memory_mb, gres, h.threads_per_core)
             for name, (h, gres) in nodes.items()]
    partitions = [PartitionLine(p.name, tuple(n for n in p.nodes if n in nodes), p.default, p.max_time)
                  for p in cluster.partitions]
    partitions = [p for p in partitions if p.nodes]  # a partition whose guests were all not observed
    values = {"cluster": cluster, "controller": controller, "nodes": lines, "partitions": partitions,
              "cgroup": cluster.cgroup}
    return SlurmFiles(*(env.get_template(f"{name}.j2").render(**values)
                        for name in ("slurm.conf", "gres.conf", "cgroup.conf")))


__all__ = ["Gres", "MigInstance", "MigLayoutError", "NodeHardware", "SlurmFiles", "awaits_mig", "gres_type", "node_gres",
           "render"]
