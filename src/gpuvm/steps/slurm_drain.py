"""Host reboots that drain, not kill: before `host.reboot` stops the VMs of a host, the Slurm nodes of
their guests are drained and the reboot waits for their jobs to end; once the host and its VMs are
back, the nodes are resumed (issue 36).

Slurm is asked on the runbook's controller guest (`slurm: {controller: …}`), over its SSH:
`scontrol show node -o` for the nodes' states, `squeue -w <nodes>` for the jobs on them, and
`scontrol update` (as root) to drain and resume. A compute guest's node is named after its VM, as
guest.slurm names it. The plan
shows the drain as a change of the host, with the jobs running then; `apply` refuses up front a
reboot of a host whose nodes run jobs unless --drain-timeout lets it wait for them
(`refusals`). A job still running when the bound is reached fails the host: its nodes are resumed
and the host is not touched.

Intent before act: the nodes gpuvm is about to drain are recorded on the host ("drain", with the
controller) before `scontrol update state=DRAIN`, with the reason "gpuvm: reboot of <host> (run …)";
the record is cleared once they are resumed. A run killed in between leaves it: the next run
drains them again and finishes the reboot, or, if the reboot is no longer planned, resumes them.
A node drained (or down) by someone else before gpuvm came is not gpuvm's: never recorded, never
resumed; a recorded node is resumed only while its reason is still gpuvm's for this host.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpuvm.errors import GpuvmError, TaskError, listed
from gpuvm.executors.base import UNDER_WAY
from gpuvm.parsers import squeue
from gpuvm.parsers.scontrol import SlurmNodeState, parse_nodes
from gpuvm.parsers.squeue import JOB_FORMAT, Job
from gpuvm.plan import Change, Disruption
from gpuvm.remote import run
from gpuvm.steps.base import Context
from gpuvm.vsphere.intent import Intent

ACT = "drain"  # the intent act on the host
FLAG = "--drain-timeout"
POLL_S = 5.0  # between two looks at the jobs still running on drained nodes


def reason_prefix(host: str) -> str:
    """The start of the reason gpuvm drains a node with for a reboot of `host` (any run's)."""
    return f"gpuvm: reboot of {host} (run "


@dataclass(frozen=True)
class DrainFact:
    """The Slurm side of a host's VMs: their nodes' states and the jobs on them (`problem`: Slurm not read)."""

    nodes: dict[str, SlurmNodeState] = field(default_factory=dict)  # the host's VMs' nodes Slurm knows
    jobs: list[Job] = field(default_factory=list)
    problem: str = ""
    controller: str = ""
    names: tuple[str, ...] = ()  # the host's VMs' node names, known to Slurm or not (not read: `problem`)


@dataclass(frozen=True)
class DrainNodes:
    """Before the host's reboot: drain its VMs' nodes, wait for their jobs (seen when planned: `jobs`)."""

    controller: str
    nodes: tuple[str, ...]
    jobs: tuple[str, ...] = ()  # shown: "12 (alice: train)"


@dataclass(frozen=True)
class ResumeNodes:
    """An interrupted run drained these nodes for a reboot that is no longer planned: resume them."""

    controller: str
    nodes: tuple[str, ...]


def _slurm(ctx: Context, controller: str, argv: list[str], root: bool = False) -> Any:
    """Run a Slurm command on the controller guest; `root`: as root (`scontrol update` is Slurm's
    operators' only: Invalid user id otherwise), through sudo unless gpuvm logs in as root."""
    if ctx.cluster is None or controller not in ctx.cluster.executors:
        raise TaskError(f"Slurm controller guest {controller} is not reachable over SSH")
    target = ctx.cluster.targets[controller]
    return run(target, ctx.cluster, argv, sudo=target.root if root else None)


def read_nodes(ctx: Context, controller: str) -> dict[str, SlurmNodeState]:
    return {n.name: n for n in parse_nodes(_slurm(ctx, controller, ["scontrol", "show", "node", "-o"]).stdout)}


def taken(node: SlurmNodeState) -> bool:
    """Drained, draining, or out of service (down, failed): set so by someone, no job starts on it."""
    return bool(set(node.state.rstrip("*").split("+")) & {"DRAIN", "DRAINED", "DRAINING", "DOWN", "FAIL", "FAILING"})


def read_jobs(ctx: Context, controller: str, nodes: list[str]) -> list[Job]:
    """The jobs on `nodes` (names Slurm knows: squeue refuses others)."""
    if not nodes:
        return []
    return squeue.jobs(_slurm(ctx, controller, ["squeue", "-h", "-w", ",".join(nodes), "-o", JOB_FORMAT]).stdout)


def observe(ctx: Context, vms: list[str]) -> DrainFact | None:
    """The states of the nodes of `vms` and the jobs on them; None: the runbook has no Slurm cluster."""
    if ctx.slurm is None:
        return None
    wanted, controller = ctx.slurm.of(vms), ctx.slurm.controller
    if not wanted:
        return DrainFact(controller=controller)
    try:
        nodes = {n: s for n, s in read_nodes(ctx, controller).items() if n in wanted}
        return DrainFact(nodes, read_jobs(ctx, controller, sorted(nodes)), controller=controller, names=tuple(sorted(wanted)))
    except GpuvmError as error:  # apply drains them all the same, or fails the host untouched
        return DrainFact(problem=str(error), controller=controller, names=tuple(sorted(wanted)))


def plan(host: str, fact: DrainFact | None, rebooting: bool, recorded: Intent | None) -> list[Change]:
    """The drain of the host's nodes before its reboot; the resume an interrupted run owes the nodes it
    drained, unless this drain takes them over (drained again, their record renewed)."""
    changes = []
    if rebooting and fact is not None and (fact.nodes or fact.problem):
        states = ", ".join(f"{n} {s.state.lower()}" for n, s in sorted(fact.nodes.items()))
        jobs = tuple(j.shown() for j in fact.jobs)
        before = fact.problem and f"not read ({fact.problem})" or states + (f"; job(s) {', '.join(jobs)} running"
                                                                          if jobs else "")
        others = sorted(n for n, s in fact.nodes.items() if taken(s) and not _ours(host, s))
        after = "drained for the reboot, resumed after it" + (f" ({', '.join(others)}: left as found)" if others else "")
        changes.append(Change("host.reboot", host, "slurm nodes", "state", before, after, Disruption.NONE,
                              DrainNodes(fact.controller, fact.names, jobs)))
    if recorded is not None and not (changes and set(recorded.data["nodes"]) <= set(fact.nodes if fact else ())):
        nodes = tuple(recorded.data["nodes"])
        changes.append(Change("host.reboot", host, "slurm nodes (interrupted drain)", "state",
                              f"{', '.join(nodes)} drained by interrupted run {recorded.run}",
                              "resumed, record cleared", Disruption.NONE, ResumeNodes(recorded.data["controller"], nodes)))
    return changes


def _ours(host: str, node: SlurmNodeState) -> bool:
    return taken(node) and node.reason.startswith(reason_prefix(host))


def refusals(changes: list[Change], timeout: float | None) -> list[str]:
    """What `apply` refuses without --drain-timeout: hosts to reboot while jobs run on their nodes."""
    if timeout is not None:
        return []
    return [f"host {c.target} must reboot while Slurm job(s) {', '.join(c.action.jobs)} run on its nodes "
            f"{', '.join(c.action.nodes)}: pass {FLAG} SECONDS to drain them and wait for the jobs to end"
            for c in changes if isinstance(c.action, DrainNodes) and c.action.jobs]


def drain(ctx: Context, host: str, action: DrainNodes, record: Callable[[list[str]], None],
          clear: Callable[[], None]) -> list[str]:
    """Drain the nodes (those someone else drained stay theirs), recorded first with `record(nodes)`,
    then wait for every job on them, at most --drain-timeout seconds (none: not at all); the nodes
    gpuvm drained. Past the bound they are resumed (`clear`: the record) and the host fails, untouched."""
    states = read_nodes(ctx, action.controller)
    present = [n for n in action.nodes if n in states]
    ours = [n for n in present if not taken(states[n]) or _ours(host, states[n])]
    if ours:
        record(ours)
        why = f"gpuvm: reboot of {host} (run {ctx.intents.run if ctx.intents is not None else '?'})"
        _slurm(ctx, action.controller, ["scontrol", "update", f"nodename={','.join(ours)}", "state=DRAIN",
                                        f"reason={why}"], root=True)
    try:
        _wait_for_jobs(ctx, host, action.controller, present)
    except Exception:
        resume(ctx, host, action.controller, ours, clear)
        raise
    return ours


def _wait_for_jobs(ctx: Context, host: str, controller: str, nodes: list[str]) -> None:
    timeout = ctx.options.drain_timeout or 0.0
    deadline = time.monotonic() + timeout
    while running := read_jobs(ctx, controller, nodes):
        if time.monotonic() >= deadline:
            waited = f"after {timeout:.0f} s of drain" if timeout else f"(started since the plan; {FLAG} waits)"
            raise TaskError(f"Slurm job(s) {', '.join(j.shown() for j in running)} still running on "
                            f"{listed(nodes)} {waited}: host {host} not rebooted, its nodes resumed")
        if UNDER_WAY.interrupted.wait(min(POLL_S, max(0.0, deadline - time.monotonic()))):
            raise TaskError(f"gpuvm was interrupted while waiting for the Slurm jobs on {listed(nodes)}")


def resume(ctx: Context, host: str, controller: str, nodes: Sequence[str], clear: Callable[[], None]) -> None:
    """Resume the recorded nodes still drained with gpuvm's reason for this host (one drained by
    someone else since keeps their drain), then clear the record."""
    if not nodes:
        return
    states = read_nodes(ctx, controller)
    if mine := [n for n in nodes if n in states and _ours(host, states[n])]:
        _slurm(ctx, controller, ["scontrol", "update", f"nodename={','.join(mine)}", "state=RESUME"], root=True)
    clear()
