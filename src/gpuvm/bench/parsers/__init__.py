"""Pure parsers: the text a benchmark printed → one `Figure`.

One small module per kind. Every parser takes the text and the log's name (used only in error
messages) and raises `BenchmarkError` when the text holds no figure.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gpuvm.bench.parsers.command import parse_command
from gpuvm.bench.parsers.common import Figure
from gpuvm.bench.parsers.fio import parse_fio
from gpuvm.bench.parsers.horovod_synthetic import parse_horovod_synthetic
from gpuvm.bench.parsers.mlperf_log import parse_mlperf_log
from gpuvm.bench.parsers.nccl_allreduce import parse_nccl_allreduce
from gpuvm.bench.parsers.tf_cnn_benchmarks import parse_tf_cnn_benchmarks
from gpuvm.bench.results import valid_figure
from gpuvm.errors import BenchmarkError, InputError

PARSERS: dict[str, Callable[..., Figure]] = {
    "tf_cnn_benchmarks": parse_tf_cnn_benchmarks,
    "horovod_synthetic": parse_horovod_synthetic,
    "nccl_allreduce": parse_nccl_allreduce,
    "mlperf_log": parse_mlperf_log,
    "command": parse_command,
    "storage": parse_fio,
    # gpuvm's own workloads print Horovod's and nccl-tests' lines
    "pytorch_train": parse_horovod_synthetic,
    "pytorch_allreduce": parse_nccl_allreduce,
}


def parse_output(kind: str, text: str, log: str = "<output>", **options: Any) -> Figure:
    """Parse `text` with the parser for `kind`; `options` go to it (`command` needs `pattern`)."""
    try:
        parser = PARSERS[kind]
    except KeyError:
        raise InputError(
            f"unknown benchmark kind {kind!r} (expected one of: {', '.join(PARSERS)})"
        ) from None
    figure = parser(text, log, **options)
    if not valid_figure(figure.value):  # "nan" or "inf" printed by a benchmark must not become a median
        raise BenchmarkError(f"{log}: the figure {figure.value!r} is not a finite number of sane size")
    return figure


__all__ = [
    "PARSERS",
    "Figure",
    "parse_command",
    "parse_fio",
    "parse_horovod_synthetic",
    "parse_mlperf_log",
    "parse_nccl_allreduce",
    "parse_output",
    "parse_tf_cnn_benchmarks",
]
