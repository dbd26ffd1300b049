"""vGPU profile names of every form vCenter reports (and NVIDIA's tables print), read for memory and
slices; names of any other shape are opaque (None)."""

import pytest

from gpuvm.vgpu_profiles import vgpu_profile


@pytest.mark.parametrize("name, gpu, memory_gb, slices, mig_profile", [
    ("grid_a100-20c", "a100", 20, None, None),
    ("grid_a100d-3-40c", "a100d", 40, 3, "3g.40gb"),
    ("nvidia_h100-7-80c", "h100", 80, 7, "7g.80gb"),
    ("nvidia_l40s-48q", "l40s", 48, None, None),
    ("nvidia_h200x-141c", "h200x", 141, None, None),
    ("nvidia_h200x-3-71c", "h200x", 71, 3, "3g.71gb"),
    ("nvidia_h200x-1-18cme", "h200x", 18, 1, "1g.18gb+me"),  # NVIDIA's H200X-1-18CME
    ("nvidia_h100l-1-12c", "h100l", 12, 1, "1g.12gb"),
    ("nvidia_rtx_pro_6000_blackwell_dc-4-96q", "rtx_pro_6000_blackwell_dc", 96, 4, "4g.96gb"),
    ("H200X-1-18C", "h200x", 18, 1, "1g.18gb"),  # as NVIDIA's tables print it
    ("grid_t4-16q", "t4", 16, None, None),
])
def test_profile_names_of_every_form(name, gpu, memory_gb, slices, mig_profile):
    p = vgpu_profile(name)
    assert p is not None and (p.gpu, p.memory_gb, p.slices) == (gpu, memory_gb, slices)
    assert (p.mig_profile if p.slices else None) == mig_profile


@pytest.mark.parametrize("name", [
    "something-else",
    "nvidia_h200x-141cme",  # +me exists only for MIG instances
    "nvidia_h100-80",  # no series letter
    "nvidia_l40s-48x",  # no series NVIDIA has
    "nvidia_b200x-12-180c",  # two-digit slices: no MIG GPU has more than 7
    "",
])
def test_names_of_unknown_shape_are_opaque(name):
    assert vgpu_profile(name) is None
