"""What every runbook model shares: no unknown keys, frozen, no booleans for numbers, and one
rule for names."""

from __future__ import annotations

import functools
import re
import types
import typing
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,79}")
REFERENCE = re.compile(rf"(?:{NAME.pattern}/)?{NAME.pattern}")  # a host or VM: name, or <vcenter>/<name>
MAX_SECONDS = 7 * 24 * 3600  # a week: longer than any build, boot or benchmark; sleep() and timers take it
# Every runbook number that becomes a timeout: finite (`.inf` / `.nan` would overflow the timers or
# wait for ever), positive, at most a week.
Seconds = Annotated[float, Field(gt=0, le=MAX_SECONDS, allow_inf_nan=False)]


def shown(value: object, limit: int = 60) -> str:
    """A value quoted for a message: control characters escaped, long values cut."""
    text = str(value)
    cut = text[:limit].encode("unicode_escape").decode("ascii")
    quoted = cut if isinstance(value, int) else f"'{cut}'"
    return quoted + (f" (… {len(text)} characters)" if len(text) > limit else "")


def required_in_schema(*names: str) -> ConfigDict:
    """The config of a model whose fields `names` default to None only so that their validator can
    say they are missing in its own words: its JSON Schema (and docs/runbook.md) says they are
    required strings, as validation does."""

    def edit(schema: dict[str, Any]) -> None:
        schema["required"] = [*schema.get("required", []), *names]
        for name in names:
            prop = schema["properties"][name]
            prop.pop("default", None)
            prop.update(next(o for o in prop.pop("anyOf") if o.get("type") != "null"))

    return ConfigDict(json_schema_extra=edit)


def _types(annotation: Any) -> set[Any]:
    """The plain types an annotation admits (unions, Optional, Annotated and lists looked through)."""
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType, typing.Annotated, list, tuple):
        args = typing.get_args(annotation)
        return set().union(*(_types(a) for a in (args[:1] if origin is typing.Annotated else args)))
    return {annotation}


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    @model_validator(mode="before")
    @classmethod
    def _no_bool_for_numbers(cls, data: Any) -> Any:
        """YAML's true/false is not 1/0: a number field refuses it (pydantic would take it)."""
        if isinstance(data, dict):
            numbers = _number_fields(cls)
            for name, value in data.items():
                items = value if isinstance(value, list) else [value]
                if name in numbers and any(isinstance(v, bool) for v in items):
                    raise ValueError(f"{name}: expected a number, got {str(value).lower()}")
        return data


@functools.cache
def _number_fields(model: type[BaseModel]) -> frozenset[str]:
    """The fields of `model` that take a number and no boolean (looked up once: a runbook of 4,096
    VMs validates ~30,000 models)."""
    return frozenset(name for name, field in model.model_fields.items()
                     if (admitted := _types(field.annotation)) & {int, float} and bool not in admitted)


def checked_name(value: str) -> str:
    """A host, VM or benchmark name: letters, digits, '.', '_', '-'; at most 80."""
    if not NAME.fullmatch(value):
        raise ValueError(f"{shown(value)} is not a valid name (letters, digits, '.', '_', '-'; max 80)")
    return value


def checked_reference(value: str) -> str:
    """A reference to a host or VM: its name, or `<vcenter>/<name>` (a name used in several vCenters)."""
    if not REFERENCE.fullmatch(value):
        raise ValueError(f"{shown(value)} is not a valid name (letters, digits, '.', '_', '-'; max 80), "
                         "or <vcenter>/<name>")
    return value
