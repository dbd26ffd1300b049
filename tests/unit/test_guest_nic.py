"""guest.nic: RDMA ports — plans from plain facts, observe and apply on a fake."""

from __future__ import annotations

import json
import re
import textwrap
from pathlib import Path

import pytest

from gpuvm.steps.base import Context
from gpuvm.errors import InputError, RemoteCommandError
from gpuvm.executors.fake import FakeExecutor, ok
from gpuvm.parsers.ibdev2netdev import PortMap
from gpuvm.parsers.ip import Link
from gpuvm.plan import Disruption
from gpuvm.remote import RemoteOptions, build_cluster
from gpuvm.runbook.loader import load_runbook
from gpuvm.steps import guest_nic
from gpuvm.steps.guest_nic import NicFact
from tests.unit.factories import ONE_GUEST_RUNBOOK

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "tools"

RUNBOOK = ONE_GUEST_RUNBOOK + "{guest}\n"


def cluster(tmp_path, guest: str, fake: FakeExecutor | None = None):
    path = tmp_path / "rb.yaml"
    path.write_text(textwrap.dedent(RUNBOOK).format(guest=textwrap.indent(textwrap.dedent(guest).strip(), " " * 6)))
    fake = fake or FakeExecutor("gpu-vm-01")
    return build_cluster(load_runbook(path), tmp_path, RemoteOptions(executor_factory=lambda name, access: fake))


PORTS = (PortMap("mlx5_0", 1, "ens64np1", False), PortMap("mlx5_1", 1, "ens64np2", False))


def fact(up=False, mtu=1500, addresses=(), ports=PORTS) -> NicFact:
    links = {"ens64np1": Link("ens64np1", up, mtu, tuple(addresses)), "ens64np2": Link("ens64np2", False, 1500)}
    return NicFact(ports, links)


def rows(changes):
    return [(c.resource, c.field, c.before, c.after, c.disruption) for c in changes]


PORT1 = "ens64np1 (mlx5_0 port 1)"
FULL = "rdma_ports: [{device: mlx5_0, port: 1, ip: 192.168.100.11/24, mtu: 9000}]"


@pytest.mark.parametrize("guest, observed, expected", [
    (FULL, fact(), [(PORT1, "mtu", 1500, 9000, Disruption.NONE), (PORT1, "state", "down", "up", Disruption.NONE),
                    (PORT1, "address", "absent", "192.168.100.11/24", Disruption.NONE)]),
    (FULL, fact(up=True, mtu=9000, addresses=["192.168.100.11/24", "fe80::1/64"]), []),
    (FULL, fact(up=True, mtu=9000, addresses=["192.168.100.11/16"]),
     [(PORT1, "address", "192.168.100.11/16", "192.168.100.11/24", Disruption.NONE)]),
    (FULL, fact(up=True, mtu=9000, addresses=["10.0.0.5/24"]),
     [(PORT1, "address", "absent", "192.168.100.11/24", Disruption.NONE)]),
    ("rdma_ports: [{interface: ens64np2}]", fact(), [("ens64np2", "state", "down", "up", Disruption.NONE)]),
    ("rdma_ports: [{interface: ens64np1, mtu: 4200}]", fact(up=True), [("ens64np1", "mtu", 1500, 4200, Disruption.NONE)]),
])
def test_plan(tmp_path, guest, observed, expected):
    c = cluster(tmp_path, guest)
    changes = guest_nic.plan(c.targets["gpu-vm-01"], observed)
    assert rows(changes) == expected
    assert all(ch.step == "guest.nic" and ch.target == "gpu-vm-01" for ch in changes)


@pytest.mark.parametrize("guest, observed, message", [
    ("rdma_ports: [{device: mlx5_2}]", fact(),
     r"rb\.yaml:\d+: guests\.hosts\[0\]\.rdma_ports\[0\]: guest\.nic: guest gpu-vm-01: port mlx5_2 port 1 not found by "
     r"ibdev2netdev \(ports: mlx5_0 port 1, mlx5_1 port 1\)"),
    ("rdma_ports: [{device: mlx5_0, port: 2}]", fact(), r"port mlx5_0 port 2 not found"),
    ("rdma_ports: [{interface: ib0}]", fact(), r"guest gpu-vm-01: port ib0: interface ib0 not found \(interfaces: ens64np1, ens64np2\)"),
    ("rdma_ports: [{device: mlx5_0}]", fact(ports=(PortMap("mlx5_0", 1, "ens99", True),)), r"interface ens99 not found"),
])
def test_plan_refuses(tmp_path, guest, observed, message):
    c = cluster(tmp_path, guest)
    with pytest.raises(InputError, match=message):
        guest_nic.plan(c.targets["gpu-vm-01"], observed)


# -- observe and apply on a fake guest ----------------------------------------------------------

class FakeGuest:
    """ibdev2netdev and ip over one dual-port ConnectX-6, in the tools' formats."""

    def __init__(self):
        self.links = json.loads((FIXTURES / "ip_j_addr_show.json").read_text())
        self.link("ens64np1").update(flags=["BROADCAST", "MULTICAST"], mtu=1500, addr_info=[])

    def link(self, name):
        return next(entry for entry in self.links if entry["ifname"] == name)

    def responses(self):
        return {
            "ibdev2netdev": lambda call: ok("", "".join(
                f"mlx5_{i} port 1 ==> ens64np{i + 1} ({'Up' if 'UP' in self.link(f'ens64np{i + 1}')['flags'] else 'Down'})\n"
                for i in (0, 1))),
            "ip -j addr show": lambda call: ok("", json.dumps(self.links)),
            re.compile(r"^ip link set dev (\S+) mtu (\d+)$"): self.set_mtu,
            re.compile(r"^ip link set dev (\S+) up$"): self.set_up,
            re.compile(r"^ip addr (add|del) (\S+) dev (\S+)$"): self.addr,
        }

    def set_mtu(self, call):
        m = re.search(r"dev (\S+) mtu (\d+)", call.command)
        self.link(m[1])["mtu"] = int(m[2])
        return ok("")

    def set_up(self, call):
        self.link(re.search(r"dev (\S+) up", call.command)[1])["flags"].append("UP")
        return ok("")

    def addr(self, call):
        m = re.search(r"addr (add|del) (\S+)/(\d+) dev (\S+)", call.command)
        info = self.link(m[4])["addr_info"]
        if m[1] == "add":
            info.append({"family": "inet", "local": m[2], "prefixlen": int(m[3])})
        else:
            info[:] = [a for a in info if (a["local"], a["prefixlen"]) != (m[2], int(m[3]))]
        return ok("")


def test_observe_reads_the_port_map_and_links(tmp_path):
    fake = FakeExecutor("gpu-vm-01", FakeGuest().responses())
    c = cluster(tmp_path, FULL, fake)
    observed = guest_nic.observe(Context(cluster=c), c.targets["gpu-vm-01"])
    assert [p.netdev for p in observed.ports] == ["ens64np1", "ens64np2"]
    assert observed.links["ens64np1"] == Link("ens64np1", False, 1500, (), "UP")
    assert fake.commands == ["ibdev2netdev", "ip -j addr show"]


def test_observe_reads_only_what_the_runbook_asks(tmp_path):
    fake = FakeExecutor("gpu-vm-01", FakeGuest().responses())
    c = cluster(tmp_path, "rdma_ports: [{interface: ens64np1}]", fake)
    guest_nic.observe(Context(cluster=c), c.targets["gpu-vm-01"])
    assert fake.commands == ["ip -j addr show"]


def test_apply_then_replan_is_empty(tmp_path):
    state = FakeGuest()
    fake = FakeExecutor("gpu-vm-01", state.responses())
    c = cluster(tmp_path, FULL, fake)
    target = c.targets["gpu-vm-01"]
    changes = guest_nic.plan(target, guest_nic.observe(Context(cluster=c), target))
    assert [ch.field for ch in changes] == ["mtu", "state", "address"]
    fake.calls.clear()
    guest_nic.apply(Context(cluster=c), target, changes)
    assert fake.commands == [
        "sudo -n ip link set dev ens64np1 mtu 9000", "sudo -n ip link set dev ens64np1 up",
        "sudo -n ip addr add 192.168.100.11/24 dev ens64np1", "ip -j addr show"]
    assert guest_nic.plan(target, guest_nic.observe(Context(cluster=c), target)) == []


def test_apply_replaces_the_prefix(tmp_path):
    state = FakeGuest()
    state.link("ens64np1").update(flags=["UP"], mtu=9000, addr_info=[{"family": "inet", "local": "192.168.100.11", "prefixlen": 16}])
    fake = FakeExecutor("gpu-vm-01", state.responses())
    c = cluster(tmp_path, FULL, fake)
    target = c.targets["gpu-vm-01"]
    guest_nic.apply(Context(cluster=c), target, guest_nic.plan(target, guest_nic.observe(Context(cluster=c), target)))
    assert fake.commands[-3:] == ["sudo -n ip addr del 192.168.100.11/16 dev ens64np1",
                                  "sudo -n ip addr add 192.168.100.11/24 dev ens64np1", "ip -j addr show"]
    assert guest_nic.plan(target, guest_nic.observe(Context(cluster=c), target)) == []


def test_apply_reads_back(tmp_path):
    state = FakeGuest()
    responses = state.responses()
    responses[re.compile(r"^ip link set dev (\S+) mtu (\d+)$")] = lambda call: ok("")  # a driver that ignores it
    fake = FakeExecutor("gpu-vm-01", responses)
    c = cluster(tmp_path, FULL, fake)
    target = c.targets["gpu-vm-01"]
    with pytest.raises(RemoteCommandError, match=r"^ens64np1 \(mlx5_0 port 1\) mtu is not 9000 after apply"):
        guest_nic.apply(Context(cluster=c), target, guest_nic.plan(target, guest_nic.observe(Context(cluster=c), target)))


def test_wanted(tmp_path):
    assert not guest_nic.wanted(cluster(tmp_path, "slots: 1").targets["gpu-vm-01"])
    assert not guest_nic.wanted(cluster(tmp_path, "nic_ats: false").targets["gpu-vm-01"])
    assert guest_nic.wanted(cluster(tmp_path, "rdma_ports: [{interface: ens64np1}]").targets["gpu-vm-01"])
