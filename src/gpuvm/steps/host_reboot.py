"""host.reboot: activate what waits for a host reboot — VMs shut down, maintenance mode, reboot, back.

Planned when a change on the host, its ESXi shell or a guest of one of its VMs needs a host reboot:
made now (passthrough, graphics, kernel settings, MIG, ConnectX ATS) or made before and still not
active (a reboot that failed or never came is planned again). The plan lists, as changes of this
step, the VMs running on the host: each is shut down cleanly first (hard power-off only after
--shutdown-timeout), so the run is refused up front without --allow-power-off. After the reboot the
host leaves maintenance mode (unless someone else put it there) and the VMs the runbook does not
manage are powered on again; the runbook's VMs get the power state it asks for from `vm.power`.

Maintenance mode gpuvm enters is state it owns: the journal records entering and leaving it, so a
host an interrupted run left in maintenance mode is planned back out (`entered_by_gpuvm`).

Hosts reboot in batches of --max-unavailable (default 1); when a host fails, the hosts not
rebooted yet are left alone, so a cluster is never taken down by one bad run.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from gpuvm.errors import GpuvmError, TargetFailures, TaskError, listed
from gpuvm.executors.group import run_parallel
from gpuvm.plan import Change, Disruption
from gpuvm.resolve import DesiredHost
from gpuvm.steps import reboot_memo
from gpuvm.steps.base import Context, Step
from gpuvm.steps.power import power_off, power_on
from gpuvm.vsphere.tasks import call, run_task

NAME = "host.reboot"


MAINTENANCE = "maintenance"  # the journal's record of gpuvm entering or leaving a host's maintenance mode


@dataclass(frozen=True)
class RebootHost:
    """Reboot and wait for it. Maintenance mode around it is gpuvm's (entered if need be, left after)
    unless someone else put the host in it: then it stays."""

    own_maintenance: bool = True


@dataclass(frozen=True)
class LeaveMaintenance:
    """Exit the maintenance mode an interrupted gpuvm run left the host in."""


@dataclass(frozen=True)
class StopForReboot:
    host: str
    restore: bool  # powered on again after the reboot (a VM the runbook does not manage)


@dataclass(frozen=True)
class RebootFact:
    waiting: list[Change]  # what the reboot activates
    running: list[str]  # VMs powered on on the host
    managed: list[str]  # the runbook's VMs on the host
    maintenance: Literal["off", "gpuvm", "other"] = "off"  # in maintenance mode, and who put it there


def entered_by_gpuvm(entries: Iterable[Mapping[str, Any]]) -> set[str]:
    """The hosts gpuvm put in maintenance mode and has not taken out (journal entries, oldest first)."""
    last = {str(e.get("host")): e.get("state") for e in entries if e.get("status") == MAINTENANCE}
    return {host for host, state in last.items() if state == "entered"}


def observe(ctx: Context, host: DesiredHost) -> RebootFact:
    """The changes planned so far that need this host's reboot (on the host, its ESXi shell, or a guest
    of one of its VMs), and the VMs that run on it."""
    vms = ctx.inventory.vms_on(host.name)
    waiting = [c for name in [host.name] + [vm.name for vm in vms] for c in ctx.planned_on(name)
               if c.disruption == Disruption.HOST_REBOOT]
    maintenance = "off"
    if ctx.inventory.hosts[host.name].in_maintenance:
        maintenance = "gpuvm" if host.maintenance_by_gpuvm else "other"
    return RebootFact(waiting, [vm.name for vm in vms if vm.powered_on], list(host.vms), maintenance)


def plan(host: DesiredHost, fact: RebootFact) -> list[Change]:
    if not fact.waiting:
        if fact.maintenance == "gpuvm":
            return [Change(NAME, host.name, "host", "maintenance mode", "on (left by an interrupted gpuvm run)",
                           "off", Disruption.NONE, LeaveMaintenance())]
        return []
    changes = [Change(NAME, host.name, "host", "reboot", f"{len(fact.waiting)} change(s) waiting",
                      "rebooted (maintenance mode)", Disruption.HOST_REBOOT,
                      RebootHost(own_maintenance=fact.maintenance != "other"))]
    for vm in fact.running:
        restore = vm not in fact.managed
        changes.append(Change(NAME, vm, "vm", "power", "poweredOn",
                              f"poweredOff for the reboot of {host.name}" + (", then on again" if restore else ""),
                              Disruption.VM_POWER_OFF, StopForReboot(host.name, restore)))
    return changes


def apply_all(ctx: Context, by_target: dict[str, list[Change]], parallel: int) -> dict[str, Exception]:
    """Reboot the hosts in batches of `max_unavailable`; a VM's failure is its host's."""
    stops: dict[str, list[tuple[str, StopForReboot]]] = {h: [] for h in by_target if h in ctx.inventory.hosts}
    for vm, changes in by_target.items():
        for change in changes:
            if isinstance(change.action, StopForReboot):
                stops.setdefault(change.action.host, []).append((vm, change.action))
    reboots = {h: c.action for h in stops for c in by_target.get(h, []) if isinstance(c.action, RebootHost)}
    leave = {h: h for h, changes in by_target.items() if any(isinstance(c.action, LeaveMaintenance) for c in changes)}
    hosts = list(reboots)
    size = max(1, ctx.options.max_unavailable)
    failed: dict[str, Exception] = {}
    try:
        run_parallel(leave, lambda h: _maintenance(ctx, h, enter=False), parallel)
    except TargetFailures as e:
        failed.update(e.failures)  # type: ignore[arg-type]
    left: dict[str, Exception] = {}  # hosts not rebooted because one failed before them
    for start in range(0, len(hosts), size):
        batch = {h: h for h in hosts[start:start + size]}
        if failed:
            left |= {h: TaskError(f"not rebooted: {listed(sorted(failed))} failed first "
                                  f"(hosts reboot {size} at a time)") for h in batch}
            continue
        try:
            run_parallel(batch, lambda h: _reboot(ctx, h, stops[h], reboots[h].own_maintenance),
                         min(parallel, size))
        except TargetFailures as e:
            failed.update(e.failures)  # type: ignore[arg-type]
    failures = failed | left
    for host, vms in stops.items():
        for vm, _ in vms:
            if host in failures:
                failures[vm] = failures[host]
    return failures


def _reboot(ctx: Context, name: str, stops: list[tuple[str, StopForReboot]], own_maintenance: bool) -> None:
    for vm, _ in stops:
        power_off(ctx, vm)
    host = ctx.session.ref("HostSystem", ctx.inventory.hosts[name].moid)
    if own_maintenance and not ctx.inventory.hosts[name].in_maintenance:
        _maintenance(ctx, name, enter=True)
    booted = call("read boot time", lambda: host.runtime.bootTime)
    try:
        run_task("RebootHost", lambda: host.RebootHost_Task(force=False), ctx.options.task_timeout)
        _wait_rebooted(host, booted, ctx.options.task_timeout)
    except GpuvmError:
        if own_maintenance:  # the host runs as before: back into service; the next plan reboots again
            with contextlib.suppress(GpuvmError):
                _maintenance(ctx, name, enter=False)
        raise
    if own_maintenance:
        _maintenance(ctx, name, enter=False)
    for vm, stop in stops:
        if stop.restore:
            power_on(ctx, vm)
    reboot_memo.remember(ctx, name)  # what this reboot was for: not rebooted for again if still pending


def _maintenance(ctx: Context, name: str, enter: bool) -> None:
    """Enter or exit the host's maintenance mode, and journal it (what gpuvm entered, it takes back)."""
    host = ctx.session.ref("HostSystem", ctx.inventory.hosts[name].moid)
    if enter:
        run_task("EnterMaintenanceMode", lambda: host.EnterMaintenanceMode_Task(timeout=0), ctx.options.task_timeout)
    else:
        run_task("ExitMaintenanceMode", lambda: host.ExitMaintenanceMode_Task(timeout=0), ctx.options.task_timeout)
    if ctx.journal is not None:
        ctx.journal.record(MAINTENANCE, host=name, state="entered" if enter else "left")


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


def apply(ctx: Context, host: DesiredHost, changes: list[Change]) -> None:
    """One host on its own (no VM to stop)."""
    if failures := apply_all(ctx, {host.name: changes}, 1):
        raise failures[host.name]


STEP = Step(NAME, "host", observe, plan, apply, apply_all=apply_all, reboots_host=True, restarts_guest=True)
