"""What gpuvm owns on a host, kept on the host itself: the custom attribute `gpuvm.owned`.

gpuvm turns passthrough off only for devices it turned on. That ownership is state, not history:
it lives in vCenter next to the device (every machine and operator sees it, in the one bulk
inventory read: `HostFacts.owned`), not in a local journal that another machine, another state
directory or a lost disk would not have. The value is JSON:

    {"passthrough": ["0000:17:00.0", ...],   enabled by gpuvm, not released since
     "released": ["0000:31:00.0", ...]}      turned off by gpuvm, the host's reboot still pending

Written before the act (`host.passthrough`), so a killed run leaves at worst a record for a device
the act never reached: seen off at the next plan, that record is dropped, never acted on. Kept
apart from `gpuvm.intent`: ownership is lasting state, an intent is an act under way (drift).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel, ValidationError

from gpuvm.vsphere.intent import MAX_VALUE, IntentStore, value_of

FIELD = "gpuvm.owned"


class Owned(BaseModel):
    passthrough: list[str] = []  # PCI addresses whose passthrough gpuvm enabled
    released: list[str] = []  # PCI addresses whose passthrough gpuvm turned off, the reboot still pending

    def encode(self) -> str:
        return json.dumps(self.model_dump(), sort_keys=True) if self.passthrough or self.released else ""


def parse(value: str | None) -> Owned:
    """The record in one attribute value; a value gpuvm did not write owns nothing (nothing released)."""
    if not value or len(value) > MAX_VALUE:
        return Owned()
    try:
        return Owned.model_validate_json(value)
    except ValidationError:
        return Owned()


def owned_of(custom_values: Any, key: int | None) -> Owned:
    """The record in an object's `customValue`."""
    return parse(value_of(custom_values, key))


class OwnedStore:
    """Edits hosts' `gpuvm.owned` records for one run."""

    def __init__(self, session: Any, run: str):
        self._store = IntentStore(session, run, field=FIELD)

    def edit(self, host: Any, what: str, change: Callable[[Owned], Owned]) -> None:
        """Replace the host's record by `change(record now)` (read and written at once; unchanged: no write)."""
        def edit(value: str | None) -> str | None:
            before = parse(value)
            after = change(before.model_copy(deep=True))
            return None if after == before else after.encode()

        self._store.rewrite(host, what, edit)
