"""vGPU profile names and what they tell: frame buffer, and MIG compute slices for MIG-backed ones.

A leaf: it imports nothing of gpuvm's, so the runbook's checks and capacity read it alike.

vCenter lists a host's types (`config.sharedPassthruGpuTypes`) as `<prefix>_<gpu>-[<slices>-]<GB><series>`,
NVIDIA's tables (NVIDIA AI Enterprise, "NVIDIA vGPU Types Reference", under
https://docs.nvidia.com/ai-enterprise/release-7/latest/infra-software/vgpu.html) the same without
prefix, in capitals:
- `grid_a100-20c`: time-sliced, 20 GB, C-series (compute); older releases use `grid_`, newer `nvidia_`;
- `grid_a100d-3-40c`, `nvidia_h200x-1-18c`: MIG-backed, 3 (1) compute slices, 40 (18) GB;
- `nvidia_h200x-1-18cme` (`H200X-1-18CME`): MIG-backed on the `1g.18gb+me` instance (with the media engines);
- `nvidia_l40s-48q`: Q-series (workstation), `-b`/`-a` likewise;
- `nvidia_rtx_pro_6000_blackwell_dc-4-96q`: a GPU name with underscores.
The GB in a name is NVIDIA's rounded figure (H200X-141C has 144 GB of frame buffer): what a name
says, not a measurement. A name of any other shape is opaque (`vgpu_profile` gives None): gpuvm then
checks nothing of its size and leaves the room to vSphere, which refuses a vGPU at power-on where
no GPU has it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

PROFILE = re.compile(r"^(?:(?:grid|nvidia)_)?(?P<gpu>[a-z][a-z0-9_]*?)-(?:(?P<slices>\d)-)?(?P<gb>\d+)"
                     r"(?P<series>[abcq])(?P<media>me)?$", re.IGNORECASE)


@dataclass(frozen=True)
class VgpuProfile:
    name: str
    memory_gb: int
    slices: int | None  # MIG compute slices; None: time-sliced
    gpu: str = ""  # the GPU part of the name, lower case: "a100d", "h200x", "rtx_pro_6000_blackwell_dc"
    series: str = "c"  # c: compute, q: workstation, b: business, a: apps
    media: bool = False  # MIG-backed on a `+me` GPU instance (the GPU's media engines with it)

    @property
    def mig_profile(self) -> str:
        return f"{self.slices}g.{self.memory_gb}gb" + ("+me" if self.media else "")


def vgpu_profile(name: str) -> VgpuProfile | None:
    m = PROFILE.match(name)
    if m is None or (m["media"] and not m["slices"]):
        return None  # `+me` exists only for MIG instances: a time-sliced `...cme` is no name NVIDIA uses
    return VgpuProfile(name, int(m["gb"]), int(m["slices"]) if m["slices"] else None, m["gpu"].lower(),
                       m["series"].lower(), bool(m["media"]))
