"""`esxcli system settings kernel list [-o NAME]`: a table with a dashed rule under the header."""

from __future__ import annotations

from dataclasses import dataclass

from gpuvm.parsers._common import unparseable

_COLUMNS = ["Name", "Type", "Configured", "Runtime", "Default", "Description"]


@dataclass(frozen=True)
class KernelSetting:
    name: str
    type: str
    configured: str
    runtime: str
    default: str
    description: str = ""

    @property
    def pending(self) -> bool:
        """A value was set that takes effect at the next reboot (`true` and `TRUE` are one value)."""
        return self.configured.strip().upper() != self.runtime.strip().upper()


def parse_esxcli_table(text: str, command: str = "esxcli") -> list[dict[str, str]]:
    """Rows of an esxcli table, by header name; column edges come from the dashed rule."""
    lines = [line.rstrip("\n") for line in text.splitlines() if line.strip()]
    if len(lines) < 2 or set(lines[1].replace(" ", "")) != {"-"}:
        raise unparseable(command, "an esxcli table (header, then a rule of dashes)", text)
    spans, start = [], None
    rule = lines[1]
    for i, ch in enumerate(rule + " "):
        if ch == "-" and start is None:
            start = i
        elif ch != "-" and start is not None:
            spans.append([start, i])
            start = None
    spans[-1][1] = max(len(line) for line in lines)  # the last column runs to the end of the line
    headers = [lines[0][a:b].strip() for a, b in spans]
    return [{h: line[a:b].strip() for h, (a, b) in zip(headers, spans)} for line in lines[2:]]


def parse_kernel_settings(text: str) -> dict[str, KernelSetting]:
    command = "esxcli system settings kernel list"
    rows = parse_esxcli_table(text, command)
    if rows and any(c not in rows[0] for c in _COLUMNS[:5]):
        raise unparseable(command, f"columns {', '.join(_COLUMNS)}", text)
    return {
        r["Name"]: KernelSetting(r["Name"], r["Type"], r["Configured"], r["Runtime"], r["Default"], r.get("Description", ""))
        for r in rows
    }


def parse_kernel_setting(text: str, name: str) -> KernelSetting:
    """The one setting `name` from `esxcli system settings kernel list -o NAME`."""
    settings = parse_kernel_settings(text)
    if name not in settings:
        raise unparseable(f"esxcli system settings kernel list -o {name}", f"a row for {name}", text)
    return settings[name]


def esxcli_bool(value: str) -> bool:
    return value.strip().upper() == "TRUE"


@dataclass(frozen=True)
class Component:
    """A row of `esxcli software component list`."""

    name: str
    version: str  # 535.154.02-1OEM.800.1.0.20613240
    vendor: str

    @property
    def driver_version(self) -> str:
        """The driver version in a VIB/component version: what precedes the ESXi build suffix."""
        return self.version.split("-", 1)[0]


def parse_components(text: str) -> list[Component]:
    """`esxcli software component list` (columns Name, Display Name, Version, …, Vendor, …)."""
    command = "esxcli software component list"
    rows = parse_esxcli_table(text, command)
    if rows and any(c not in rows[0] for c in ("Name", "Version", "Vendor")):
        raise unparseable(command, "columns Name, Version and Vendor", text)
    return [Component(r["Name"], r["Version"], r["Vendor"]) for r in rows]
