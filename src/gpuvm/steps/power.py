"""VM operations the VM steps share: power off safely (guest shutdown first, hard power-off only after
a timeout), power on, and reconfigure."""

from __future__ import annotations

import time
from typing import Any, Callable

from gpuvm.errors import TaskError
from gpuvm.steps.base import Context
from gpuvm.plan import Change, Disruption
from gpuvm.vsphere.tasks import call, run_task, wait_for_other_tasks


def power_off(ctx: Context, vm_name: str) -> None:
    from pyVmomi import vim

    vm = _idle(ctx, vm_name)
    if _state(vm) == "poweredOff":
        return
    try:
        vm.ShutdownGuest()  # clean shutdown through VMware Tools
        deadline = time.monotonic() + ctx.options.shutdown_timeout
        while time.monotonic() < deadline:
            if _state(vm) == "poweredOff":
                return
            time.sleep(2)
    except (vim.fault.ToolsUnavailable, vim.fault.InvalidState, vim.fault.TaskInProgress):
        pass  # no tools in the guest: fall through to a hard power-off
    except Exception:  # the simulator and old hosts answer NotSupported and the like
        pass
    if _state(vm) != "poweredOff":
        run_task("PowerOffVM", vm.PowerOffVM_Task, ctx.options.task_timeout)


def power_on(ctx: Context, vm_name: str) -> None:
    vm = _idle(ctx, vm_name)
    if _state(vm) != "poweredOn":
        run_task("PowerOnVM", vm.PowerOnVM_Task, ctx.options.task_timeout)


def _idle(ctx: Context, vm_name: str) -> Any:
    """The VM, once no task runs on it: a power-on left running by a run that was killed ends first,
    then its power state is read (vSphere would refuse a second power-on in the wrong state)."""
    vm = ctx.session.ref("VirtualMachine", ctx.inventory.vms[vm_name].moid)
    wait_for_other_tasks(ctx.session, vm, ctx.options.task_timeout)
    return vm


def _state(vm: Any) -> str:
    return str(call("read power state", lambda: vm.runtime.powerState))


def reconfigure(ctx: Context, vm_name: str, changes: list[Change], spec: Any,
                check: Callable[[Any], None] | None = None) -> None:
    """ReconfigVM with `spec`: powered off first if a change needs it, never stacked on a task still
    running on the VM. `check(config)` may refuse, on the VM's configuration read just before; the
    spec carries that read's `changeVersion`, so vSphere refuses the change (ConcurrentAccess) if
    anyone changed the VM in between: two runs can never both add a device."""
    if any(c.disruption == Disruption.VM_POWER_OFF for c in changes):
        power_off(ctx, vm_name)
    vm = _idle(ctx, vm_name)
    config = call("read configuration", lambda: vm.config)
    if check is not None:
        check(config)
    version = getattr(config, "changeVersion", None)
    if isinstance(version, str) and version:
        spec.changeVersion = version
    try:
        run_task("ReconfigVM", lambda: vm.ReconfigVM_Task(spec=spec), ctx.options.task_timeout)
    except TaskError as e:
        if "concurrent modification" in str(e):
            raise TaskError(f"{e} (the VM changed while gpuvm reconfigured it: another run or a person; "
                            "run apply again to re-plan)") from None
        raise
