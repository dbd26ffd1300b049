"""guest.nic: the RDMA ports inside a guest: link up, MTU, address.

Ports are named by RDMA device and port (mapped to the interface with `ibdev2netdev`) or by
interface; apply uses `ip link set dev X mtu N`, `ip link set dev X up` and `ip addr add`.
Addresses and MTU set with `ip` do NOT survive a reboot of the guest: persisting them (netplan,
NetworkManager, ifcfg files) is left to the OS image, and the next `gpuvm apply` sets them again.
Addresses the runbook does not name are left on the interface. ConnectX ATS is `guest.nic_ats`.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field

from gpuvm.errors import RemoteCommandError
from gpuvm.parsers.ibdev2netdev import PortMap, parse_ibdev2netdev
from gpuvm.parsers.ip import Link, parse_ip_addr_json
from gpuvm.plan import Change
from gpuvm.desired.ssh import DesiredGuest, RdmaPort
from gpuvm.remote import Cluster, run
from gpuvm.steps.base import Context, Step

NAME = "guest.nic"


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
class NicFact:
    ports: tuple[PortMap, ...] = ()  # from ibdev2netdev
    links: dict[str, Link] = field(default_factory=dict)  # from `ip -j addr show`


def wanted(target: DesiredGuest) -> bool:
    return bool(target.rdma_ports)


def observe(ctx: Context, target: DesiredGuest) -> NicFact:
    cluster = ctx.cluster
    ports: tuple[PortMap, ...] = ()
    if any(p.device for p in target.rdma_ports):
        ports = tuple(parse_ibdev2netdev(run(target, cluster, ["ibdev2netdev"]).stdout))
    return NicFact(ports, parse_ip_addr_json(run(target, cluster, ["ip", "-j", "addr", "show"]).stdout))


def plan(target: DesiredGuest, fact: NicFact) -> list[Change]:
    changes: list[Change] = []
    for i, port in enumerate(target.rdma_ports):
        changes += _plan_port(target.name, port, _link(target, fact, i, port))
    return changes


def _link(target: DesiredGuest, fact: NicFact, i: int, port: RdmaPort) -> Link:
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


def apply(ctx: Context, target: DesiredGuest, changes: list[Change]) -> None:
    for change in changes:
        for command in argv(change.action):
            run(target, ctx.cluster, command, sudo=target.root)
    _check_links(target, ctx.cluster, changes)


def _check_links(target: DesiredGuest, cluster: Cluster, changes: list[Change]) -> None:
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
