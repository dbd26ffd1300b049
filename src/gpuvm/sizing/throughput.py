"""Training throughput of one GPU from published measurements, and a roofline calibrated on them where a
GPU has none.

Precisions: `fp32` is PyTorch's default fp32 training, which runs convolutions on TF32 tensor cores on
the GPUs that have them (NVIDIA's tables label it "TF32") and plain FP32 on V100 and T4 (labelled
"FP32"); `fp16` and `bf16` are mixed precision (AMP), measured with fp16 and taken at the same rate
for bf16 (the same tensor-core peak on every GPU here that has bf16).

Every row is a published single-GPU run of ResNet-50 v1.5. A GPU and precision with rows is sized at
the rate nearest all of them in relative terms (2 / (1/lowest + 1/highest): as far below the highest
as above the lowest), so no cited row is further from the estimate than the rows are from each other.
Rows marked `reference` are NVIDIA's own (DeepLearningExamples, batch 256 where memory allows); their
8-GPU strong scaling is the scaling used. MLPerf Training publishes minutes to train on 8 or more GPUs,
not a single GPU's images/s, so no MLPerf row is here. No published single-GPU ResNet-50 training row
was found for the H100 NVL, H200 NVL, L40S or RTX PRO 6000 Blackwell: they are sized by the roofline.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from gpuvm.sizing.tables import GpuSpec, ModelSpec

DLE = ("NVIDIA DeepLearningExamples (github.com/NVIDIA/DeepLearningExamples), "
       "PyTorch/Classification/ConvNets/resnet50v1.5/README.md, "
       "'Training performance results' (pytorch-21.03 NGC container, 1 GPU), table ")
LAMBDA = ("Lambda deeplearning-benchmark, pytorch/pytorch-train-throughput-{}.csv (github.com/lambdal/"
          "deeplearning-benchmark, commit 0551cb7), row '{}', column resnet50 (DLE's script; batch per "
          "pytorch-train-bs-{}.csv: 1280 on A100 and H100 PCIe)")
LAMBDA_V2 = ("Lambda deeplearning-benchmark, pytorch/pytorch-train-throughput-v2-{}.csv (github.com/lambdal/"
             "deeplearning-benchmark, commit aa5addb), row '{}', column resnet50 (DLE's script, synthetic data; "
             "batch: results_v2/<row>/PyTorch_resnet50_{}/benchmark.para)")
WITHIN = 0.25  # every cited row within this of the estimate, and of the calibrated roofline


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


def _lambda_v2(gpu: str, precision: str, rate: float, batch: int, row: str) -> Measured:
    kind, run = ("fp32", "FP32") if precision == "fp32" else ("fp16", "AMP")
    return Measured(gpu, precision, "resnet50", rate, batch, None, LAMBDA_V2.format(kind, row, run))


def _dle(gpu: str, precision: str, rate: float, batch: int, scaling_8: float, table: str) -> Measured:
    """A row of DLE's tables: its 1-GPU throughput and 8-GPU strong scaling; the batch is the
    platform's in configs.yml (DGX-1 FP32: 112, all else 256)."""
    return Measured(gpu, precision, "resnet50", rate, batch, scaling_8, DLE + table, reference=True)


H100_SXM_V2 = "LambdaOD_Texas_1xH100_80GB_SXM5_192-222-52-102_v2"  # one of its 1-GPU H100 SXM5 rows; the others agree within 1 %
H100_PCIE_V2 = "LambdaOD_1x_Texas_1xH100_80GB_PCIe_209-20-158-50_v2"
H200_V2 = "LambdaBM_ENG04_1xH200_140GB_SXM_h200_v2"
B200_V2 = "LambdaOD_test_1xB200_192GB_129-213-83-251_v2"
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
    _lambda_v2("h100-sxm", "fp32", 1894, 640, H100_SXM_V2),
    _lambda_v2("h100-sxm", "mixed", 2790, 1280, H100_SXM_V2),
    _lambda_v2("h100-pcie", "fp32", 1248, 640, H100_PCIE_V2),
    _lambda_v2("h100-pcie", "mixed", 1976, 1280, H100_PCIE_V2),
    _lambda_v2("h200", "fp32", 2259, 1280, H200_V2),
    _lambda_v2("h200", "mixed", 3079, 2560, H200_V2),
    _lambda_v2("b200", "fp32", 2967, 1664, B200_V2),
    _lambda_v2("b200", "mixed", 3076, 3328, B200_V2),
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


def nearest_all(rates: list[float]) -> float:
    """The rate as far (relatively) below the highest as above the lowest: within x of every rate
    whenever any single rate is."""
    return 2 / (1 / min(rates) + 1 / max(rates))


@dataclass(frozen=True)
class Calibration:
    """A tensor-core training step's time per sample, fitted to every row of a precision:
    seconds_per_flop x the model's training FLOPs (the time no GPU removes: kernel launches, the
    framework) + the same FLOPs at `peak_fraction` of the GPU's dense peak for the precision (the
    math) + bytes_per_activation_byte x its fp32 activations / the GPU's memory bandwidth (the
    traffic); `worst`: the largest relative miss over the `rows`."""

    seconds_per_flop: float
    peak_fraction: float  # 0: no math term
    bytes_per_activation_byte: float
    worst: float
    rows: int

    def parts(self, gpu: GpuSpec, precision: str, flops: float,
              activation_bytes: float | None) -> tuple[float, float, float]:
        """One sample's seconds on `gpu`: (fixed, math, traffic)."""
        math = flops / (self.peak_fraction * _peak(gpu, precision)) if self.peak_fraction else 0.0
        traffic = (self.bytes_per_activation_byte * activation_bytes / (gpu.memory_gb_per_s * 1e9)
                   if activation_bytes else 0.0)
        return self.seconds_per_flop * flops, math, traffic


def calibration(precision: str, gpu_of: dict[str, GpuSpec], model_of: dict[str, ModelSpec]) -> Calibration:
    """The three constants that keep the largest relative miss over this precision's tensor-core rows
    smallest (a grid, refined around the best point: deterministic, some ten thousand tries; kept per
    table, which are constants)."""
    key = (precision, id(gpu_of), id(model_of))
    if key not in _CALIBRATED:
        _CALIBRATED[key] = _calibrate(precision, gpu_of, model_of)
    return _CALIBRATED[key]


_CALIBRATED: dict[tuple[str, int, int], Calibration] = {}


def _calibrate(precision: str, gpu_of: dict[str, GpuSpec], model_of: dict[str, ModelSpec]) -> Calibration:
    rows = [(gpu_of[m.gpu], _flops(model_of[m.model]), model_of[m.model].activation_bytes_per_sample, m.samples_per_s)
            for m in MEASURED if m.precision == precision and (precision == "mixed" or gpu_of[m.gpu].tf32)]

    def fit(point: tuple[float, float, float], worst: float = 0.0) -> Calibration:
        fixed, per_peak_flop, traffic = point  # per_peak_flop: 1 / the fraction of peak reached
        return Calibration(fixed, 1 / per_peak_flop if per_peak_flop else 0.0, traffic, worst, len(rows))

    def worst(point: tuple[float, float, float]) -> float:
        calibrated = fit(point)
        return max(abs(1 / (max(sum(calibrated.parts(g, precision, f, b)), 1e-15) * rate) - 1)
                   for g, f, b, rate in rows)

    tops = (max(1 / (rate * f) for _, f, _, rate in rows),  # each term alone at the slowest row's pace
            max(_peak(g, precision) / (rate * f) for g, f, _, rate in rows),
            max(g.memory_gb_per_s * 1e9 / (rate * b) for g, _, b, rate in rows))
    best = span = tuple(top / 2 for top in tops)
    for _ in range(4):
        axes = [[max(centre + reach * i / 10, 0.0) for i in range(-10, 11)] for centre, reach in zip(best, span)]
        best = min(itertools.product(*axes), key=worst)
        span = tuple(reach / 5 for reach in span)
    return fit(best, worst(best))


def roofline(gpu: GpuSpec, precision: str, flops: float, activation_bytes: float | None,
             gpus: dict[str, GpuSpec], models: dict[str, ModelSpec]) -> tuple[float, list[str], float]:
    """(samples/s, how, the calibration's worst miss). Tensor cores: one sample's step time as
    calibrated on every row of the precision (`calibration`). Plain FP32 (V100, T4): the compute roof,
    the best fraction of peak any reference row of plain FP32 sustained."""
    if precision == "mixed" or gpu.tf32:
        fit = calibration(precision, gpus, models)
        fixed, math, traffic = fit.parts(gpu, precision, flops, activation_bytes)
        moved = fit.bytes_per_activation_byte * (activation_bytes or 0)
        note = (f"roofline: {fixed * 1e3:.3f} ms per sample fixed + {flops / 1e9:.1f} GFLOP at {fit.peak_fraction:.0%} "
                f"of {_peak(gpu, precision) / 1e12:g} TFLOPS ({math * 1e3:.3f} ms) + {moved / 1e9:.2f} GB moved at "
                f"{gpu.memory_gb_per_s:g} GB/s ({traffic * 1e3:.3f} ms) = {1 / (fixed + math + traffic):,.0f}/s; "
                f"fitted to the {fit.rows} {precision} tensor-core rows, every one within {fit.worst:.0%} of it")
        if not activation_bytes:
            note += "; no activations given (--activation-mb): no traffic counted, so this is the fastest it can be"
        return 1 / (fixed + math + traffic), [note], fit.worst
    plain = [m for m in MEASURED if m.reference and m.precision == "fp32" and not gpus[m.gpu].tf32]
    utilization = max(m.samples_per_s * _flops(models[m.model]) / _peak(gpus[m.gpu], "fp32") for m in plain)
    compute = utilization * _peak(gpu, "fp32") / flops
    note = (f"compute roof: {utilization:.1%} of {_peak(gpu, 'fp32') / 1e12:g} TFLOPS / {flops / 1e9:.1f} GFLOP "
            f"= {compute:,.0f}/s (the best fraction of peak of the plain FP32 reference rows)")
    worst = max(abs(utilization * _peak(gpus[m.gpu], "fp32") / _flops(models[m.model]) / m.samples_per_s - 1)
                for m in MEASURED if m.precision == "fp32" and not gpus[m.gpu].tf32)
    return compute, [note], worst


def throughput(gpu: GpuSpec, precision: str, model: ModelSpec | None, flops: float,
               activation_bytes: float | None, gpus: int, gpu_table: dict[str, GpuSpec],
               model_table: dict[str, ModelSpec]) -> Throughput:
    """One GPU's rate for `model` (None: a model by its training FLOPs per sample alone) at `precision`; `scaling`: the
    efficiency of `gpus` of them in one data-parallel job."""
    klass = precision_class(precision)
    rows = [m for m in MEASURED
            if model is not None and (m.model, m.gpu, m.precision) == (model.name, gpu.name, klass)]
    if rows:
        rates = [m.samples_per_s for m in rows]
        point, how, notes = nearest_all(rates), "measured", []
        if len(rows) > 1:
            notes.append(f"the rate nearest every row: 2 / (1/{min(rates):,.0f} + 1/{max(rates):,.0f}) = {point:,.0f}/s, "
                         f"within {max(rates) / point - 1:.0%} of each")
        low, high = min(rates), max(rates)
    else:
        point, notes, worst = roofline(gpu, klass, flops, activation_bytes, gpu_table, model_table)
        how = "roofline"
        notes.append(f"no published run on this GPU and precision: the range is the roofline's worst miss, ±{worst:.0%}")
        low, high = point * (1 - worst), point * (1 + worst)
    reference = [m for m in rows if m.reference]
    measured_8 = [m.scaling_8 for m in reference if m.scaling_8]
    many = min(measured_8) / 8 if measured_8 else DEFAULT_SCALING
    scaling_source = (f"{many:.0%} of linear: the measured 8-GPU strong scaling of the reference row, "
                      f"taken for any count above one" if measured_8 else
                      f"{many:.0%} of linear: the worst 8-GPU scaling NVIDIA published (A100 AMP, 6.72 of 8); "
                      f"none measured for this GPU and precision")
    return Throughput(point, low, high, how, [m.label() for m in rows] + notes,
                      many if gpus > 1 else 1.0, scaling_source, many)
