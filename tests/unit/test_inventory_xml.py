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
