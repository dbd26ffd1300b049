"""The plan of a benchmark campaign (pure: reads only the runbook).

`plan_campaign` expands the `benchmarks` runs into the points to measure: a scaling run gives one
point per node count (one job over the first N guests), a concurrent run one point per group (one
job per VM, all at once). Each job carries its rendered command line and hostfile; `uploads` lists
the files to copy first (`dry_run.describe` words it all for `--dry-run`).

A campaign with `setups` is a list of stages (`plan_stages`): each setup's runbook (runbook/setups.py)
and the points measured on it. A point's network settings (bench/network.py) come from the port
maps read on its guests when its stage starts; `plan_campaign` without them renders none.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from gpuvm.bench.commands import (
    BUNDLED,
    Shell,
    bundled_program,
    container_name,
    docker_command,
    launcher_command,
    program_context,
    render_user_command,
    render_words,
)
from gpuvm.errors import InputError
from gpuvm.bench.network import PortMaps, derive, per_guest, script_name
from gpuvm.bench.batch import batch_script, submit_command
from gpuvm.bench.slurm import node_name, submit_guest
from gpuvm.runbook.benchmarks import (
    BenchmarkRun,
    BenchmarkSpec,
    check_benchmarks,
    concurrent_groups,
    gpus_per_vm,
    guests_in_order,
    upload_source,
)
from gpuvm.runbook.guests import Guest
from gpuvm.runbook.model import Runbook

LOCAL = "local"  # the executor name of this machine (--local)


@dataclass(frozen=True)
class Job:
    """One mpirun (or docker run) started on `launcher`; for concurrent points, one per VM."""

    launcher: str  # guest VM name, or LOCAL
    hosts: tuple[tuple[str, int], ...]  # hostfile lines: address, slots
    hostfile: str  # path relative to the workdir
    np: int
    batch_size: int  # per GPU
    command: Shell
    vm: str | None = None  # concurrent: the VM this job's figure belongs to
    container: str | None = None  # docker container name, when containerised
    network_script: str | None = None  # the per-guest wrapper its ranks start through (bench/network.py)
    nodes: tuple[str, ...] = ()  # launch srun, sbatch: the Slurm nodes it runs on (the launcher submits it)
    batch: str | None = None  # launch sbatch: the batch script (`command`, sbatch, reads it on its stdin)


@dataclass(frozen=True)
class PlannedPoint:
    run: BenchmarkRun
    index: int  # the run's position in benchmarks.runs
    label: str  # directory name: nodes-2, group-1-vm1+vm2
    nodes: int
    gpus_per_node: int
    vms: int
    jobs: tuple[Job, ...]
    guests: tuple[str, ...]  # every guest taking part (uploads go to each)
    setup: str | None = None  # the campaign's setup it is measured in
    mapping: str | None = None  # "on" / "off" when the run measures both (network_mapping)
    network: tuple[tuple[str, str], ...] = ()  # the derived network settings its jobs use (all guests' ports)
    guest_network: tuple[tuple[str, tuple[tuple[str, str], ...]], ...] = ()  # each guest's own, when any
    data: str | None = None  # "files" / "synthetic" when the run compares both (compare_synthetic)

    @property
    def concurrent(self) -> bool:
        return self.run.scenario == "concurrent"


@dataclass(frozen=True)
class Upload:
    target: str  # guest VM name or LOCAL
    source: Path
    destination: str  # absolute, or relative to the workdir
    mode: int


def select_runs(spec: BenchmarkSpec, only: Sequence[str] = ()) -> list[tuple[int, BenchmarkRun]]:
    names = [r.name for r in spec.runs]
    unknown = [n for n in only if n not in names]
    if unknown:
        raise InputError(f"--only {', '.join(unknown)}: no such benchmark (the runbook has: {', '.join(names)})")
    return [(i, r) for i, r in enumerate(spec.runs) if not only or r.name in only]


@dataclass(frozen=True)
class Stage:
    """One layout of a campaign: the runbook itself, or a setup's runbook, and its runs."""

    setup: str | None
    runbook: Runbook
    only: tuple[str, ...]  # the runs measured in it (all, when empty)


def plan_stages(runbook: Runbook, *, local: bool = False, only: Sequence[str] = (),
                setups: Sequence[str] = ()) -> list[Stage]:
    """The campaign's stages: one per setup (those named in `setups`, default all), else the
    runbook. `--local` ignores setups (a bare-metal baseline has no VMs). Checked: nothing runs."""
    spec = check_benchmarks(runbook, local=local)
    select_runs(spec, only)
    if local or not spec.setups:
        if setups:
            raise InputError(f"--setup {', '.join(setups)}: " + ("--local runs have no setups" if local else
                             "the runbook has no benchmarks.setups"))
        return [Stage(None, runbook, tuple(only))]
    from gpuvm.runbook.setups import setup_runbooks

    known = [s.name for s in spec.setups]
    unknown = [name for name in setups if name not in known]
    if unknown:
        raise InputError(f"--setup {', '.join(unknown)}: no such setup (the runbook has: {', '.join(known)})")
    stages = []
    for setup, book in setup_runbooks(runbook):
        if setups and setup.name not in setups:
            continue
        names = [r.name for r in book.benchmarks.runs]  # type: ignore[union-attr]
        mine = tuple(n for n in only if n in names)
        if not only or mine:
            stages.append(Stage(setup.name, book, mine))
    return stages


def plan_campaign(runbook: Runbook, *, local: bool = False, only: Sequence[str] = (),
                  local_root: bool | None = None, setup: str | None = None,
                  ports: PortMaps | None = None) -> list[PlannedPoint]:
    """Every point to measure, with its rendered commands. Pure: reads only the runbook (and the
    guests' port maps, when given, for the network settings)."""
    spec = check_benchmarks(runbook, local=local)
    if local_root is None:
        local_root = os.geteuid() == 0
    points: list[PlannedPoint] = []
    for index, run in select_runs(spec, only):
        if run.scenario == "scaling":
            points.extend(_scaling_points(runbook, spec, index, run, local, local_root, ports))
        else:
            points.extend(_concurrent_points(runbook, spec, index, run, ports))
    return [replace(p, setup=setup) for p in points] if setup else points


Network = tuple[tuple[str, str], ...]


def _network(run: BenchmarkRun, guests: Sequence[Guest], mapping: str | None,
             ports: PortMaps | None) -> tuple[dict[str, str], tuple[tuple[str, Network], ...]]:
    """The network settings of a point: those of all its guests' ports (recorded with its results)
    and each guest's own (what its ranks get); none when the point is "mapping off"."""
    if mapping == "off" or ports is None:
        return {}, ()
    found = derive(guests, ports)
    mine = per_guest(run, guests, ports)
    if not any(mine.values()):
        return {}, ()
    return (found.settings(run) if found else {}), tuple((vm, tuple(s.items())) for vm, s in mine.items())


def _variants(run: BenchmarkRun, local: bool) -> list[tuple[str | None, str | None, str]]:
    """(network mapping, data, label suffix) of each point measured at one node count or group."""
    mappings = [None] if local or not run.network_mapping else list(run.network_mapping)
    sources = ["files", "synthetic"] if run.compare_synthetic else [None]
    return [(mapping, data, (f"-mapping-{mapping}" if mapping else "") + (f"-{data}" if data else ""))
            for mapping in mappings for data in sources]


def taking_part(points: Sequence[PlannedPoint]) -> set[str]:
    """Every guest the points use: participants and launchers."""
    return {g for p in points for g in p.guests} | {j.launcher for p in points for j in p.jobs}


def _scaling_points(runbook: Runbook, spec: BenchmarkSpec, index: int, run: BenchmarkRun, local: bool,
                    local_root: bool, ports: PortMaps | None) -> list[PlannedPoint]:
    ordered = [] if local else guests_in_order(runbook, spec.launcher)
    points = []
    for nodes in run.node_counts:
        chosen: list[Guest] = []
        if local:
            per_vm = run.gpus_per_vm or 1
            hosts: tuple[tuple[str, int], ...] = (("localhost", nodes * per_vm),)
            launcher, root, guests = LOCAL, local_root, ()
        else:
            chosen = ordered[:nodes]
            per_vm = gpus_per_vm(run, chosen, runbook, ("benchmarks", "runs", index))
            launcher, root = chosen[0].vm, chosen[0].ssh.user == "root"
            if run.through_slurm:  # Slurm ranks the nodes in slurm.conf's order: the runbook's
                chosen.sort(key=runbook.guests.hosts.index)  # type: ignore[union-attr]
                launcher = submit_guest(runbook)
            hosts = tuple((g.ssh.address, per_vm) for g in chosen)
            guests = tuple(g.vm for g in chosen)
        for mapping, data, suffix in _variants(run, local):
            label = f"nodes-{nodes}{suffix}"
            network, own = _network(run, chosen, mapping, ports)
            job = _job(runbook, spec, index, run, label, launcher, hosts, nodes, per_vm, root, local,
                       wrapped=bool(own), data=data)
            points.append(PlannedPoint(run, index, label, nodes, per_vm, nodes, (job,), guests, mapping=mapping,
                                       network=tuple(network.items()), guest_network=own, data=data))
    return points


def _concurrent_points(runbook: Runbook, spec: BenchmarkSpec, index: int, run: BenchmarkRun,
                       ports: PortMaps | None) -> list[PlannedPoint]:
    guests = {g.vm: g for g in runbook.guests.hosts} if runbook.guests else {}
    vm_hosts = {vm.name: vm.host for vm in runbook.vms}
    points, keys = [], {}
    for j, group in enumerate(concurrent_groups(runbook, run), 1):
        members = [guests[name] for name in group]
        per_vm = gpus_per_vm(run, members, runbook, ("benchmarks", "runs", index))
        nodes = len({vm_hosts.get(g.vm, g.vm) for g in members})
        total = per_vm * len(members)
        if total % nodes:
            raise runbook.error(("benchmarks", "runs", index, "groups", j - 1),
                                f"{total} GPUs do not spread evenly over {nodes} ESXi hosts")
        key = (nodes, total // nodes, len(members))
        if key in keys:
            raise runbook.error(("benchmarks", "runs", index, "groups", j - 1),
                                f"same configuration as group {keys[key]} ({len(members)} VM(s) × {per_vm} GPU(s) "
                                f"on {nodes} host(s)); results could not tell them apart")
        keys[key] = j
        for mapping, data, suffix in _variants(run, False):
            label = f"group-{j}-" + "+".join(group) + suffix
            network, own = _network(run, members, mapping, ports)
            jobs = tuple(
                _job(runbook, spec, index, run, label, *_alone(runbook, run, g, per_vm), 1, per_vm,
                     g.ssh.user == "root", False, vm=g.vm, wrapped=bool(own), data=data)
                for g in members
            )
            points.append(PlannedPoint(run, index, label, nodes, total // nodes, len(members), jobs, tuple(group),
                                       mapping=mapping, network=tuple(network.items()), guest_network=own,
                                       data=data))
    return points


def _alone(runbook: Runbook, run: BenchmarkRun, guest: Guest, per_vm: int) -> tuple[str, tuple[tuple[str, int], ...]]:
    """A concurrent point's job on one guest: its launcher and hosts (Slurm: the submit guest, the node)."""
    if run.through_slurm:
        return submit_guest(runbook), ((guest.ssh.address, per_vm),)
    return guest.vm, (("localhost", per_vm),)


def _job(runbook: Runbook, spec: BenchmarkSpec, index: int, run: BenchmarkRun, label: str, launcher: str,
         hosts: tuple[tuple[str, int], ...], nodes: int, per_vm: int, root: bool, local: bool,
         vm: str | None = None, wrapped: bool = False, data: str | None = None) -> Job:
    np = sum(slots for _, slots in hosts)
    if data == "synthetic":  # compare_synthetic's other half: the same run on synthetic tensors
        run = run.model_copy(update={"data": "synthetic"})
    batch_size = run.per_gpu_batch(np if run.scenario == "scaling" else per_vm)
    hostfile = f"hostfile-{run.name}-{label}"
    container = spec.container and not local
    context = program_context(run, np=np, nodes=nodes, per_vm=per_vm, batch=batch_size, hostfile=hostfile,
                              local=local, guest=launcher)
    if run.command is not None:
        program = render_user_command(runbook, index, run.command, context)
    else:
        program = render_words(f"{run.kind}.j2", **context)
    image = runbook.guests.image if runbook.guests else None
    rsh_port = container_sshd_port(runbook) if container else None
    wrapper = script_name(run.name, label) if wrapped else None
    nodes = _slurm_nodes(runbook, hosts) if run.through_slurm else ()
    gpus = per_vm if _have_gpus(runbook, nodes) else None
    command = launcher_command(run, np=np, hosts=hosts, hostfile=hostfile, allow_run_as_root=root or container,
                               rsh_port=rsh_port, program=program, wrapper=wrapper, nodes=nodes, gpus_per_node=gpus)
    batch = None
    if run.launch == "sbatch":  # the srun line goes into the batch script
        batch, command = batch_script(run, nodes, hosts[0][1], gpus, command), submit_command(run)
    name = None
    if container and image is not None:
        name = container_name(run.name, label)
        command = docker_command(name, image, spec.docker_args, inner=command, rdma=has_rdma(runbook, launcher))
    return Job(launcher, hosts, hostfile, np, batch_size, command, vm=vm, container=name, network_script=wrapper,
               nodes=nodes, batch=batch)


def _slurm_nodes(runbook: Runbook, hosts: Sequence[tuple[str, int]]) -> tuple[str, ...]:
    by_address = {g.ssh.address: g for g in runbook.guests.hosts} if runbook.guests else {}
    return tuple(node_name(by_address[address]) for address, _ in hosts)


def _have_gpus(runbook: Runbook, nodes: Sequence[str]) -> bool:
    """Whether srun asks for GPUs (--gpus-per-node): when the nodes' VMs have GPUs in the runbook
    (Slurm then counts them as GRES); guests without any run their ranks on CPUs."""
    vms = {vm.name: vm for vm in runbook.vms}
    return bool(nodes) and all(name in vms and vms[name].gpus is not None for name in nodes)


def container_sshd_port(runbook: Runbook) -> int | None:
    """The port of the worker containers' sshd (what mpirun's ssh uses between containers)."""
    if runbook.guests is None:
        return None
    mesh, image = runbook.guests.ssh_mesh, runbook.guests.image
    return (mesh.container_port if mesh else None) or (image.sshd_port if image else None)


def has_rdma(runbook: Runbook, vm: str) -> bool:
    """Whether the guest has RDMA ports (its containers then get /dev/infiniband)."""
    guest = next((g for g in runbook.guests.hosts if g.vm == vm), None) if runbook.guests else None
    return bool(guest and guest.rdma_ports)


def uploads(runbook: Runbook, points: Sequence[PlannedPoint], local: bool) -> list[Upload]:
    """Files to copy before the campaign: each run's `upload` (and on guests the workload shipped
    with gpuvm that it runs) to every guest the run uses, once each."""
    seen: dict[tuple[str, str], Upload] = {}
    for point in points:
        targets = (LOCAL,) if local else point.guests
        files = [(upload_source(runbook, src), dst) for src, dst in point.run.upload.items()]
        bundled = bundled_program(point.run) or (BUNDLED["pytorch_train"] if point.run.dataset else None)
        if not local and bundled is not None:  # a dataset is written by the training workload
            files.append((bundled, bundled.name))
        for source, destination in files:
            mode = 0o755 if os.access(source, os.X_OK) else 0o644
            for target in targets:
                seen.setdefault((target, destination), Upload(target, source, destination, mode))
    return list(seen.values())

