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

from gpuvm.errors import RemoteCommandError
from gpuvm.parsers.ibdev2netdev import PortMap, parse_ibdev2netdev
from gpuvm.parsers.ip import Link, parse_ip_addr_json
from gpuvm.parsers.mlxconfig import ats_enabled
from gpuvm.parsers.mst import MstDevice, parse_mst_status
from gpuvm.plan import Change, Disruption
from gpuvm.remote import Cluster, RemoteTarget, run
from gpuvm.runbook.model import RdmaPort
from gpuvm.steps.base import Context, Step

NAME = "guest.nic"


@dataclass(frozen=True)
class SetCardAts:
    device: str  # what mlxconfig is given: the mst device, else the card's PCI address
    value: bool


@dataclass(frozen=True)
class SetMtu:
    interface: str
    mtu: int


@dataclass(frozen=True)
class LinkUp:
    interface: str


@dataclass(frozen=True)
class SetAddress:
    interface: str
    address: str  # "10.0.0.1/24"
    replaces: str | None  # the same address with another prefix


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


def wanted(target: RemoteTarget) -> bool:
    return target.guest is not None and (target.guest.nic_ats is not None or bool(target.guest.rdma_ports))


def observe(ctx: Context, target: RemoteTarget) -> NicFact:
    guest, cluster = target.guest, ctx.cluster
    assert guest is not None
    cards: tuple[Card, ...] = ()
    if guest.nic_ats is not None:
        cards = tuple(Card(pci, dev, ats_enabled(run(target, cluster, ["mlxconfig", "-d", dev, "q", "ATS_ENABLED"],
                                                     sudo=target.root).stdout))
                      for pci, dev in _cards(_mst_devices(target, cluster)))
    ports: tuple[PortMap, ...] = ()
    if any(p.device for p in guest.rdma_ports):
        ports = tuple(parse_ibdev2netdev(run(target, cluster, ["ibdev2netdev"]).stdout))
    links = parse_ip_addr_json(run(target, cluster, ["ip", "-j", "addr", "show"]).stdout) if guest.rdma_ports else {}
    return NicFact(cards, ports, links)


def _mst_devices(target: RemoteTarget, cluster: Cluster) -> list[MstDevice]:
    """`mst status -v`. Observing never runs `mst start` (a dry run loads no driver): without the
    mst device files, mlxconfig is given the card's PCI address instead."""
    return parse_mst_status(run(target, cluster, ["mst", "status", "-v"], sudo=target.root).stdout)


def _cards(devices: list[MstDevice]) -> list[tuple[str, str]]:
    """(pci, device for mlxconfig) of each card's first function: "ca:00.0" and "ca:00.1" are one card."""
    cards: dict[str, tuple[str, str]] = {}
    for d in sorted(devices, key=lambda d: d.pci):
        cards.setdefault(d.pci.rsplit(".", 1)[0], (d.pci, d.mst or d.pci))
    return list(cards.values())


def plan(target: RemoteTarget, fact: NicFact) -> list[Change]:
    guest = target.guest
    assert guest is not None
    changes: list[Change] = []
    if guest.nic_ats is not None:
        if not fact.cards:
            raise target.error(NAME, ("nic_ats",), "nic_ats is set but `mst status -v` lists no Mellanox device")
        for card in fact.cards:
            if card.ats != guest.nic_ats:
                changes.append(Change(NAME, target.name, f"ConnectX {card.pci} ({card.mst})", "ATS_ENABLED",
                                      card.ats, guest.nic_ats, Disruption.HOST_REBOOT,
                                      SetCardAts(card.mst, guest.nic_ats)))
    for i, port in enumerate(guest.rdma_ports):
        changes += _plan_port(target.name, port, _link(target, fact, i, port))
    return changes


def _link(target: RemoteTarget, fact: NicFact, i: int, port: RdmaPort) -> Link:
    name = port.interface
    if port.device is not None:
        mapped = next((p.netdev for p in fact.ports if (p.ibdev, p.port) == (port.device, port.port)), None)
        if mapped is None:
            known = ", ".join(f"{p.ibdev} port {p.port}" for p in fact.ports) or "none"
            raise target.error(NAME, ("rdma_ports", i),
                         f"port {port.describe()} not found by ibdev2netdev (ports: {known})")
        name = mapped
    assert name is not None
    if name not in fact.links:
        known = ", ".join(fact.links) or "none"
        raise target.error(NAME, ("rdma_ports", i), f"port {port.describe()}: interface {name} not found "
                                                    f"(interfaces: {known})")
    return fact.links[name]


def _plan_port(name: str, port: RdmaPort, link: Link) -> list[Change]:
    resource = link.name if port.interface else f"{link.name} ({port.describe()})"
    changes = []
    if port.mtu is not None and link.mtu != port.mtu:
        changes.append(Change(NAME, name, resource, "mtu", link.mtu, port.mtu, action=SetMtu(link.name, port.mtu)))
    if not link.up:
        changes.append(Change(NAME, name, resource, "state", "down", "up", action=LinkUp(link.name)))
    if port.ip is not None:
        want = ipaddress.ip_interface(port.ip)
        have = [ipaddress.ip_interface(a) for a in link.addresses]
        if want not in have:
            # the same address with another prefix is replaced; other addresses stay
            old = next((str(h) for h in have if h.ip == want.ip), None)
            changes.append(Change(NAME, name, resource, "address", old or "absent", str(want),
                                  action=SetAddress(link.name, str(want), old)))
    return changes


def argv(action: SetMtu | LinkUp | SetAddress) -> list[list[str]]:
    """The `ip` commands that make a port change."""
    if isinstance(action, SetMtu):
        return [["ip", "link", "set", "dev", action.interface, "mtu", str(action.mtu)]]
    if isinstance(action, LinkUp):
        return [["ip", "link", "set", "dev", action.interface, "up"]]
    drop = [["ip", "addr", "del", action.replaces, "dev", action.interface]] if action.replaces else []
    return drop + [["ip", "addr", "add", action.address, "dev", action.interface]]


def apply(ctx: Context, target: RemoteTarget, changes: list[Change]) -> None:
    for change in changes:
        if isinstance(change.action, SetCardAts):
            _set_ats(target, ctx.cluster, change.action)
        else:
            for command in argv(change.action):
                run(target, ctx.cluster, command, sudo=target.root)
    _check_links(target, ctx.cluster, [c for c in changes if not isinstance(c.action, SetCardAts)])


def _set_ats(target: RemoteTarget, cluster: Cluster, action: SetCardAts) -> None:
    value = "true" if action.value else "false"
    run(target, cluster, ["mlxconfig", "-y", "-d", action.device, "set", f"ATS_ENABLED={value}"], sudo=target.root)
    now = ats_enabled(run(target, cluster, ["mlxconfig", "-d", action.device, "q", "ATS_ENABLED"],
                          sudo=target.root).stdout)
    if now != action.value:
        raise RemoteCommandError(f"ATS_ENABLED on {action.device} reads {now} after the set")


def _check_links(target: RemoteTarget, cluster: Cluster, changes: list[Change]) -> None:
    """Read the interfaces back: what was set must show."""
    if not changes:
        return
    links = parse_ip_addr_json(run(target, cluster, ["ip", "-j", "addr", "show"]).stdout)
    for change in changes:
        action = change.action
        link = links.get(action.interface)
        if link is None:
            ok = False
        elif isinstance(action, SetMtu):
            ok = link.mtu == action.mtu
        elif isinstance(action, LinkUp):
            ok = link.up
        else:
            ok = ipaddress.ip_interface(action.address) in [ipaddress.ip_interface(a) for a in link.addresses]
        if not ok:
            raise RemoteCommandError(f"{change.resource} {change.field} is not {change.after} "
                                     "after apply")


STEP = Step(NAME, "guest", observe, plan, apply, wanted=wanted)
