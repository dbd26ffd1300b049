"""Every value gpuvm keeps in vCenter, read back as input: one bounded, typed reader.

gpuvm keeps its state in vCenter custom attributes: `gpuvm.intent` on hosts, VMs and templates
(acts under way, the reboot memo: vsphere/intent.py), `gpuvm.owned` on hosts (vsphere/owned.py),
and `gpuvm.lease.<run>` / `gpuvm.lock.<host>` on the root folder (vsphere/lock.py). Anyone with the
privilege can write those attributes too, so every value is read here, as input:

1. bounded before it is parsed: at most MAX_CHARS characters and MAX_DEPTH levels of nesting (a
   scan of the brackets outside strings), so that no value makes the JSON parser recurse or churn;
2. a JSON object of a schema with a version: each record gpuvm writes now says `"v": 1`. A record
   with no version is what the previous release wrote (the same shape): honoured only where it
   validates strictly as that shape; a version gpuvm does not know is foreign;
3. strictly typed, no field missing and none unknown: a run id in the journal's format (12 hex
   digits, `journal.Journal`), times with their zone, each intent act with its own data
   (`power-off` restores `poweredOn` or `poweredOff`; `clone <VM>` names that VM; `rebooted` keeps
   the host's boot time and short hex digests; `drain` names the controller guest and the Slurm
   nodes), on its kind of object (a host's act on a host).

Anything else is `Foreign`: reported (plan and verify warn, naming the object, the field and how
to clear it), never acted on, and never overwritten by gpuvm (vsphere/intent.py).
"""

from __future__ import annotations

import json
import re
from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import (AfterValidator, BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr, ValidationError,
                      model_validator)

VERSION = 1
MAX_CHARS = 16_000  # gpuvm's largest value (a reboot memo of 200 changes) is ~6,000 characters
MAX_DEPTH = 8  # gpuvm's deepest value (a reboot memo's digests) nests 5 levels
SHOWN = 60  # characters of a foreign value quoted in a message
RUN_ID = re.compile(r"[0-9a-f]{12}")  # journal.Journal.run_id
DIGEST = 12  # hex characters of a reboot memo's change digests
MAX_REMEMBERED = 200  # changes a reboot memo names
MAX_NODES = 256  # Slurm nodes a drain record names (the VMs of one host)

_STRING = re.compile(r'"(?:[^"\\]|\\.)*"', re.DOTALL)
_BRACKET = re.compile(r"[\[\]{}]")


class Foreign(BaseModel):
    """A value, or one record of it, that gpuvm cannot prove it wrote: reported, never acted on."""

    model_config = ConfigDict(frozen=True)

    object: str  # the host, VM or template (or "root folder") holding it
    field: str  # the custom attribute: gpuvm.intent, gpuvm.owned, gpuvm.lease.<run>, gpuvm.lock.<host>
    why: str  # what makes it not gpuvm's
    shown: str  # the start of the value
    act: str = ""  # in gpuvm.intent: the act whose record this is ("": the whole value)

    def message(self) -> str:
        if self.object == ROOT:
            clear = (f"once no gpuvm run is running, remove it: `govc fields.rm {self.field}` (or the vSphere Client: "
                     "Administration > Custom Attributes)")
        else:
            when = "once no gpuvm act is outstanding on it" if self.act else "if nobody needs it"
            clear = (f"{when}, clear it: `govc fields.set {self.field} '' <path of {self.object}>`, "
                     f"PowerCLI `Set-Annotation -Entity {self.object} -CustomAttribute {self.field} -Value ''`, "
                     "or the object's Custom Attributes in the vSphere Client")
        kept = ("a run that needs this lock replaces it by a marker quoting it and is refused for one lease"
                if self.field.startswith("gpuvm.lock.") else "does not overwrite it")
        return (f"{self.field} holds a value gpuvm did not write ({self.why}: {self.shown}); gpuvm does not act on it, "
                f"{kept}; {clear}")


ROOT = "root folder"


class Unreadable(ValueError):
    """A value that is not a bounded JSON object; the message says why."""


def shown(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value)
    return repr(text[:SHOWN] + ("…" if len(text) > SHOWN else ""))


def bounded(text: Any) -> dict[str, Any]:
    """The JSON object in `text`, its size and nesting checked before it is parsed."""
    if not isinstance(text, str):
        raise Unreadable(f"a {type(text).__name__}, not text")
    if len(text) > MAX_CHARS:
        raise Unreadable(f"{len(text):,} characters, gpuvm writes at most {MAX_CHARS:,}")
    depth = deepest = 0
    for bracket in _BRACKET.findall(_STRING.sub('""', text)):
        depth += 1 if bracket in "[{" else -1
        deepest = max(deepest, depth)
    if deepest > MAX_DEPTH:
        raise Unreadable(f"nested {deepest} levels deep, gpuvm writes at most {MAX_DEPTH}")
    try:
        data = json.loads(text)
    except (ValueError, RecursionError):
        raise Unreadable("not JSON") from None
    if not isinstance(data, dict):
        raise Unreadable(f"a JSON {type(data).__name__}, not an object")
    return data


def _aware(text: str) -> str:
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        raise ValueError("not an ISO 8601 time") from None
    if when.tzinfo is None:
        raise ValueError("a time without its zone")
    return text


def _run_id(text: str) -> str:
    if not RUN_ID.fullmatch(text):
        raise ValueError("not a gpuvm run id (12 hex digits)")
    return text


RunId = Annotated[StrictStr, AfterValidator(_run_id)]
Stamp = Annotated[StrictStr, Field(max_length=40), AfterValidator(_aware)]
Text = Annotated[StrictStr, Field(max_length=1000)]  # why, who: gpuvm's own name objects of up to 255 characters
Name = Annotated[StrictStr, Field(min_length=1, max_length=255)]  # a host's (DNS) or VM's name
Digest = Annotated[StrictStr, Field(pattern=f"^[0-9a-f]{{{DIGEST}}}$")]
Pci = Annotated[StrictStr, Field(pattern=r"^[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]$")]


class Record(BaseModel):
    """A record as gpuvm writes it: versioned (no version: the previous release's, same shape), no field unknown."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    v: Literal[1] | None = None


# -- gpuvm.intent: act → record ------------------------------------------------------------------

class IntentRecord(Record):
    run: RunId
    why: Text
    since: Stamp
    data: dict[str, Any]


class NoData(Record):
    """maintenance: gpuvm is entering, or holds, the host's maintenance mode."""


class PowerOffData(Record):
    host: Name
    restore: Literal["poweredOn", "poweredOff"]


class CloneData(Record):
    vm: Name
    task: Annotated[StrictStr, Field(pattern=r"^[A-Za-z0-9_.:-]{1,80}$")] | None = None


class RebootedData(Record):
    booted: Literal[""] | Stamp
    changes: Annotated[list[Annotated[list[Digest], Field(min_length=1, max_length=2)]],
                       Field(max_length=MAX_REMEMBERED)]


class DrainData(Record):
    """drain: gpuvm drained these Slurm nodes (of the host's VMs) for its reboot and owes them a resume."""

    controller: Name  # the guest where scontrol runs
    nodes: Annotated[list[Name], Field(max_length=MAX_NODES)]  # the nodes' names: their VMs'


REBOOTED = "rebooted"  # the reboot memo (steps/reboot_memo.py): a record of a reboot done, not of an act to come
ACTS: dict[str, tuple[str, type[Record]]] = {  # act → the kind of object it is on, its data
    "maintenance": ("host", NoData), REBOOTED: ("host", RebootedData), "power-off": ("vm", PowerOffData),
    "drain": ("host", DrainData)}
CLONE = "clone "  # "clone <VM>", on the template (or VM) the VM is cloned from


def kind_of(act: str) -> str | None:
    """The kind of object ("host", "vm": VMs and templates) gpuvm records `act` on; None: not an act of gpuvm's."""
    return "vm" if act.startswith(CLONE) else ACTS[act][0] if act in ACTS else None


def act_data(act: str, kind: str, data: dict[str, Any]) -> dict[str, Any]:
    """The act's data, checked against its schema (ValueError: not an act gpuvm records on a `kind`)."""
    on = kind_of(act)
    if on is None:
        raise ValueError("not an act gpuvm records")
    schema = CloneData if act.startswith(CLONE) else ACTS[act][1]
    if on != kind:
        raise ValueError(f"gpuvm records it on a {on}, not a {kind}")
    typed = schema.model_validate(data)
    if isinstance(typed, CloneData) and typed.vm != act[len(CLONE):]:
        raise ValueError(f"its data names VM {typed.vm[:SHOWN]!r}")
    return typed.model_dump(exclude_none=True, exclude={"v"})


def intent_record(act: str, kind: str, record: Any) -> IntentRecord:
    """One act's record, strictly (ValueError with the reason otherwise)."""
    if not isinstance(record, dict):
        raise ValueError(f"a JSON {type(record).__name__}, not a record")
    typed = IntentRecord.model_validate(record)
    return typed.model_copy(update={"data": act_data(act, kind, typed.data)})


# -- gpuvm.owned ---------------------------------------------------------------------------------

class OwnedRecord(Record):
    model_config = ConfigDict(title="record of what gpuvm owns")

    run: RunId | None = None  # the run that wrote it last (none in the previous release's records)
    passthrough: list[Pci]
    released: list[Pci]

    @model_validator(mode="after")
    def _run_with_version(self) -> OwnedRecord:
        if self.v is not None and self.run is None:
            raise ValueError("a versioned record names its run")
        return self


# -- the root folder: gpuvm.lease.<run>, gpuvm.lock.<host> -----------------------------------------

class Lease(Record):
    """A run's lease (vsphere/lock.py)."""

    model_config = ConfigDict(title="lease")

    run: RunId
    who: Text
    since: Stamp
    expires: Stamp
    taking: StrictBool
    hosts: Annotated[StrictInt, Field(ge=0)]

    @property
    def until(self) -> datetime:
        return datetime.fromisoformat(self.expires)


class Holder(Record):
    """A host lock's value: the run holding it (held while that run's lease is unexpired)."""

    model_config = ConfigDict(title="lock value")

    run: RunId
    who: Text
    since: Stamp


class Held(Record):
    """A host lock's value that holds it until its own `expires`: gpuvm's marker of a foreign value
    it found there (`found`), or a lock from a gpuvm before leases."""

    model_config = ConfigDict(title="lock value")

    since: Stamp
    expires: Stamp
    found: Text | None = None
    who: Text | None = None  # the rest: a lock from before leases
    run: Text | None = None
    machine: Text | None = None
    pid: StrictInt | None = None

    @property
    def until(self) -> datetime:
        return datetime.fromisoformat(self.expires)


def why_invalid(error: Exception) -> str:
    """One short reason from a validation error."""
    if isinstance(error, ValidationError):
        first = error.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        text = str(first["msg"]).removeprefix("Value error, ")
        return f"{where}: {text}"[:SHOWN * 2] if where else text[:SHOWN * 2]
    return str(error)[:SHOWN * 2]


def read(text: Any, schema: type[Record]) -> Record:
    """`text` as a record of `schema` (Unreadable with the reason otherwise)."""
    data = bounded(text)
    try:
        return schema.model_validate(data)
    except ValueError as error:
        raise Unreadable(f"not a {schema.model_config.get('title')} gpuvm writes: {why_invalid(error)}") from None


def encode(record: Record) -> str:
    """What gpuvm writes: the record with the current version."""
    return json.dumps(record.model_copy(update={"v": VERSION}).model_dump(exclude_none=True), sort_keys=True)
