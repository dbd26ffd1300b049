"""Sizing as arithmetic: memory per GPU, GPU counts, storage rate, requests in flight, checkpoint
rate and epoch time from a SizingSpec (pure functions; every formula names its source).

Units: memory in GiB (as nvidia-smi and the datasheets' "80 GB" count it); data rates in decimal
GB/s and MB/s (as storage is sold); a sample's size in decimal KB.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from gpuvm.sizing.measured import MeasuredStorage
from gpuvm.sizing.spec import SizingSpec
from gpuvm.sizing.tables import (
    DECODE_IMAGES_PER_CORE,
    DECODE_SOURCE,
    MASTER_BYTES,
    MODELS,
    OPTIMIZER_STATE_BYTES,
    GPUS,
    TRAIN_TO_FORWARD,
    WEIGHT_BYTES,
    find_gpu,
)
from gpuvm.sizing.throughput import throughput

GIB = 2**30


@dataclass(frozen=True)
class Memory:
    """GiB per GPU, by part. `optimizer_state` includes mixed precision's fp32 master weights."""

    weights: float
    gradients: float
    optimizer_state: float
    activations: float

    @property
    def total(self) -> float:
        return self.weights + self.gradients + self.optimizer_state + self.activations


@dataclass(frozen=True)
class Sizing:
    spec: SizingSpec
    gpu: str
    gpu_memory_gib: float
    parameters: int
    memory: Memory  # plain data parallel: every GPU holds every part
    memory_sharded: Memory  # optimizer state sharded over the job's GPUs (ZeRO stage 1)
    min_gpus: int | None  # plain data parallel: 1 if it fits, None if no count does
    min_gpus_sharded: int | None
    samples_per_s: float  # one job's, all its GPUs
    throughput_source: str
    throughput_basis: str  # measured (--results) | table (published runs) | roofline | utilization
    samples_per_s_range: tuple[float, float]  # one job's, from the rows below
    throughput_rows: list[str]  # the published rows and roofs the rate came from
    gpus_for_target: int | None  # the GPU count that trains `epochs` within `hours`, if asked
    storage_gb_per_s: float
    decode: Decode  # the CPU cores that decode the images the GPUs train on
    reads_per_s: float
    reads_in_flight: float
    checkpoint_gb: float
    checkpoint_mb_per_s: float
    epoch_minutes: float
    assumptions: list[str] = field(default_factory=list)
    storage_measured: list[MeasuredStorage] = field(default_factory=list)  # read rates benchmarks measured


@dataclass(frozen=True)
class Decode:
    """CPU cores that read and decode the samples: the GPUs' images/s over one core's rate."""

    images_per_core: float
    cores: float  # all jobs' GPUs
    cores_per_gpu: float
    source: str


def decode_cores(spec: SizingSpec, samples_per_s: float) -> Decode:
    per_core = spec.decode_per_core or DECODE_IMAGES_PER_CORE
    source = "--decode-per-core (sizing.decode_per_core)" if spec.decode_per_core else DECODE_SOURCE
    return Decode(per_core, samples_per_s * spec.jobs / per_core, samples_per_s / spec.gpus / per_core, source)


def model_memory(parameters: int, precision: str, optimizer: str, activation_bytes: float,
                 shards: int = 1) -> Memory:
    """Weights and gradients at the training precision, fp32 optimizer state (plus the master
    weights of mixed precision) split over `shards` GPUs, activations for the per-GPU batch."""
    state = MASTER_BYTES[precision] + OPTIMIZER_STATE_BYTES[optimizer]
    return Memory(weights=parameters * WEIGHT_BYTES[precision] / GIB,
                  gradients=parameters * WEIGHT_BYTES[precision] / GIB,
                  optimizer_state=parameters * state / shards / GIB,
                  activations=activation_bytes / GIB)


def smallest_sharded(full: Memory, usable_gib: float) -> int | None:
    """The fewest GPUs over which sharding the optimizer state (ZeRO-1: each GPU keeps 1/n of it)
    leaves every GPU within `usable_gib`: n >= state / (usable - weights - gradients - activations)."""
    room = usable_gib - (full.weights + full.gradients + full.activations)
    if room <= 0:
        return None
    return max(1, math.ceil(full.optimizer_state / room - 1e-9))


def size(spec: SizingSpec, measured: tuple[float, str] | None = None,
         storage: list[MeasuredStorage] | None = None, notes: list[str] | None = None) -> Sizing:
    """The sizing of `spec`; `measured` (samples/s of one job, where from) replaces the estimate;
    `storage`: read rates measured, shown beside the rate needed; `notes`: where inputs came from
    (an inventory's GPUs), printed first among the assumptions."""
    gpu = find_gpu(spec.gpu)
    assert gpu is not None  # SizingSpec checked it
    table = MODELS.get(spec.model or "")
    parameters = spec.parameters or table.parameters
    notes = list(notes or [])

    if spec.activation_mb_per_sample is not None:
        activation_fp32 = spec.activation_mb_per_sample * 1e6
    elif table is not None:
        activation_fp32 = table.activation_bytes_per_sample
        notes.append(f"activations: {activation_fp32 / 1e6:.1f} MB per {table.sample} in fp32, measured with "
                     "PyTorch 1.13 (autograd's saved tensors); they grow with the image's area")
    else:
        activation_fp32 = 0.0
        notes.append("activations: not counted (no activation_mb_per_sample given for this model)")
    half = WEIGHT_BYTES[spec.precision] / 4
    if half < 1:
        notes.append("activations at half precision: half of fp32's (autocast keeps some in fp32)")
    activations = activation_fp32 * half * spec.batch_per_gpu

    def memory(shards: int) -> Memory:
        return model_memory(parameters, spec.precision, spec.optimizer, activations, shards)

    usable = gpu.memory_gib
    plain, sharded = memory(1), memory(spec.gpus)
    min_plain = 1 if plain.total <= usable else None
    min_sharded = smallest_sharded(plain, usable)
    notes.append(f"memory per GPU: the model's state and activations only; CUDA context, workspaces and "
                 f"fragmentation take part of the {gpu.memory_gib:g} GiB too")
    notes.append(f"GPU: {gpu.name}, dense peaks and bandwidth from the {gpu.source}")

    rate, basis, source, low, high, rows, samples_per_s = _job_rate(spec, gpu, table, measured, activation_fp32, notes)
    gpus_for_target = None
    if spec.epochs is not None and spec.hours is not None:
        gpus_for_target = _gpus_for(spec, samples_per_s / spec.gpus if rate is None else rate.per_gpu,
                                    rate.scaling_many if rate else None, notes)

    reads_per_sample = math.ceil(spec.sample_kb / spec.io_kb) if spec.io_kb else 1
    reads_per_s = samples_per_s * spec.jobs * reads_per_sample
    checkpoint_bytes = parameters * (4 + OPTIMIZER_STATE_BYTES[spec.optimizer])  # fp32 weights + state
    if not spec.decode_per_core:
        notes.append(f"CPU cores to decode: one core decodes {DECODE_IMAGES_PER_CORE} images/s, {DECODE_SOURCE}")
    notes.append(f"storage: every sample read once per epoch ({reads_per_sample} read(s) of "
                 f"{spec.io_kb or spec.sample_kb:g} KB), no cache in front of it")
    return Sizing(
        spec=spec, gpu=gpu.name, gpu_memory_gib=gpu.memory_gib, parameters=parameters,
        memory=plain, memory_sharded=sharded, min_gpus=min_plain, min_gpus_sharded=min_sharded,
        samples_per_s=samples_per_s, throughput_source=source, throughput_basis=basis,
        samples_per_s_range=(low, high), throughput_rows=rows, gpus_for_target=gpus_for_target,
        storage_gb_per_s=samples_per_s * spec.sample_kb * 1e3 * spec.jobs / 1e9,
        decode=decode_cores(spec, samples_per_s),
        reads_per_s=reads_per_s,
        reads_in_flight=reads_per_s * spec.storage_latency_ms / 1e3,  # Little's law: L = λ W
        checkpoint_gb=checkpoint_bytes / 1e9,
        checkpoint_mb_per_s=checkpoint_bytes * spec.jobs / (spec.checkpoint_minutes * 60) / 1e6,
        epoch_minutes=spec.dataset_samples / samples_per_s / 60,
        assumptions=notes,
        storage_measured=list(storage or []),
    )


def _job_rate(spec: SizingSpec, gpu, table, measured: tuple[float, str] | None, activation_fp32: float,
              notes: list[str]):
    """One job's samples/s and where from, first found of: the user's measurement (--results), the
    old utilization rule (only when --utilization is given), the table of published runs."""
    forward = spec.forward_gflops * 1e9 if spec.forward_gflops else 2 * table.forward_gmacs * 1e9 if table else None
    if measured is not None:
        rate, source = measured
        notes.append("throughput: measured (--results), in place of gpuvm's table of published runs")
        return None, "measured", source, rate, rate, [source], rate
    if forward is None:
        from gpuvm.errors import InputError

        raise InputError("no throughput to size storage with: give forward_gflops for this model, or --results")
    if spec.utilization is not None:
        peak = gpu.tflops.get(spec.precision) or gpu.tflops["fp32"]
        rate = spec.gpus * spec.utilization * peak * 1e12 / (TRAIN_TO_FORWARD * forward)
        source = (f"utilization: {spec.gpus} x {spec.utilization:.0%} of {peak:g} TFLOPS / "
                  f"({TRAIN_TO_FORWARD} x {forward / 1e9:.2f} GFLOP per sample)")
        return None, "utilization", source, rate, rate, [source], rate
    return _from_tables(spec, gpu, table, forward, activation_fp32, notes)


def _from_tables(spec: SizingSpec, gpu, table, forward: float, activation_fp32: float, notes: list[str]):
    """The job's rate from published single-GPU runs (or the roofline over them) x GPUs x scaling."""
    activations = (table.activation_bytes_per_sample if table else
                   activation_fp32 if spec.activation_mb_per_sample is not None else None)
    rate = throughput(gpu, spec.precision, table, TRAIN_TO_FORWARD * forward, activations, spec.gpus, GPUS, MODELS)
    scaling = spec.scaling_efficiency if spec.scaling_efficiency is not None else rate.scaling
    job = spec.gpus * scaling
    unit = ("TF32 tensor cores (PyTorch's default for convolutions)" if gpu.tf32 else "plain FP32 (no TF32)")
    kind = "mixed precision (AMP; fp16 rows, bf16 taken at the same rate)" if spec.precision != "fp32" else unit
    basis = "table" if rate.how == "measured" else "roofline"
    what = "published runs" if rate.how == "measured" else "a roofline fitted to published runs"
    source = f"{basis}: {rate.per_gpu:,.0f}/s per GPU from {what}"
    if spec.gpus > 1:
        source += f" x {spec.gpus} x {scaling:.0%}"
    notes.append(f"throughput: {spec.precision} on {gpu.name} is {kind}; the table's runs are ResNet-50 v1.5 "
                 f"at the source's batch (256 where it fits), taken for batch {spec.batch_per_gpu}")
    if spec.precision == "bf16" and "bf16" not in gpu.tflops:
        notes.append(f"{gpu.name} has no bf16 tensor cores: its fp16 rate is shown")
    if spec.gpus > 1:
        notes.append("scaling: " + (f"{scaling:.0%} of linear (--scaling-efficiency)" if spec.scaling_efficiency
                                    is not None else rate.scaling_source))
    return (rate, basis, source, rate.low * job, rate.high * job, rate.rows, rate.per_gpu * job)


def _gpus_for(spec: SizingSpec, per_gpu: float, scaling: float | None, notes: list[str]) -> int:
    """The fewest GPUs whose rate trains `epochs` of the dataset within `hours`: n x per_gpu x
    efficiency(n) >= epochs x samples / seconds, efficiency 1 for one GPU."""
    efficiency = spec.scaling_efficiency or scaling or 1.0
    needed = spec.epochs * spec.dataset_samples / (spec.hours * 3600)
    count = 1 if per_gpu >= needed else max(2, math.ceil(needed / (per_gpu * efficiency) - 1e-9))
    notes.append(f"time to train: {spec.epochs:g} epochs in {spec.hours:g} h need {needed:,.0f} samples/s: "
                 f"{count} GPU(s) at {per_gpu:,.0f}/s each" + (f", {efficiency:.0%} scaling" if count > 1 else ""))
    return count
