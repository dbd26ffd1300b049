"""guest.nic: ConnectX ATS and the RDMA ports (link up, MTU, address) inside a guest.

ATS: `mst start`, then `mlxconfig -d <mst device> q ATS_ENABLED` per card (the value for the next
boot); set with `mlxconfig -y -d <dev> set ATS_ENABLED=true`. With the NIC passed through, the
value takes effect only when the ESXi *host* reboots, so the change is marked "needs host reboot".
mlxconfig settings belong to the card, so each card is queried once, through its first function.

Ports are named by RDMA device and port (mapped to the interface with `ibdev2netdev`) or by
interface; apply uses `ip link set dev X mtu N`, `ip link set dev X up` and `ip addr add`.
Addresses and MTU set with `ip` do NOT survive a reboot of the guest: persisting them (netplan,
NetworkManager, ifcfg files) is left to the OS image, and the next `gpuvm apply` sets them again.
Addresses the runbook does not name are left on the interface.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field

from gpuvm.errors import InputError, RemoteCommandError
from gpuvm.parsers.ibdev2netdev import PortMap, parse_ibdev2netdev
from gpuvm.parsers.ip import Link, parse_ip_addr_json
from gpuvm.parsers.mlxconfig import ats_enabled
from gpuvm.parsers.mst import MstDevice, parse_mst_status
from gpuvm.plan import Change, Disruption
from gpuvm.remote import Cluster, RemoteTarget, run
from gpuvm.runbook.model import RdmaPort

NAME = "guest.nic"


@dataclass(frozen=True)
class Card:
    pci: str  # the first function's address, "ca:00.0"
    mst: str  # "/dev/mst/mt4123_pciconf0"
    ats: bool  # ATS_ENABLED for the next boot


@dataclass(frozen=True)
class NicFact:
    cards: tuple[Card, ...] = ()
    ports: tuple[PortMap, ...] = ()  # from ibdev2netdev
    links: dict[str, Link] = field(default_factory=dict)  # from `ip -j addr show`


def wanted(target: RemoteTarget, cluster: Cluster) -> bool:
    return target.guest is not None and (target.guest.nic_ats is not None or bool(target.guest.rdma_ports))


def _root(target: RemoteTarget) -> bool:
    """mst, mlxconfig and ip changes need root: sudo unless the login user is root."""
    return target.sudo or target.access.user != "root"


def observe(target: RemoteTarget, cluster: Cluster) -> NicFact:
    guest = target.guest
    assert guest is not None
    cards: tuple[Card, ...] = ()
    if guest.nic_ats is not None:
        cards = tuple(Card(pci, dev, ats_enabled(run(target, cluster, ["mlxconfig", "-d", dev, "q", "ATS_ENABLED"],
                                                     sudo=_root(target)).stdout))
                      for pci, dev in _cards(_mst_devices(target, cluster)))
    ports: tuple[PortMap, ...] = ()
    if any(p.device for p in guest.rdma_ports):
        ports = tuple(parse_ibdev2netdev(run(target, cluster, ["ibdev2netdev"]).stdout))
    links = parse_ip_addr_json(run(target, cluster, ["ip", "-j", "addr", "show"]).stdout) if guest.rdma_ports else {}
    return NicFact(cards, ports, links)


def _mst_devices(target: RemoteTarget, cluster: Cluster) -> list[MstDevice]:
    """`mst status -v`. Observing never runs `mst start` (a dry run loads no driver): without the
    mst device files, mlxconfig is given the card's PCI address instead."""
    return parse_mst_status(run(target, cluster, ["mst", "status", "-v"], sudo=_root(target)).stdout)


def _cards(devices: list[MstDevice]) -> list[tuple[str, str]]:
    """(pci, device for mlxconfig) of each card's first function: "ca:00.0" and "ca:00.1" are one card."""
    cards: dict[str, tuple[str, str]] = {}
    for d in sorted(devices, key=lambda d: d.pci):
        cards.setdefault(d.pci.rsplit(".", 1)[0], (d.pci, d.mst or d.pci))
    return list(cards.values())


def plan(target: RemoteTarget, fact: NicFact, cluster: Cluster) -> list[Change]:
    guest = target.guest
    assert guest is not None
    changes: list[Change] = []
    if guest.nic_ats is not None:
        if not fact.cards:
            raise _input(target, cluster, ("nic_ats",), "nic_ats is set but `mst status -v` lists no Mellanox device")
        for card in fact.cards:
            if card.ats != guest.nic_ats:
                changes.append(Change(NAME, target.name, f"ConnectX {card.pci} ({card.mst})", "ATS_ENABLED",
                                      card.ats, guest.nic_ats, Disruption.HOST_REBOOT,
                                      spec={"device": card.mst, "value": "true" if guest.nic_ats else "false"}))
    for i, port in enumerate(guest.rdma_ports):
        changes += _plan_port(target.name, port, _link(target, cluster, fact, i, port))
    return changes


def _link(target: RemoteTarget, cluster: Cluster, fact: NicFact, i: int, port: RdmaPort) -> Link:
    name = port.interface
    if port.device is not None:
        mapped = next((p.netdev for p in fact.ports if (p.ibdev, p.port) == (port.device, port.port)), None)
        if mapped is None:
            known = ", ".join(f"{p.ibdev} port {p.port}" for p in fact.ports) or "none"
            raise _input(target, cluster, ("rdma_ports", i),
                         f"port {port.describe()} not found by ibdev2netdev (ports: {known})")
        name = mapped
    assert name is not None
    if name not in fact.links:
        known = ", ".join(fact.links) or "none"
        raise _input(target, cluster, ("rdma_ports", i), f"port {port.describe()}: interface {name} not found "
                                                         f"(interfaces: {known})")
    return fact.links[name]


def _input(target: RemoteTarget, cluster: Cluster, loc: tuple[str | int, ...], message: str) -> InputError:
    guests = cluster.runbook.guests.hosts if cluster.runbook.guests else []
    index = next((i for i, g in enumerate(guests) if g.vm == target.name), 0)
    return cluster.runbook.error(("guests", "hosts", index) + loc, f"{NAME}: guest {target.name}: {message}")


def _plan_port(name: str, port: RdmaPort, link: Link) -> list[Change]:
    resource = link.name if port.interface else f"{link.name} ({port.describe()})"
    spec = {"interface": link.name}
    changes = []
    if port.mtu is not None and link.mtu != port.mtu:
        changes.append(Change(NAME, name, resource, "mtu", link.mtu, port.mtu, spec=spec | {"mtu": port.mtu}))
    if not link.up:
        changes.append(Change(NAME, name, resource, "state", "down", "up", spec=spec | {"up": True}))
    if port.ip is not None:
        want = ipaddress.ip_interface(port.ip)
        have = [ipaddress.ip_interface(a) for a in link.addresses]
        if want not in have:
            # the same address with another prefix is replaced; other addresses stay
            old = next((str(h) for h in have if h.ip == want.ip), None)
            changes.append(Change(NAME, name, resource, "address", old or "absent", str(want),
                                  spec=spec | {"add": str(want), "delete": old}))
    return changes


def apply(target: RemoteTarget, changes: list[Change], cluster: Cluster) -> None:
    sudo = _root(target)
    for change in changes:
        spec, dev = change.spec, change.spec.get("interface")
        if "device" in spec:
            _set_ats(target, cluster, spec["device"], spec["value"])
        elif "mtu" in spec:
            run(target, cluster, ["ip", "link", "set", "dev", dev, "mtu", str(spec["mtu"])], sudo=sudo)
        elif "up" in spec:
            run(target, cluster, ["ip", "link", "set", "dev", dev, "up"], sudo=sudo)
        elif "add" in spec:
            if spec["delete"]:
                run(target, cluster, ["ip", "addr", "del", spec["delete"], "dev", dev], sudo=sudo)
            run(target, cluster, ["ip", "addr", "add", spec["add"], "dev", dev], sudo=sudo)
    _check_links(target, cluster, [c for c in changes if "interface" in c.spec])


def _set_ats(target: RemoteTarget, cluster: Cluster, device: str, value: str) -> None:
    sudo = _root(target)
    run(target, cluster, ["mlxconfig", "-y", "-d", device, "set", f"ATS_ENABLED={value}"], sudo=sudo)
    now = ats_enabled(run(target, cluster, ["mlxconfig", "-d", device, "q", "ATS_ENABLED"], sudo=sudo).stdout)
    if now != (value == "true"):
        raise RemoteCommandError(f"{target.name}: {NAME}: ATS_ENABLED on {device} reads {now} after the set")


def _check_links(target: RemoteTarget, cluster: Cluster, changes: list[Change]) -> None:
    """Read the interfaces back: what was set must show."""
    if not changes:
        return
    links = parse_ip_addr_json(run(target, cluster, ["ip", "-j", "addr", "show"]).stdout)
    for change in changes:
        link, spec = links.get(change.spec["interface"]), change.spec
        if link is None:
            ok = False
        elif "mtu" in spec:
            ok = link.mtu == spec["mtu"]
        elif "up" in spec:
            ok = link.up
        else:
            ok = ipaddress.ip_interface(spec["add"]) in [ipaddress.ip_interface(a) for a in link.addresses]
        if not ok:
            raise RemoteCommandError(f"{target.name}: {NAME}: {change.resource} {change.field} is not {change.after} "
                                     "after apply")


class GuestNicStep:
    name, role = NAME, "guest"
    wanted = staticmethod(wanted)
    observe = staticmethod(observe)
    plan = staticmethod(plan)
    apply = staticmethod(apply)
