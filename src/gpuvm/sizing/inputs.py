"""What `gpuvm size` sizes: a runbook's `sizing` section, the flags given laid over it, a results
directory's measured throughput (in place of the estimate) and storage rates, and a saved
inventory's GPU model and count. `sizing_of` gathers them and sizes the job; the command only
parses its flags and renders the `Sizing`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import ValidationError

from gpuvm.errors import InputError
from gpuvm.runbook.loader import load_runbook
from gpuvm.sizing.estimate import Sizing, size
from gpuvm.sizing.spec import SizingSpec

# flag name → SizingSpec field (the flags say the unit; the section's field names do too)
FLAGS = {
    "model": "model", "parameters": "parameters", "forward_gflops": "forward_gflops",
    "activation_mb": "activation_mb_per_sample", "precision": "precision", "optimizer": "optimizer",
    "batch_per_gpu": "batch_per_gpu", "gpu": "gpu", "gpus": "gpus", "jobs": "jobs", "sample_kb": "sample_kb",
    "dataset_samples": "dataset_samples", "latency_ms": "storage_latency_ms", "io_kb": "io_kb",
    "checkpoint_minutes": "checkpoint_minutes", "utilization": "utilization",
    "scaling_efficiency": "scaling_efficiency", "epochs": "epochs", "hours": "hours",
    "decode_per_core": "decode_per_core",
}


def sizing_of(runbook: Path | None, flags: dict[str, Any], results: Path | None = None,
              benchmark: str | None = None, inventory: Path | None = None) -> Sizing:
    """The job sized from its inputs. `flags`: the flags given (by FLAGS' names; None: not given).
    `results`: a results directory, whose measured images/s (of `benchmark`) replace the estimate,
    whose storage benchmarks' read rates are shown, and whose dataset's file size is the sample size
    where neither a flag nor the runbook gives one."""
    given = {field: flags[flag] for flag, field in FLAGS.items() if flags.get(flag) is not None}
    if "parameters" in given:
        given["parameters"] = int(given["parameters"])
    measured, storage, read = None, [], None
    if results is not None:
        from gpuvm.sizing.measured import measured_sample_kb, measured_storage, measured_throughput

        storage = measured_storage(results)
        if found := measured_throughput(results, benchmark, given.get("gpus"), required=not storage):
            rate, measured_gpus, source = found
            given.setdefault("gpus", measured_gpus)
            measured = (rate, source)
        read = measured_sample_kb(results, benchmark)
    spec, notes = spec_of(runbook, given, inventory, {"sample_kb": read[0]} if read else {})
    if read and spec.sample_kb == read[0]:
        notes.append(read[1])
    return size(spec, measured, storage, notes)


def spec_of(runbook: Path | None, given: dict[str, Any], inventory: Path | None = None,
            measured: dict[str, Any] | None = None) -> tuple[SizingSpec, list[str]]:
    """The runbook's `sizing` section with the flags given (by field) laid over it, both over what
    `measured` results say (a dataset's file size), then the inventory's GPU model (and its count of
    them, where neither says how many GPUs a job has); with notes for the report. A bad value names
    its flag, or the runbook's field."""
    section: dict[str, Any] = {}
    if runbook is not None:
        book = load_runbook(runbook)
        if book.sizing is None:
            raise InputError(f"{runbook}: no `sizing` section (see gpuvm/sizing/spec.py), or leave the runbook out")
        section = book.sizing.model_dump(exclude_unset=True)
    fields, notes = {**(measured or {}), **section, **given}, []
    if inventory is not None:
        from gpuvm.sizing.inventory import gpu_from_inventory

        flag = f"{runbook}: sizing.gpu" if "gpu" in section and "gpu" not in given else "--gpu"
        chosen, note = gpu_from_inventory(inventory, fields.get("gpu"), flag)
        fields["gpu"] = chosen.model
        if "gpus" not in fields:
            fields["gpus"] = chosen.count
            note += "; the job uses all of them (--gpus for fewer)"
        elif fields["gpus"] > chosen.count:
            note += f"; the job's {fields['gpus']} GPUs are more than it holds"
        notes.append(note)
    try:
        return SizingSpec.model_validate(fields), notes
    except ValidationError as e:
        first = e.errors()[0]
        field = ".".join(str(p) for p in first["loc"])
        flag = next((f"--{f.replace('_', '-')}" for f, name in FLAGS.items() if name == field), None)
        where = f"{flag}: " if flag and field in given else (f"{runbook}: sizing.{field}: " if field else "")
        raise InputError(f"{where}{first['msg'].removeprefix('Value error, ')}") from None
