"""A SOAP answer decoded by lxml into the same pyVmomi objects pyVmomi's own decoder builds.

pyVmomi decodes with expat and a Python handler per XML event, checking every field as it sets it:
for the one inventory read of a 512-host vCenter that is most of gpuvm's time. lxml parses the
whole answer in C; this walks its tree with pyVmomi's own type information (the declared type of
every property, `xsi:type` where the server names a subtype) and fills the objects' fields
directly. What it meets and does not decode (a fault inside the data, say) raises `Unsupported`,
and the caller decodes the same bytes with pyVmomi. tests/integration/test_soap_xml.py compares
both decodings field by field.
"""

from __future__ import annotations

import gc
import io
from datetime import datetime
from typing import Any, Callable

XSI_TYPE = "{http://www.w3.org/2001/XMLSchema-instance}type"
SOAP_BODY = "{http://schemas.xmlsoap.org/soap/envelope/}Body"
NS_VIM = "urn:vim25"  # the namespace of vSphere's properties (vim25)
DATA, ARRAY, STR, CONVERT, BOOL, ENUM, REFERENCE = "data object", "array", "string", "convert", "bool", "enum", "ref"
TIME = "dateTime"


class Unsupported(Exception):
    """The answer holds something this decoder leaves to pyVmomi."""


def decode(body: bytes, result_type: type, stub: Any, fault: bool = False,
           parse: Callable[[bytes, type, Any], Any] | None = None) -> Any:
    """A SOAP answer as pyVmomi would decode it: by lxml when it can, else (and for a fault) by
    pyVmomi. `parse(body, result_type, stub)`, when given, is tried first: a caller's own reading of
    the answer (inventory_xml.py's), which raises `Unsupported` for what it leaves to the others. The
    garbage collector waits meanwhile: the objects made hold no cycles to collect, and its passes
    over them would cost more than the decoding."""
    from pyVmomi import SoapAdapter

    if not fault:
        collecting = gc.isenabled()
        gc.disable()
        try:
            for decoder in (parse, decode_response):
                if decoder is not None:
                    try:
                        return decoder(body, result_type, stub)
                    except Unsupported:
                        pass
        finally:
            if collecting:
                gc.enable()
    return SoapAdapter.SoapResponseDeserializer(stub).Deserialize(io.BytesIO(body), result_type)


def xml_tree(body: bytes) -> Any:
    """An answer's lxml tree (no entities, no network: the answer comes from a server)."""
    from lxml import etree

    return etree.fromstring(body, parser=etree.XMLParser(resolve_entities=False, no_network=True, huge_tree=True))


def decode_response(body: bytes, result_type: type, stub: Any) -> Any:
    """The `returnval` of a SOAP response (bytes) as an object of `result_type` (pyVmomi's)."""
    root = xml_tree(body)
    answer = root.find(SOAP_BODY)
    if answer is None or len(answer) != 1:
        raise Unsupported("not a SOAP answer with one body element")
    values = list(answer[0])
    decoder = Decoder(stub)
    if issubclass(result_type, list):  # one returnval per item (RetrieveContents)
        items = result_type()
        items.extend(decoder.value(value, result_type.Item) for value in values)
        return items
    if not values:
        return None
    if len(values) > 1:
        raise Unsupported("more than one returnval")
    return decoder.value(values[0], result_type)


class Decoder:
    def __init__(self, stub: Any):
        from pyVmomi import SoapAdapter, VmomiSupport

        self.stub = stub
        self.version = stub.version
        self._lookup = SoapAdapter.SoapDeserializer(stub).LookupWsdlType
        self._vmomi = VmomiSupport
        self._is_dynamic = SoapAdapter.isDynamicType
        # (declared type, xsi:type as written) → the type decoded; the prefixes of a SOAP answer
        # are declared once, on its envelope, so a written name means one type throughout
        self._kinds: dict[tuple[type, str | None], tuple[type, str]] = {}
        self._references: dict[str, type] = {}  # a reference's type as written → its class
        self._fields: dict[type, tuple[dict[str, Any], dict[str, Any], list[tuple[str, type]]]] = {}

    def type_of(self, element: Any, declared: type) -> type:
        """The type `element` decodes as, where `declared` is expected."""
        xsi = element.get(XSI_TYPE)
        try:
            return self._kinds[(declared, xsi)][0]
        except KeyError:
            self._kinds[(declared, xsi)] = self._kind(element, declared, xsi)
            return self._kinds[(declared, xsi)][0]

    def value(self, element: Any, declared: type) -> Any:
        xsi = element.get(XSI_TYPE)
        try:
            kind, how = self._kinds[(declared, xsi)]
        except KeyError:
            kind, how = self._kinds[(declared, xsi)] = self._kind(element, declared, xsi)
        if how is DATA:
            return self._data_object(element, kind)
        if how is ARRAY:
            items = kind()
            items.extend(self.value(child, kind.Item) for child in element)
            return items
        if how is STR:
            return element.text or ""
        if how is CONVERT:
            return kind(element.text or "")
        if how is BOOL:
            return boolean(element.text or "")
        if how is ENUM:
            return getattr(kind, element.text or "")
        if how is TIME:
            return _time(element.text or "")
        return self.reference(element)

    def _kind(self, element: Any, declared: type, xsi: str | None) -> tuple[type, str]:
        """The type to decode an element as (its xsi:type where it names one, as pyVmomi decides),
        and how: DATA, ARRAY, STR, CONVERT, BOOL, ENUM or REFERENCE."""
        vmomi = self._vmomi
        kind = declared
        if xsi and not self._is_dynamic(declared):
            ns, name = self._split(element, xsi)
            named = self._lookup(ns, name, allowManagedObjectReference=True)
            if not (issubclass(named, list) and issubclass(declared, list)):
                kind = named
        elif issubclass(declared, list):
            kind = declared.Item
        if self.version:
            kind = vmomi.GetCompatibleType(kind, self.version)
        if issubclass(kind, Exception):
            raise Unsupported(f"a fault ({kind.__name__}) in the data")
        if issubclass(kind, vmomi.DataObject):
            return kind, DATA
        if issubclass(kind, list):
            return kind, ARRAY
        if kind is str or kind is bool:
            return kind, STR if kind is str else BOOL
        if issubclass(kind, vmomi.ManagedObject):
            return kind, REFERENCE
        if issubclass(kind, vmomi.Enum):
            return kind, ENUM
        if issubclass(kind, datetime):  # a host's runtime.bootTime
            return kind, TIME
        if kind in (type, vmomi.ManagedMethod, vmomi.binary) or not issubclass(kind, (int, float, str)):
            raise Unsupported(f"a {kind.__name__} value")
        return kind, CONVERT  # byte, short, int, long, float, double; str types (PropertyPath)

    def _data_object(self, element: Any, kind: type) -> Any:
        fields, defaults, lists = self._fields_of(kind)
        obj = kind.__new__(kind)
        values = obj.__dict__
        values.update(defaults)
        for name, list_type in lists:
            values[name] = list_type()
        for child in element:
            try:
                name, declared, is_array = fields[child.tag]
            except KeyError:
                raise Unsupported(f"{kind.__name__} has no property {child.tag}") from None
            value = self.value(child, declared)
            if is_array and not isinstance(value, list):
                values[name].append(value)  # one item of an array property
            else:
                values[name] = value
        return obj

    def _fields_of(self, kind: type) -> tuple[dict[str, Any], dict[str, Any], list[tuple[str, type]]]:
        """A data object type's properties by XML tag (name, declared type, is an array), the
        defaults pyVmomi's constructor gives scalars, and the array properties (a fresh list each)."""
        if kind not in self._fields:
            probe = kind()  # pyVmomi's own defaults
            fields, defaults, lists = {}, {}, []
            for prop in kind._GetPropertyList():
                is_array = issubclass(prop.type, list)
                fields[f"{{{NS_VIM}}}{prop.name}"] = (prop.name, prop.type, is_array)
                if is_array:
                    lists.append((prop.name, prop.type))
                else:
                    defaults[prop.name] = getattr(probe, prop.name)
            self._fields[kind] = (fields, defaults, lists)
        return self._fields[kind]

    def reference(self, element: Any) -> Any:
        if element.get("serverGuid") is not None:
            raise Unsupported("a reference with a serverGuid")
        written = element.get("type", "")
        try:
            kind = self._references[written]
        except KeyError:  # looked up once per type (lxml builds `nsmap` anew at each call)
            kind = self._references[written] = self._lookup(*self._split(element, written))
        return kind(element.text or "", self.stub)

    @staticmethod
    def _split(element: Any, qualified: str) -> tuple[str, str]:
        prefix, _, name = qualified.rpartition(":")
        return element.nsmap.get(prefix or None, ""), name


def _time(text: str) -> datetime:
    """An xsd:dateTime as pyVmomi decodes it."""
    from pyVmomi.Iso8601 import ParseISO8601

    value = ParseISO8601(text)
    if value is None:
        raise Unsupported(f"not a dateTime: {text!r}")
    return value


def boolean(text: str) -> bool:
    if text == "true" or text == "1" or text.lower() == "true":
        return True
    if text == "false" or text == "0" or text.lower() == "false":
        return False
    raise Unsupported(f"not a boolean: {text!r}")
