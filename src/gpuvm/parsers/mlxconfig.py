"""`mlxconfig -d DEV q [PARAM...]`: parameter -> value of the "Next Boot" column (or all three with -e)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from gpuvm.parsers._common import unparseable
from gpuvm.untrusted import checked

# Names are upper case but for a few, e.g. EXP_ROM_UEFI_x86_ENABLE (MFT spells them so).
_ROW = re.compile(r"^[ *]\s+([A-Z][A-Za-z0-9_]*(?:\[\d+\])?)\s+(\S+)(?:\s+(\S+)\s+(\S+))?\s*$")


@dataclass(frozen=True)
class MlxParam:
    default: str | None
    current: str | None
    next_boot: str


def parse_mlxconfig_params(text: str) -> dict[str, MlxParam]:
    """Every parameter; `default`/`current` are only known from `mlxconfig -e q`."""
    lines = text.splitlines()
    try:
        start = next(i for i, line in enumerate(lines) if line.startswith("Configurations:"))
    except StopIteration:
        raise unparseable("mlxconfig q", "a 'Configurations:' section", text) from None
    extended = "Default" in lines[start]
    params = {}
    for line in lines[start + 1 :]:
        if not line.strip() or line.startswith("The '*'"):
            continue
        m = _ROW.match(line)
        if not m or bool(m[3]) != extended:
            raise unparseable("mlxconfig q", "rows 'PARAM  VALUE' under 'Configurations:'", line)
        for value in m.groups()[1:]:
            if value is not None:
                checked(value, "an mlxconfig value", "mlxconfig q")
        if extended:
            params[m[1]] = MlxParam(default=m[2], current=m[3], next_boot=m[4])
        else:
            params[m[1]] = MlxParam(default=None, current=None, next_boot=m[2])
    return params


def parse_mlxconfig_query(text: str) -> dict[str, str]:
    """Parameter -> the value mlxconfig shows (the "Next Boot" value), e.g. {"ATS_ENABLED": "False(0)"}."""
    return {name: p.next_boot for name, p in parse_mlxconfig_params(text).items()}


def mlx_bool(value: str) -> bool:
    """`True(1)` / `False(0)` (also bare `True`, `1`...) as a bool."""
    v = value.strip()
    m = re.fullmatch(r"(?i)(true|false)(?:\((\d)\))?|([01])", v)
    if not m:
        raise unparseable("mlxconfig q", "a boolean such as True(1) or False(0)", v)
    return (m[1] or "").lower() == "true" or m[3] == "1"


@dataclass(frozen=True)
class AtsState:
    current: bool  # what the card runs now
    next_boot: bool  # what it runs after the next cold boot (for a passed-through card: the host's reboot)


def ats_state(text: str) -> AtsState:
    """ATS_ENABLED now and for the next boot, from `mlxconfig -d DEV -e q ATS_ENABLED`."""
    param = parse_mlxconfig_params(text).get("ATS_ENABLED")
    if param is None:
        raise unparseable("mlxconfig -e q ATS_ENABLED", "an ATS_ENABLED row", text)
    if param.current is None:
        raise unparseable("mlxconfig -e q ATS_ENABLED", "the Default, Current and Next Boot columns of -e", text)
    return AtsState(mlx_bool(param.current), mlx_bool(param.next_boot))
