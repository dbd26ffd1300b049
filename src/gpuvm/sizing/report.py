"""A Sizing as rows for gpuvm's one table renderer, and as JSON (schema gpuvm.size/1)."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from gpuvm.sizing.estimate import Memory, Sizing

SCHEMA = "gpuvm.size/1"


def _gib(value: float) -> str:
    return f"{value:,.2f} GiB"


def _count(value: int | None) -> str:
    return "does not fit" if value is None else str(value)


def memory_rows(s: Sizing) -> list[tuple[str, str, str]]:
    """Part, plain data parallel, optimizer state sharded over the job's GPUs."""
    parts = [(name.replace("_", " "), getattr(s.memory, name), getattr(s.memory_sharded, name))
             for name in ("weights", "gradients", "optimizer_state", "activations")]
    return [(part, _gib(plain), _gib(sharded)) for part, plain, sharded in parts] + [
        ("total", _gib(s.memory.total), _gib(s.memory_sharded.total)),
        (f"smallest GPU count ({s.gpu}, {s.gpu_memory_gib:g} GiB)", _count(s.min_gpus), _count(s.min_gpus_sharded)),
    ]


def rate_rows(s: Sizing) -> list[tuple[str, str, str]]:
    spec = s.spec
    jobs = f" x {spec.jobs} jobs" if spec.jobs > 1 else ""
    return [
        ("throughput (one job)", f"{s.samples_per_s:,.0f} samples/s", s.throughput_source),
        *((("throughput range", f"{low:,.0f}-{high:,.0f} samples/s", "the rows below"),)
          if (low := s.samples_per_s_range[0]) != (high := s.samples_per_s_range[1]) else ()),
        *((("GPUs for the target", str(s.gpus_for_target),
            f"{spec.epochs:g} epochs in {spec.hours:g} h"),) if s.gpus_for_target is not None else ()),
        ("storage must deliver", f"{s.storage_gb_per_s:,.2f} GB/s",
         f"{s.samples_per_s:,.0f}/s x {spec.sample_kb:g} KB{jobs}"),
        *(("storage measured", f"{m.gb_per_s:,.2f} GB/s", f"{m.source}: {_of_needed(m.gb_per_s, s)}")
          for m in s.storage_measured),
        ("CPU cores to decode", f"{s.decode.cores:,.1f} ({s.decode.cores_per_gpu:,.1f} per GPU)",
         f"{s.samples_per_s:,.0f}/s{jobs} / {s.decode.images_per_core:,.0f} per core: "
         + ("--decode-per-core" if s.spec.decode_per_core else "gpuvm's measurement (below)")),
        ("reads per second", f"{s.reads_per_s:,.0f}", f"one per {spec.io_kb or spec.sample_kb:g} KB"),
        ("reads in flight", f"{s.reads_in_flight:,.1f}",
         f"Little's law: {s.reads_per_s:,.0f}/s x {spec.storage_latency_ms:g} ms"),
        ("checkpoint", f"{s.checkpoint_gb:,.2f} GB", "fp32 weights + optimizer state"),
        ("checkpoint write rate", f"{s.checkpoint_mb_per_s:,.2f} MB/s",
         f"one every {spec.checkpoint_minutes:g} min{jobs}, averaged"),
        ("epoch", f"{s.epoch_minutes:,.1f} min", f"{spec.dataset_samples:,} samples"),
    ]


def _of_needed(gb_per_s: float, s: Sizing) -> str:
    ratio = gb_per_s / s.storage_gb_per_s
    return f"{ratio:.2f} x what is needed" if ratio >= 1 else f"only {ratio:.0%} of what is needed"


def title(s: Sizing) -> str:
    spec = s.spec
    model = spec.model or f"{s.parameters:,} parameters"
    return (f"{model}, {spec.precision}, {spec.optimizer}, batch {spec.batch_per_gpu} per GPU, "
            f"{spec.gpus} x {s.gpu}, {spec.jobs} job(s)")


def print_sizing(console: Any, s: Sizing) -> None:
    from gpuvm.render import table

    console.print(title(s))
    console.print(table("Memory per GPU", ("", "data parallel", f"optimizer sharded over {s.spec.gpus}"),
                        memory_rows(s), numbers_from=1))
    console.print(table("Rates", ("", "value", "from"), rate_rows(s)))
    if s.throughput_basis not in ("measured", "utilization"):
        console.print("Throughput from:")
        for row in s.throughput_rows:
            console.print(f"  - {row}", soft_wrap=True)
    console.print("Assumptions:")
    for note in s.assumptions:
        console.print(f"  - {note}", soft_wrap=True)


def _memory(memory: Memory) -> dict[str, float]:
    return {**{k: round(v, 4) for k, v in asdict(memory).items()}, "total": round(memory.total, 4)}


def sizing_json(s: Sizing) -> dict[str, Any]:
    return {
        "schema": SCHEMA,
        "inputs": s.spec.model_dump(mode="json"),
        "gpu": {"name": s.gpu, "memory_gib": s.gpu_memory_gib},
        "parameters": s.parameters,
        "memory_gib_per_gpu": {"data_parallel": _memory(s.memory), "optimizer_sharded": _memory(s.memory_sharded)},
        "min_gpus": {"data_parallel": s.min_gpus, "optimizer_sharded": s.min_gpus_sharded},
        "samples_per_s": round(s.samples_per_s, 2),
        "throughput_source": s.throughput_source,
        "throughput_basis": s.throughput_basis,
        "samples_per_s_range": [round(v, 2) for v in s.samples_per_s_range],
        "throughput_rows": s.throughput_rows,
        "gpus_for_target": s.gpus_for_target,
        "storage_gb_per_s": round(s.storage_gb_per_s, 4),
        "storage_measured": [{"benchmark": m.benchmark, "gb_per_s": round(m.gb_per_s, 4), "source": m.source,
                              "of_needed": round(m.gb_per_s / s.storage_gb_per_s, 4)} for m in s.storage_measured],
        "decode": {"images_per_core": s.decode.images_per_core, "cores": round(s.decode.cores, 3),
                   "cores_per_gpu": round(s.decode.cores_per_gpu, 3), "source": s.decode.source},
        "reads_per_s": round(s.reads_per_s, 2),
        "reads_in_flight": round(s.reads_in_flight, 3),
        "checkpoint_gb": round(s.checkpoint_gb, 4),
        "checkpoint_mb_per_s": round(s.checkpoint_mb_per_s, 4),
        "epoch_minutes": round(s.epoch_minutes, 3),
        "assumptions": s.assumptions,
    }
