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
MIN_LENGTH = 6  # a shorter secret cannot be masked without garbling other text (`tim********`)


def remember(value: str | None, where: str = "a secret") -> str | None:
    """Mark a value as secret so that `redact` hides it wherever it appears; refuse one too short
    to hide safely (`where` names where it came from)."""
    if value:
        if len(value) < MIN_LENGTH:
            raise InputError(f"{where}: the secret is shorter than {MIN_LENGTH} characters; gpuvm could not "
                             "mask it in its output without garbling other text: use a longer one")
        with _lock:
            _known.add(value)
    return value


def is_secret(value: str) -> bool:
    """Whether `value` contains a remembered secret."""
    with _lock:
        return any(secret in value for secret in _known)


def secret_from_env(variable: str, where: str) -> str:
    """The value of environment variable `variable`; `where` names the runbook field asking."""
    value = os.environ.get(variable)
    if not value:
        raise InputError(f"{where}: environment variable {variable} is not set (it holds the secret)")
    return remember(value, f"{where} ({variable})")  # type: ignore[return-value]


def remember_runbook_secrets(model: object) -> None:
    """Every secret a runbook names (its `*_env` fields whose variables are set), and govc's
    password, remembered at load: whichever command runs, none of them reaches a file or output."""
    from pydantic import BaseModel

    def walk(value: object, where: tuple[str, ...]) -> None:
        if isinstance(value, BaseModel):
            for name in type(value).model_fields:
                field = getattr(value, name)
                if name.endswith("_env") and isinstance(field, str) and os.environ.get(field):
                    remember(os.environ[field], f"{''.join(where + ('.' + name,)).lstrip('.')} ({field})")
                elif not isinstance(field, (str, int, float)) and field is not None:  # scalars hold no model
                    walk(field, where + ("." + name,))
        elif isinstance(value, (list, tuple)):
            for i, item in enumerate(value):
                walk(item, where + (f"[{i}]",))
        elif isinstance(value, dict):
            for key, item in value.items():
                walk(item, where + (f".{key}",))

    walk(model, ())
    if os.environ.get("GOVC_PASSWORD"):
        remember(os.environ["GOVC_PASSWORD"], "GOVC_PASSWORD")


def redact(text: str) -> str:
    with _lock:
        values = sorted(_known, key=len, reverse=True)
    for value in values:
        text = text.replace(value, MASK)
    return text
