"""A Linux guest's CPUs as Slurm's gres.conf `Cores=` needs them: `lscpu -p=CPU,CORE,SOCKET` (which
core and socket each CPU is), and each NVIDIA PCI device's NUMA node and local CPUs from sysfs
(`/sys/bus/pci/devices/<address>/numa_node`, `local_cpulist`: what `nvidia-smi topo -m` prints as
"CPU Affinity"; in a VM, what its virtual NUMA topology gives the device)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from gpuvm.parsers._common import unparseable

LSCPU = "lscpu -p=CPU,CORE,SOCKET"
PCI = "/sys/bus/pci/devices/*/{numa_node,local_cpulist}"
_RANGE = re.compile(r"(\d{1,5})(?:-(\d{1,5}))?")


def parse_cpulist(text: str, source: str = PCI) -> frozenset[int]:
    """`0-31,64-95` → those CPU ids."""
    cpus: set[int] = set()
    for part in text.strip().split(","):
        m = _RANGE.fullmatch(part.strip())
        if not m or (m[2] and int(m[2]) < int(m[1])):
            raise unparseable(source, "a CPU list such as '0-31,64-95'", text)
        cpus.update(range(int(m[1]), int(m[2] or m[1]) + 1))
    return frozenset(cpus)


def cpulist(ids: set[int] | frozenset[int]) -> str:
    """Ids as a list of ranges: {0, 1, 2, 5} → `0-2,5`."""
    ranges: list[list[int]] = []
    for i in sorted(ids):
        if ranges and i == ranges[-1][1] + 1:
            ranges[-1][1] = i
        else:
            ranges.append([i, i])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in ranges)


@dataclass(frozen=True)
class CpuTopology:
    core_of: dict[int, int]  # CPU id → Slurm's core index: cores numbered socket by socket, from 0
    threads_per_core: int


def parse_lscpu(text: str) -> CpuTopology:
    """`lscpu -p=CPU,CORE,SOCKET` (its `#` comments aside). Slurm's gres.conf `Cores=` are logical core
    indices ("core 0 the first core on the first socket, core 1 the second"), not CPU ids: with two
    threads per core, CPUs 0 and 64 may be core 0."""
    cores: dict[int, tuple[int, int]] = {}
    for line in text.splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        fields = line.strip().split(",")
        if len(fields) != 3 or not all(f.isdigit() for f in fields):
            raise unparseable(LSCPU, "lines 'cpu,core,socket' of numbers", line)
        cores[int(fields[0])] = (int(fields[2]), int(fields[1]))
    ranked = {core: index for index, core in enumerate(sorted(set(cores.values())))}
    per_core = max((list(cores.values()).count(c) for c in ranked), default=1)
    return CpuTopology({cpu: ranked[core] for cpu, core in cores.items()}, per_core)


def parse_pci_cpus(text: str) -> dict[str, tuple[int, frozenset[int]]]:
    """Lines `<PCI address> <numa_node> <local_cpulist>` → address → (NUMA node, its CPUs); -1: none known."""
    devices = {}
    for line in text.splitlines():
        fields = line.split()
        if not fields:
            continue
        if len(fields) != 3 or not re.fullmatch(r"[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]", fields[0]) \
                or not re.fullmatch(r"-?\d{1,4}", fields[1]):
            raise unparseable(PCI, "lines '<PCI address> <NUMA node> <CPU list>'", line)
        devices[fields[0]] = (int(fields[1]), parse_cpulist(fields[2]))
    return devices
