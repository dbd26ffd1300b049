"""Is `gpuvm size` honest? Its memory figures against what real PyTorch (Debian's python3-torch,
CPU) allocates for torchvision models, parameter counts taken from the models themselves."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from gpuvm.sizing.estimate import GIB, model_memory
from gpuvm.sizing.tables import MODELS

pytestmark = pytest.mark.integration

PYTHON = "/usr/bin/python3"  # the distribution's Python: python3-torch, python3-torchvision
MEASURE = os.path.join(os.path.dirname(__file__), "..", "..", "src", "gpuvm", "sizing", "measure_torch.py")


@pytest.fixture(scope="module")
def allocated() -> dict[str, dict]:
    if os.system(f"{PYTHON} -c 'import torch, torchvision' 2>/dev/null") != 0:
        pytest.fail(f"{PYTHON} cannot import torch and torchvision: apt-get install python3-torch python3-torchvision")
    done = subprocess.run([PYTHON, MEASURE, "resnet18", "mobilenet_v2"], capture_output=True, text=True,
                          timeout=120, check=True)
    return {m["model"]: m for m in map(json.loads, done.stdout.splitlines())}


@pytest.mark.parametrize("name", ["resnet18", "mobilenet_v2"])
@pytest.mark.parametrize(("optimizer", "state_key"), [("sgd-momentum", "sgd_momentum_state_bytes"),
                                                      ("adam", "adam_state_bytes")])
def test_weights_gradients_and_optimizer_state_are_what_pytorch_allocates(allocated, name, optimizer, state_key):
    measured = allocated[name]
    memory = model_memory(measured["parameters"], "fp32", optimizer, activation_bytes=0)
    assert memory.weights * GIB == measured["weights_bytes"]
    assert memory.gradients * GIB == measured["gradients_bytes"]
    assert memory.optimizer_state * GIB == measured[state_key]


@pytest.mark.parametrize("name", ["resnet18", "mobilenet_v2"])
def test_mixed_precision_state_is_what_pytorch_allocates_master_weights_included(allocated, name):
    """Half weights and gradients, fp32 master weights and momentum (apex O2 / ZeRO's layout)."""
    measured = allocated[name]
    memory = model_memory(measured["parameters"], "bf16", "sgd-momentum", activation_bytes=0)
    assert memory.weights * GIB == measured["mixed_weights_bytes"]
    assert memory.gradients * GIB == measured["mixed_gradients_bytes"]
    assert memory.optimizer_state * GIB == measured["mixed_master_bytes"] + measured["mixed_sgd_momentum_state_bytes"]


@pytest.mark.parametrize("name", ["resnet18", "mobilenet_v2"])
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_the_whole_estimate_is_within_15_percent_of_what_pytorch_allocates(allocated, name, precision):
    """`size`'s memory per GPU at batch 32 (weights, gradients, optimizer state and the activations
    autograd saves, halved by size for mixed precision) against the bytes PyTorch allocated for them."""
    from gpuvm.sizing.estimate import size
    from gpuvm.sizing.spec import SizingSpec

    m, batch = allocated[name], 32
    if precision == "fp32":
        state = m["weights_bytes"] + m["gradients_bytes"] + m["sgd_momentum_state_bytes"]
        activations = m["activation_bytes_per_sample"]
    else:
        state = (m["mixed_weights_bytes"] + m["mixed_gradients_bytes"] + m["mixed_master_bytes"]
                 + m["mixed_sgd_momentum_state_bytes"])
        activations = m["mixed_activation_bytes_per_sample"]
    estimate = size(SizingSpec(model=name, precision=precision, batch_per_gpu=batch), measured=(1, "-")).memory
    assert estimate.activations * GIB == pytest.approx(activations * batch, rel=0.15)
    assert estimate.total * GIB == pytest.approx(state + activations * batch, rel=0.15)


@pytest.mark.parametrize("name", ["resnet18", "mobilenet_v2"])
def test_the_table_holds_the_models_own_counts_and_activations(allocated, name):
    measured, table = allocated[name], MODELS[name]
    assert table.parameters == measured["parameters"]
    assert table.activation_bytes_per_sample == pytest.approx(measured["activation_bytes_per_sample"], rel=0.05)


def test_data_path_campaign_overhead_and_data_rate(tmp_path):
    """Seed 002's experiment in miniature: the same point on synthetic tensors and on JPEG files
    (a DataLoader with workers), `bench compare` giving the data path's overhead; and `gpuvm size`'s
    storage rate from the measured images/s matching the rate the workload read at, within 5 %."""
    import re

    from typer.testing import CliRunner

    from gpuvm.cli.main import app
    from gpuvm.bench.commands import BUNDLED

    def gpuvm(*args):
        return CliRunner().invoke(app, [str(a) for a in args], catch_exceptions=False)

    files = tmp_path / "jpegs"
    wrote = subprocess.run([PYTHON, BUNDLED["pytorch_train"], "--write-dataset", files, "--files", "48",
                            "--file-kb", "20"], capture_output=True, text=True, check=True).stdout
    mean_kb = sum(p.stat().st_size for p in files.glob("*.jpg")) / 48 / 1000
    assert f"mean {mean_kb:.1f} KB" in wrote
    for name, data in (("synthetic", "synthetic"), ("files", files)):
        (tmp_path / f"{name}.yaml").write_text(f"""\
benchmarks:
  runs:
    - {{name: rn18, kind: pytorch_train, model: resnet18, python: {PYTHON}, batch_size: 8, launch: none,
       data: '{data}', repeats: 1, timeout: 120, env: {{OMP_NUM_THREADS: "1"}},
       args: [--image-size, "32", --num-iters, "3", --num-batches-per-iter, "2", --num-warmup-batches, "1",
              --workers, "2"]}}
""")
        result = gpuvm("bench", "run", tmp_path / f"{name}.yaml", "--local", "--out", tmp_path / name)
        assert result.exit_code == 0, result.output
    synthetic, real = (next((tmp_path / n).iterdir()) for n in ("synthetic", "files"))

    compared = gpuvm("bench", "compare", real, "--baseline", synthetic)
    assert compared.exit_code == 0 and "Overhead" in compared.output, compared.output

    log = "\n".join(p.read_text() for p in (real / "logs").rglob("*.log"))
    read_mb_s = float(re.search(r"Data read: ([\d.]+) MB/s from 48 files", log).group(1))
    sized = json.loads(gpuvm("size", "--model", "resnet18", "--results", real, "--sample-kb", mean_kb,
                             "--json").stdout)
    assert sized["throughput_source"].startswith("measured: rn18")
    assert sized["storage_gb_per_s"] * 1000 == pytest.approx(read_mb_s, rel=0.05)


def test_decode_only_measures_one_cores_rate_on_photograph_shaped_files(tmp_path):
    """gpuvm's workload writes files of a photograph's shape (--pixels) at the size asked, and
    `--decode-only` times reading and decoding them alone: per second of CPU time (one thread, so at
    least the wall clock's rate), the figure `gpuvm size --decode-per-core` takes."""
    import re

    from gpuvm.bench.commands import BUNDLED

    workload = [PYTHON, BUNDLED["pytorch_train"]]
    files = tmp_path / "photos"
    wrote = subprocess.run([*workload, "--write-dataset", files, "--files", "16", "--file-kb", "12",
                            "--pixels", "160x120"], capture_output=True, text=True, check=True).stdout
    sizes = [p.stat().st_size for p in files.glob("*.jpg")]
    assert "Wrote 16 files of 160 x 120 px" in wrote and sum(sizes) / 16 == pytest.approx(12_000, rel=0.15)
    done = subprocess.run([*workload, "--data-dir", files, "--decode-only", "--batch-size", "8", "--image-size", "64",
                           "--num-warmup-batches", "1", "--num-batches-per-iter", "2", "--num-iters", "2"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    per_core, wall = map(float, re.search(r"Decode: ([\d.]+) images/s per core \+-[\d.]+ \(CPU time; 1 thread: "
                                          r"([\d.]+) images/s wall\)", done.stdout).groups())
    assert per_core >= wall * 0.95 > 0
    refused = subprocess.run([*workload, "--decode-only"], capture_output=True, text=True)
    assert refused.returncode == 2 and "--decode-only times the files of --data-dir" in refused.stderr
    too_few = subprocess.run([*workload, "--data-dir", files, "--decode-only"], capture_output=True, text=True)
    assert too_few.returncode == 2 and "fewer than one batch (32)" in too_few.stderr  # 16 files: one line, no traceback
    assert "Traceback" not in too_few.stderr
