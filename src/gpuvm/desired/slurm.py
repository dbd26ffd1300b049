"""The desired state of Slurm on a guest (guest.slurm): the cluster every node shares, and this
guest's part in it. Made from the runbook's `slurm:` section by `resolve_ssh`."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Partition:
    name: str
    nodes: tuple[str, ...]  # guests (VM names)
    default: bool
    max_time: str = "INFINITE"


@dataclass(frozen=True)
class CgroupConstraints:
    cores: bool = True
    devices: bool = True
    ram_space: bool = True


@dataclass(frozen=True)
class SlurmCluster:
    """What every node of the cluster shares: the same on each guest's `SlurmNode`."""

    name: str  # ClusterName
    controller: str  # the guest (VM name) that runs slurmctld
    compute: tuple[str, ...]  # the guests (VM names) that run slurmd, in the runbook's order
    partitions: tuple[Partition, ...]
    mpi_default: str = "pmi2"  # pmix | pmi2 | none
    cgroup: CgroupConstraints | None = CgroupConstraints()  # None: no cgroup plugins
    extra: tuple[str, ...] = ()  # more slurm.conf lines


@dataclass(frozen=True)
class SlurmNode:
    """A guest's part in the cluster."""

    cluster: SlurmCluster
    gres_type: str | None = None  # its GPUs' GRES type when the runbook knows it (a vGPU profile); None: observed

    def controller_of(self, name: str) -> bool:
        return self.cluster.controller == name

    def compute_of(self, name: str) -> bool:
        return name in self.cluster.compute
