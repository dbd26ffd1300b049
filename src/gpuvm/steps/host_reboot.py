"""host.reboot: activate changes that need a reboot — maintenance mode, reboot, exit maintenance.

Planned when an earlier host step planned a change marked "needs host reboot". Refused while VMs
run on the host: gpuvm never evacuates or powers off VMs to reboot a host.
"""

from __future__ import annotations

import time

from gpuvm.errors import TaskError
from gpuvm.plan import Change, Disruption
from gpuvm.resolve import Desired
from gpuvm.steps.base import ApplyContext
from gpuvm.vsphere.facts import Inventory
from gpuvm.vsphere.tasks import call, run_task

NAME = "host.reboot"


def plan(desired: Desired, inventory: Inventory, prior: list[Change]) -> list[Change]:
    hosts = dict.fromkeys(c.target for c in prior
                          if c.disruption == Disruption.HOST_REBOOT and c.target in desired.hosts)
    return [Change(NAME, host, "host", "reboot", "changes pending", "rebooted (maintenance mode)",
                   Disruption.HOST_REBOOT) for host in hosts]


def apply(ctx: ApplyContext, target: str, changes: list[Change]) -> None:
    facts = ctx.inventory.hosts[target]
    running = [vm.name for vm in ctx.inventory.vms_on(target) if vm.powered_on]
    if running:
        raise TaskError(f"{NAME}: host runs powered-on VMs ({', '.join(running)}); power them off or "
                        "move them before gpuvm reboots it")
    host = ctx.session.ref("HostSystem", facts.moid)
    timeout = ctx.options.task_timeout
    if not facts.in_maintenance:
        run_task(target, NAME, "EnterMaintenanceMode", lambda: host.EnterMaintenanceMode_Task(timeout=0), timeout)
    run_task(target, NAME, "RebootHost", lambda: host.RebootHost_Task(force=False), timeout)
    _wait_connected(target, host, timeout)
    if not facts.in_maintenance:
        run_task(target, NAME, "ExitMaintenanceMode", lambda: host.ExitMaintenanceMode_Task(timeout=0), timeout)


def _wait_connected(target: str, host: object, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state = call(target, NAME, "read connection state", lambda: host.runtime.connectionState)  # type: ignore[attr-defined]
        if state == "connected":
            return
        time.sleep(5)
    raise TaskError(f"{NAME}: host did not reconnect within {timeout:.0f} s after the reboot")


class HostRebootStep:
    name, scope = NAME, "host"
    plan = staticmethod(plan)
    apply = staticmethod(apply)
