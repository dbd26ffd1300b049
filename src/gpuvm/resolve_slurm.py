"""From the runbook's `slurm:` section to each guest's `SlurmNode` (desired/slurm.py), and to the
`SlurmNodes` host.reboot drains before it reboots a host (desired/slurm_nodes.py)."""

from __future__ import annotations

from gpuvm.desired.slurm import CgroupConstraints, Partition, SlurmCluster, SlurmNode
from gpuvm.desired.slurm_nodes import SlurmNodes
from gpuvm.runbook.model import Runbook
from gpuvm.runbook.vms import VgpuGpus
from gpuvm.runbook.slurm import Slurm


def slurm_node(runbook: Runbook, guest: str) -> SlurmNode | None:
    """The guest's part in the runbook's Slurm cluster; None without `slurm:` or for a guest that is
    neither its controller nor a compute node."""
    if runbook.slurm is None or runbook.guests is None:
        return None
    cluster = _cluster(runbook.slurm, tuple(g.vm for g in runbook.guests.hosts))
    if guest != cluster.controller and guest not in cluster.compute:
        return None
    vm = next((v for v in runbook.vms if v.name == guest), None)
    gres_type = vm.gpus.profile if vm is not None and isinstance(vm.gpus, VgpuGpus) else None
    return SlurmNode(cluster, gres_type)


def _cluster(slurm: Slurm, guests: tuple[str, ...]) -> SlurmCluster:
    compute = tuple(slurm.compute) if slurm.compute is not None else guests
    cgroup = slurm.cgroup
    return SlurmCluster(
        slurm.cluster_name, slurm.controller, compute,
        tuple(Partition(p.name, compute if p.nodes == "all" else tuple(p.nodes), p.name == slurm.default_partition,
                        p.max_time) for p in slurm.partitions),
        slurm.mpi_default,
        CgroupConstraints(cgroup.constrain_cores, cgroup.constrain_devices, cgroup.constrain_ram_space) if cgroup else None,
        tuple(slurm.extra))


def slurm_nodes(runbook: Runbook) -> SlurmNodes | None:
    """Where host.reboot asks Slurm about a host's VMs' nodes; None: the runbook has no Slurm cluster."""
    if runbook.slurm is None or runbook.guests is None:
        return None
    cluster = _cluster(runbook.slurm, tuple(g.vm for g in runbook.guests.hosts))
    return SlurmNodes(cluster.controller, cluster.compute)
