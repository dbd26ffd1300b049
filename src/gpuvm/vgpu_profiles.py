"""vGPU profile names and what they tell: frame buffer, and MIG compute slices for MIG-backed ones.

A leaf: it imports nothing of gpuvm's, so the runbook's checks and capacity read it alike.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# grid_a100-20c (time-sliced, 20 GB), grid_a100d-3-40c (MIG-backed: 3 compute slices, 40 GB);
# newer releases name them nvidia_a100-20c.
PROFILE = re.compile(r"^[a-z]+_[a-z0-9]+-(?:(?P<slices>\d)-)?(?P<gb>\d+)[a-z]+$")


@dataclass(frozen=True)
class VgpuProfile:
    name: str
    memory_gb: int
    slices: int | None  # MIG compute slices; None: time-sliced

    @property
    def mig_profile(self) -> str:
        return f"{self.slices}g.{self.memory_gb}gb"


def vgpu_profile(name: str) -> VgpuProfile | None:
    m = PROFILE.match(name)
    if m is None:
        return None
    return VgpuProfile(name, int(m["gb"]), int(m["slices"]) if m["slices"] else None)
