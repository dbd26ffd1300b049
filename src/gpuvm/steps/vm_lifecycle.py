"""vm.lifecycle: VMs that the runbook declares but vCenter lacks are created, VMs it marks
`state: absent` are destroyed. First among the VM steps, so the steps after it configure a new VM
and power it on in the same apply.

A create is a clone of the runbook's template onto the VM's host and datastore (`CloneVM_Task`),
powered off, with cloud-init's guestinfo in its extraConfig; the plan creates nothing. Before the
clone, its intent is recorded on the template (act "clone <VM>", with the task once started), and
cleared once the clone ended: a run killed while the clone runs leaves it, and the next run waits
for that task and adopts the VM it made instead of cloning again (vCenter would refuse the second
clone of one name in a folder: DuplicateName). A destroy
(`Destroy_Task`) is refused without --allow-destroy, and a running VM is powered off first
(--allow-power-off); VMs the runbook does not name are never touched.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from gpuvm.errors import TaskError
from gpuvm.plan import Change, Disruption
from gpuvm.desired import Clone, CloneNetwork, DesiredVm
from gpuvm.steps.base import Context, Step
from gpuvm.steps.power import power_off
from gpuvm.names import vsphere_name
from gpuvm.vsphere.facts import VmFacts
from gpuvm.vsphere.intent import Intent
from gpuvm.vsphere.tasks import call, run_task, wait, wait_for_other_tasks

NAME = "vm.lifecycle"


@dataclass(frozen=True)
class CloneVm:
    clone: Clone


@dataclass(frozen=True)
class PowerOffForDestroy:
    pass


@dataclass(frozen=True)
class DestroyVm:
    pass


@dataclass(frozen=True)
class ClearCloneIntent:
    template: str  # the template (or VM) whose record of this VM's clone a killed run left


@dataclass(frozen=True)
class LifecycleFact:
    vm: VmFacts | None = None  # as vCenter has it (None: missing, or a clone the plan makes)
    clones_begun: dict[str, Intent] = field(default_factory=dict)  # template → its record of a clone of this VM


def observe(ctx: Context, vm: DesiredVm) -> LifecycleFact:
    """The VM as vCenter has it, and the clones of it an earlier run began (recorded on the templates,
    and on the VM the runbook clones it from)."""
    facts = ctx.inventory.vms.get(vm.name)
    act = clone_act(vm.name)
    sources = dict(ctx.inventory.templates)
    if vm.clone is not None and vm.clone.template in ctx.inventory.vms:
        sources[vm.clone.template] = ctx.inventory.vms[vm.clone.template]
    begun = {name: source.intents[act] for name, source in sources.items() if act in source.intents}
    return LifecycleFact(None if facts is None or facts.clone_of is not None else facts, begun)


def plan(vm: DesiredVm, fact: LifecycleFact) -> list[Change]:
    facts = fact.vm
    if facts is not None and vm.state == "present":  # made by a clone whose intent a killed run left behind
        return [Change(NAME, vm.name, f"template {template}", "clone intent",
                       f"clone begun by run {intent.run} at {intent.since}", "cleared (the VM exists)",
                       Disruption.NONE, ClearCloneIntent(template)) for template, intent in fact.clones_begun.items()]
    if vm.state == "absent":
        if facts is None:
            return []
        changes = []
        if facts.powered_on:
            changes.append(Change(NAME, vm.name, "vm", "power", "poweredOn", "poweredOff", Disruption.VM_POWER_OFF,
                                  PowerOffForDestroy()))
        return changes + [Change(NAME, vm.name, "vm", "exists", f"yes (on {facts.host})", "DESTROYED",
                                 Disruption.VM_DESTROY, DestroyVm())]
    if facts is None and vm.clone is not None:
        return [Change(NAME, vm.name, "vm", "exists", None,
                       f"create: clone of {vm.clone.template} on {vm.host}, datastore {vm.clone.datastore}"
                       + (f", folder {vm.clone.folder}" if vm.clone.folder else "")
                       + (f", resource pool {vm.clone.pool}" if vm.clone.pool else "")
                       + (f", network {vm.clone.network.name}" if vm.clone.network else "")
                       + "".join(f" (after the clone run {i.run} began at {i.since}, awaited first)"
                                 for t, i in fact.clones_begun.items() if t == vm.clone.template),
                       Disruption.NONE, CloneVm(vm.clone))]
    return []


def _clone(ctx: Context, vm: DesiredVm, clone: Clone) -> None:
    from pyVmomi import vim

    inventory = ctx.inventory
    source = inventory.templates.get(clone.template) or inventory.vms[clone.template]
    template = ctx.session.ref("VirtualMachine", source.moid)
    host = ctx.session.ref("HostSystem", inventory.hosts[vm.host].moid)
    folder, pool = call("read the template's folder and the host's resource pool",
                        lambda: (template.parent, host.parent.resourcePool))
    if clone.folder_moid:
        folder = ctx.session.ref("Folder", clone.folder_moid)
    if clone.pool_moid:
        pool = ctx.session.ref("ResourcePool", clone.pool_moid)
    spec = vim.vm.CloneSpec(powerOn=False, template=False, location=vim.vm.RelocateSpec(
        host=host, pool=pool, datastore=ctx.session.ref("Datastore", inventory.datastores[clone.datastore].moid)))
    if clone.guestinfo or clone.network:
        spec.config = vim.vm.ConfigSpec(extraConfig=[vim.option.OptionValue(key=k, value=v) for k, v in clone.guestinfo])
    if clone.network:
        spec.config.deviceChange = [_nic_edit(ctx, template, clone.network)]
    act = clone_act(vm.name)
    name = vsphere_name(vm.name)  # east/gpu-vm-01 (a name in several vCenters) is gpu-vm-01 in vCenter east
    made = _awaited(ctx, template, folder, name, source.intents.get(act))
    if made is None:
        made = _start_clone(ctx, template, vm.name, lambda: template.CloneVM_Task(folder=folder, name=name, spec=spec),
                            f"CloneVM_Task (clone of {clone.template})")
    _intents(ctx).clear(template, act)
    planned = inventory.vms[vm.name]  # the steps that follow find the new VM by its moid
    inventory.vms[vm.name] = planned.model_copy(update={"moid": made._moId, "clone_of": None})


def clone_act(vm: str) -> str:
    """The intent act on a template for its clone named `vm` (one per VM: clones of one template run at once),
    by the VM's name in vCenter: the template is in the VM's vCenter, whichever runbook names it."""
    return f"clone {vsphere_name(vm)}"


def _intents(ctx: Context) -> Any:
    if ctx.intents is None:
        raise TaskError("internal: no intent store for this run")
    return ctx.intents


def _start_clone(ctx: Context, template: Any, vm: str, start: Callable[[], Any], action: str) -> Any:
    """Record the clone's intent on the template, start it, record its task, wait. A clone that
    failed is no longer under way (intent cleared); one gpuvm stopped waiting for still is (kept)."""
    act, vm = clone_act(vm), vsphere_name(vm)
    _intents(ctx).record(template, act, f"clone to {vm}", vm=vm)
    task = call(action, start)
    _intents(ctx).record(template, act, f"clone to {vm}", vm=vm, task=task._moId)
    try:
        return wait(task, action, ctx.options.task_timeout)
    except TaskError:
        if _state(task) == "error":
            _intents(ctx).clear(template, act)
        raise


def _state(task: Any) -> str | None:
    """The task's state; None when vCenter no longer knows it."""
    try:
        return str(call("read clone task", lambda: task.info.state))
    except TaskError:
        return None


def _awaited(ctx: Context, template: Any, folder: Any, name: str, intent: Intent | None) -> Any:
    """The VM a clone begun by an earlier run made, once that clone ended; None when there was
    none or it made nothing (then this run clones)."""
    if intent is None:
        return None
    task = intent.data.get("task")
    if isinstance(task, str) and task:
        ref = ctx.session.ref("Task", task)
        try:
            wait(ref, f"the clone to {name} begun by run {intent.run}", ctx.options.task_timeout)
        except TaskError:  # it failed, or vCenter no longer knows it: look for the VM itself; still running: stop
            if _state(ref) in ("queued", "running"):
                raise
    else:  # killed before the task was recorded: whatever runs on the template may be it
        wait_for_other_tasks(ctx.session, template, ctx.options.task_timeout)
    index = ctx.session.content.searchIndex
    return call("find the cloned VM", lambda: index.FindChild(entity=folder, name=name))


def _nic_edit(ctx: Context, template: Any, network: CloneNetwork) -> Any:
    """The edit of the template's first NIC (as the clone gets it) onto the runbook's network: the
    template's device as read (one read, at apply), its backing replaced, connected at power-on."""
    from pyVmomi import vim

    devices = call("read the template's devices", lambda: template.config.hardware.device)
    nic = next((d for d in devices if d.key == network.nic_key), None)
    if not isinstance(nic, vim.vm.device.VirtualEthernetCard):  # gone since the plan: a minimal device of that class
        nic = getattr(vim.vm.device, network.nic_type)(key=network.nic_key)
    if network.portgroup_key:
        nic.backing = vim.vm.device.VirtualEthernetCard.DistributedVirtualPortBackingInfo(
            port=vim.dvs.PortConnection(switchUuid=network.switch_uuid, portgroupKey=network.portgroup_key))
    else:
        nic.backing = vim.vm.device.VirtualEthernetCard.NetworkBackingInfo(
            network=ctx.session.ref("Network", network.moid), deviceName=network.name)
    nic.connectable = vim.vm.device.VirtualDevice.ConnectInfo(startConnected=True, allowGuestControl=True,
                                                              connected=False)
    return vim.vm.device.VirtualDeviceSpec(operation=vim.vm.device.VirtualDeviceSpec.Operation.edit, device=nic)


def apply(ctx: Context, vm: DesiredVm, changes: list[Change]) -> None:
    for change in changes:
        action = change.action
        if isinstance(action, CloneVm):
            _clone(ctx, vm, action.clone)
        elif isinstance(action, ClearCloneIntent):
            source = ctx.inventory.templates.get(action.template) or ctx.inventory.vms[action.template]
            _intents(ctx).clear(ctx.session.ref("VirtualMachine", source.moid), clone_act(vm.name))
        elif isinstance(action, PowerOffForDestroy):
            power_off(ctx, vm.name)
        elif isinstance(action, DestroyVm):
            ref = ctx.session.ref("VirtualMachine", ctx.inventory.vms[vm.name].moid)
            run_task("Destroy_Task", ref.Destroy_Task, ctx.options.task_timeout)
            del ctx.inventory.vms[vm.name]


STEP = Step(NAME, "vm", observe, plan, apply)
