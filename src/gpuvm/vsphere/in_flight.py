"""vCenter tasks in flight on a runbook's VMs, awaited once before `apply` observes them.

A run stopped (SIGTERM, a kill, a lost terminal) while vSphere reconfigures or powers a VM leaves
that task running: vSphere finishes it without the client. A re-run that observed meanwhile would
plan on the VM as it was, and its own step would then refuse the VM changed since the plan
(vm.hardware: "run apply again to re-plan"). So `apply` waits for those tasks first and plans on
what they leave. Steps still wait where they act (steps/power.py `_idle`): a task can start
between the plan and the change.

Hosts are left out: their tasks (maintenance mode entered while an operator evacuates a host) may
last as long as the operator's work, which would hold up the whole fleet's run, and host.reboot
awaits them where it acts on that host."""

from __future__ import annotations

import time
from collections.abc import Callable, Collection
from typing import Any

from gpuvm.errors import TaskError
from gpuvm.vsphere.tasks import Busy, TaskWatcher, call, read_running_tasks

Say = Callable[[str], None]  # a progress line


def on_vms(session: Any, vms: Collection[str], again: bool = True) -> list[tuple[str, Busy]]:
    """(VM name, task) for each task queued or running on a VM named in `vms` (names in vCenter):
    one read of vCenter's recent tasks (never part of the inventory read); only when some run on
    VMs, one more of those VMs' names (`again`: both read again if a VM went in between)."""
    from pyVmomi import vim

    running = call("read running tasks", lambda: read_running_tasks(session))
    busy = [b for tasks in running.values() for b in tasks if isinstance(b.entity, vim.VirtualMachine)]
    if not busy:
        return []
    names = call("read the names of busy VMs", lambda: _names(session, [b.entity for b in busy], quiet=again))
    if names is None:
        return on_vms(session, vms, again=False)
    return [(names[b.entity._moId], b) for b in busy if names.get(b.entity._moId) in vms]


def await_on_vms(session: Any, vms: Collection[str], timeout: float, say: Say | None = None) -> None:
    """Wait (up to `timeout` seconds) for the tasks in flight now on the VMs named in `vms`, saying
    which first; still running after it: TaskError naming each VM and task (nothing was changed)."""
    waiting = on_vms(session, vms)
    if not waiting:
        return
    if say is not None:
        say(f"waiting for {len(waiting)} vCenter task(s) in flight: " + ", ".join(f"{vm} {b.kind}" for vm, b in waiting))
    from pyVmomi import vim

    began, stub = time.monotonic(), session.si._stub
    watcher = TaskWatcher.of(stub)  # polls every task waited for over this connection together

    def ended(vm: str, busy: Busy) -> bool:
        left = began + timeout - time.monotonic()
        return left > 0 and call(f"wait for {busy.kind} on {vm}",
                                 lambda: watcher.wait(vim.Task(busy.task, stub), left)) is not None

    if not all(ended(vm, busy) for vm, busy in waiting):
        running = {b.task for tasks in call("read running tasks", lambda: read_running_tasks(session)).values()
                   for b in tasks}
        if late := [(vm, b) for vm, b in waiting if b.task in running]:
            raise TaskError(f"{len(late)} vCenter task(s) still in flight after {timeout:.0f} s: "
                            + ", ".join(f"{vm} {b}" for vm, b in late)
                            + "; nothing was changed: run apply again once they have ended")
    if say is not None:
        say(f"done: {len(waiting)} task(s) ended in {time.monotonic() - began:.1f} s")


def _names(session: Any, entities: list[Any], quiet: bool) -> dict[str, str] | None:
    """The `name` of each VM, by moid, in one request; None where one is gone (destroyed since it
    was seen) and `quiet`."""
    from pyVmomi import vim, vmodl

    collector = vmodl.query.PropertyCollector
    spec = collector.FilterSpec(objectSet=[collector.ObjectSpec(obj=entity) for entity in entities],
                                propSet=[collector.PropertySpec(type=vim.VirtualMachine, pathSet=["name"])])
    try:
        found = session.call(session.content.propertyCollector, "RetrieveContents", [spec]) or []
    except vmodl.fault.ManagedObjectNotFound:
        if not quiet:
            raise
        return None
    return {obj.obj._moId: prop.val for obj in found for prop in obj.propSet or [] if prop.name == "name"}
