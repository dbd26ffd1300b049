"""nvidia-smi `topo -m` (how GPUs are connected) and `--query-gpu=index,pci.bus_id` (where they are).

`topo -m` prints a matrix: a header of device labels (GPU0…, then NICs as NIC0… or mlx5_0…)
followed by `CPU Affinity`, `NUMA Affinity` (and `GPU NUMA ID` from R535), one row per device, and
a legend. A cell says how two devices connect: `X` (itself), `NV#` (a bonded set of # NVLinks),
or a PCIe path, nearest first: `PIX`, `PXB`, `PHB`, `NODE`, `SYS` (`SOC` in old drivers). Cells
are tab-separated; on a terminal the header is underlined with escape codes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from gpuvm.parsers._common import unparseable

TOPO = "nvidia-smi topo -m"
BUS_IDS = "nvidia-smi --query-gpu=index,pci.bus_id --format=csv,noheader"
_ESCAPES = re.compile(r"\x1b\[[0-9;]*m")
_CELL = re.compile(r"^(X|NV\d+|PIX|PXB|PHB|NODE|SYS|SOC)$")
_GPU = re.compile(r"^GPU(\d+)$")
SWITCHED_NVLINKS = 12  # the fewest NVLinks a GPU of an NVSwitch board has (HGX A100)


@dataclass(frozen=True)
class TopoMatrix:
    gpus: tuple[int, ...]  # GPU indices, as the rows list them
    links: dict[tuple[int, int], str]  # (GPU i, GPU j) → cell, both ways

    def nvlinked(self) -> list[tuple[int, int]]:
        """GPU pairs (i < j) joined by NVLink."""
        return sorted((i, j) for (i, j), cell in self.links.items() if i < j and cell.startswith("NV"))

    def switched(self) -> bool:
        """Whether the GPUs are joined by an NVSwitch: 3 or more, every pair `NV#` with one # of at least
        SWITCHED_NVLINKS. A switch joins every pair by all of a GPU's NVLinks (12 on A100, 18 on
        H100/H200/B200); direct links share them among its peers (bridged PCIe cards: NV# to one peer,
        none to the rest; a 4-GPU HGX H100 without NVSwitch: NV6 to each of 3 peers)."""
        cells = {self.links.get((i, j), "") for i in self.gpus for j in self.gpus if i != j}
        counts = {int(c[2:]) if c[2:].isdigit() and c.startswith("NV") else 0 for c in cells}
        return len(self.gpus) >= 3 and len(counts) == 1 and counts.pop() >= SWITCHED_NVLINKS


def parse_topo_matrix(text: str) -> TopoMatrix:
    lines = [_ESCAPES.sub("", line) for line in text.splitlines()]
    if any("No devices were found" in line for line in lines):
        return TopoMatrix((), {})
    header = next((i for i, line in enumerate(lines) if line.split()[:1] == ["GPU0"]), None)
    if header is None:
        raise unparseable(TOPO, "a matrix whose header starts with GPU0", text)
    labels = []
    for token in lines[header].split():
        if token in ("CPU", "NUMA"):
            break
        labels.append(token)
    cells: dict[tuple[str, str], str] = {}
    for line in lines[header + 1:]:
        tokens = line.split()
        if not tokens or tokens[0] == "Legend:":
            break
        row = tokens[1:1 + len(labels)]
        if len(row) != len(labels) or not all(_CELL.match(c) for c in row):
            raise unparseable(TOPO, f"rows of {len(labels)} cells (X, NV#, PIX, PXB, PHB, NODE or SYS)", line)
        cells.update({(tokens[0], label): cell for label, cell in zip(labels, row)})
    gpus = [int(m[1]) for label in labels if (m := _GPU.match(label))]
    links = {(i, j): cells[(f"GPU{i}", f"GPU{j}")] for i in gpus for j in gpus
             if i != j and (f"GPU{i}", f"GPU{j}") in cells}
    return TopoMatrix(tuple(gpus), links)


def parse_bus_ids(text: str) -> dict[int, str]:
    """GPU index → PCI address as vSphere writes it (`00000000:B1:00.0` → `0000:b1:00.0`)."""
    addresses = {}
    for line in text.splitlines():
        if not line.strip():
            continue
        parts = [p.strip() for p in line.split(",")]
        m = re.match(r"^([0-9A-Fa-f]{4,8}):([0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7])$", parts[-1])
        if len(parts) != 2 or not parts[0].isdigit() or not m:
            raise unparseable(BUS_IDS, "lines 'index, 00000000:17:00.0'", line)
        addresses[int(parts[0])] = f"{int(m[1], 16):04x}:{m[2].lower()}"
    return addresses
