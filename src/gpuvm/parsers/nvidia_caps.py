"""/proc/driver/nvidia-caps/mig-minors: the minor of each MIG capability's device file
(/dev/nvidia-caps/nvidia-cap<minor>), which a process needs besides /dev/nvidia<N> to use a MIG
device: `gpu0/gi1/access 12` (GPU instance 1 of GPU 0), `gpu0/gi1/ci0/access 13` (its compute
instance 0)."""

from __future__ import annotations

import re

from gpuvm.parsers._common import unparseable

SOURCE = "/proc/driver/nvidia-caps/mig-minors"
_LINE = re.compile(r"(config|monitor|gpu\d{1,3}/gi\d{1,3}(?:/ci\d{1,3})?/access) (\d{1,9})")


def parse_mig_minors(text: str) -> dict[str, int]:
    """Capability (`gpu0/gi1/access`, `gpu0/gi1/ci0/access`, `config`, `monitor`) → its minor."""
    minors = {}
    for line in text.splitlines():
        if not line.strip():
            continue
        m = _LINE.fullmatch(line.strip())
        if not m:
            raise unparseable(SOURCE, "lines '<capability> <minor>' such as 'gpu0/gi1/access 12'", line)
        minors[m[1]] = int(m[2])
    return minors


def gpu_instance_cap(gpu: int, gpu_instance: int) -> str:
    return f"gpu{gpu}/gi{gpu_instance}/access"


def compute_instance_cap(gpu: int, gpu_instance: int, compute_instance: int) -> str:
    return f"gpu{gpu}/gi{gpu_instance}/ci{compute_instance}/access"


def cap_device(minor: int) -> str:
    return f"/dev/nvidia-caps/nvidia-cap{minor}"
