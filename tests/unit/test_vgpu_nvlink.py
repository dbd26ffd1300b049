"""Which vGPU VMs get `pciPassthru<n>.cfg.enable_uvm = 0` (unified memory off, so NVLink P2P works)."""

from __future__ import annotations

import pytest

from gpuvm.runbook.vms import VgpuGpus


@pytest.mark.parametrize("profile, count, nvlink, uses", [
    ("grid_a100-40c", 1, None, False),       # one vGPU: no peer to link to
    ("grid_a100-40c", 2, None, True),        # time-sliced vGPUs on NVLinked GPUs
    ("grid_a100d-3-40c", 2, None, False),    # MIG-backed: MIG has no GPU-to-GPU P2P
    ("grid_a100d-3-40c", 2, True, True),     # said explicitly: as said
    ("grid_a100-40c", 2, False, False),
])
def test_enable_uvm_only_for_vgpus_that_can_use_nvlink(profile, count, nvlink, uses):
    assert VgpuGpus(mode="vgpu", profile=profile, count=count, nvlink=nvlink).uses_nvlink is uses
