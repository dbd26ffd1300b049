"""`ibdev2netdev` and `ibdev2netdev -v`: RDMA device + port -> network interface and its state."""

from __future__ import annotations

import re
from dataclasses import dataclass

from gpuvm.parsers._common import unparseable
from gpuvm.untrusted import checked, interface, pci_address, rdma_device

_SHORT = re.compile(r"^(\S+) port (\d+) ==> (\S+) \((Up|Down)\)$")
_VERBOSE = re.compile(r"^([0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.\d) (\S+) (.*) port (\d+) \((\w+) *\) ==> (\S+) \((Up|Down)\)$")


@dataclass(frozen=True)
class PortMap:
    ibdev: str
    port: int
    netdev: str
    up: bool
    pci: str | None = None  # only with -v
    port_state: str | None = None  # "ACTIVE", "DOWN"... only with -v
    description: str | None = None  # card and firmware, only with -v


def parse_ibdev2netdev(text: str) -> list[PortMap]:
    """Both forms; each line is matched on its own so mixed output parses too."""
    ports = []
    for line in text.splitlines():
        line = line.strip()
        if not line:
            continue
        if m := _VERBOSE.match(line):
            ports.append(_checked(PortMap(m[2], int(m[4]), m[6], m[7] == "Up", m[1], m[5], m[3])))
        elif m := _SHORT.match(line):
            ports.append(_checked(PortMap(m[1], int(m[2]), m[3], m[4] == "Up")))
        else:
            raise unparseable("ibdev2netdev", "lines 'mlx5_0 port 1 ==> NETDEV (Up|Down)'", line)
    return ports


def _checked(port: PortMap) -> PortMap:
    """The port, each name held to its grammar: they become NCCL_IB_HCA, NCCL_SOCKET_IFNAME and
    Open MPI's btl_tcp_if_include, which mpirun forwards to the other nodes through a shell."""
    rdma_device(port.ibdev, "ibdev2netdev")
    interface(port.netdev, "ibdev2netdev")
    if port.pci is not None:
        pci_address(port.pci, "ibdev2netdev -v")
    if port.description is not None:
        checked(port.description, "a product name", "ibdev2netdev -v")
    return port
