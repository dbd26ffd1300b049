"""The figures `gpuvm size` starts from, each with its source.

Models: parameter counts and forward cost per 224 x 224 image are torchvision's published weight
metadata (`num_params`, `GFLOPS`; pytorch.org/vision/stable/models). torchvision's "GFLOPS" count
one multiply-add as one operation, as the ResNet paper's "3.8 x 10^9 FLOPs" do (He et al. 2015,
Table 1), so gpuvm doubles them to get floating-point operations. Activation bytes per sample are
measured: what autograd saves for backward in one fp32 training step, per image
(`src/gpuvm/sizing/measure_torch.py`, PyTorch 1.13 CPU, 224 px; unique storages, input excluded).

GPUs: memory, memory bandwidth and dense (no sparsity) peak tensor throughput from NVIDIA's datasheets, each
row naming its own; where a datasheet prints tensor figures "with sparsity" (its footnote), the row holds half.
fp32 training uses TF32 tensor cores where the GPU has them (cuDNN's default for convolutions in PyTorch),
plain FP32 otherwise. Measured training rates: throughput.py.
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
    memory_gib: float  # as the datasheet prints it ("141 GB"; nvidia-smi's MiB agree within a few %)
    tflops: dict[str, float]  # dense peak: fp32 (TF32 where there is), fp16, bf16, fp8 (where there is)
    memory_gb_per_s: float  # memory bandwidth, the convnets' other roof
    tf32: bool  # fp32 training runs on TF32 tensor cores (Ampere and later)
    source: str
    architecture: str  # NVIDIA's name of the generation (hopper): parts of one differ in peaks and bandwidth only
    family: str = ""  # the product's name, compacted, that vSphere's and nvidia-smi's names contain

    @property
    def key(self) -> str:
        return self.family or self.name.split("-")[0]

    @property
    def variant(self) -> str:
        """What tells this part from others of its family in a name (sxm, pcie, nvl, 80gb); "" for the plain part."""
        return self.name.removeprefix(self.key).strip("-") if not self.family else ""


# "Datasheet (sparse)": the tensor figures printed carry the datasheet's "with sparsity" footnote; halved here.
H200 = "NVIDIA H200 datasheet (nvidia.com/en-us/data-center/h200, Technical Specifications)"
H100 = "NVIDIA H100 datasheet (nvidia.com/en-us/data-center/h100, Technical Specifications)"
GPUS: dict[str, GpuSpec] = {g.name: g for g in (
    GpuSpec("a100-80gb", 80, {"fp32": 156, "fp16": 312, "bf16": 312}, 2039, True,
            "NVIDIA A100 datasheet nvidia-a100-datasheet-us-nvidia-1758950-r4 (SXM4; PCIe: 1,935 GB/s)", architecture="ampere"),
    GpuSpec("a100-40gb", 40, {"fp32": 156, "fp16": 312, "bf16": 312}, 1555, True,
            "NVIDIA A100 datasheet nvidia-a100-datasheet-us-nvidia-1758950-r4 (PCIe and SXM4)", architecture="ampere"),
    GpuSpec("h100-sxm", 80, {"fp32": 494.7, "fp16": 989.4, "bf16": 989.4, "fp8": 1978.9}, 3350, True,
            f"{H100}, H100 SXM column: TF32 989, BF16 1,979, FP8 3,958 TFLOPS with sparsity; 80 GB, 3.35 TB/s", architecture="hopper"),
    GpuSpec("h100-pcie", 80, {"fp32": 378, "fp16": 756, "bf16": 756, "fp8": 1513}, 2000, True,
            "NVIDIA H100 PCIe product brief PB-11133-001: TF32 756, BF16 1,513, FP8 3,026 TFLOPS with "
            "sparsity; 80 GB, 2 TB/s", architecture="hopper"),
    GpuSpec("h100-nvl", 94, {"fp32": 417.5, "fp16": 835.5, "bf16": 835.5, "fp8": 1670.5}, 3900, True,
            f"{H100}, H100 NVL column: TF32 835, BF16 1,671, FP8 3,341 TFLOPS with sparsity; 94 GB, 3.9 TB/s", architecture="hopper"),
    GpuSpec("h200", 141, {"fp32": 494.7, "fp16": 989.4, "bf16": 989.4, "fp8": 1978.9}, 4800, True,
            f"{H200}, H200 SXM column: TF32 989, BF16 1,979, FP8 3,958 TFLOPS with sparsity; 141 GB, 4.8 TB/s", architecture="hopper"),
    GpuSpec("h200-nvl", 141, {"fp32": 417.5, "fp16": 835.5, "bf16": 835.5, "fp8": 1670.5}, 4800, True,
            f"{H200}, H200 NVL column: TF32 835, BF16 1,671, FP8 3,341 TFLOPS with sparsity; 141 GB, 4.8 TB/s", architecture="hopper"),
    GpuSpec("b200", 180, {"fp32": 1100, "fp16": 2250, "bf16": 2250, "fp8": 4500}, 7700, True,
            "NVIDIA HGX B200 specifications (nvidia.com/en-us/data-center/hgx, per GPU): TF32 2.2, FP16/BF16 4.5, "
            "FP8 9 PFLOPS with sparsity; 180 GB HBM3E, 7.7 TB/s", architecture="blackwell"),
    GpuSpec("l40s", 48, {"fp32": 183, "fp16": 362, "bf16": 362, "fp8": 733}, 864, True,
            "NVIDIA L40S datasheet: TF32 183 | 366*, BF16 362.05 | 733*, FP8 733 | 1,466* TFLOPS (* with "
            "sparsity); 48 GB GDDR6, 864 GB/s", architecture="ada"),
    GpuSpec("rtx-pro-6000", 96, {"fp32": 250, "fp16": 500, "bf16": 500, "fp8": 1000}, 1597, True,
            "NVIDIA RTX PRO 6000 Blackwell Server Edition datasheet (nvidia.com/en-us/data-center/"
            "rtx-pro-6000-blackwell-server-edition): 96 GB GDDR7, 1,597 GB/s, FP4 4 PFLOPS with sparsity; "
            "dense FP8, BF16, TF32 by Blackwell's halving per step (FP4 2 → FP8 1 → BF16 0.5 → TF32 0.25 PFLOPS, "
            "the ratios of the HGX B200 row); no TF32/BF16 line of its own", architecture="blackwell", family="rtxpro6000"),
    GpuSpec("a30", 24, {"fp32": 82, "fp16": 165, "bf16": 165}, 933, True, "NVIDIA A30 datasheet", architecture="ampere"),
    GpuSpec("v100-32gb", 32, {"fp32": 15.7, "fp16": 125}, 900, False, "NVIDIA V100 datasheet (SXM2)", architecture="volta"),
    GpuSpec("v100-16gb", 16, {"fp32": 15.7, "fp16": 125}, 900, False, "NVIDIA V100 datasheet (SXM2)", architecture="volta"),
    GpuSpec("t4", 16, {"fp32": 8.1, "fp16": 65}, 320, False, "NVIDIA T4 datasheet", architecture="turing"),
)}


def find_gpu(text: str) -> GpuSpec | None:
    """A GPU of the table by its table name or by the names vSphere and nvidia-smi give it
    ("GA100 [A100 PCIe 80GB]": the product in brackets; "NVIDIA A100-SXM4-40GB", "NVIDIA H200 NVL";
    nvidia-smi's "NVIDIA H100 80GB HBM3": HBM3 is the SXM5 part's, the PCIe card has HBM2e); None if
    unknown or ambiguous. A family's plain part (h200) is the one whose variant (nvl) the name lacks."""
    if text.strip().lower() in GPUS:
        return GPUS[text.strip().lower()]
    product = re.search(r"\[(.+)\]", text)
    compact = re.sub(r"[^a-z0-9]", "", (product.group(1) if product else text).lower())
    if "h100" in compact and "hbm3" in compact and "nvl" not in compact:
        compact += "sxm"
    found = [g for g in GPUS.values() if g.key in compact]
    if len(found) > 1 and any(f"{g.memory_gib:g}gb" in compact for g in found):
        found = [g for g in found if f"{g.memory_gib:g}gb" in compact]
    if len(found) > 1:
        named = [g for g in found if g.variant and g.variant in compact]
        found = named or [g for g in found if not g.variant] or found
    return found[0] if len(found) == 1 else None


# Bytes a parameter costs, by part (Rajbhandari et al. 2020, "ZeRO", §3.1: mixed-precision Adam
# keeps fp16 weights and gradients, 2 + 2 bytes, and fp32 master weights, momentum and variance,
# 4 + 4 + 4 = 12 bytes). fp32 training keeps no master copy. PyTorch's autocast keeps fp32 weights
# and gradients instead (4 + 4) and no master copy: the same total per optimizer, split differently.
WEIGHT_BYTES = {"fp32": 4, "fp16": 2, "bf16": 2}
MASTER_BYTES = {"fp32": 0, "fp16": 4, "bf16": 4}
OPTIMIZER_STATE_BYTES = {"sgd": 0, "sgd-momentum": 4, "adam": 8, "adamw": 8}  # fp32 buffers per parameter

# One CPU core's rate on the data path of image training: images per second of one process's CPU time,
# measured by gpuvm's own workload, `pytorch_train.py --data-dir DIR --decode-only` (read, PIL decode,
# RandomResizedCrop(224), ToTensor: what each DataLoader worker does; one thread), over 200 files
# written by `pytorch_train.py --write-dataset DIR --files 200 --file-kb 110 --pixels 500x375`
# (ImageNet's typical photograph: 500 x 375 px, ~110 KB), on this project's build machine (AMD EPYC,
# Debian's python3-torch 1.13 and Pillow), 2026-11-28, five runs: 360.7, 325.4, 318.7 (the defaults:
# batch 32, 10 warm-up, 10 x 10 timed batches), 308.2, 303.0 (2 warm-up, 5 x 4); the median, rounded.
# CPU time, not the wall clock: the machine was shared (88-197 images/s wall).
DECODE_IMAGES_PER_CORE = 320
DECODE_SOURCE = ("gpuvm's measurement: pytorch_train.py --decode-only on 500 x 375 px, 110 KB JPEGs (PIL decode, "
                 "RandomResizedCrop 224, ToTensor), 303-361 images/s per core of CPU time in five runs on an AMD "
                 "EPYC, median 319; --decode-per-core with your CPU's own")

IMAGENET_TRAIN_IMAGES = 1_281_167  # ILSVRC2012 training set (Russakovsky et al. 2015)
IMAGENET_MEAN_KB = 110  # its ~138 GB of JPEGs / 1.28 M images; REFERENCE §7 and seed 000
# Training costs ~3 forward passes: backward computes gradients for activations and for weights,
# each about a forward's cost (Kaplan et al. 2020, "Scaling Laws", §2.1: 6N per token vs 2N forward).
TRAIN_TO_FORWARD = 3
