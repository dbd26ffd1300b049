"""Every host and VM of a vCenter as facts, from the one request of retrieve.py.

The answers are read by lxml straight into the property values converted here (inventory_xml.py),
several times faster than pyVmomi's decoding; a page it cannot read is decoded by soap_xml.py, or
pyVmomi, as any answer.
"""

from __future__ import annotations

from typing import Any

from gpuvm import collector
from gpuvm.pci import pci_id, unsigned16
from gpuvm.vsphere.facts import (DatastoreFacts, Graphics, HostFacts, Inventory, NetworkFacts, PciDevice, VmFacts, VmNic,
                                  VmPciDevice)
from gpuvm.vsphere import intent, inventory_xml, lock, owned
from gpuvm.vsphere.intent import field_key, value_of
from gpuvm.vsphere.retrieve import Sent, send_retrieve
from gpuvm.vsphere.session import Session
from gpuvm.vsphere.tasks import call

def _props(obj: Any) -> dict[str, Any]:
    return {p.name: p.val for p in (obj.propSet or [])}


def host_facts(moid: str, props: dict[str, Any], intent_key: int | None = None,
               owned_key: int | None = None) -> HostFacts:
    numa: dict[str, int] = {}
    numa_info = props.get("hardware.numaInfo")
    for index, node in enumerate(getattr(numa_info, "numaNode", None) or []):
        for pci in node.pciId or []:
            numa[pci] = int(node.typeId) if node.typeId is not None else index
    passthru = {p.id: p for p in props.get("config.pciPassthruInfo") or []}
    devices = []
    for dev in props.get("hardware.pciDevice") or []:
        info = passthru.get(dev.id)
        devices.append(PciDevice(
            id=dev.id, vendor_id=unsigned16(dev.vendorId), device_id=unsigned16(dev.deviceId),
            vendor_name=dev.vendorName or "", device_name=dev.deviceName or "", class_id=unsigned16(dev.classId),
            numa_node=numa.get(dev.id),
            passthru_capable=bool(info and info.passthruCapable),
            passthru_enabled=bool(info and info.passthruEnabled),
            passthru_active=bool(info and info.passthruActive),
        ))
    parent = props.get("parent")
    intents = intent.read(value_of(props.get("customValue"), intent_key), props["name"], "host")
    mine, foreign = owned.read(value_of(props.get("customValue"), owned_key), props["name"])
    return HostFacts(
        name=props["name"], moid=moid, compute_resource=parent._moId if parent is not None else "",
        networks=[ref._moId for ref in props.get("network") or []],
        system_uuid=props.get("hardware.systemInfo.uuid") or "",
        memory_mb=int(props.get("hardware.memorySize") or 0) // (1024 * 1024),
        cpu_threads=int(props.get("hardware.cpuInfo.numCpuThreads") or 0),
        connection_state=str(props.get("runtime.connectionState") or ""),
        in_maintenance=bool(props.get("runtime.inMaintenanceMode")),
        power_state=str(props.get("runtime.powerState") or ""),
        booted=boot_time(props.get("runtime.bootTime")),
        rebind_without_reboot=bool(props.get("capability.deviceRebindWithoutRebootSupported")),
        graphics=_graphics(props.get("config.graphicsConfig"), props.get("config.graphicsInfo") or []),
        vgpu_profiles=list(props.get("config.sharedPassthruGpuTypes") or []),
        gpu_memory_mb={g.pciId: int(g.memorySizeInKB) // 1024 for g in props.get("config.graphicsInfo") or []
                       if g.pciId and g.memorySizeInKB},
        pci=devices,
        passthru_system=_moid(props.get("configManager.pciPassthruSystem")),
        graphics_manager=_moid(props.get("configManager.graphicsManager")),
        intents=intents.acts, owned=mine, foreign=intents.foreign + ([foreign] if foreign else []),
        vm_moids=[ref._moId for ref in props.get("vm") or []],
    )


def boot_time(value: Any) -> str:
    """A host's `runtime.bootTime` as HostFacts and the reboot memo keep it (ISO 8601; "" unknown)."""
    if value is None:
        return ""
    return value.isoformat() if hasattr(value, "isoformat") else str(value)


def _graphics(config: Any, info: list[Any]) -> Graphics:
    running = {gpu.pciId: gpu.graphicsType for gpu in info if gpu.pciId and gpu.graphicsType}
    if config is None:
        return Graphics(running=running)
    return Graphics(default_type=config.hostDefaultGraphicsType or "shared",
                    assignment_policy=config.sharedPassthruAssignmentPolicy or "performance",
                    devices={d.deviceId: d.graphicsType for d in config.deviceType or []}, running=running)


def _moid(ref: Any) -> str | None:
    return ref._moId if ref is not None else None


def vm_pci_devices(devices: list[Any]) -> list[VmPciDevice]:
    from pyVmomi import vim

    out = []
    for dev in devices or []:
        if not isinstance(dev, vim.vm.device.VirtualPCIPassthrough):
            continue
        backing = dev.backing
        label = dev.deviceInfo.label if dev.deviceInfo else ""
        if isinstance(backing, vim.vm.device.VirtualPCIPassthrough.VmiopBackingInfo):
            out.append(VmPciDevice(key=dev.key, kind="vgpu", label=label, profile=backing.vgpu))
        elif isinstance(backing, vim.vm.device.VirtualPCIPassthrough.DynamicBackingInfo):
            allowed, *more = backing.allowedDevice or [None]
            out.append(VmPciDevice(key=dev.key, kind="dynamic", label=label,
                                   vendor_id=unsigned16(allowed.vendorId) if allowed else None,
                                   device_id=unsigned16(allowed.deviceId) if allowed else None,
                                   assigned=backing.assignedId or None,
                                   also_allowed=[pci_id(unsigned16(a.vendorId), unsigned16(a.deviceId)) for a in more]))
        elif isinstance(backing, vim.vm.device.VirtualPCIPassthrough.DeviceBackingInfo):
            out.append(VmPciDevice(key=dev.key, kind="classic", label=label, address=backing.id,
                                   vendor_id=unsigned16(backing.vendorId or 0),
                                   device_id=int(backing.deviceId, 16) if backing.deviceId else None))
    return out


def vm_nic(devices: list[Any]) -> VmNic | None:
    """The first virtual NIC (in device order, as the guest numbers them), its key and class."""
    from pyVmomi import vim

    for dev in devices or []:
        if isinstance(dev, vim.vm.device.VirtualEthernetCard):
            return VmNic(key=dev.key, type=type(dev).__name__.rpartition(".")[2])
    return None


def vm_facts(moid: str, props: dict[str, Any], host_names: dict[str, str],
             datastore_names: dict[str, str] | None = None, intent_key: int | None = None) -> VmFacts:
    host_ref = props.get("runtime.host")
    intents = intent.read(value_of(props.get("customValue"), intent_key), props["name"], "vm")
    return VmFacts(
        name=props["name"], moid=moid,
        host=host_names.get(host_ref._moId) if host_ref is not None else None,
        power_state=str(props.get("runtime.powerState") or "poweredOff"),
        cpus=int(props.get("config.hardware.numCPU") or 1),
        memory_mb=int(props.get("config.hardware.memoryMB") or 0),
        firmware=str(props.get("config.firmware") or "bios"),
        reservation_locked=bool(props.get("config.memoryReservationLockedToMax")),
        hw_version=str(props.get("config.version") or ""),
        extra_config={o.key: str(o.value) for o in props.get("config.extraConfig") or []},
        pci=vm_pci_devices(props.get("config.hardware.device") or []),
        nic=vm_nic(props.get("config.hardware.device") or []),
        datastores=[(datastore_names or {}).get(ref._moId, ref._moId) for ref in props.get("datastore") or []],
        disk_gb=-(-int(props.get("summary.storage.committed") or 0) >> 30),
        intents=intents.acts, foreign=intents.foreign,
    )


def read_inventory(session: Session, alone: bool = True, sent: Sent | None = None) -> Inventory:
    """The vCenter's inventory. `alone`: no other process reads meanwhile (vsphere/fleet.py's children
    do), so that a large answer's pieces are parsed by a second thread, on the core left free.
    `sent`: the read already sent (`send_retrieve`), its answer read here."""
    with collector.paused():  # the read's objects made in bulk
        parse = inventory_xml.parse_page if alone else inventory_xml.parse_whole
        return _read_inventory(session, (sent or send_retrieve(session))(parse=parse))


def _read_inventory(session: Session, objects: list[Any]) -> Inventory:
    from pyVmomi import vim

    fields = call("read custom attributes", lambda: session.content.customFieldsManager.field)
    intent_key, owned_key = field_key(fields), field_key(fields, owned.FIELD)
    hosts: dict[str, HostFacts] = {}
    host_names: dict[str, str] = {}
    datastores: dict[str, DatastoreFacts] = {}
    folders: dict[str, list[str]] = {}
    pools: dict[str, list[tuple[str, str]]] = {}
    networks: list[tuple[dict[str, Any], NetworkFacts]] = []
    switches: dict[str, str] = {}  # distributed switch moid → uuid
    uplinks: set[str] = set()  # the switches' uplink port groups: not a network for a VM
    vm_objects = []
    for item in objects:  # (reference, properties) from inventory_xml; ObjectContent where it left the page
        obj, props = item if isinstance(item, tuple) else (item.obj, _props(item))
        if isinstance(obj, vim.HostSystem):
            facts = host_facts(obj._moId, props, intent_key, owned_key)
            hosts[facts.name] = facts
            host_names[facts.moid] = facts.name
        elif isinstance(obj, vim.Datastore):
            datastores[props["name"]] = DatastoreFacts(name=props["name"], moid=obj._moId,
                                                       free_gb=int(props.get("summary.freeSpace") or 0) >> 30)
        elif isinstance(obj, vim.Folder):
            if "VirtualMachine" in (props.get("childType") or []):
                folders.setdefault(props["name"], []).append(obj._moId)
        elif isinstance(obj, vim.ResourcePool):  # vApps too: a vApp is a resource pool
            owner = props.get("owner")
            pools.setdefault(props["name"], []).append((obj._moId, owner._moId if owner is not None else ""))
        elif isinstance(obj, vim.Network):  # distributed port groups too
            networks.append((props, NetworkFacts(name=props["name"], moid=obj._moId,
                                                 portgroup_key=props.get("key") or "")))
        elif isinstance(obj, vim.DistributedVirtualSwitch):
            switches[obj._moId] = props.get("uuid") or ""
            uplinks.update(ref._moId for ref in props.get("config.uplinkPortgroup") or [])
        else:
            vm_objects.append((obj._moId, props))
    by_name: dict[str, list[NetworkFacts]] = {}
    for props, net in networks:
        if net.moid in uplinks:
            continue
        switch = props.get("config.distributedVirtualSwitch")
        if switch is not None:
            net.switch_uuid = switches.get(switch._moId, "")
        by_name.setdefault(net.name, []).append(net)
    datastore_names = {d.moid: d.name for d in datastores.values()}
    vms, templates = {}, {}
    for moid, props in vm_objects:
        facts = vm_facts(moid, props, host_names, datastore_names, intent_key)
        (templates if props.get("config.template") else vms)[facts.name] = facts
    return Inventory(source=session.target.url, hosts=hosts, vms=vms, templates=templates, datastores=datastores,
                     folders=folders, pools=pools, networks=by_name, foreign=_root_foreign(session, fields))


def _root_foreign(session: Session, fields: Any) -> list[Any]:
    """The values of the root folder's leases and locks gpuvm did not write (read only when such attributes exist)."""
    names = {f.key: f.name for f in fields or [] if f.name.startswith((lock.PREFIX, lock.LEASE_PREFIX))}
    if not names:
        return []
    root = session.content.rootFolder
    values = {v.key: v.value for v in call("read lock holders", lambda: root.customValue) or [] if v.key in names}
    return lock.foreign_values({names[key]: value for key, value in values.items()})
