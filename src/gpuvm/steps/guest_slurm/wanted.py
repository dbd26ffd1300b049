"""The controller's files as the cluster needs them: every compute guest's hardware read (in
parallel), its GRES from the runbook's MIG layout or vGPU profile. Observe renders them for the
plan; apply renders them again when a guest's MIG devices were yet to be made (`awaiting_mig`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from gpuvm.desired.ssh import DesiredGuest
from gpuvm.executors.group import run_group
from gpuvm.mig import MigLayoutError
from gpuvm.remote import Cluster, run
from gpuvm.steps.guest_slurm.actions import slurm_node
from gpuvm.steps.guest_slurm.observe import GuestSlurm, parse, script
from gpuvm.steps.guest_slurm.render import NodeHardware, NodeLine, awaits_mig, node_gres, render


def read(target: DesiredGuest, cluster: Cluster, controller: bool) -> GuestSlurm:
    result = run(target, cluster, ["sh", "-c", script(controller)], sudo=target.root)
    return parse(result.stdout, target.login.address, controller)


@dataclass(frozen=True)
class WantedFiles:
    files: dict[str, str] = field(default_factory=dict)  # path → wanted content
    gres: dict[str, str] = field(default_factory=dict)  # node (VM name) → wanted Gres=
    unread: dict[str, str] = field(default_factory=dict)  # compute guests not read → why (no files planned then)
    problem: str | None = None  # why the files cannot be rendered (a MIG layout that does not fit)
    awaiting_mig: tuple[str, ...] = ()  # nodes whose MIG devices are not the runbook's yet (gres.conf: Count=)


def wanted_files(cluster: Cluster, target: DesiredGuest, own: NodeHardware) -> WantedFiles:
    """The files for the cluster whose controller is `target` (its hardware `own`)."""
    slurm = slurm_node(target).cluster
    others = {n: cluster.targets[n] for n in slurm.compute if n != target.name and n in cluster.targets}
    missing = [n for n in slurm.compute if n != target.name and n not in cluster.targets]
    read_ = run_group(others, lambda t: read(t, cluster, False).hardware, max(1, min(32, len(others))), name="slurm")
    hardware = {**read_.ok, **({target.name: own} if target.name in slurm.compute else {})}
    unread = {**{n: "its VM's vCenter was not reached" for n in missing}, **{n: str(e) for n, e in read_.failed.items()}}
    nodes: dict[str, tuple[NodeHardware, tuple]] = {}
    awaiting = []
    for name in (n for n in slurm.compute if n in hardware):
        guest = cluster.targets[name]
        vgpu = guest.slurm.gres_type if guest.slurm else None
        try:
            nodes[name] = (hardware[name], node_gres(hardware[name], guest.mig, vgpu))
        except MigLayoutError as e:
            return WantedFiles(problem=f"guest {name}'s MIG layout: {e}")
        if awaits_mig(hardware[name], guest.mig, vgpu):
            awaiting.append(name)
    gres = {name: NodeLine(name, h.hostname, h.address, h.cpus, h.memory_mb, g).gres_field
            for name, (h, g) in nodes.items()}
    if unread:  # rendered without them, the files would drop their nodes (and restart slurmctld): not planned
        return WantedFiles(gres=gres, unread=dict(sorted(unread.items())))
    return WantedFiles(render(slurm, own, nodes).by_path(), gres, awaiting_mig=tuple(awaiting))
