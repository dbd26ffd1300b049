"""`ip -j addr show`: network interfaces with admin state, MTU and addresses (iproute2's JSON)."""

from __future__ import annotations

import json
from dataclasses import dataclass

from gpuvm.parsers._common import unparseable


@dataclass(frozen=True)
class Link:
    name: str
    up: bool  # administratively up (the UP flag), as `ip link set dev X up` sets it
    mtu: int
    addresses: tuple[str, ...] = ()  # "192.168.100.11/24", "fe80::1/64"
    operstate: str = "UNKNOWN"  # "UP", "DOWN", "UNKNOWN" (dummy devices and some drivers)


def parse_ip_addr_json(text: str) -> dict[str, Link]:
    """Interfaces by name. Older iproute2 prints `{}` for entries it has nothing for: skipped."""
    command = "ip -j addr show"
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        raise unparseable(command, "a JSON list of interfaces", text) from None
    if not isinstance(data, list):
        raise unparseable(command, "a JSON list of interfaces", text)
    links = {}
    for entry in data:
        if not isinstance(entry, dict) or "ifname" not in entry:
            continue
        addresses = tuple(f"{a['local']}/{a['prefixlen']}" for a in entry.get("addr_info", [])
                          if isinstance(a, dict) and "local" in a and "prefixlen" in a)
        links[entry["ifname"]] = Link(entry["ifname"], "UP" in entry.get("flags", []), int(entry.get("mtu", 0)),
                                      addresses, str(entry.get("operstate", "UNKNOWN")))
    return links
