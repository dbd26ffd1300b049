"""`gpuvm size`: a thin command over gpuvm.sizing.inputs (inputs from the runbook's `sizing` section, flags
override them; `--results` puts a measured throughput in place of the estimate; `--inventory` takes
the GPU model and count from a saved inventory)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import typer

from gpuvm.cli.common import handle_errors, out


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
    precision: Annotated[Optional[str], typer.Option(help="fp32 (TF32 math from Ampere on), fp16 or bf16 (mixed); tf32 "
                                                         "and amp are taken as fp32 and fp16  [default: fp32]")] = None,
    optimizer: Annotated[Optional[str], typer.Option(help="sgd, sgd-momentum, adam, adamw  [default: sgd-momentum]")] = None,
    batch_per_gpu: Annotated[Optional[int], typer.Option(help="Samples per GPU per step  [default: 64]")] = None,
    gpu: Annotated[Optional[str], typer.Option(help="h200, h200-nvl, h100-sxm, h100-pcie, h100-nvl, b200, l40s, "
                                                    "rtx-pro-6000, a100-80gb, a100-40gb, a30, v100-32gb, v100-16gb, "
                                                    "t4, or a name as nvidia-smi prints it  [default: a100-80gb]")] = None,
    gpus: Annotated[Optional[int], typer.Option(help="GPUs per job  [default: 1, the measured point's, or "
                                                     "all of --inventory's]")] = None,
    jobs: Annotated[Optional[int], typer.Option(help="Jobs reading from the storage at once  [default: 1]")] = None,
    sample_kb: Annotated[Optional[float], typer.Option(help="One sample on disk, KB  [default: 110]")] = None,
    dataset_samples: Annotated[Optional[int], typer.Option(help="Samples per epoch  [default: 1281167]")] = None,
    latency_ms: Annotated[Optional[float], typer.Option(help="One storage read's latency, ms  [default: 1]")] = None,
    io_kb: Annotated[Optional[float], typer.Option(help="One read's size, KB  [default: a whole sample]")] = None,
    checkpoint_minutes: Annotated[Optional[float], typer.Option(help="Minutes between checkpoints  [default: 30]")] = None,
    decode_per_core: Annotated[Optional[float], typer.Option(help="Images/s one CPU core decodes (measure: pytorch_train.py "
                                                                  "--data-dir DIR --decode-only)  [default: gpuvm's "
                                                                  "measurement, 320]")] = None,
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
    from gpuvm.sizing.inputs import sizing_of
    from gpuvm.sizing.report import print_sizing, sizing_json

    sizing = sizing_of(runbook, flags, results, benchmark, inventory)
    if json_:
        print(json.dumps(sizing_json(sizing), indent=2))
    else:
        print_sizing(out, sizing)
