"""The inventory read's one request: every host, VM, datastore, folder, pool and network under a
ContainerView, with explicit property paths, by one PropertyCollector RetrievePropertiesEx (the
paging token followed, the view destroyed in `finally`). Never walk managed-object attributes in a
loop: each would be a network round trip. Kept apart from its decoding (inventory.py), so that the
request can be sent before the rest of gpuvm is loaded (gpuvm/read_ahead.py)."""

from __future__ import annotations

from typing import Any, Callable

from gpuvm.vsphere.session import Session

HOST_PROPERTIES = [
    "name",
    "parent",
    "network",
    "vm",
    "hardware.pciDevice",
    "hardware.numaInfo",
    "hardware.systemInfo.uuid",
    "hardware.memorySize",
    "hardware.cpuInfo.numCpuThreads",
    "config.pciPassthruInfo",
    "config.graphicsConfig",
    "config.graphicsInfo",
    "config.sharedPassthruGpuTypes",
    "capability.deviceRebindWithoutRebootSupported",
    "runtime.connectionState",
    "runtime.inMaintenanceMode",
    "runtime.powerState",
    "runtime.bootTime",
    "configManager.pciPassthruSystem",
    "configManager.graphicsManager",
    "customValue",
]

VM_PROPERTIES = [
    "name",
    "runtime.host",
    "runtime.powerState",
    "config.template",
    "config.firmware",
    "config.version",
    "config.hardware.numCPU",
    "config.hardware.memoryMB",
    "config.hardware.device",
    "config.extraConfig",
    "config.memoryReservationLockedToMax",
    "datastore",
    "summary.storage.committed",
    "customValue",
]

DATASTORE_PROPERTIES = ["name", "summary.freeSpace"]
FOLDER_PROPERTIES = ["name", "childType"]
POOL_PROPERTIES = ["name", "owner"]
NETWORK_PROPERTIES = ["name"]  # standard port groups (and opaque networks); distributed port groups add:
PORTGROUP_PROPERTIES = ["name", "key", "config.distributedVirtualSwitch"]
SWITCH_PROPERTIES = ["uuid", "config.uplinkPortgroup"]  # its uuid goes into a NIC's port backing; no NIC joins an uplink

Sent = Callable[..., list[Any]]  # send_retrieve's answer, not yet read: takes `retrieve`'s decoding

PAGE_SIZE = 5000  # objects per page; vCenter may return fewer


def filter_spec(view: Any) -> Any:
    """The PropertyCollector's filter: every object under `view`, with the property paths above."""
    from pyVmomi import vim, vmodl

    collector = vmodl.query.PropertyCollector
    traverse = collector.TraversalSpec(name="view", path="view", skip=False, type=vim.view.ContainerView)
    return collector.FilterSpec(
        objectSet=[collector.ObjectSpec(obj=view, skip=True, selectSet=[traverse])],
        propSet=[
            collector.PropertySpec(type=vim.HostSystem, pathSet=HOST_PROPERTIES),
            collector.PropertySpec(type=vim.VirtualMachine, pathSet=VM_PROPERTIES),
            collector.PropertySpec(type=vim.Datastore, pathSet=DATASTORE_PROPERTIES),
            collector.PropertySpec(type=vim.Folder, pathSet=FOLDER_PROPERTIES),
            collector.PropertySpec(type=vim.ResourcePool, pathSet=POOL_PROPERTIES),
            collector.PropertySpec(type=vim.Network, pathSet=NETWORK_PROPERTIES),
            collector.PropertySpec(type=vim.dvs.DistributedVirtualPortgroup, pathSet=PORTGROUP_PROPERTIES),
            collector.PropertySpec(type=vim.DistributedVirtualSwitch, pathSet=SWITCH_PROPERTIES),
        ],
    )


VIEW_TYPES = ["HostSystem", "VirtualMachine", "Datastore", "Folder", "ResourcePool", "Network",
              "DistributedVirtualSwitch"]


def retrieve(session: Session, **decoding: Any) -> list[Any]:
    """All host and VM objects with the properties above, in one request (plus paging).
    `decoding` goes to `session.call` (read_inventory leaves out the devices it never reads)."""
    return send_retrieve(session)(**decoding)


def send_retrieve(session: Session) -> Sent:
    """`retrieve`'s request sent now; its answer read (and the rest paged) by the function returned,
    which takes `retrieve`'s `decoding`: vCenter prepares the answer in between."""
    from pyVmomi import vim, vmodl

    content = session.content
    view = content.viewManager.CreateContainerView(content.rootFolder, [getattr(vim, t) for t in VIEW_TYPES], True)
    try:
        collector = content.propertyCollector
        options = vmodl.query.PropertyCollector.RetrieveOptions(maxObjects=PAGE_SIZE)
        first = session.send(collector, "RetrievePropertiesEx", [filter_spec(view)], options)
    except BaseException:
        view.DestroyView()
        raise

    def objects(**decoding: Any) -> list[Any]:
        try:
            result = first(decoding.get("parse"))
            objects: list[Any] = []
            while result is not None:
                objects.extend(result.objects)
                if not result.token:
                    break
                result = session.call(collector, "ContinueRetrievePropertiesEx", result.token, **decoding)
            return objects
        finally:
            view.DestroyView()

    return objects
