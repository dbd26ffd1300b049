"""The inventory read's answer parsed by lxml straight into the property values read_inventory reads.

soap_xml.py decodes any answer into the objects pyVmomi builds (an ObjectContent per object, a
DynamicProperty per property, a data object per device): for a 512-host vCenter that is most of a
plan's time. This reads a RetrievePropertiesEx (or ContinueRetrievePropertiesEx) page knowing what
gpuvm asks for (retrieve.py's property lists): the scalar and reference properties straight from
their text, only the VM devices read_inventory reads (PCI passthrough devices and NICs, decoded by
soap_xml as pyVmomi would), and the other structured properties by soap_xml. Each object comes out as
(reference, {property path: value}), the values of the types pyVmomi gives (a host's PCI devices,
passthrough states and NUMA nodes: plain namespaces with the fields host_facts reads), so
read_inventory's conversion to facts is the same for both. Anything else in the answer (a property it does not know,
a fault in `missingSet`) raises `Unsupported`: the page is then decoded by soap_xml or pyVmomi.
tests/integration/test_soap_xml.py compares the facts of both paths.

A large answer (a 4,096-VM vCenter's: 32 MB) is parsed in pieces of whole `objects`, each with the
answer's envelope around it: the caller's thread parses the next piece (lxml, in C, without the GIL)
while a second thread reads the piece before, so that the parse and the reading take two cores (the
parse stays in the caller's thread: its memory is malloc's main arena, reused). A piece that is
not a whole XML document (a cut that was not between two `objects`) is `Unsupported`: the answer is
then read whole, as any other.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any, Callable

from gpuvm import collector
from gpuvm.vsphere.soap_xml import SOAP_BODY, XSI_TYPE, Decoder, Unsupported, boolean, xml_tree

VIM = "{urn:vim25}"
OBJECTS, TOKEN, OBJ, PROPSET, NAME, VAL = (VIM + t for t in ("objects", "token", "obj", "propSet", "name", "val"))


@dataclass
class Page:
    """One page of the read: its objects as (reference, properties), and the token of the next."""
    objects: list[tuple[Any, dict[str, Any]]] = field(default_factory=list)
    token: str | None = None


def _text(decoder: "_Reader", val: Any) -> str:
    return val.text or ""


def _int(decoder: "_Reader", val: Any) -> int:
    return int(val.text)


def _bool(decoder: "_Reader", val: Any) -> bool:
    return boolean(val.text or "")


def _ref(decoder: "_Reader", val: Any) -> Any:
    return decoder.reference(val)


def _refs(decoder: "_Reader", val: Any) -> list[Any]:
    return [decoder.reference(item) for item in val]


def _strings(decoder: "_Reader", val: Any) -> list[str]:
    return [item.text or "" for item in val]


def _devices(decoder: "_Reader", val: Any) -> list[Any]:
    return decoder.devices(val)


def _fields(element: Any) -> dict[str, str | None]:
    """A data object's scalar fields by name (a repeated one: its last)."""
    return {child.tag[len(VIM):]: child.text for child in element}


def _pci_devices(decoder: "_Reader", val: Any) -> list[SimpleNamespace]:
    """hardware.pciDevice: the fields host_facts reads (ids as vSphere's signed shorts)."""
    devices = []
    for device in val:
        f = _fields(device)
        devices.append(SimpleNamespace(id=f.get("id") or "", vendorId=int(f.get("vendorId") or 0),
                                       deviceId=int(f.get("deviceId") or 0), classId=int(f.get("classId") or 0),
                                       vendorName=f.get("vendorName"), deviceName=f.get("deviceName")))
    return devices


def _passthru(decoder: "_Reader", val: Any) -> list[SimpleNamespace]:
    """config.pciPassthruInfo (SR-IOV subtypes too): the fields host_facts reads."""
    infos = []
    for info in val:
        f = _fields(info)
        infos.append(SimpleNamespace(id=f.get("id") or "", passthruCapable=boolean(f.get("passthruCapable") or "false"),
                                     passthruEnabled=boolean(f.get("passthruEnabled") or "false"),
                                     passthruActive=boolean(f.get("passthruActive") or "false")))
    return infos


def _numa(decoder: "_Reader", val: Any) -> SimpleNamespace:
    """hardware.numaInfo: each node's typeId and PCI ids (its many cpuID skipped by lxml, in C)."""
    nodes = []
    for node in val.iterchildren(VIM + "numaNode"):
        type_id = node.findtext(VIM + "typeId")
        nodes.append(SimpleNamespace(typeId=int(type_id) if type_id is not None else None,
                                     pciId=[pci.text or "" for pci in node.iterchildren(VIM + "pciId")]))
    return SimpleNamespace(numaNode=nodes)


# The properties of inventory.py's lists read from their text (enums as their text: facts keep str()).
READERS: dict[str, Callable[["_Reader", Any], Any]] = {
    "name": _text, "key": _text, "uuid": _text, "hardware.systemInfo.uuid": _text,
    "runtime.powerState": _text, "runtime.connectionState": _text,
    "config.firmware": _text, "config.version": _text,
    "hardware.memorySize": _int, "hardware.cpuInfo.numCpuThreads": _int, "config.hardware.numCPU": _int,
    "config.hardware.memoryMB": _int, "summary.storage.committed": _int, "summary.freeSpace": _int,
    "runtime.inMaintenanceMode": _bool, "capability.deviceRebindWithoutRebootSupported": _bool,
    "config.template": _bool, "config.memoryReservationLockedToMax": _bool,
    "parent": _ref, "runtime.host": _ref, "owner": _ref, "config.distributedVirtualSwitch": _ref,
    "configManager.pciPassthruSystem": _ref, "configManager.graphicsManager": _ref,
    "network": _refs, "vm": _refs, "datastore": _refs, "config.uplinkPortgroup": _refs,
    "childType": _strings, "config.sharedPassthruGpuTypes": _strings,
    "config.hardware.device": _devices,
    "hardware.pciDevice": _pci_devices, "config.pciPassthruInfo": _passthru, "hardware.numaInfo": _numa,
}
# decoded by soap_xml into pyVmomi's objects (few, or read field by field by facts)
DECODED = {"config.graphicsConfig", "config.graphicsInfo", "runtime.bootTime", "config.extraConfig", "customValue"}


PIECE_BYTES = 1 << 20  # an answer parsed in pieces of about this size (one piece: parsed here, no thread)
MAX_PIECES = 64
BETWEEN = b"</objects><objects"  # where a piece may end: between two objects of the answer


def parse_page(body: bytes, result_type: type, stub: Any) -> Page | None:
    """A RetrievePropertiesEx / ContinueRetrievePropertiesEx answer as a Page (None: no objects)."""
    if len(body) < 2 * PIECE_BYTES:
        return parse_whole(body, result_type, stub)
    trees: queue.Queue[Any] = queue.Queue()
    read: dict[str, Any] = {}

    def read_all() -> None:
        try:
            read["page"] = _page(iter(trees.get, None), stub)
        except BaseException as e:  # raised below, in the caller's thread
            read["error"] = e

    reader = threading.Thread(target=read_all, name="inventory-xml", daemon=True)
    reader.start()
    try:
        for document in pieces(body):
            if read:  # the reader stopped (Unsupported)
                break
            trees.put(xml_tree(document))
    except Exception as e:  # lxml's XMLSyntaxError: a cut inside something; the answer is read whole
        read.setdefault("error", Unsupported(f"a piece of the answer: {e}"))
    finally:
        trees.put(None)
        reader.join()
    if "error" in read:
        raise read["error"]
    return read["page"]


def parse_whole(body: bytes, result_type: type, stub: Any) -> Page | None:
    """`parse_page` in one piece, no thread (where other processes take the other cores)."""
    return _page(iter([xml_tree(body)]), stub)


def _page(trees: Iterator[Any], stub: Any) -> Page | None:
    reader: _Reader | None = None
    page = Page()
    for root in trees:
        answer = root.find(SOAP_BODY)
        if answer is None or len(answer) != 1 or len(answer[0]) > 1:
            raise Unsupported("not a SOAP answer with at most one returnval")
        if not len(answer[0]):
            return None
        reader = reader or _Reader(stub)
        for child in answer[0][0]:
            if child.tag == OBJECTS:
                try:
                    page.objects.append(reader.object(child))
                except (ValueError, TypeError) as e:  # a value not as vSphere writes it (an int without text…)
                    raise Unsupported(str(e)) from None
            elif child.tag == TOKEN:
                page.token = child.text
            else:
                raise Unsupported(f"{child.tag} in a RetrieveResult")
        collector.discard(root)  # as long to free as to build: left to the OS where the process ends next
    return page


def pieces(body: bytes) -> Iterator[bytes]:
    """The answer as documents of about PIECE_BYTES each: its envelope (up to the first `objects`,
    from after the last) around a run of whole `objects`; the answer itself when small or without
    objects. Cut only where one `objects` ends and the next begins (BETWEEN). Each made when asked
    for: one piece's bytes in memory at a time."""
    first, last = body.find(b"<objects"), body.rfind(b"</objects>")
    count = min(MAX_PIECES, len(body) // PIECE_BYTES)
    if count < 2 or first < 0 or last < first:
        yield body
        return
    head, tail, whole = body[:first], body[last + len(b"</objects>"):], memoryview(body)
    start = first
    for index in range(1, count + 1):
        cut = body.find(BETWEEN, max(start, first + (last - first) * index // count), last) if index < count else -1
        end = cut + len(b"</objects>") if cut >= 0 else last + len(b"</objects>")
        if end > start:
            yield b"".join((head, whole[start:end], tail))
        start = end


class _Reader:
    def __init__(self, stub: Any) -> None:
        from pyVmomi import vim, vmodl

        self._decoder = Decoder(stub)
        self._any = next(p.type for p in vmodl.DynamicProperty._GetPropertyList() if p.name == "val")
        self._device = vim.vm.device.VirtualDevice
        self._read_types = (vim.vm.device.VirtualPCIPassthrough, vim.vm.device.VirtualEthernetCard)
        self._device_read: dict[str | None, bool] = {}  # a device's xsi:type as written → read_inventory reads it

    def reference(self, element: Any) -> Any:
        return self._decoder.reference(element)

    def object(self, element: Any) -> tuple[Any, dict[str, Any]]:
        obj, props = None, {}
        for child in element:
            if child.tag == PROPSET:
                if len(child) != 2 or child[0].tag != NAME or child[1].tag != VAL:
                    raise Unsupported("a propSet without one name and one val")
                name, val = child[0].text, child[1]
                read = READERS.get(name)
                if read is not None:
                    props[name] = read(self, val)
                elif name in DECODED:
                    props[name] = self._decoder.value(val, self._any)
                else:
                    raise Unsupported(f"the property {name}")
            elif child.tag == OBJ:
                obj = self.reference(child)
            else:
                raise Unsupported(f"{child.tag} in an ObjectContent")  # missingSet: a fault in the data
        if obj is None:
            raise Unsupported("an ObjectContent without obj")
        return obj, props

    def devices(self, val: Any) -> list[Any]:
        """The VM's devices read_inventory reads, in their order (the first NIC is the guest's first)."""
        kept = []
        for device in val:
            kind = device.get(XSI_TYPE)
            read = self._device_read.get(kind)
            if read is None:
                read = self._device_read[kind] = issubclass(self._decoder.type_of(device, self._device),
                                                            self._read_types)
            if read:
                kept.append(self._decoder.value(device, self._device))
        return kept
