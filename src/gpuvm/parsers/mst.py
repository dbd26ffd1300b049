"""`mst status -v`: the Mellanox devices, their MST device files, PCI address, RDMA and net names."""

from __future__ import annotations

import re
from dataclasses import dataclass

from gpuvm.parsers._common import unparseable


@dataclass(frozen=True)
class MstDevice:
    device_type: str  # "ConnectX6"
    mst: str | None  # "/dev/mst/mt4123_pciconf0", None before `mst start`
    pci: str  # "ca:00.0"
    rdma: str | None  # "mlx5_0"
    net: str | None  # "ens64np1" (without mst's "net-" prefix)
    numa: int | None


_ROW = re.compile(r"^(\S+?)(?:\(rev:\w+\))?\s+(\S+)\s+([0-9a-fA-F:.]+)\s+(\S+)\s+(\S+)\s+(-?\d+|NA)?\s*$")


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
        m = _ROW.match(line.strip())
        if not m:
            raise unparseable("mst status -v", "rows 'TYPE  /dev/mst/...  bb:dd.f  mlx5_N  net-NAME  NUMA'", line)
        mst = None if m[2] == "NA" else m[2]
        rdma = None if m[4] == "NA" else m[4]
        net = None if m[5] == "NA" else m[5].removeprefix("net-")
        numa = int(m[6]) if m[6] and m[6] != "NA" else None
        devices.append(MstDevice(m[1], mst, m[3], rdma, net, numa))
    return devices
