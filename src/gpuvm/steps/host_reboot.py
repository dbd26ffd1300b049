"""host.reboot: activate what waits for a host reboot — VMs shut down, maintenance mode, reboot, back.

Planned when a change on the host, its ESXi shell or a guest of one of its VMs needs a host reboot:
made now (passthrough, graphics, kernel settings, MIG, ConnectX ATS) or made before and still not
active (a reboot that failed or never came is planned again). The plan lists, as changes of this
step, the VMs running on the host: each is shut down cleanly first (hard power-off only after
--shutdown-timeout), so the run is refused up front without --allow-power-off. Work an earlier
step left for maintenance mode (the NVIDIA vGPU manager's install, `esxi.vgpu_manager`) is done
once the host is in it, just before the reboot. After the reboot the host leaves maintenance mode
(unless someone else put it there) and the VMs the runbook does not manage are powered on again.
The runbook's VMs it stopped get, while still off, what the VM steps planned on them (the engine's
`Context.while_off`: hardware version, devices, advanced settings), then come back with their host
when the runbook wants them on, before the next batch: rolling reboots never have more than
--max-unavailable hosts' VMs down. As in `vm.power`, VMs that take their GPUs by dynamic DirectPath
start after the others; when a VM of the host that `vm.power` starts first (it may name a GPU a
dynamic VM would take) does not come back now, they are left to `vm.power` too.

Intent before act (vsphere/intent.py): before stopping a VM gpuvm records "power-off" on it (the
state to restore, why, the host); before entering maintenance mode, "maintenance" on the host. Each
record is cleared only once the act is undone: the host out of maintenance, the VM on again. When
anything after the first stop fails, the run undoes what it did; what it cannot undo keeps its
record, and the next run of any machine plans it (host out of maintenance, VM on again, a stale
record cleared). Maintenance mode without gpuvm's record is someone else's and never touched; a
record gpuvm cannot prove it wrote (vsphere/records.py: `{"maintenance": 42}`, a power-off record
naming no gpuvm run) is no record of gpuvm's: reported, never acted on.

With a Slurm cluster in the runbook, the Slurm nodes of the host's VMs are drained first and their
jobs waited for (refused up front without --drain-timeout), then resumed once the host and its VMs
are back, the drain recorded on the host like maintenance mode (steps/slurm_drain.py).

Hosts reboot in batches of --max-unavailable (default 1); when a host fails, the hosts not
rebooted yet are left alone, so a cluster is never taken down by one bad run. A VM's stop is its
host's reboot's: given without that reboot (`--target` leaves it out: gpuvm/targeting.py) it fails,
never reads as done.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Literal

from gpuvm.errors import GpuvmError, TaskError, listed
from gpuvm.executors.group import run_group
from gpuvm.plan import Change, Disruption
from gpuvm.desired import DesiredHost
from gpuvm.steps import reboot_memo, slurm_drain
from gpuvm.steps.base import Context, Step
from gpuvm.steps.power import power_off, power_on
from gpuvm.steps.slurm_drain import DrainFact, DrainNodes, ResumeNodes
from gpuvm.steps.vm_power import SetPower
from gpuvm.vsphere import tasks
from gpuvm.vsphere.intent import Intent
from gpuvm.vsphere.tasks import call, wait_for_other_tasks

NAME = "host.reboot"

MAINTENANCE = "maintenance"  # the act recorded on a host gpuvm puts in maintenance mode (and the journal's status)
POWER_OFF = "power-off"  # the act recorded on a VM gpuvm stops for a reboot
CANCEL_GRACE_S = 30.0  # how long a canceled task may take to end before its record is left to the next run


@dataclass(frozen=True)
class RebootHost:
    """Reboot and wait for it. Maintenance mode around it is gpuvm's (entered if need be, left after)
    unless someone else put the host in it: then it stays."""

    own_maintenance: bool = True


@dataclass(frozen=True)
class LeaveMaintenance:
    """Finish what an interrupted run began on the host's maintenance mode, then clear its record."""

    in_maintenance: bool  # when planned; False: the record is stale (the enter failed, or an operator left)


@dataclass(frozen=True)
class StopForReboot:
    host: str
    restore: bool  # powered on again after the reboot (a VM the runbook does not manage)


@dataclass(frozen=True)
class RestorePower:
    """A VM an interrupted run stopped for a reboot: on again (a VM the runbook does not manage), record cleared."""

    host: str
    power_on: bool


@dataclass(frozen=True)
class RebootFact:
    waiting: list[Change]  # what the reboot activates
    running: list[str]  # VMs powered on on the host
    managed: list[str]  # the runbook's VMs on the host
    # in maintenance mode, and who put it there; "recorded": gpuvm's record, but the host is not in it
    maintenance: Literal["off", "gpuvm", "other", "recorded"] = "off"
    recorded: Intent | None = None  # gpuvm's "maintenance" record on the host
    stopped: dict[str, Intent] = field(default_factory=dict)  # VMs on it with a "power-off" record → the record
    slurm: DrainFact | None = None  # when a reboot is planned and the runbook has a Slurm cluster: its VMs' nodes
    drained: Intent | None = None  # gpuvm's "drain" record on the host (slurm_drain)


def observe(ctx: Context, host: DesiredHost) -> RebootFact:
    """The changes planned so far that need this host's reboot (on the host, its ESXi shell, or a guest
    of one of its VMs), the VMs that run on it, and what interrupted runs recorded on them."""
    vms = ctx.inventory.vms_on(host.name)
    waiting = [c for name in [host.name] + [vm.name for vm in vms] for c in ctx.planned_on(name)
               if c.disruption == Disruption.HOST_REBOOT]
    facts = ctx.inventory.hosts[host.name]
    recorded = facts.intents.get(MAINTENANCE)
    if facts.in_maintenance:
        maintenance = "gpuvm" if recorded else "other"
    else:
        maintenance = "recorded" if recorded else "off"
    stopped = {vm.name: vm.intents[POWER_OFF] for vm in vms if POWER_OFF in vm.intents}
    slurm = slurm_drain.observe(ctx, [vm.name for vm in vms]) if waiting else None
    return RebootFact(waiting, [vm.name for vm in vms if vm.powered_on], list(host.vms), maintenance,  # type: ignore[arg-type]
                      recorded, stopped, slurm, facts.intents.get(slurm_drain.ACT))


def _by(intent: Intent) -> str:
    return f"run {intent.run}" + (f": {intent.why}" if intent.why else "")


def plan(host: DesiredHost, fact: RebootFact) -> list[Change]:
    changes = slurm_drain.plan(host.name, fact.slurm, bool(fact.waiting), fact.drained)
    if fact.waiting:
        changes.append(Change(NAME, host.name, "host", "reboot", f"{len(fact.waiting)} change(s) waiting",
                              "rebooted (maintenance mode)", Disruption.HOST_REBOOT,
                              RebootHost(own_maintenance=fact.maintenance != "other")))
        for vm in fact.running:
            restore = vm not in fact.managed
            changes.append(Change(NAME, vm, "vm", "power", "poweredOn",
                                  f"poweredOff for the reboot of {host.name}" + (", then on again" if restore else ""),
                                  Disruption.VM_POWER_OFF, StopForReboot(host.name, restore)))
    elif fact.maintenance == "gpuvm" and fact.recorded is not None:
        changes.append(Change(NAME, host.name, "host", "maintenance mode",
                              f"on (left by interrupted {_by(fact.recorded)})", "off", Disruption.NONE,
                              LeaveMaintenance(in_maintenance=True)))
    elif fact.maintenance == "recorded" and fact.recorded is not None:
        changes.append(Change(NAME, host.name, "host", "maintenance mode",
                              f"off, recorded as entered by {_by(fact.recorded)}", "off, record cleared",
                              Disruption.NONE, LeaveMaintenance(in_maintenance=False)))
    for vm, intent in fact.stopped.items():
        if fact.waiting and vm in fact.running:
            continue  # stopped again for this reboot: its record is renewed then
        on = vm in fact.running
        restore = not on and vm not in fact.managed and intent.data.get("restore") == "poweredOn"
        after = "poweredOn, record cleared" if restore else "record cleared" + ("" if on else " (vm.power sets its state)")
        changes.append(Change(NAME, vm, "vm", "power", f"{'poweredOn' if on else 'poweredOff'} (interrupted {_by(intent)})",
                              after, Disruption.NONE, RestorePower(host.name, restore)))
    return changes


@dataclass
class _HostWork:
    reboot: RebootHost | None = None
    leave: LeaveMaintenance | None = None
    stops: list[tuple[str, StopForReboot]] = field(default_factory=list)
    drain: DrainNodes | None = None
    resume: ResumeNodes | None = None
    restores: list[tuple[str, RestorePower]] = field(default_factory=list)

    @property
    def vms(self) -> list[str]:
        return [vm for vm, _ in self.stops] + [vm for vm, _ in self.restores]


def apply_all(ctx: Context, by_target: dict[str, list[Change]], parallel: int) -> dict[str, Exception]:
    """Finish what interrupted runs left (every host at once), then reboot the hosts in batches of
    `max_unavailable`; a VM's failure is its host's."""
    work: dict[str, _HostWork] = {}
    for target, changes in by_target.items():
        for change in changes:
            action = change.action
            if isinstance(action, RebootHost):
                work.setdefault(target, _HostWork()).reboot = action
            elif isinstance(action, LeaveMaintenance):
                work.setdefault(target, _HostWork()).leave = action
            elif isinstance(action, DrainNodes):
                work.setdefault(target, _HostWork()).drain = action
            elif isinstance(action, ResumeNodes):
                work.setdefault(target, _HostWork()).resume = action
            elif isinstance(action, StopForReboot):
                work.setdefault(action.host, _HostWork()).stops.append((target, action))
            elif isinstance(action, RestorePower):
                work.setdefault(action.host, _HostWork()).restores.append((target, action))
    recovering = {h: h for h, w in work.items() if w.reboot is None}
    unmade = {vm: TaskError(f"not stopped: the reboot of {h} is not part of this run")  # `--target`: never "done"
              for h in recovering for vm, _ in work[h].stops}
    failed = dict(run_group(recovering, lambda h: _recover(ctx, h, work[h]), parallel, name="recover").failed)
    _end(ctx, recovering, work, failed | unmade)
    hosts = [h for h, w in work.items() if w.reboot is not None]
    size = max(1, ctx.options.max_unavailable)
    left: dict[str, Exception] = {}  # hosts not rebooted because one failed before them
    for start in range(0, len(hosts), size):
        batch = {h: h for h in hosts[start:start + size]}
        if failed:
            left |= {h: TaskError(f"not rebooted: {listed(sorted(failed))} failed first "
                                  f"(hosts reboot {size} at a time)") for h in batch}
            continue
        failed.update(run_group(batch, lambda h: _reboot(ctx, h, work[h]), min(parallel, size), name="reboot").failed)
        _end(ctx, batch, work, failed)
    failures = failed | left
    for host, w in work.items():
        for vm in w.vms:
            if host in failures:
                failures[vm] = failures[host]
    return unmade | failures


def _begin(ctx: Context, name: str, work: _HostWork) -> None:
    """The host's work starts now (its batch's turn): it and its VMs are begun (journal, progress)."""
    for target in (name, *work.vms):
        ctx.begin(target)


def _end(ctx: Context, hosts: Iterable[str], work: dict[str, _HostWork], failed: dict[str, Exception]) -> None:
    """The hosts' work ended (their batch's): they and their VMs are done, or failed (with the host, or
    on their own: a VM in `failed`)."""
    for host in hosts:
        for target in (host, *work[host].vms):
            ctx.end(target, failed.get(target) or failed.get(host))


def _recover(ctx: Context, name: str, work: _HostWork) -> None:
    """What interrupted runs left on a host that is not rebooted now: Slurm nodes drained, maintenance
    mode, then its VMs."""
    _begin(ctx, name, work)
    _resume_interrupted(ctx, name, work)
    if work.leave is not None:
        _leave_interrupted(ctx, name, work.leave)
    _restore_all(ctx, [(vm, restore.power_on) for vm, restore in work.restores])


def _reboot(ctx: Context, name: str, work: _HostWork) -> None:
    assert work.reboot is not None
    _begin(ctx, name, work)
    own = work.reboot.own_maintenance
    _resume_interrupted(ctx, name, work)
    drained = _drain(ctx, name, work.drain)  # a job still running past --drain-timeout: failed here, nothing stopped
    stopped: list[str] = []  # VMs this run stopped (or found stopped by an earlier one): owed a power-on on failure
    try:
        for vm, _ in work.stops:
            _record(ctx, _vm(ctx, vm), POWER_OFF, name, f"stopped for the reboot of {name}", host=name,
                    restore="poweredOn")
            stopped.append(vm)
            power_off(ctx, vm)
        stopped += [vm for vm, restore in work.restores if restore.power_on]
        host = _host(ctx, name)
        if own:
            own = _enter(ctx, name, f"reboot of {name} for pending changes")
        _in_maintenance(ctx, name)
        booted = call("read boot time", lambda: host.runtime.bootTime)
        _run("RebootHost", lambda: host.RebootHost_Task(force=False), ctx.options.task_timeout)
        _wait_rebooted(host, booted, ctx.options.task_timeout)
    except Exception:  # the host runs as before: undo what this run did; the next plan reboots again
        _undo(ctx, name, own, stopped)
        with contextlib.suppress(Exception):  # else kept recorded: the next run resumes them
            _resume(ctx, name, work.drain, drained)
        raise
    if own:
        _leave(ctx, name)
    managed = [vm for vm, stop in work.stops if not stop.restore]
    held = ctx.while_off.run(managed) if ctx.while_off is not None and managed else set(managed)
    changed = ctx.while_off.steps if ctx.while_off is not None else frozenset()
    back = {vm: _back_now(ctx, vm, frozenset() if vm in held else changed) for vm in managed}
    dynamic = {vm for vm in managed if _starts_dynamic(ctx, vm)}
    if _named_gpus_wait(ctx, name, {vm for vm, on in back.items() if on and vm not in dynamic}):
        back |= dict.fromkeys(dynamic, False)  # vm.power starts them after the VMs that name their GPUs
    try:
        _restore_all(ctx, [(vm, stop.restore or back[vm]) for vm, stop in work.stops if vm not in dynamic]
                     + [(vm, r.power_on) for vm, r in work.restores]
                     + [(vm, back[vm]) for vm in managed if vm in dynamic])  # after the VMs that name GPUs
    finally:
        _resume(ctx, name, work.drain, drained)  # the host is back: its nodes take jobs again
    reboot_memo.remember(ctx, name)  # what this reboot was for: not rebooted for again if still pending


def _drain(ctx: Context, name: str, drain: DrainNodes | None) -> list[str]:
    """Drain the host's Slurm nodes and wait for their jobs (slurm_drain.drain), recorded on the host."""
    if drain is None:
        return []
    return slurm_drain.drain(
        ctx, name, drain,
        record=lambda nodes: _record(ctx, _host(ctx, name), slurm_drain.ACT, name, f"Slurm nodes drained for the reboot "
                                     f"of {name}", controller=drain.controller, nodes=nodes),
        clear=lambda: _clear(ctx, _host(ctx, name), slurm_drain.ACT, name))


def _resume(ctx: Context, name: str, drain: DrainNodes | ResumeNodes | None, nodes: list[str]) -> None:
    if drain is not None:
        slurm_drain.resume(ctx, name, drain.controller, nodes, lambda: _clear(ctx, _host(ctx, name), slurm_drain.ACT, name))


def _resume_interrupted(ctx: Context, name: str, work: _HostWork) -> None:
    """Resume the nodes an interrupted run drained (not drained again by this run: slurm_drain.plan)."""
    if work.resume is not None:
        _resume(ctx, name, work.resume, list(work.resume.nodes))


def _in_maintenance(ctx: Context, name: str) -> None:
    """What earlier steps left to be done on the host in maintenance mode, just before the reboot
    (installing the NVIDIA vGPU manager): actions with an `in_maintenance(ctx, host)` method."""
    for change in ctx.planned_on(name):
        if (work := getattr(change.action, "in_maintenance", None)) is not None:
            _journal(ctx, "in-maintenance", host=name, step=change.step, resource=change.resource, after=change.after)
            work(ctx, name)


def _undo(ctx: Context, name: str, own: bool, stopped: list[str]) -> None:
    """After a failure: the host out of the maintenance mode gpuvm holds, the VMs it stopped on again.
    What cannot be undone now keeps its record for the next run."""
    if own:
        with contextlib.suppress(Exception):
            host = _host(ctx, name)
            if MAINTENANCE in ctx.intents.current(host, "host"):  # only maintenance mode gpuvm recorded, never an operator's
                wait_for_other_tasks(ctx.session, host, CANCEL_GRACE_S)  # an enter task being canceled ends first
                _leave(ctx, name)
    for vm in stopped:
        with contextlib.suppress(Exception):
            _restore(ctx, vm, True)


def _enter(ctx: Context, name: str, why: str) -> bool:
    """Enter maintenance mode, recorded on the host first; whether gpuvm holds it (else it is left
    as found). A task an interrupted run left entering ends first. A host in maintenance mode already
    is gpuvm's if the plan saw gpuvm's record on it, else an operator's who entered since the plan:
    the record is taken back and the mode left to them."""
    host = _host(ctx, name)
    ours = MAINTENANCE in ctx.inventory.hosts[name].intents
    _record(ctx, host, MAINTENANCE, name, why)
    wait_for_other_tasks(ctx.session, host, ctx.options.task_timeout)
    if call("read maintenance mode", lambda: host.runtime.inMaintenanceMode) is True:
        if not ours:
            _clear(ctx, host, MAINTENANCE, name)
        return ours
    timeout = ctx.options.task_timeout  # vCenter gives up then too (the VMs on the host still running)
    _run("EnterMaintenanceMode", lambda: host.EnterMaintenanceMode_Task(timeout=int(timeout)), timeout,
         started=lambda: _journal(ctx, MAINTENANCE, host=name, state="entering"))
    _journal(ctx, MAINTENANCE, host=name, state="entered")
    return True


def _leave(ctx: Context, name: str) -> None:
    """Leave the maintenance mode gpuvm entered (if the host is in it), then clear its record."""
    host = _host(ctx, name)
    if call("read maintenance mode", lambda: host.runtime.inMaintenanceMode) is True:
        _run("ExitMaintenanceMode", lambda: host.ExitMaintenanceMode_Task(timeout=0), ctx.options.task_timeout)
        _journal(ctx, MAINTENANCE, host=name, state="left")
    _clear(ctx, host, MAINTENANCE, name)


def _leave_interrupted(ctx: Context, name: str, leave: LeaveMaintenance) -> None:
    """Take the host out of the maintenance mode an interrupted run entered, and clear its record.
    A task it left entering ends first; a host that was not in maintenance mode when planned is
    taken out only if such a task put it there (never when an operator entered it since)."""
    host = _host(ctx, name)
    waited = wait_for_other_tasks(ctx.session, host, ctx.options.task_timeout)
    if call("read maintenance mode", lambda: host.runtime.inMaintenanceMode) is True and (leave.in_maintenance or waited):
        _run("ExitMaintenanceMode", lambda: host.ExitMaintenanceMode_Task(timeout=0), ctx.options.task_timeout)
        _journal(ctx, MAINTENANCE, host=name, state="left")
    _clear(ctx, host, MAINTENANCE, name)


def _restore_all(ctx: Context, vms: list[tuple[str, bool]]) -> None:
    """`_restore` every VM, each tried whatever happened to the one before; the first error raised after."""
    errors = []
    for vm, on in vms:
        try:
            _restore(ctx, vm, on)
        except Exception as error:
            errors.append(error)
    if errors:
        raise errors[0]


def _back_now(ctx: Context, vm: str, changed: frozenset[str]) -> bool:
    """A runbook VM comes back with its host, before the next batch reboots (rolling: at most
    --max-unavailable hosts' VMs down at once), when the plan powers it on and nothing left after
    this step needs it off: the steps in `changed` (new devices, a hardware upgrade) were carried out
    while it was off (`Context.while_off`). Else `vm.power` powers it on later."""
    later = [c for c in ctx.planned_on(vm) if c.step != NAME and c.step not in changed]
    return (any(isinstance(c.action, SetPower) and c.action.state == "on" for c in later)
            and not any(c.disruption == Disruption.VM_POWER_OFF for c in later))


def _starts_dynamic(ctx: Context, vm: str) -> bool:
    """Whether `vm.power` would start the VM with the dynamic DirectPath VMs, after the others."""
    return any(isinstance(c.action, SetPower) and c.action.dynamic for c in ctx.planned_on(vm))


def _named_gpus_wait(ctx: Context, host: str, coming: set[str]) -> bool:
    """Whether a VM on the host that `vm.power` starts before the dynamic DirectPath ones (it may name a
    GPU a dynamic VM would take) is not among `coming` (powered on now): then the dynamic VMs wait too."""
    return any(isinstance(c.action, SetPower) and c.action.state == "on" and not c.action.dynamic
               for other in ctx.inventory.vms_on(host) if other.name not in coming
               for c in ctx.planned_on(other.name))


def _restore(ctx: Context, vm: str, on: bool) -> None:
    """Power on a VM gpuvm stopped (if `on`), then clear its record."""
    if on:
        power_on(ctx, vm)
    _clear(ctx, _vm(ctx, vm), POWER_OFF, vm)


def _run(action: str, start: Callable[[], Any], timeout: float, started: Callable[[], None] | None = None) -> None:
    """Start a task and wait for it (`_finish`); `started` is told once vCenter has it."""
    task = call(action, start)
    if started is not None:
        started()
    _finish(task, action, timeout)


def _finish(task: Any, action: str, timeout: float) -> None:
    """Wait for the task; one still running after `timeout` is canceled, not left to finish unseen
    (if it completes anyway, the record made before it covers it)."""
    try:
        tasks.wait(task, action, timeout)
    except TaskError:
        with contextlib.suppress(Exception):
            if task.info.state in ("queued", "running"):
                task.CancelTask()
        raise


def _wait_rebooted(host: Any, booted_before: Any, timeout: float) -> None:
    """Until the host is connected again with a new boot time (a host still going down reads connected)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            state, booted = call("read host state", lambda: (host.runtime.connectionState, host.runtime.bootTime))
            if state == "connected" and booted != booted_before:
                return
        except GpuvmError:
            pass  # vCenter loses the host while it reboots
        if time.monotonic() >= deadline:
            raise TaskError(f"host did not come back within {timeout:.0f} s after the reboot")
        time.sleep(5)


def _host(ctx: Context, name: str) -> Any:
    return ctx.session.ref("HostSystem", ctx.inventory.hosts[name].moid)


def _vm(ctx: Context, name: str) -> Any:
    return ctx.session.ref("VirtualMachine", ctx.inventory.vms[name].moid)


def _record(ctx: Context, entity: Any, act: str, target: str, why: str, **data: Any) -> None:
    ctx.intents.record(entity, act, why, **data)
    _journal(ctx, "intent", target=target, act=act, state="recorded")


def _clear(ctx: Context, entity: Any, act: str, target: str) -> None:
    ctx.intents.clear(entity, act)
    _journal(ctx, "intent", target=target, act=act, state="cleared")


def _journal(ctx: Context, status: str, **extra: Any) -> None:
    """History for the user (and for tests timing a signal); what recovery needs is on the objects."""
    if ctx.journal is not None:
        ctx.journal.record(status, **extra)


def apply(ctx: Context, host: DesiredHost, changes: list[Change]) -> None:
    """One host on its own (no VM to stop)."""
    if failures := apply_all(ctx, {host.name: changes}, 1):
        raise failures[host.name]


STEP = Step(NAME, "host", observe, plan, apply, apply_all=apply_all, reboots_host=True, restarts_guest=True,
            begins_targets=True)
