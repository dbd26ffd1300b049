"""host.reboot: activate changes that need a reboot — maintenance mode, reboot, exit maintenance.

Planned when an earlier host step planned a change marked "needs host reboot". Refused while VMs
run on the host: gpuvm never evacuates or powers off VMs to reboot a host.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from gpuvm.errors import TaskError
from gpuvm.plan import Change, Disruption
from gpuvm.resolve import DesiredHost
from gpuvm.steps.base import Context, Step
from gpuvm.vsphere.tasks import call, run_task

NAME = "host.reboot"


@dataclass(frozen=True)
class RebootHost:
    """Maintenance mode (unless the host is in it already), reboot, wait, exit maintenance mode."""


def observe(ctx: Context, host: DesiredHost) -> list[Change]:
    """What waits for this host's reboot: the changes earlier steps planned for it that need one."""
    return [c for c in ctx.planned_on(host.name) if c.disruption == Disruption.HOST_REBOOT]


def plan(host: DesiredHost, pending: list[Change]) -> list[Change]:
    if not pending:
        return []
    return [Change(NAME, host.name, "host", "reboot", "changes pending", "rebooted (maintenance mode)",
                   Disruption.HOST_REBOOT, RebootHost())]


def apply(ctx: Context, host: DesiredHost, changes: list[Change]) -> None:
    target = host.name
    facts = ctx.inventory.hosts[target]
    running = [vm.name for vm in ctx.inventory.vms_on(target) if vm.powered_on]
    if running:
        raise TaskError(f"host runs powered-on VMs ({', '.join(running)}); power them off or "
                        "move them before gpuvm reboots it")
    host = ctx.session.ref("HostSystem", facts.moid)
    timeout = ctx.options.task_timeout
    if not facts.in_maintenance:
        run_task("EnterMaintenanceMode", lambda: host.EnterMaintenanceMode_Task(timeout=0), timeout)
    run_task("RebootHost", lambda: host.RebootHost_Task(force=False), timeout)
    _wait_connected(target, host, timeout)
    if not facts.in_maintenance:
        run_task("ExitMaintenanceMode", lambda: host.ExitMaintenanceMode_Task(timeout=0), timeout)


def _wait_connected(target: str, host: object, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state = call("read connection state", lambda: host.runtime.connectionState)  # type: ignore[attr-defined]
        if state == "connected":
            return
        time.sleep(5)
    raise TaskError(f"host did not reconnect within {timeout:.0f} s after the reboot")


STEP = Step(NAME, "host", observe, plan, apply, reboots_host=True)
