"""`nvidia-smi -q [-d CLOCK,TEMPERATURE,POWER,PERFORMANCE]`: driver and CUDA versions, and per GPU
its clocks, temperature, power, the clock throttle (event) reasons that are active, and on a vGPU
(or vCS-licensed) guest its "vGPU Software Licensed Product" (product name, License Status).

The output is an indented tree of `Name : value` lines under section headers. Driver generations
name sections differently: "Power Readings" (≤ 530) / "GPU Power Readings", "Clocks Throttle
Reasons" (≤ 530) / "Clocks Event Reasons", "Power Draw" / "Average Power Draw": both are read.
Fields the driver reports as N/A are left out.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import UTC, datetime

from gpuvm.parsers._common import unparseable

_LINE = re.compile(r"^(\s*)(.+?)(?:\s+:\s*(.*))?\s*$")
_NUMBER = re.compile(r"^(-?\d+(?:\.\d+)?)\s*(MHz|C|W)$")
_THROTTLE_SECTIONS = ("Clocks Throttle Reasons", "Clocks Event Reasons")
_POWER_SECTIONS = ("Power Readings", "GPU Power Readings")
_LICENCE_SECTION = "vGPU Software Licensed Product"
# `Licensed (Expiry: 2025-3-19 7:29:4 GMT)`: NVIDIA prints the fields without leading zeros
_EXPIRY = re.compile(r"\(Expiry:\s*(\d{4})-(\d{1,2})-(\d{1,2})\s+(\d{1,2}):(\d{1,2}):(\d{1,2})\s*GMT\)")
_CLOCK_SECTIONS = {"Clocks": "clocks_mhz", "Applications Clocks": "applications_clocks_mhz",
                   "Max Clocks": "max_clocks_mhz"}


@dataclass
class GpuReadings:
    bus_id: str
    name: str | None = None
    performance_state: str | None = None
    clocks_mhz: dict[str, float] = field(default_factory=dict)  # graphics, sm, memory, video now
    applications_clocks_mhz: dict[str, float] = field(default_factory=dict)  # what the clocks are set to
    max_clocks_mhz: dict[str, float] = field(default_factory=dict)
    temperature_c: float | None = None
    power_w: float | None = None
    power_limit_w: float | None = None
    throttle_reasons: list[str] = field(default_factory=list)  # the reasons "Active" (e.g. "SW Power Cap")
    licensed_product: str | None = None  # "NVIDIA Virtual Compute Server"; None: no licensed product section
    license_status: str | None = None  # "Licensed (Expiry: 2025-3-19 7:29:4 GMT)", "Unlicensed (Restricted)"


@dataclass
class SmiReport:
    driver: str | None
    cuda: str | None
    gpus: list[GpuReadings]


def parse_nvidia_smi_q(text: str) -> SmiReport:
    """The versions in the header and every `GPU <bus id>` block."""
    if "NVSMI LOG" not in text:
        raise unparseable("nvidia-smi -q", "the '==NVSMI LOG==' header", text)
    header: dict[str, str] = {}
    gpus: list[GpuReadings] = []
    path: list[tuple[int, str]] = []  # the sections the line is in, with their indents
    for raw in text.splitlines():
        if not raw.strip() or raw.lstrip().startswith("="):
            continue
        m = _LINE.match(raw)
        indent, name, value = len(m[1]), m[2].strip(), m[3]
        if indent == 0 and name.startswith("GPU ") and value is None:
            gpus.append(GpuReadings(bus_id=name.removeprefix("GPU ").strip()))
            path = []
            continue
        while path and path[-1][0] >= indent:
            path.pop()
        if value is None:
            path.append((indent, name))
            continue
        if not gpus:
            header[name] = value.strip()
            continue
        _read(gpus[-1], [section for _, section in path], name, value.strip())
    return SmiReport(_known(header.get("Driver Version")), _known(header.get("CUDA Version")), gpus)


def _read(gpu: GpuReadings, sections: list[str], name: str, value: str) -> None:
    top = sections[0] if sections else None
    number = _number(value)
    if top is None:
        if name == "Product Name":
            gpu.name = _known(value)
        elif name == "Performance State":
            gpu.performance_state = _known(value)
    elif top == _LICENCE_SECTION:
        if name == "Product Name":
            gpu.licensed_product = _known(value)
        elif name == "License Status":
            gpu.license_status = _known(value)
    elif top in _THROTTLE_SECTIONS:
        if value == "Active":
            gpu.throttle_reasons.append(name)
    elif top in _CLOCK_SECTIONS and len(sections) == 1 and number is not None:
        getattr(gpu, _CLOCK_SECTIONS[top])[name.lower()] = number
    elif top == "Temperature" and name == "GPU Current Temp":
        gpu.temperature_c = number
    elif top in _POWER_SECTIONS:
        if name in ("Power Draw", "Average Power Draw") and number is not None:
            gpu.power_w = number
        elif name in ("Power Limit", "Current Power Limit", "Enforced Power Limit") and number is not None:
            gpu.power_limit_w = gpu.power_limit_w if name == "Enforced Power Limit" and gpu.power_limit_w else number


def _number(value: str) -> float | None:
    m = _NUMBER.match(value)
    return float(m[1]) if m else None


def _known(value: str | None) -> str | None:
    return None if value is None or value.strip() in ("", "N/A", "[N/A]") else value.strip()


def license_state(status: str) -> tuple[bool, datetime | None]:
    """A `License Status` value → (licensed, expiry in UTC; None when it prints none). Only
    `Licensed…` counts: `Unlicensed (Restricted)`, `Unlicensed (Unrestricted)` and anything else do not."""
    licensed = status.strip().startswith("Licensed")
    m = _EXPIRY.search(status)
    if not licensed or m is None:
        return licensed, None
    try:
        return True, datetime(*(int(g) for g in m.groups()), tzinfo=UTC)  # type: ignore[misc]
    except ValueError:  # a date that does not exist (month 13): no expiry gpuvm can trust
        return True, None
