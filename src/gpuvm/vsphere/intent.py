"""Intent on the object: what gpuvm is about to do to a host or VM, recorded on that object before
the act and cleared once the act is undone or finished.

One global custom attribute, `gpuvm.intent`, holds on each host, VM or template a JSON object:
act → record (`Intent`). It lives in vCenter, so every machine and every operator sees it (the
vSphere client shows it as the object's "gpuvm.intent" attribute), and the next run of any
machine reads it in the one bulk inventory read (`HostFacts.intents`, `VmFacts.intents`) and
finishes or undoes what an interrupted run began. History stays in the local journal; state that
recovery needs lives here.

Acts in use: "maintenance" (gpuvm is entering, or holds, the host's maintenance mode),
"power-off" (gpuvm stops this VM for a host reboot and owes it a power-on), "clone <VM>" (on the
template: a clone of that name is under way), "drain" (gpuvm drained the Slurm nodes of the
host's VMs for its reboot and owes them a resume: steps/slurm_drain.py), and one memo kept once its act is done: "rebooted"
(the host rebooted for these changes: a change still pending after it is not rebooted for again).

Each value is read as input (vsphere/records.py): a record gpuvm cannot prove it wrote (not
bounded JSON, not of an act's schema, no gpuvm run id) is `Foreign`: plan and verify warn of it,
nothing acts on it. gpuvm never overwrites one: acts it did not write are kept as found when it
rewrites the value, and it refuses (TaskError, the act not done) to record an act over a foreign
record of that act, or on an object whose whole value is not gpuvm's.

Writes to one object are serialised within a run (the whole value is replaced by each SetField);
across runs the host locks keep two runs off the same host's objects.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel

from gpuvm.errors import TaskError
from gpuvm.vsphere import records
from gpuvm.vsphere.records import Foreign, Unreadable, shown
from gpuvm.vsphere.tasks import call

FIELD = "gpuvm.intent"


class Intent(BaseModel):
    """One act gpuvm began on an object and has not finished or undone (read: `records.IntentRecord`,
    its data checked against its act's schema)."""

    run: str = "?"  # the run that recorded it
    why: str = ""
    since: str = ""  # vCenter's time when recorded
    data: dict[str, Any] = {}  # what the act needs to be finished or undone (e.g. the power state to restore)


@dataclass(frozen=True)
class Intents:
    """One attribute value, read: gpuvm's acts, and what is not gpuvm's (reported, never acted on)."""

    acts: dict[str, Intent] = field(default_factory=dict)
    kept: dict[str, Any] = field(default_factory=dict)  # acts gpuvm did not write: kept as found when it rewrites
    foreign: list[Foreign] = field(default_factory=list)
    whole: Foreign | None = None  # the value is not gpuvm's at all: gpuvm does not replace it


def read(value: str | None, name: str, kind: str) -> Intents:
    """The intents in the value of `gpuvm.intent` on `name` (a "host" or a "vm": VMs and templates)."""
    if not value:
        return Intents()
    try:
        raw = records.bounded(value)
        if not raw:
            raise Unreadable("an empty object: gpuvm clears the attribute instead")
    except Unreadable as error:
        whole = Foreign(object=name, field=FIELD, why=str(error), shown=shown(value))
        return Intents(foreign=[whole], whole=whole)
    acts, kept, foreign = {}, {}, []
    for act, record in raw.items():
        try:
            typed = records.intent_record(act, kind, record)
            acts[act] = Intent(run=typed.run, why=typed.why, since=typed.since, data=typed.data)
        except ValueError as error:
            kept[act] = record
            foreign.append(Foreign(object=name, field=FIELD, why=f"act {act[:records.SHOWN]!r}: "
                                   f"{records.why_invalid(error)}", shown=shown(record), act=act))
    return Intents(acts, kept, foreign)


def encode(intents: Mapping[str, Intent], kept: Mapping[str, Any] | None = None) -> str:
    """The value gpuvm writes: each act's record with the current version, the acts it did not write as found."""
    records_ = {act: {"v": records.VERSION, **i.model_dump()} for act, i in intents.items()} | dict(kept or {})
    return json.dumps(records_, sort_keys=True) if records_ else ""


def field_key(fields: Any, name: str = FIELD) -> int | None:
    """The key of the field `name` (`gpuvm.intent`) among vCenter's custom field definitions (None: not
    defined yet)."""
    return next((f.key for f in fields or [] if f.name == name), None)


def value_of(custom_values: Any, key: int | None) -> str | None:
    """The value of the field `key` in an object's `customValue` (the last one wins, as vCenter shows it)."""
    if key is None:
        return None
    values = [v.value for v in custom_values or [] if getattr(v, "key", None) == key]
    return values[-1] if values else None


def _named(entity: Any) -> str:
    """How an object is named in a message about its value (no round trip for its name)."""
    return f"{getattr(entity, '_wsdlName', 'object')} {getattr(entity, '_moId', entity)}"


class IntentStore:
    """Records and clears intents on vSphere objects for one run. `field`: the custom attribute it
    writes (`gpuvm.intent`; `vsphere/owned.py` keeps what gpuvm owns in another)."""

    def __init__(self, session: Any, run: str, field: str = FIELD):
        self.session = session
        self.run = run
        self.field = field
        self._key: int | None = None
        self._guard = threading.Lock()
        self._locks: dict[str, threading.Lock] = {}

    @property
    def _manager(self) -> Any:
        return self.session.content.customFieldsManager

    def key(self) -> int:
        """The attribute's key, its definition created on first use (a global field: every type)."""
        from pyVmomi import vim

        with self._guard:
            if self._key is None:
                self._key = field_key(call("read custom attributes", lambda: self._manager.field), self.field)
            if self._key is None:
                try:
                    self._key = self._manager.AddCustomFieldDef(name=self.field, moType=None).key
                except vim.fault.DuplicateName:  # another run defined it just now
                    self._key = field_key(call("read custom attributes", lambda: self._manager.field), self.field)
            assert self._key is not None
            return self._key

    def _lock(self, entity: Any) -> threading.Lock:
        with self._guard:
            return self._locks.setdefault(entity._moId, threading.Lock())

    def current(self, entity: Any, kind: str) -> dict[str, Intent]:
        """gpuvm's intents on `entity` (a "host" or a "vm") now (one read)."""
        key = self.key()
        return read(value_of(call("read intent", lambda: entity.customValue), key), _named(entity), kind).acts

    def record(self, entity: Any, act: str, why: str, **data: Any) -> None:
        """Record, before the act, that this run is about to do `act` to `entity`, and why."""
        since = call("read vCenter time", lambda: self.session.si.CurrentTime()).isoformat(timespec="seconds")
        self._update(entity, act, Intent(run=self.run, why=why, since=since, data=data))

    def clear(self, entity: Any, act: str) -> None:
        """The act is finished or undone: remove its record (others on the object stay)."""
        self._update(entity, act, None)

    def _update(self, entity: Any, act: str, intent: Intent | None) -> None:
        def edit(value: str | None) -> str | None:
            found = read(value, _named(entity), records.kind_of(act) or "vm")
            if intent is None and act not in found.acts:
                return None  # nothing of gpuvm's to clear
            foreign = found.whole or next((f for f in found.foreign if f.act == act), None)
            if intent is not None and foreign is not None:
                raise TaskError(f"not recording intent {act!r} on {foreign.object}, so not doing it: "
                                + foreign.message())
            acts = {a: i for a, i in found.acts.items() if a != act}
            if intent is not None:
                acts[act] = intent
            return encode(acts, found.kept)

        self.rewrite(entity, f"record intent {act!r}", edit)

    def rewrite(self, entity: Any, what: str, edit: Callable[[str | None], str | None]) -> None:
        """Replace the field's value on `entity` by `edit(value now)` (None: leave it), read and written
        under this run's lock for the object."""
        key = self.key()
        with self._lock(entity):
            value = edit(value_of(call(f"read {self.field}", lambda: entity.customValue), key))
            if value is not None:
                call(what, lambda: self._manager.SetField(entity=entity, key=key, value=value))
