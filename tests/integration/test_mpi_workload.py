"""The NumPy MLP workload, run for real under Open MPI, parsed by the horovod_synthetic parser."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from gpuvm.bench.parsers import parse_output

pytestmark = pytest.mark.integration

SCRIPT = Path(__file__).parents[2] / "src" / "gpuvm" / "bench" / "workloads" / "mpi_synthetic.py"
PYTHON = "/usr/bin/python3"  # the distribution's Python, as in a guest: needs python3-mpi4py, python3-numpy


def mpirun(*args: str) -> subprocess.CompletedProcess:
    launcher = shutil.which("mpirun")
    if launcher is None:
        pytest.fail("mpirun not found: install Open MPI (apt-get install openmpi-bin)")
    root = ["--allow-run-as-root"] if os.geteuid() == 0 else []
    command = [launcher, *root, "--oversubscribe", *args]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, f"{' '.join(command)} failed:\n{result.stdout}\n{result.stderr}"
    return result


def workload(*args: str) -> list[str]:
    return [PYTHON, str(SCRIPT), "--batch-size", "32", "--num-iters", "5",
            "--num-batches-per-iter", "5", "--num-warmup-batches", "3", "--hidden", "64", *args]  # fmt: skip


def test_two_ranks_train_and_report_like_horovod():
    result = mpirun("-np", "2", *workload())
    figure = parse_output("horovod_synthetic", result.stdout, "mpi_synthetic.log")
    assert figure.value > 0
    assert figure.detail["workers"] == 2
    assert figure.detail["batch_size"] == 32
    assert len(figure.detail["iterations"]) == 5  # warm-up excluded
    assert figure.value == pytest.approx(2 * figure.detail["per_device"], rel=1e-2)
    # rank 0 alone prints
    assert result.stdout.count("Total img/sec on") == 1
    assert result.stdout.count("Model: numpy-mlp") == 1


def test_only_rank_zero_prints_with_tagged_output():
    result = mpirun("-np", "2", "--tag-output", *workload())
    lines = [line for line in result.stdout.splitlines() if line.strip()]
    assert lines and all(re.match(r"\[\d+,0\]<stdout>:", line) for line in lines), result.stdout
    assert parse_output("horovod_synthetic", result.stdout).value > 0
