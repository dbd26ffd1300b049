"""What gpuvm owns on a host, kept on the host itself: the custom attribute `gpuvm.owned`.

gpuvm turns passthrough off only for devices it turned on. That ownership is state, not history:
it lives in vCenter next to the device (every machine and operator sees it, in the one bulk
inventory read: `HostFacts.owned`), not in a local journal that another machine, another state
directory or a lost disk would not have. The value is JSON:

    {"v": 1, "run": "3f2a9c1d0e4b",          the schema's version, the run that wrote it last
     "passthrough": ["0000:17:00.0", ...],   enabled by gpuvm, not released since
     "released": ["0000:31:00.0", ...]}      turned off by gpuvm, the host's reboot still pending

Read as input (vsphere/records.py): a value gpuvm did not write owns nothing, is reported, and is
never overwritten (the passthrough step refuses to change that host's devices until it is cleared).
A value with no version (the previous release's) is honoured when it has exactly that shape.

Written before the act (`host.passthrough`), so a killed run leaves at worst a record for a device
the act never reached: seen off at the next plan, that record is dropped, never acted on. Kept
apart from `gpuvm.intent`: ownership is lasting state, an intent is an act under way (drift).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pydantic import BaseModel

from gpuvm.errors import TaskError
from gpuvm.vsphere import records
from gpuvm.vsphere.intent import IntentStore
from gpuvm.vsphere.records import Foreign, OwnedRecord, Unreadable, shown

FIELD = "gpuvm.owned"


class Owned(BaseModel):
    passthrough: list[str] = []  # PCI addresses whose passthrough gpuvm enabled
    released: list[str] = []  # PCI addresses whose passthrough gpuvm turned off, the reboot still pending

    def encode(self, run: str) -> str:
        """The value gpuvm writes (the current version, `run` writing it); "" when it owns nothing."""
        if not self.passthrough and not self.released:
            return ""
        return records.encode(OwnedRecord(run=run, passthrough=self.passthrough, released=self.released))


def read(value: str | None, host: str) -> tuple[Owned, Foreign | None]:
    """The record in one attribute value on `host`; a value gpuvm did not write owns nothing (nothing
    released) and is returned as foreign."""
    if not value:
        return Owned(), None
    try:
        record = records.read(value, OwnedRecord)
    except Unreadable as error:
        return Owned(), Foreign(object=host, field=FIELD, why=str(error), shown=shown(value))
    assert isinstance(record, OwnedRecord)
    return Owned(passthrough=record.passthrough, released=record.released), None


class OwnedStore:
    """Edits hosts' `gpuvm.owned` records for one run."""

    def __init__(self, session: Any, run: str):
        self._store = IntentStore(session, run, field=FIELD)
        self.run = run

    def edit(self, host: Any, what: str, change: Callable[[Owned], Owned]) -> None:
        """Replace the host's record by `change(record now)` (read and written at once; unchanged: no
        write). A value gpuvm did not write is not replaced: TaskError, nothing done."""
        def edit(value: str | None) -> str | None:
            before, foreign = read(value, f"host {getattr(host, '_moId', host)}")
            if foreign is not None:
                raise TaskError(f"not recording what gpuvm owns on {foreign.object}, so not changing it: "
                                + foreign.message())
            after = change(before.model_copy(deep=True))
            return None if after == before else after.encode(self.run)

        self._store.rewrite(host, what, edit)
