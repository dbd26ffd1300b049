"""Training throughput of one GPU from published measurements, and a roofline bound calibrated on them
where a GPU or precision has none.

Precisions: `fp32` is PyTorch's default fp32 training, which runs convolutions on TF32 tensor cores on
the GPUs that have them (A100, H100, L40S, A30: NVIDIA's tables label it "TF32") and plain FP32 on
V100 and T4 (labelled "FP32"); `fp16` and `bf16` are mixed precision (AMP), measured with fp16 and
taken at the same rate for bf16 (the same tensor-core peak on A100/H100).

Rows marked `reference` are NVIDIA's own single-GPU runs of the ResNet-50 v1.5 recipe (a batch of 256
where memory allows): the point estimate. The other rows are other published runs of the same model
(other batch sizes, software); they widen the range shown, never move the point.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from gpuvm.sizing.tables import GpuSpec, ModelSpec

DLE = ("NVIDIA DeepLearningExamples (github.com/NVIDIA/DeepLearningExamples), "
       "PyTorch/Classification/ConvNets/resnet50v1.5/README.md, "
       "'Training performance results' (pytorch-21.03 NGC container, 1 GPU), table ")
LAMBDA = ("Lambda deeplearning-benchmark, pytorch/pytorch-train-throughput-{}.csv (github.com/lambdal/"
          "deeplearning-benchmark, commit 0551cb7), row '{}', column resnet50 (DLE's script; batch per "
          "pytorch-train-bs-{}.csv: 1280 on A100 and H100 PCIe)")


def precision_class(precision: str) -> str:
    return "fp32" if precision == "fp32" else "mixed"


@dataclass(frozen=True)
class Measured:
    """One published single-GPU training rate."""

    gpu: str
    precision: str  # fp32 (TF32 where the GPU has it) | mixed
    model: str
    samples_per_s: float
    batch: int | None
    scaling_8: float | None  # measured 8-GPU speedup over 1 GPU, where the source gives it
    source: str
    reference: bool = False

    def label(self) -> str:
        batch = f", batch {self.batch}" if self.batch else ""
        return f"{self.samples_per_s:,.0f}/s on {self.gpu} ({self.precision}{batch}): {self.source}"


def _lambda(gpu: str, precision: str, rate: float, row: str) -> Measured:
    kind = "fp32" if precision == "fp32" else "fp16"
    return Measured(gpu, precision, "resnet50", rate, None, None, LAMBDA.format(kind, row, kind))


def _dle(gpu: str, precision: str, rate: float, batch: int, scaling_8: float, table: str) -> Measured:
    """A row of DLE's tables: its 1-GPU throughput and 8-GPU strong scaling; the batch is the
    platform's in configs.yml (DGX-1 FP32: 112, all else 256)."""
    return Measured(gpu, precision, "resnet50", rate, batch, scaling_8, DLE + table, reference=True)


MEASURED: list[Measured] = [
    _dle("a100-80gb", "fp32", 938, 256, 7.72, "'NVIDIA DGX A100 (8x A100 80GB)', TF32"),
    _dle("a100-80gb", "mixed", 2470, 256, 6.72, "'NVIDIA DGX A100 (8x A100 80GB)', mixed precision"),
    _dle("v100-16gb", "fp32", 367, 112, 7.76, "'NVIDIA DGX-1 16GB (8x V100 16GB)', FP32"),
    _dle("v100-16gb", "mixed", 1200, 256, 6.93, "'NVIDIA DGX-1 16GB (8x V100 16GB)', mixed precision"),
    _dle("v100-32gb", "fp32", 356, 112, 7.75, "'NVIDIA DGX-1 32GB (8x V100 32GB)', FP32"),
    _dle("v100-32gb", "mixed", 1156, 256, 6.96, "'NVIDIA DGX-1 32GB (8x V100 32GB)', mixed precision"),
    _lambda("a100-80gb", "fp32", 1066, "A100 80GB SXM4"),
    _lambda("a100-80gb", "mixed", 1582, "A100 80GB SXM4"),
    _lambda("h100-sxm", "fp32", 1753, "H100 80GB SXM5"),
    _lambda("h100-sxm", "mixed", 2616, "H100 80GB SXM5"),
    _lambda("h100-pcie", "fp32", 1197, "H100 80GB PCIe Gen5"),
    _lambda("h100-pcie", "mixed", 1866, "H100 80GB PCIe Gen5"),
    _lambda("v100-16gb", "fp32", 369, "LambdaCloud V100 16GB"),
    _lambda("v100-16gb", "mixed", 833, "LambdaCloud V100 16GB"),
]

# Batch-size speedups of data parallelism are not free: without a measured 8-GPU figure, assume
# DLE's worst measured (6.72 of 8 on A100 AMP) rather than perfect scaling.
DEFAULT_SCALING = 6.72 / 8


@dataclass(frozen=True)
class Throughput:
    """One GPU's samples/s: a point, a range, and where they came from."""

    per_gpu: float
    low: float
    high: float
    how: str  # "measured" | "roofline"
    rows: list[str]
    scaling: float  # efficiency of n GPUs over n x one (1.0 for one GPU)
    scaling_source: str
    scaling_many: float  # the same for any count above one (time to train sizes the count)


def _flops(model: ModelSpec) -> float:
    return 3 * 2 * model.forward_gmacs * 1e9  # training ~ 3 forward passes; 2 FLOP per multiply-add


def _peak(gpu: GpuSpec, precision: str) -> float:
    return (gpu.tflops["fp16"] if precision == "mixed" else gpu.tflops["fp32"]) * 1e12


def roofline(gpu: GpuSpec, precision: str, flops: float, activation_bytes: float | None,
             gpus: dict[str, GpuSpec], models: dict[str, ModelSpec]) -> tuple[float, list[str]]:
    """The lower of two roofs, each as high as the best reference row reached on that resource:
    compute, the largest fraction of peak any reference row of this precision (on the same kind of
    unit: tensor cores, or plain FP32) sustained; memory, the fewest bytes per sample any mixed-precision
    reference row implies at its GPU's full bandwidth (per byte of fp32 activation; twice that in fp32,
    whose activations take 4 bytes, not 2)."""
    tensor = precision == "mixed" or gpu.tf32
    same_unit = [m for m in MEASURED if m.reference and m.precision == precision
                 and (precision == "mixed" or gpus[m.gpu].tf32 == tensor)]
    utilization = max(m.samples_per_s * _flops(models[m.model]) / _peak(gpus[m.gpu], precision)
                      for m in same_unit)
    compute = utilization * _peak(gpu, precision) / flops
    notes = [f"compute roof: {utilization:.1%} of {_peak(gpu, precision) / 1e12:g} TFLOPS / {flops / 1e9:.1f} GFLOP "
             f"= {compute:,.0f}/s (the best fraction of peak of the {precision} reference rows)"]
    if activation_bytes is None:
        return compute, notes
    mixed = [m for m in MEASURED if m.reference and m.precision == "mixed"]
    per_activation_byte = min(gpus[m.gpu].memory_gb_per_s * 1e9
                              / (m.samples_per_s * models[m.model].activation_bytes_per_sample) for m in mixed)
    moved = per_activation_byte * activation_bytes * (2 if precision == "fp32" else 1)
    memory = gpu.memory_gb_per_s * 1e9 / moved
    notes.append(f"memory roof: {gpu.memory_gb_per_s:g} GB/s / {moved / 1e9:.2f} GB moved per sample = "
                 f"{memory:,.0f}/s (bytes per sample: the fewest a mixed-precision reference row implies, x2 in fp32)")
    return min(compute, memory), notes


def throughput(gpu: GpuSpec, precision: str, model: ModelSpec | None, flops: float,
               activation_bytes: float | None, gpus: int, gpu_table: dict[str, GpuSpec],
               model_table: dict[str, ModelSpec]) -> Throughput:
    """One GPU's rate for `model` (None: a model by its training FLOPs per sample alone) at `precision`; `scaling`: the
    efficiency of `gpus` of them in one data-parallel job."""
    klass = precision_class(precision)
    rows = [m for m in MEASURED
            if model is not None and (m.model, m.gpu, m.precision) == (model.name, gpu.name, klass)]
    reference = [m for m in rows if m.reference]
    if reference:
        point, how, notes = statistics.median(m.samples_per_s for m in reference), "measured", []
    else:
        point, notes = roofline(gpu, klass, flops, activation_bytes, gpu_table, model_table)
        how = "roofline"
        if not rows:  # a GPU nobody published: the range goes down to the worst row-to-roof ratio seen
            notes.append("no published run on this GPU: the range's low end is the roof x 0.9, the lowest "
                         "measured/roof ratio of the reference GPUs")
    rates = [point] + [m.samples_per_s for m in rows] + ([0.9 * point] if not rows else [])
    measured_8 = [m.scaling_8 for m in reference if m.scaling_8]
    many = min(measured_8) / 8 if measured_8 else DEFAULT_SCALING
    scaling_source = (f"{many:.0%} of linear: the measured 8-GPU strong scaling of the reference row, "
                      f"taken for any count above one" if measured_8 else
                      f"{many:.0%} of linear: the worst 8-GPU scaling NVIDIA published (A100 AMP, 6.72 of 8); "
                      f"none measured for this GPU and precision")
    return Throughput(point, min(rates), max(rates), how, [m.label() for m in rows] + notes,
                      many if gpus > 1 else 1.0, scaling_source, many)
