"""What every runbook model shares: no unknown keys, frozen, and one rule for names."""

from __future__ import annotations

import re

from pydantic import BaseModel, ConfigDict

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,79}$")


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def checked_name(value: str) -> str:
    """A host, VM or benchmark name: letters, digits, '.', '_', '-'; at most 80."""
    if not NAME.match(value):
        raise ValueError(f"'{value}' is not a valid name (letters, digits, '.', '_', '-'; max 80)")
    return value
