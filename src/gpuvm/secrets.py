"""Secrets read from the environment, and the one place that scrubs them from text.

Every password or passphrase gpuvm reads goes through `secret_from_env`, which remembers the
value; `redact` replaces every remembered value in a string. Logs, plans, journals, reports and
error messages pass their text through `redact` before it leaves the process.
"""

from __future__ import annotations

import os
import threading

from gpuvm.errors import InputError

_lock = threading.Lock()
_known: set[str] = set()

MASK = "********"


def remember(value: str | None) -> str | None:
    """Mark a value as secret so that `redact` hides it wherever it appears."""
    if value:
        with _lock:
            _known.add(value)
    return value


def secret_from_env(variable: str, where: str) -> str:
    """The value of environment variable `variable`; `where` names the runbook field asking."""
    value = os.environ.get(variable)
    if not value:
        raise InputError(f"{where}: environment variable {variable} is not set (it holds the secret)")
    return remember(value)  # type: ignore[return-value]


def redact(text: str) -> str:
    with _lock:
        values = sorted(_known, key=len, reverse=True)
    for value in values:
        text = text.replace(value, MASK)
    return text
