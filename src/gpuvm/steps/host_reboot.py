"""host.reboot: activate what waits for a host reboot — VMs shut down, maintenance mode, reboot, back.

Planned when a change on the host, its ESXi shell or a guest of one of its VMs needs a host reboot:
made now (passthrough, graphics, kernel settings, MIG, ConnectX ATS) or made before and still not
active (a reboot that failed or never came is planned again). The plan lists, as changes of this
step, the VMs running on the host: each is shut down cleanly first (hard power-off only after
--shutdown-timeout), so the run is refused up front without --allow-power-off. After the reboot the
host leaves maintenance mode (unless it was in it before) and the VMs the runbook does not manage
are powered on again; the runbook's VMs get the power state it asks for from `vm.power`.

Hosts reboot in batches of --max-unavailable (default 1); when a host fails, the hosts not
rebooted yet are left alone, so a cluster is never taken down by one bad run.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from typing import Any

from gpuvm.errors import GpuvmError, TaskError, TargetFailures
from gpuvm.executors.group import run_parallel
from gpuvm.plan import Change, Disruption
from gpuvm.resolve import DesiredHost
from gpuvm.steps.base import Context, Step
from gpuvm.steps.power import power_off, power_on
from gpuvm.vsphere.tasks import call, run_task

NAME = "host.reboot"


@dataclass(frozen=True)
class RebootHost:
    """Maintenance mode (unless the host is in it already), reboot, wait, exit maintenance mode."""


@dataclass(frozen=True)
class StopForReboot:
    host: str
    restore: bool  # powered on again after the reboot (a VM the runbook does not manage)


@dataclass(frozen=True)
class RebootFact:
    waiting: list[Change]  # what the reboot activates
    running: list[str]  # VMs powered on on the host
    managed: list[str]  # the runbook's VMs on the host


def observe(ctx: Context, host: DesiredHost) -> RebootFact:
    """The changes planned so far that need this host's reboot (on the host, its ESXi shell, or a guest
    of one of its VMs), and the VMs that run on it."""
    vms = ctx.inventory.vms_on(host.name)
    waiting = [c for name in [host.name] + [vm.name for vm in vms] for c in ctx.planned_on(name)
               if c.disruption == Disruption.HOST_REBOOT]
    return RebootFact(waiting, [vm.name for vm in vms if vm.powered_on], list(host.vms))


def plan(host: DesiredHost, fact: RebootFact) -> list[Change]:
    if not fact.waiting:
        return []
    changes = [Change(NAME, host.name, "host", "reboot", f"{len(fact.waiting)} change(s) waiting",
                      "rebooted (maintenance mode)", Disruption.HOST_REBOOT, RebootHost())]
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
    hosts = [h for h in stops if any(isinstance(c.action, RebootHost) for c in by_target.get(h, []))]
    size = max(1, ctx.options.max_unavailable)
    failed: dict[str, Exception] = {}
    left: dict[str, Exception] = {}  # hosts not rebooted because one failed before them
    for start in range(0, len(hosts), size):
        batch = {h: h for h in hosts[start:start + size]}
        if failed:
            left |= {h: TaskError(f"not rebooted: {', '.join(sorted(failed))} failed first "
                                  f"(hosts reboot {size} at a time)") for h in batch}
            continue
        try:
            run_parallel(batch, lambda h: _reboot(ctx, h, stops[h]), min(parallel, size))
        except TargetFailures as e:
            failed.update(e.failures)  # type: ignore[arg-type]
    failures = failed | left
    for host, vms in stops.items():
        for vm, _ in vms:
            if host in failures:
                failures[vm] = failures[host]
    return failures


def _reboot(ctx: Context, name: str, stops: list[tuple[str, StopForReboot]]) -> None:
    facts = ctx.inventory.hosts[name]
    for vm, _ in stops:
        power_off(ctx, vm)
    host = ctx.session.ref("HostSystem", facts.moid)
    timeout = ctx.options.task_timeout
    if not facts.in_maintenance:
        run_task("EnterMaintenanceMode", lambda: host.EnterMaintenanceMode_Task(timeout=0), timeout)
    booted = call("read boot time", lambda: host.runtime.bootTime)
    try:
        run_task("RebootHost", lambda: host.RebootHost_Task(force=False), timeout)
        _wait_rebooted(host, booted, timeout)
    except GpuvmError:
        if not facts.in_maintenance:  # the host runs as before: back into service; the next plan reboots again
            with contextlib.suppress(GpuvmError):
                run_task("ExitMaintenanceMode", lambda: host.ExitMaintenanceMode_Task(timeout=0), timeout)
        raise
    if not facts.in_maintenance:
        run_task("ExitMaintenanceMode", lambda: host.ExitMaintenanceMode_Task(timeout=0), timeout)
    for vm, stop in stops:
        if stop.restore:
            power_on(ctx, vm)


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
