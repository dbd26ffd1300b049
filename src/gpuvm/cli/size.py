"""`gpuvm size`: a thin command over gpuvm.sizing (inputs from the runbook's `sizing` section, flags
override them; `--results` puts a measured throughput in place of the estimate; `--inventory` takes
the GPU model and count from a saved inventory)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from gpuvm.cli.common import handle_errors, load, out
from gpuvm.errors import InputError

# flag name → SizingSpec field (the flags say the unit; the section's field names do too)
FLAGS = {
    "model": "model", "parameters": "parameters", "forward_gflops": "forward_gflops",
    "activation_mb": "activation_mb_per_sample", "precision": "precision", "optimizer": "optimizer",
    "batch_per_gpu": "batch_per_gpu", "gpu": "gpu", "gpus": "gpus", "jobs": "jobs", "sample_kb": "sample_kb",
    "dataset_samples": "dataset_samples", "latency_ms": "storage_latency_ms", "io_kb": "io_kb",
    "checkpoint_minutes": "checkpoint_minutes", "utilization": "utilization",
    "scaling_efficiency": "scaling_efficiency", "epochs": "epochs", "hours": "hours",
}


def register(app: typer.Typer) -> None:
    app.command("size")(size_command)


@handle_errors
def size_command(
    runbook: Annotated[Optional[Path], typer.Argument(help="A runbook with a `sizing` section (optional)",
                                                      show_default=False)] = None,
    model: Annotated[Optional[str], typer.Option(help="resnet18, resnet50, resnet101, vgg16, mobilenet_v2")] = None,
    parameters: Annotated[Optional[float], typer.Option(help="Parameter count, for a model not in the table (7e9)")] = None,
    forward_gflops: Annotated[Optional[float], typer.Option(help="Its forward pass per sample, GFLOP")] = None,
    activation_mb: Annotated[Optional[float], typer.Option(help="Its activations per sample, MB in fp32")] = None,
    precision: Annotated[Optional[str], typer.Option(help="fp32 (TF32 math on A100/H100), fp16 or bf16 (mixed); tf32 "
                                                         "and amp are taken as fp32 and fp16  [default: fp32]")] = None,
    optimizer: Annotated[Optional[str], typer.Option(help="sgd, sgd-momentum, adam, adamw  [default: sgd-momentum]")] = None,
    batch_per_gpu: Annotated[Optional[int], typer.Option(help="Samples per GPU per step  [default: 64]")] = None,
    gpu: Annotated[Optional[str], typer.Option(help="a100-80gb, a100-40gb, h100-sxm, h100-pcie, l40s, a30, "
                                                    "v100-32gb, v100-16gb, t4  [default: a100-80gb]")] = None,
    gpus: Annotated[Optional[int], typer.Option(help="GPUs per job  [default: 1, the measured point's, or "
                                                     "all of --inventory's]")] = None,
    jobs: Annotated[Optional[int], typer.Option(help="Jobs reading from the storage at once  [default: 1]")] = None,
    sample_kb: Annotated[Optional[float], typer.Option(help="One sample on disk, KB  [default: 110]")] = None,
    dataset_samples: Annotated[Optional[int], typer.Option(help="Samples per epoch  [default: 1281167]")] = None,
    latency_ms: Annotated[Optional[float], typer.Option(help="One storage read's latency, ms  [default: 1]")] = None,
    io_kb: Annotated[Optional[float], typer.Option(help="One read's size, KB  [default: a whole sample]")] = None,
    checkpoint_minutes: Annotated[Optional[float], typer.Option(help="Minutes between checkpoints  [default: 30]")] = None,
    utilization: Annotated[Optional[float], typer.Option(help="Fraction of peak FLOPS reached, in place of the table "
                                                              "of published runs  [default: the table]")] = None,
    scaling_efficiency: Annotated[Optional[float], typer.Option(help="n GPUs' rate over n x one GPU's  [default: "
                                                                     "the table's 8-GPU measurement]")] = None,
    epochs: Annotated[Optional[float], typer.Option(help="Time to train: epochs (with --hours)")] = None,
    hours: Annotated[Optional[float], typer.Option(help="Time to train: within this many hours (with --epochs)")] = None,
    results: Annotated[Optional[Path], typer.Option(help="A results directory: use its measured images/s, and "
                                                         "show its storage benchmarks' read rates")] = None,
    benchmark: Annotated[Optional[str], typer.Option(help="The benchmark of --results to read")] = None,
    inventory: Annotated[Optional[Path], typer.Option(help="A saved inventory (gpuvm inventory RUNBOOK --save "
                                                           "FILE): its GPU model (--gpu picks one where it "
                                                           "holds several) and count")] = None,
    json_: Annotated[bool, typer.Option("--json", help="Print JSON (schema gpuvm.size/1)")] = False,
) -> None:
    """Memory per GPU, GPU count, storage rate, reads in flight, checkpoint rate and epoch time of a training job."""
    flags = dict(locals())
    from gpuvm.sizing.estimate import size
    from gpuvm.sizing.report import print_sizing, sizing_json

    given = {field: flags[flag] for flag, field in FLAGS.items() if flags[flag] is not None}
    if "parameters" in given:
        given["parameters"] = int(given["parameters"])
    measured, storage = None, []
    if results is not None:
        from gpuvm.sizing.measured import measured_storage, measured_throughput

        storage = measured_storage(results)
        if found := measured_throughput(results, benchmark, given.get("gpus"), required=not storage):
            rate, measured_gpus, source = found
            given.setdefault("gpus", measured_gpus)
            measured = (rate, source)
    spec, notes = _spec(runbook, given, inventory)
    sizing = size(spec, measured, storage, notes)
    if json_:
        print(json.dumps(sizing_json(sizing), indent=2))
    else:
        print_sizing(out, sizing)


def _spec(runbook: Path | None, given: dict[str, Any], inventory: Path | None = None) -> tuple[Any, list[str]]:
    """The runbook's `sizing` section with the flags given laid over it, then the inventory's GPU model
    (and its count of them, where neither says how many GPUs a job has); with notes for the report."""
    from pydantic import ValidationError

    from gpuvm.sizing.spec import SizingSpec

    section: dict[str, Any] = {}
    if runbook is not None:
        book = load(runbook)
        if book.sizing is None:
            raise InputError(f"{runbook}: no `sizing` section (see gpuvm/sizing/spec.py), or leave the runbook out")
        section = book.sizing.model_dump(exclude_unset=True)
    fields, notes = {**section, **given}, []
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
