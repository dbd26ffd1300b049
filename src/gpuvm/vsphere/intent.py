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
template: a clone of that name is under way), and one memo kept once its act is done: "rebooted"
(the host rebooted for these changes: a change still pending after it is not rebooted for again).

Writes to one object are serialised within a run (the whole value is replaced by each SetField);
across runs the host locks keep two runs off the same host's objects.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Mapping
from typing import Any

from pydantic import BaseModel

from gpuvm.vsphere.tasks import call

FIELD = "gpuvm.intent"
MAX_VALUE = 16_000  # characters: a value longer than this was not written by gpuvm


class Intent(BaseModel):
    """One act gpuvm began on an object and has not finished or undone."""

    run: str = "?"  # the run that recorded it
    why: str = ""
    since: str = ""  # vCenter's time when recorded
    data: dict[str, Any] = {}  # what the act needs to be finished or undone (e.g. the power state to restore)


def parse(value: str | None) -> dict[str, Intent]:
    """The intents in one attribute value; a value gpuvm did not write is kept as act "unreadable"
    (verify shows it; nothing acts on it)."""
    if not value:
        return {}
    try:
        raw = json.loads(value) if len(value) <= MAX_VALUE else None
    except ValueError:
        raw = None
    if not isinstance(raw, dict):
        return {"unreadable": Intent(why=f"{FIELD} holds a value gpuvm did not write")}
    out: dict[str, Intent] = {}
    for act, record in raw.items():
        try:
            out[str(act)] = Intent.model_validate(record)
        except ValueError:
            out[str(act)] = Intent(why=f"{FIELD}[{act}] holds a record gpuvm did not write")
    return out


def encode(intents: Mapping[str, Intent]) -> str:
    return json.dumps({act: i.model_dump() for act, i in intents.items()}, sort_keys=True) if intents else ""


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


def values_of(custom_values: Any, key: int | None) -> dict[str, Intent]:
    """The intents in an object's `customValue`."""
    return parse(value_of(custom_values, key))


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

    def current(self, entity: Any) -> dict[str, Intent]:
        """The intents on `entity` now (one read)."""
        key = self.key()
        return values_of(call("read intent", lambda: entity.customValue), key)

    def record(self, entity: Any, act: str, why: str, **data: Any) -> None:
        """Record, before the act, that this run is about to do `act` to `entity`, and why."""
        since = call("read vCenter time", lambda: self.session.si.CurrentTime()).isoformat(timespec="seconds")
        self._update(entity, act, Intent(run=self.run, why=why, since=since, data=data))

    def clear(self, entity: Any, act: str) -> None:
        """The act is finished or undone: remove its record (others on the object stay)."""
        self._update(entity, act, None)

    def _update(self, entity: Any, act: str, intent: Intent | None) -> None:
        def edit(value: str | None) -> str | None:
            intents = parse(value)
            if intent is None and act not in intents:
                return None
            intents.pop(act, None)
            if intent is not None:
                intents[act] = intent
            return encode(intents)

        self.rewrite(entity, f"record intent {act!r}", edit)

    def rewrite(self, entity: Any, what: str, edit: Callable[[str | None], str | None]) -> None:
        """Replace the field's value on `entity` by `edit(value now)` (None: leave it), read and written
        under this run's lock for the object."""
        key = self.key()
        with self._lock(entity):
            value = edit(value_of(call(f"read {self.field}", lambda: entity.customValue), key))
            if value is not None:
                call(what, lambda: self._manager.SetField(entity=entity, key=key, value=value))
