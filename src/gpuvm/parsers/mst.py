"""`mst status -v`: the Mellanox devices, their MST device files, PCI address, RDMA and net names.

Only the "PCI devices:" table is read; the sections mst prints after it ("Cable devices:" once
`mst cable add` ran, "LinkX chip devices:", …) end it. Every name is held to its grammar
(`gpuvm.untrusted`): the MST device and PCI address go on mlxconfig's command line.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from gpuvm.parsers._common import unparseable
from gpuvm.untrusted import checked, interface, pci_address, rdma_device


@dataclass(frozen=True)
class MstDevice:
    device_type: str  # "ConnectX6"
    mst: str | None  # "/dev/mst/mt4123_pciconf0", None before `mst start`
    pci: str  # "ca:00.0"
    rdma: str | None  # "mlx5_0"
    net: str | None  # "ens64np1" (without mst's "net-" prefix)
    numa: int | None


_ROW = re.compile(r"^(\S+?)(?:\(rev:\w+\))?\s+(\S+)\s+([0-9a-fA-F:.]+)((?:\s+\S+){0,3})\s*$")
_NUMA = re.compile(r"^-?\d+$")
_SECTION = re.compile(r"^[A-Za-z][\w ]*:\s*$|^-+\s*$")  # "Cable devices:", or the rule under one
COMMAND = "mst status -v"


def parse_mst_status(text: str) -> list[MstDevice]:
    """Devices from the "PCI devices:" table of `mst status -v`, in the order listed."""
    lines = text.splitlines()
    try:
        header = next(i for i, line in enumerate(lines) if line.startswith("DEVICE_TYPE"))
    except StopIteration:
        raise unparseable("mst status -v", "a 'DEVICE_TYPE  MST  PCI  RDMA  NET  NUMA' table", text) from None
    devices = []
    for line in lines[header + 1 :]:
        if not line.strip():
            continue
        if _SECTION.match(line):
            break
        m = _ROW.match(line.strip())
        try:
            if not m:
                raise ValueError(line)
            rdma, net, numa = _rdma_net_numa(m[4].split())
        except ValueError:
            raise unparseable("mst status -v", "rows 'TYPE  /dev/mst/...  bb:dd.f  mlx5_N  net-NAME  NUMA'",
                              line) from None
        devices.append(_checked(MstDevice(m[1], None if m[2] == "NA" else m[2], m[3], rdma, net, numa)))
    return devices


def _checked(device: MstDevice) -> MstDevice:
    checked(device.device_type, "a device type", COMMAND)
    if device.mst is not None:
        checked(device.mst, "an MST device", COMMAND)
    pci_address(device.pci, COMMAND)
    if device.rdma is not None:
        rdma_device(device.rdma, COMMAND)
    if device.net is not None:
        interface(device.net, COMMAND)
    return device


def _rdma_net_numa(rest: list[str]) -> tuple[str | None, str | None, int | None]:
    """RDMA, NET and NUMA, any of which mst leaves blank (NET before the netdev exists) or prints NA:
    a number is NUMA, `net-` starts NET, what is left is RDMA."""
    numa = int(rest.pop()) if rest and _NUMA.match(rest[-1]) else None
    if numa is None and len(rest) == 3 and rest[-1] == "NA":
        rest.pop()
    net = rest.pop()[len("net-"):] if rest and rest[-1].startswith("net-") else None
    if net is None and len(rest) == 2 and rest[-1] == "NA":
        rest.pop()
    if len(rest) > 1:
        raise ValueError(rest)
    rdma = rest[0] if rest and rest[0] != "NA" else None
    return rdma, net, numa
