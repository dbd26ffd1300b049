"""The inventory read decoded by lxml (vsphere/soap_xml.py) against pyVmomi's own decoding of the same
read, field by field, on a simulated vCenter whose VMs hold every kind of PCI device."""

from __future__ import annotations

import collections
import contextlib
from collections.abc import Iterator
from typing import Any

import pytest
from pyVmomi import VmomiSupport, vim, vmodl

from gpusim import Simulator
from gpuvm.runbook.vcenters import VCenter
from gpuvm.vsphere import inventory, retrieve
from gpuvm.vsphere.intent import IntentStore
from gpuvm.vsphere.session import Session, resolve_target

from .vcenter import env_for, pyvmomi

pytestmark = pytest.mark.integration

Device = vim.vm.device.VirtualPCIPassthrough


def wait(task: Any) -> None:
    from pyVim.task import WaitForTask

    WaitForTask(task)


def add(vm: Any, backing: Any, **config: Any) -> None:
    change = vim.vm.device.VirtualDeviceSpec(operation="add", device=Device(key=-1, backing=backing))
    wait(vm.ReconfigVM_Task(vim.vm.ConfigSpec(deviceChange=[change], memoryReservationLockedToMax=True, **config)))


@pytest.fixture(scope="module")
def lab():
    """Two hosts: passthrough on and active (rebind), graphics changed, an intent; VMs with a classic
    DirectPath GPU, extraConfig and a NIC after other devices, a running dynamic DirectPath VM
    (assignedId), a vGPU, an intent; a template, a VM folder, a resource pool, a network."""
    with Simulator(hosts=2, vms_per_host=3, rebind=True, templates=["ubuntu-gpu"], vm_folders=["gpu-train"],
                   resource_pools=["training"], networks=["gpu-net:esx-02"]) as sim, pyvmomi(sim) as si:
        content = si.RetrieveContent()
        view = content.viewManager.CreateContainerView(content.rootFolder, [vim.ManagedEntity], True)
        objects = {o.name: o for o in view.view if isinstance(o, (vim.HostSystem, vim.VirtualMachine))}
        view.DestroyView()
        host = objects["esx-01"]
        host.configManager.pciPassthruSystem.UpdatePassthruConfig(
            [vim.host.PciPassthruConfig(id=i, passthruEnabled=True) for i in ("0000:17:00.0", "0000:b1:00.0")])
        add(objects["esx-01-vm1"], Device.DeviceBackingInfo(
            id="0000:17:00.0", deviceId="20b5", vendorId=0x10DE, systemId=host.hardware.systemInfo.uuid),
            firmware="efi", extraConfig=[vim.option.OptionValue(key="pciPassthru.use64bitMMIO", value="TRUE"),
                                         vim.option.OptionValue(key="pciPassthru.64bitMMIOSizeGB", value="256")])
        add(objects["esx-01-vm2"], Device.DynamicBackingInfo(
            allowedDevice=[Device.AllowedDevice(vendorId=0x10DE, deviceId=0x20B5)], customLabel="a100"),
            firmware="efi", extraConfig=[vim.option.OptionValue(key="pciPassthru.use64bitMMIO", value="TRUE"),
                                         vim.option.OptionValue(key="pciPassthru.64bitMMIOSizeGB", value="256")])
        wait(objects["esx-01-vm2"].PowerOnVM_Task())
        objects["esx-02"].configManager.graphicsManager.UpdateGraphicsConfig(vim.host.GraphicsConfig(
            hostDefaultGraphicsType="sharedDirect", sharedPassthruAssignmentPolicy="performance"))
        add(objects["esx-02-vm1"], Device.VmiopBackingInfo(vgpu="grid_a100-20c"))
        nic = vim.vm.device.VirtualVmxnet3(key=-2, backing=vim.vm.device.VirtualEthernetCard.NetworkBackingInfo(
            deviceName="VM Network"))
        wait(objects["esx-01-vm1"].ReconfigVM_Task(vim.vm.ConfigSpec(deviceChange=[
            vim.vm.device.VirtualDeviceSpec(operation="add", device=nic)])))
        with pytest.MonkeyPatch.context() as env:  # the simulator's settings, for this fixture's lifetime only
            for key, value in env_for(sim).items():
                env.setenv(key, value)
            with Session(resolve_target(VCenter(password_env="GPUVM_VCENTER_PASSWORD"))) as session:
                store = IntentStore(session, "c0ffee000003")
                store.record(objects["esx-01"], "rebooted", "for changes", booted="2026-11-25T16:50:17+00:00",
                             changes=[["0123456789ab"]])
                store.record(objects["esx-01-vm1"], "power-off", "reboot of esx-01", host="esx-01", restore="poweredOn")
            yield sim


@contextlib.contextmanager
def decoded_by_pyvmomi(session: Session) -> Iterator[None]:
    """Every call of `session` (sent ahead or not) made and decoded by pyVmomi (the stub's own call)."""
    call, send = session.call, session.send
    session.call = lambda mo, method, *args, **_: getattr(mo, method)(*args)  # type: ignore[method-assign]
    session.send = lambda mo, method, *args: lambda parse=None: getattr(mo, method)(*args)  # type: ignore[method-assign]
    try:
        yield
    finally:
        session.call, session.send = call, send  # type: ignore[method-assign]


def pyvmomi_retrieve(session: Session) -> list[Any]:
    """retrieve.retrieve, decoded by pyVmomi."""
    with decoded_by_pyvmomi(session):
        return retrieve.retrieve(session)


def same(a: Any, b: Any, where: str = "") -> None:
    """Field by field: data objects by every property, references by type and moid, the rest by value and type."""
    assert type(a) is type(b), f"{where}: {type(a).__name__} != {type(b).__name__}"
    if isinstance(a, VmomiSupport.DataObject):
        for prop in a._GetPropertyList():
            same(getattr(a, prop.name), getattr(b, prop.name), f"{where}.{prop.name}")
    elif isinstance(a, list):
        assert len(a) == len(b), f"{where}: {len(a)} != {len(b)} items"
        for i, (x, y) in enumerate(zip(a, b)):
            same(x, y, f"{where}[{i}]")
    elif isinstance(a, VmomiSupport.ManagedObject):
        assert a._moId == b._moId, where
    else:
        assert a == b, f"{where}: {a!r} != {b!r}"


def test_lxml_decodes_the_inventory_read_as_pyvmomi_does(lab):
    with Session(resolve_target(VCenter(password_env="GPUVM_VCENTER_PASSWORD"))) as session:
        fast = retrieve.retrieve(session)
        slow = pyvmomi_retrieve(session)
        kinds = collections.Counter(type(o.obj).__name__ for o in fast)
        assert len(fast) == len(slow) and kinds == {"vim.HostSystem": 2, "vim.VirtualMachine": 7, "vim.Datastore": 1,
                                                    "vim.Folder": 5, "vim.ResourcePool": 2, "vim.Network": 2,
                                                    "vim.dvs.DistributedVirtualPortgroup": 2,
                                                    "vim.DistributedVirtualSwitch": 1}, kinds
        for a, b in zip(sorted(fast, key=lambda o: o.obj._moId), sorted(slow, key=lambda o: o.obj._moId)):
            same(a, b, a.obj._moId)
        facts = inventory.read_inventory(session)
    vms = facts.vms
    assert [d.kind for d in vms["esx-01-vm1"].pci] == ["classic"]
    assert vms["esx-01-vm2"].pci[0].assigned in ("0000:17:00.0", "0000:b1:00.0") and vms["esx-02-vm1"].pci[0].profile == "grid_a100-20c"
    assert facts.hosts["esx-01"].device("0000:17:00.0").passthru_active
    assert facts.hosts["esx-02"].graphics.default_type == "sharedDirect"
    pg = facts.networks["DC0_DVPG0"][0]  # a distributed port group: its key and its switch's uuid
    assert pg.portgroup_key == pg.moid and pg.switch_uuid and not facts.networks["VM Network"][0].distributed
    assert pg.moid in facts.hosts["esx-01"].networks and facts.networks["VM Network"][0].moid in facts.hosts["esx-02"].networks


def pyvmomi_inventory(session: Session) -> Any:
    """read_inventory of pyVmomi's own decoding of every answer."""
    with decoded_by_pyvmomi(session):
        return inventory.read_inventory(session)


@pytest.mark.parametrize("piece_bytes", [None, 3000])
def test_the_facts_of_inventory_xmls_reading_are_those_of_pyvmomis_decoding(lab, mocker, piece_bytes):
    """read_inventory reads the answer with inventory_xml (the properties it asks for, only the VM
    devices it reads): the facts are those it makes of pyVmomi's decoding of the whole answer. And
    so when the answer is parsed in pieces (small here: a 4,096-VM answer's are 2 MB)."""
    from gpuvm.vsphere import inventory_xml

    if piece_bytes:
        mocker.patch.object(inventory_xml, "PIECE_BYTES", piece_bytes)
    trees = mocker.spy(inventory_xml, "xml_tree")  # one per piece
    pages = mocker.spy(inventory_xml, "parse_page")
    with Session(resolve_target(VCenter(password_env="GPUVM_VCENTER_PASSWORD"))) as session:
        fast = inventory.read_inventory(session)
        assert pages.call_count == 1 and pages.spy_exception is None and len(pages.spy_return.objects) == 22
        assert (trees.call_count > 2) if piece_bytes else (trees.call_count == 1)
        slow = pyvmomi_inventory(session)
    assert fast.model_dump(exclude={"taken"}) == slow.model_dump(exclude={"taken"})
    vm = fast.vms["esx-01-vm1"]  # a GPU and a NIC read among the devices left unread
    assert [d.kind for d in vm.pci] == ["classic"] and vm.nic is not None and vm.nic.type == "VirtualVmxnet3"
    assert vm.intents["power-off"].data == {"host": "esx-01", "restore": "poweredOn"}
    assert "rebooted" in fast.hosts["esx-01"].intents
    assert fast.templates and fast.folders["gpu-train"] and fast.pools["training"] and fast.networks["gpu-net"]
    assert any(h.pci and h.pci[0].numa_node is not None for h in fast.hosts.values())
    assert fast.hosts["esx-01"].booted and fast.hosts["esx-01"].vm_moids and fast.vms["esx-01-vm1"].extra_config


def test_a_page_inventory_xml_cannot_read_is_decoded_by_soap_xml_with_the_same_facts(lab, mocker):
    from gpuvm.vsphere import inventory_xml, soap_xml

    mocker.patch.dict(inventory_xml.READERS)
    del inventory_xml.READERS["config.firmware"]  # a property it does not know: the page goes on to soap_xml
    decodes = mocker.spy(soap_xml, "decode_response")
    with Session(resolve_target(VCenter(password_env="GPUVM_VCENTER_PASSWORD"))) as session:
        fast = inventory.read_inventory(session)
        assert isinstance(decodes.spy_return, vmodl.query.PropertyCollector.RetrieveResult)
        slow = pyvmomi_inventory(session)
    assert fast.model_dump(exclude={"taken"}) == slow.model_dump(exclude={"taken"})
    assert fast.vms["esx-01-vm1"].firmware == "efi"


def test_faults_raised_faults_in_the_data_decoded_by_pyvmomi_requests_counted(lab):
    with Session(resolve_target(VCenter(password_env="GPUVM_VCENTER_PASSWORD"))) as session:
        collector = session.content.propertyCollector
        lab.requests(reset=True)
        with pytest.raises(vmodl.fault.ManagedObjectNotFound):  # a fault answer, raised as pyVmomi raises it
            session.call(collector, "RetrievePropertiesEx", [vmodl.query.PropertyCollector.FilterSpec(
                objectSet=[vmodl.query.PropertyCollector.ObjectSpec(obj=vim.HostSystem("host-nowhere"))],
                propSet=[vmodl.query.PropertyCollector.PropertySpec(type=vim.HostSystem, pathSet=["name"])])],
                vmodl.query.PropertyCollector.RetrieveOptions())
        session.content.sessionManager.Logout()  # gpusim then answers each property with a fault
        root = session.content.rootFolder
        result = session.call(collector, "RetrievePropertiesEx", [vmodl.query.PropertyCollector.FilterSpec(
            objectSet=[vmodl.query.PropertyCollector.ObjectSpec(obj=root)],
            propSet=[vmodl.query.PropertyCollector.PropertySpec(type=vim.Folder, pathSet=["name"])])],
            vmodl.query.PropertyCollector.RetrieveOptions())
        missing = result.objects[0].missingSet[0]  # a fault in the data: soap_xml leaves it to pyVmomi
        assert missing.path == "name" and isinstance(missing.fault, vim.fault.NotAuthenticated)
        assert lab.requests() == {"RetrievePropertiesEx": 2, "Logout": 1}
        assert session.counter.calls["RetrievePropertiesEx"] == 2


def test_a_list_answer_decoded_by_lxml_as_pyvmomi_does(lab, mocker):
    from gpuvm.vsphere import soap_xml

    fast_decodes = mocker.spy(soap_xml, "decode_response")
    with Session(resolve_target(VCenter(password_env="GPUVM_VCENTER_PASSWORD"))) as session:
        content = session.content
        traverse = vmodl.query.PropertyCollector.TraversalSpec(name="recent", path="recentTask", skip=False,
                                                               type=vim.TaskManager)
        spec = vmodl.query.PropertyCollector.FilterSpec(  # the tasks the fixture ran: a list answer
            objectSet=[vmodl.query.PropertyCollector.ObjectSpec(obj=content.taskManager, skip=True,
                                                                selectSet=[traverse])],
            propSet=[vmodl.query.PropertyCollector.PropertySpec(type=vim.Task, pathSet=["info.entity", "info.state"])])
        fast = session.call(content.propertyCollector, "RetrieveContents", [spec])
        slow = content.propertyCollector.RetrieveContents([spec])
    assert fast_decodes.spy_exception is None and len(fast) == len(slow) >= 4
    same(fast, slow, "RetrieveContents")
