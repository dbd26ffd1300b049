"""vm.hardware: firmware, CPUs, memory, full memory reservation, and the VM's PCI devices.

Devices (GPUs by classic DirectPath, dynamic DirectPath or vGPU profile; passed-through NICs)
are compared as sets: present ones are kept, missing ones added, others removed — never a second
copy. Changes to a powered-on VM are marked as needing a power-off (devices are added only while
the VM is off; CPUs, memory and firmware are not hot-changed).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

from gpuvm.plan import Change, Disruption
from gpuvm.desired import DesiredDevice, DesiredVm
from gpuvm.steps.base import Context, Step, present, vm_facts
from gpuvm.steps.power import reconfigure
from gpuvm.vsphere.facts import VmFacts, VmPciDevice

NAME = "vm.hardware"


@dataclass(frozen=True)
class SetHardware:
    field: str  # firmware | cpus | memory_mb | memoryReservationLockedToMax
    value: Any


@dataclass(frozen=True)
class AddDevice:
    device: DesiredDevice
    system_uuid: str  # the vCenter's or host's system id, for classic passthrough backings


@dataclass(frozen=True)
class RemoveDevice:
    key: int


def _identity(device: DesiredDevice | VmPciDevice) -> tuple:
    """What makes two devices the same device: its address, PCI id or vGPU profile, by kind."""
    if device.kind == "classic":
        return ("classic", device.address)
    if device.kind == "dynamic":
        return ("dynamic", device.vendor_id, device.device_id)
    return ("vgpu", device.profile)


def _devices(devices: list[DesiredDevice] | list[VmPciDevice]) -> Counter:
    return Counter(_identity(d) for d in devices)


def _device_changes(vm: DesiredVm, facts: VmFacts, disruption: Disruption) -> list[Change]:
    wanted, have = _devices(vm.devices), _devices(facts.pci)
    changes = []
    surplus = have - wanted
    for dev in facts.pci:
        ident = _identity(dev)
        if surplus[ident] > 0:
            surplus[ident] -= 1
            changes.append(Change(NAME, vm.name, f"pci device {dev.key}", "device", dev.describe(), None,
                                  disruption, RemoveDevice(dev.key)))
    missing = wanted - have
    for dev in vm.devices:
        ident = _identity(dev)
        if missing[ident] > 0:
            missing[ident] -= 1
            changes.append(Change(NAME, vm.name, "pci device (new)", "device", None, dev.describe(), disruption,
                                  AddDevice(dev, vm.system_uuid)))
    return changes


def plan(vm: DesiredVm, facts: VmFacts) -> list[Change]:
    off = Disruption.VM_POWER_OFF if facts.powered_on else Disruption.NONE
    changes = []

    def want(field: str, before: Any, after: Any, disruption: Disruption = off) -> None:
        if after is not None and before != after:
            changes.append(Change(NAME, vm.name, "vm", field, before, after, disruption, SetHardware(field, after)))

    want("firmware", facts.firmware, vm.firmware)
    want("cpus", facts.cpus, vm.cpus)
    want("memory_mb", facts.memory_mb, vm.memory_mb)
    if vm.reservation_locked:  # reserving all memory can be done while the VM runs
        want("memoryReservationLockedToMax", facts.reservation_locked, True, Disruption.NONE)
    return changes + _device_changes(vm, facts, off)


def _signed16(value: int) -> int:
    return value - 0x10000 if value > 0x7FFF else value


def device_spec(dev: DesiredDevice, system_uuid: str, key: int) -> Any:
    from pyVmomi import vim

    passthrough = vim.vm.device.VirtualPCIPassthrough
    if dev.kind == "classic":
        backing = passthrough.DeviceBackingInfo(
            id=dev.address, deviceId=format(dev.device_id or 0, "x"), vendorId=_signed16(dev.vendor_id or 0),
            systemId=system_uuid, deviceName=dev.label)
    elif dev.kind == "dynamic":
        allowed = passthrough.AllowedDevice(vendorId=_signed16(dev.vendor_id or 0), deviceId=_signed16(dev.device_id or 0))
        backing = passthrough.DynamicBackingInfo(allowedDevice=[allowed], customLabel=dev.label, deviceName="")
    else:
        backing = passthrough.VmiopBackingInfo(vgpu=dev.profile)
    return vim.vm.device.VirtualDeviceSpec(operation=vim.vm.device.VirtualDeviceSpec.Operation.add,
                                           device=passthrough(key=key, backing=backing))


CONFIG_SPEC_FIELDS = {"firmware": "firmware", "cpus": "numCPUs", "memory_mb": "memoryMB",
                      "memoryReservationLockedToMax": "memoryReservationLockedToMax"}


def config_spec(changes: list[Change]) -> Any:
    from pyVmomi import vim

    spec = vim.vm.ConfigSpec()
    device_changes = []
    for index, change in enumerate(changes):
        action = change.action
        if isinstance(action, SetHardware):
            setattr(spec, CONFIG_SPEC_FIELDS[action.field], action.value)
        elif isinstance(action, RemoveDevice):
            device_changes.append(vim.vm.device.VirtualDeviceSpec(
                operation=vim.vm.device.VirtualDeviceSpec.Operation.remove,
                device=vim.vm.device.VirtualPCIPassthrough(key=action.key)))
        elif isinstance(action, AddDevice):
            device_changes.append(device_spec(action.device, action.system_uuid, -100 - index))
    if device_changes:
        spec.deviceChange = device_changes
    return spec


def _check_unchanged(config: Any, planned: VmFacts) -> None:
    """Devices are added exactly once: refuse if the VM's devices changed since the plan was made
    (a task of a killed run finishing late, another run, or a person at the console)."""
    from gpuvm.errors import TaskError
    from gpuvm.vsphere.inventory import vm_pci_devices

    now = vm_pci_devices(config.hardware.device)
    if _devices(now) != _devices(planned.pci):
        raise TaskError(f"the VM's PCI devices changed since the plan was made "
                        f"(now: {', '.join(d.describe() for d in now) or 'none'}); run apply again to re-plan")


def apply(ctx: Context, vm: DesiredVm, changes: list[Change]) -> None:
    planned = ctx.inventory.vms[vm.name]
    devices = any(isinstance(c.action, (AddDevice, RemoveDevice)) for c in changes)
    reconfigure(ctx, vm.name, changes, config_spec(changes),
                check=(lambda config: _check_unchanged(config, planned)) if devices else None)


STEP = Step(NAME, "vm", vm_facts, plan, apply, wanted=present, restarts_guest=True)
