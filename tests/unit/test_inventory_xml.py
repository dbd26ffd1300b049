"""inventory_xml.parse_page on answers written here: the next page's token, an empty answer, and what
it leaves to soap_xml (a fault in the data, an unknown property)."""

from __future__ import annotations

import pytest
from pyVmomi import SoapAdapter, vim

from gpuvm.vsphere.inventory_xml import parse_page
from gpuvm.vsphere.soap_xml import Unsupported

ENVELOPE = ('<?xml version="1.0" encoding="UTF-8"?><soapenv:Envelope xmlns:soapenv="http://schemas.xmlsoap.org/'
            'soap/envelope/" xmlns:xsd="http://www.w3.org/2001/XMLSchema" xmlns:xsi="http://www.w3.org/2001/'
            'XMLSchema-instance"><soapenv:Body><RetrievePropertiesExResponse xmlns="urn:vim25">{}'
            '</RetrievePropertiesExResponse></soapenv:Body></soapenv:Envelope>')
HOST = ('<objects><obj type="HostSystem">host-1</obj>'
        '<propSet><name>name</name><val xsi:type="xsd:string">esx-01</val></propSet>'
        '<propSet><name>runtime.inMaintenanceMode</name><val xsi:type="xsd:boolean">false</val></propSet>'
        '<propSet><name>hardware.memorySize</name><val xsi:type="xsd:long">1099511627776</val></propSet>'
        '<propSet><name>vm</name><val xsi:type="ArrayOfManagedObjectReference">'
        '<ManagedObjectReference type="VirtualMachine">vm-7</ManagedObjectReference></val></propSet>{}</objects>')


@pytest.fixture(scope="module")
def stub():
    return SoapAdapter.SoapStubAdapter(host="localhost", version="vim.version.version9")


def answer(body: str) -> bytes:
    return ENVELOPE.format(body).encode()


def test_a_page_with_a_token_reads_its_objects_and_the_token(stub):
    page = parse_page(answer(f"<returnval><token>page-2</token>{HOST.format('')}</returnval>"), object, stub)
    assert page is not None and page.token == "page-2"
    [(obj, props)] = page.objects
    assert isinstance(obj, vim.HostSystem) and obj._moId == "host-1"
    assert props["name"] == "esx-01" and props["runtime.inMaintenanceMode"] is False
    assert props["hardware.memorySize"] == 1 << 40 and [ref._moId for ref in props["vm"]] == ["vm-7"]


def test_the_last_page_has_no_token_and_an_empty_answer_no_page(stub):
    assert parse_page(answer(f"<returnval>{HOST.format('')}</returnval>"), object, stub).token is None
    assert parse_page(answer(""), object, stub) is None


@pytest.mark.parametrize("extra", [
    '<missingSet><path>name</path><fault><fault xsi:type="NotAuthenticated"/></fault></missingSet>',
    '<propSet><name>summary.quickStats</name><val xsi:type="HostListSummaryQuickStats"/></propSet>',
    '<propSet><name>hardware.cpuInfo.numCpuThreads</name><val xsi:type="xsd:short"/></propSet>',
])
def test_a_fault_in_the_data_or_a_property_it_does_not_ask_for_is_left_to_soap_xml(stub, extra):
    with pytest.raises(Unsupported):
        parse_page(answer(f"<returnval>{HOST.format(extra)}</returnval>"), object, stub)


HOST_DEVICES = (
    '<propSet><name>hardware.pciDevice</name><val xsi:type="ArrayOfHostPciDevice">'
    '<HostPciDevice><id>0000:00:00.0</id><classId>1536</classId><bus>0</bus><slot>0</slot><function>0</function>'
    '<vendorId>-32634</vendorId><subVendorId>4136</subVendorId><vendorName>Intel Corporation</vendorName>'
    '<deviceId>2466</deviceId><subDeviceId>2667</subDeviceId><deviceName>Memory Map</deviceName></HostPciDevice>'
    '<HostPciDevice><id>0000:17:00.0</id><classId>770</classId><bus>23</bus><slot>0</slot><function>0</function>'
    '<vendorId>4318</vendorId><subVendorId>4318</subVendorId><deviceId>8373</deviceId><subDeviceId>5203</subDeviceId>'
    '</HostPciDevice></val></propSet>'
    '<propSet><name>config.pciPassthruInfo</name><val xsi:type="ArrayOfHostPciPassthruInfo">'
    '<HostPciPassthruInfo xsi:type="HostPciPassthruInfo"><id>0000:17:00.0</id><dependentDevice>0000:17:00.0'
    '</dependentDevice><passthruEnabled>true</passthruEnabled><passthruCapable>true</passthruCapable>'
    '<passthruActive>false</passthruActive></HostPciPassthruInfo>'
    '<HostPciPassthruInfo xsi:type="HostSriovInfo"><id>0000:00:00.0</id><dependentDevice>0000:00:00.0'
    '</dependentDevice><passthruEnabled>false</passthruEnabled><passthruCapable>true</passthruCapable>'
    '<passthruActive>true</passthruActive><sriovEnabled>false</sriovEnabled><sriovCapable>true</sriovCapable>'
    '<sriovActive>false</sriovActive><numVirtualFunctionRequested>0</numVirtualFunctionRequested>'
    '<numVirtualFunction>0</numVirtualFunction><maxVirtualFunctionSupported>8</maxVirtualFunctionSupported>'
    '</HostPciPassthruInfo></val></propSet>'
    '<propSet><name>hardware.numaInfo</name><val xsi:type="HostNumaInfo"><type>NUMA</type><numNodes>2</numNodes>'
    '<numaNode><typeId>5</typeId><cpuID>0</cpuID><cpuID>1</cpuID><memoryRangeBegin>0</memoryRangeBegin>'
    '<memoryRangeLength>1024</memoryRangeLength><pciId>0000:00:00.0</pciId></numaNode>'
    '<numaNode><typeId>7</typeId><cpuID>2</cpuID><memoryRangeBegin>1024</memoryRangeBegin>'
    '<memoryRangeLength>1024</memoryRangeLength><pciId>0000:17:00.0</pciId></numaNode></val></propSet>')


def test_a_hosts_devices_passthrough_and_numa_read_make_the_facts_pyvmomis_decoding_makes(stub):
    """Read from their text (not decoded), a host's PCI devices, passthrough states (one enabled, not
    yet active; an SR-IOV one) and NUMA nodes (type ids not their index) give pyVmomi's facts."""
    import io

    from pyVmomi import vmodl

    from gpuvm.vsphere import inventory

    body = answer(f"<returnval>{HOST.format(HOST_DEVICES)}</returnval>")
    [(obj, props)] = parse_page(body, object, stub).objects
    [decoded] = SoapAdapter.SoapResponseDeserializer(stub).Deserialize(
        io.BytesIO(body), vmodl.query.PropertyCollector.RetrieveResult).objects
    fast, slow = inventory.host_facts(obj._moId, props), inventory.host_facts(obj._moId, inventory._props(decoded))
    assert fast.model_dump() == slow.model_dump()
    intel, gpu = fast.pci
    assert (intel.vendor_id, intel.numa_node, intel.passthru_active, intel.passthru_enabled) == (0x8086, 5, True, False)
    assert (gpu.vendor_id, gpu.device_id, gpu.numa_node, gpu.passthru_state) == (0x10DE, 0x20B5, 7, "enabled (reboot pending)")


def hosts(count: int) -> bytes:
    """An answer of `count` hosts (host-1 …, esx-01 …) and the next page's token after them."""
    objects = "".join(HOST.format("").replace("host-1<", f"host-{n}<").replace(">esx-01<", f">esx-{n:02d}<")
                      for n in range(1, count + 1))
    return answer(f"<returnval>{objects}<token>page-2</token></returnval>")


@pytest.mark.parametrize("piece_bytes", [1, 700, 1500])
def test_a_large_answer_read_in_pieces_gives_every_object_in_order_once(stub, monkeypatch, piece_bytes):
    """A 4,096-VM vCenter's answer (32 MB) is parsed in pieces by a thread while the pieces before are
    read (issue 34): the objects and the token are the whole answer's."""
    from gpuvm.vsphere import inventory_xml

    body = hosts(40)
    whole = parse_page(body, object, stub)
    monkeypatch.setattr(inventory_xml, "PIECE_BYTES", piece_bytes)
    pieces = list(inventory_xml.pieces(body))
    assert 1 < len(pieces) <= inventory_xml.MAX_PIECES
    assert sum(piece.count(b"<objects>") for piece in pieces) == 40
    page = parse_page(body, object, stub)
    assert page.token == whole.token == "page-2"
    assert [(obj._moId, props["name"]) for obj, props in page.objects] == [
        (obj._moId, props["name"]) for obj, props in whole.objects] == [(f"host-{n}", f"esx-{n:02d}") for n in range(1, 41)]


def test_a_piece_that_is_not_a_whole_document_leaves_the_answer_to_soap_xml(stub, monkeypatch):
    """Cut elsewhere than between two objects (inside one), a piece does not parse: Unsupported, and
    soap_xml.decode then reads the answer whole."""
    from gpuvm.vsphere import inventory_xml

    monkeypatch.setattr(inventory_xml, "PIECE_BYTES", 700)
    monkeypatch.setattr(inventory_xml, "BETWEEN", b"</propSet><propSet")
    with pytest.raises(Unsupported, match="a piece of the answer"):
        parse_page(hosts(40), object, stub)
