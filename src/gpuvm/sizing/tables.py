"""The figures `gpuvm size` starts from, each with its source.

Models: parameter counts and forward cost per 224 x 224 image are torchvision's published weight
metadata (`num_params`, `GFLOPS`; pytorch.org/vision/stable/models). torchvision's "GFLOPS" count
one multiply-add as one operation, as the ResNet paper's "3.8 x 10^9 FLOPs" do (He et al. 2015,
Table 1), so gpuvm doubles them to get floating-point operations. Activation bytes per sample are
measured: what autograd saves for backward in one fp32 training step, per image
(`src/gpuvm/sizing/measure_torch.py`, PyTorch 1.13 CPU, 224 px; unique storages, input excluded).

GPUs: memory, memory bandwidth and dense (no sparsity) peak tensor throughput from NVIDIA's datasheets (A100:
nvidia-a100-datasheet-us-nvidia-1758950-r4; H100: H100 datasheet; L40S, A30, V100 and T4: their
datasheets). fp32 training uses TF32 tensor cores where the GPU has them (cuDNN's default for
convolutions in PyTorch), plain FP32 otherwise. Measured training rates: throughput.py.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class ModelSpec:
    name: str
    parameters: int
    forward_gmacs: float  # multiply-adds per sample, in 10^9 (torchvision's "GFLOPS")
    activation_bytes_per_sample: int  # fp32, measured by measure_torch.py
    sample: str = "224 x 224 image"


MODELS: dict[str, ModelSpec] = {m.name: m for m in (
    ModelSpec("resnet18", 11_689_512, 1.81, 21_577_728),
    ModelSpec("resnet50", 25_557_032, 4.09, 85_307_392),
    ModelSpec("resnet101", 44_549_160, 7.80, 126_251_008),
    ModelSpec("vgg16", 138_357_544, 15.47, 72_753_152),
    ModelSpec("mobilenet_v2", 3_504_872, 0.30, 77_858_304),
)}


@dataclass(frozen=True)
class GpuSpec:
    name: str
    memory_gib: float
    tflops: dict[str, float]  # dense peak per training precision: fp32 (TF32 where there is), fp16, bf16
    memory_gb_per_s: float  # memory bandwidth, the convnets' other roof
    tf32: bool  # fp32 training runs on TF32 tensor cores (Ampere and later)
    source: str


GPUS: dict[str, GpuSpec] = {g.name: g for g in (
    GpuSpec("a100-80gb", 80, {"fp32": 156, "fp16": 312, "bf16": 312}, 2039, True,
            "NVIDIA A100 datasheet (SXM4; PCIe: 1,935 GB/s)"),
    GpuSpec("a100-40gb", 40, {"fp32": 156, "fp16": 312, "bf16": 312}, 1555, True, "NVIDIA A100 datasheet (PCIe and SXM4)"),
    GpuSpec("h100-sxm", 80, {"fp32": 494.7, "fp16": 989.4, "bf16": 989.4}, 3350, True, "NVIDIA H100 datasheet (SXM5)"),
    GpuSpec("h100-pcie", 80, {"fp32": 378, "fp16": 756, "bf16": 756}, 2000, True, "NVIDIA H100 datasheet (PCIe)"),
    GpuSpec("l40s", 48, {"fp32": 183, "fp16": 362, "bf16": 362}, 864, True, "NVIDIA L40S datasheet"),
    GpuSpec("a30", 24, {"fp32": 82, "fp16": 165, "bf16": 165}, 933, True, "NVIDIA A30 datasheet"),
    GpuSpec("v100-32gb", 32, {"fp32": 15.7, "fp16": 125}, 900, False, "NVIDIA V100 datasheet (SXM2)"),
    GpuSpec("v100-16gb", 16, {"fp32": 15.7, "fp16": 125}, 900, False, "NVIDIA V100 datasheet (SXM2)"),
    GpuSpec("t4", 16, {"fp32": 8.1, "fp16": 65}, 320, False, "NVIDIA T4 datasheet"),
)}


def find_gpu(text: str) -> GpuSpec | None:
    """A GPU of the table by its table name or by the names vSphere and nvidia-smi give it
    ("GA100 [A100 PCIe 80GB]", "NVIDIA A100-SXM4-40GB", "GH100 [H100 PCIe]", nvidia-smi's
    "NVIDIA H100 80GB HBM3": HBM3 is the SXM5 part's, the PCIe card has HBM2e); None if unknown
    or ambiguous."""
    if text.strip().lower() in GPUS:
        return GPUS[text.strip().lower()]
    compact = re.sub(r"[^a-z0-9]", "", text.lower())
    if "h100" in compact and "hbm3" in compact:
        compact += "sxm"
    found = [g for g in GPUS.values() if g.name.split("-")[0] in compact]
    for narrower in (lambda g: f"{g.memory_gib:g}gb" in compact, lambda g: g.name.split("-")[-1] in compact):
        if len(found) > 1 and any(narrower(g) for g in found):
            found = [g for g in found if narrower(g)]
    return found[0] if len(found) == 1 else None


# Bytes a parameter costs, by part (Rajbhandari et al. 2020, "ZeRO", §3.1: mixed-precision Adam
# keeps fp16 weights and gradients, 2 + 2 bytes, and fp32 master weights, momentum and variance,
# 4 + 4 + 4 = 12 bytes). fp32 training keeps no master copy. PyTorch's autocast keeps fp32 weights
# and gradients instead (4 + 4) and no master copy: the same total per optimizer, split differently.
WEIGHT_BYTES = {"fp32": 4, "fp16": 2, "bf16": 2}
MASTER_BYTES = {"fp32": 0, "fp16": 4, "bf16": 4}
OPTIMIZER_STATE_BYTES = {"sgd": 0, "sgd-momentum": 4, "adam": 8, "adamw": 8}  # fp32 buffers per parameter

IMAGENET_TRAIN_IMAGES = 1_281_167  # ILSVRC2012 training set (Russakovsky et al. 2015)
IMAGENET_MEAN_KB = 110  # its ~138 GB of JPEGs / 1.28 M images; REFERENCE §7 and seed 000
# Training costs ~3 forward passes: backward computes gradients for activations and for weights,
# each about a forward's cost (Kaplan et al. 2020, "Scaling Laws", §2.1: 6N per token vs 2N forward).
TRAIN_TO_FORWARD = 3
