"""VM operations the VM steps share: power off safely (guest shutdown first, hard power-off only after
a timeout), power on, and reconfigure."""

from __future__ import annotations

import time
from http.client import HTTPException
from typing import Any, Callable

from gpuvm.errors import TaskError
from gpuvm.steps.base import Context
from gpuvm.plan import Change, Disruption
from gpuvm.vsphere.tasks import call, fault_text, run_task, wait_for_other_tasks


SHUTDOWN_ATTEMPTS = 3  # a transient answer to ShutdownGuest is asked again this often, never taken as "no tools"
SHUTDOWN_RETRY_S = 2.0


def power_off(ctx: Context, vm_name: str) -> None:
    """Shut the guest down cleanly through VMware Tools, and power off hard only when the guest has no
    tools to ask or did not stop within --shutdown-timeout."""
    vm = _idle(ctx, vm_name)
    if _state(vm) == "poweredOff":
        return
    if _shutdown_guest(vm):
        deadline = time.monotonic() + ctx.options.shutdown_timeout
        while time.monotonic() < deadline:
            if _state(vm) == "poweredOff":
                return
            time.sleep(2)
    if _state(vm) != "poweredOff":
        run_task("PowerOffVM", vm.PowerOffVM_Task, ctx.options.task_timeout)


def _shutdown_guest(vm: Any) -> bool:
    """Ask the guest to shut down: True once asked, False when it has no tools to ask (ToolsUnavailable,
    or NotSupported from a host that cannot). Any other answer (a lost connection, a task in
    progress) is asked again a few times, then raised: a guest that could shut down cleanly is
    never powered off hard because vCenter hiccuped."""
    from pyVmomi import vim, vmodl

    for attempt in range(1, SHUTDOWN_ATTEMPTS + 1):
        try:
            vm.ShutdownGuest()
            return True
        except (vim.fault.ToolsUnavailable, vmodl.fault.NotSupported):
            return False
        except vim.fault.InvalidPowerState:
            return True  # off already (someone else stopped it): the wait sees it
        except (vmodl.MethodFault, OSError, HTTPException) as error:
            if attempt == SHUTDOWN_ATTEMPTS:
                text = fault_text(error) if isinstance(error, vmodl.MethodFault) else f"{type(error).__name__}: {error}"
                raise TaskError(f"ShutdownGuest failed {attempt} times ({text}); not powered off hard") from None
            time.sleep(SHUTDOWN_RETRY_S)
    return False


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
