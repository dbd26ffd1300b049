"""`ip -j addr show`: network interfaces with admin state, MTU and addresses (iproute2's JSON)."""

from __future__ import annotations

import ipaddress
import json
from dataclasses import dataclass

from gpuvm.parsers._common import unparseable
from gpuvm.untrusted import UntrustedValueError, interface, shown


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
        name = interface(str(entry["ifname"]), command)
        addresses = tuple(_address(a["local"], a["prefixlen"]) for a in entry.get("addr_info", [])
                          if isinstance(a, dict) and "local" in a and "prefixlen" in a)
        operstate = str(entry.get("operstate", "UNKNOWN"))
        if not operstate.isascii() or not operstate.replace("_", "").isalpha():
            raise UntrustedValueError(f"`{command}` answered {shown(operstate)} as the state of {name}")
        try:
            mtu = int(entry.get("mtu", 0))
        except (TypeError, ValueError):
            raise unparseable(command, f"a number as the MTU of {name}", str(entry.get("mtu"))) from None
        links[name] = Link(name, "UP" in entry.get("flags", []), mtu, addresses, operstate)
    return links


def _address(local: object, prefixlen: object) -> str:
    """`local/prefixlen`, held to the grammar of an IP interface address."""
    text = f"{local}/{prefixlen}"
    try:
        return str(ipaddress.ip_interface(text)) if isinstance(prefixlen, int) else _refused(text)
    except ValueError:
        return _refused(text)


def _refused(text: str) -> str:
    raise UntrustedValueError(f"`ip -j addr show` answered {shown(text)} as an address, which is not one; "
                              "refusing to use it")
