"""`gpuvm size`'s throughput: published single-GPU runs where there are some for the GPU and
precision, a roofline calibrated on them where not, the user's own runs (--results) before both;
and the GPU count that trains a target in time."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from gpuvm.cli.main import app
from gpuvm.sizing.estimate import size
from gpuvm.sizing.spec import SizingSpec
from gpuvm.sizing.throughput import MEASURED


def sized(*args) -> dict:
    result = CliRunner().invoke(app, ["size", "--model", "resnet50", "--batch-per-gpu", "256", "--json",
                                      *[str(a) for a in args]])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


@pytest.mark.parametrize(("gpu", "precision", "published"), [
    ("a100-80gb", "fp32", 938), ("a100-80gb", "fp16", 2470), ("a100-80gb", "bf16", 2470),
    ("v100-16gb", "fp32", 367), ("v100-16gb", "fp16", 1200),
])
def test_a_published_run_is_the_answer_and_is_cited(gpu, precision, published):
    data = sized("--gpu", gpu, "--precision", precision)
    assert data["throughput_basis"] == "table"
    assert data["samples_per_s"] == published
    low, high = data["samples_per_s_range"]
    assert low <= published <= high
    assert any(f"{published:,}/s on {gpu}" in row and "DeepLearningExamples" in row for row in data["throughput_rows"])


def test_h100_has_no_reference_run_so_a_roofline_over_them_answers():
    """Mixed precision convnets are memory-bound: the H100's roof is its bandwidth over the bytes the
    reference rows imply; TF32 at twice the bytes. Other published H100 runs widen the range."""
    fp16, fp32 = sized("--gpu", "h100-sxm", "--precision", "bf16"), sized("--gpu", "h100-sxm", "--precision", "fp32")
    v100 = sized("--gpu", "v100-16gb", "--precision", "fp16")["samples_per_s"]
    assert fp16["throughput_basis"] == fp32["throughput_basis"] == "roofline"
    assert fp16["samples_per_s"] == pytest.approx(v100 * 3350 / 900, rel=1e-3)  # the fewest bytes: V100's
    assert fp32["samples_per_s"] == pytest.approx(fp16["samples_per_s"] / 2, rel=1e-3)
    assert fp16["samples_per_s_range"] == [2616, fp16["samples_per_s"]]  # Lambda's H100 SXM5 run, the roof
    assert any("memory roof" in row for row in fp32["throughput_rows"])
    assert any("TF32 tensor cores" in note for note in fp32["assumptions"])


def test_the_roofline_does_not_exceed_a_reference_gpu_run():
    """Calibrated on the best of each resource, the bound holds the reference rows themselves."""
    from gpuvm.sizing.tables import GPUS, MODELS
    from gpuvm.sizing.throughput import roofline

    for row in (m for m in MEASURED if m.reference):
        flops = 3 * 2 * MODELS[row.model].forward_gmacs * 1e9
        roof, _ = roofline(GPUS[row.gpu], row.precision, flops, MODELS[row.model].activation_bytes_per_sample,
                           GPUS, MODELS)
        assert roof >= row.samples_per_s * 0.999, row


def test_v100_fp32_is_plain_fp32_and_a_gpu_without_rows_gets_a_range():
    assert any("plain FP32" in note for note in sized("--gpu", "v100-16gb")["assumptions"])
    t4 = sized("--gpu", "t4", "--precision", "fp32")
    low, high = t4["samples_per_s_range"]
    assert low == pytest.approx(0.9 * high, rel=1e-3) and high == t4["samples_per_s"]


def test_the_users_own_runs_come_first(tmp_path):
    from tests.unit.test_sizing import _results

    data = sized("--results", _results(tmp_path))
    assert data["throughput_basis"] == "measured" and data["samples_per_s"] == 2757.0
    assert any("measured (--results)" in note for note in data["assumptions"])


def test_many_gpus_scale_by_the_published_strong_scaling():
    one, eight = sized("--precision", "fp16"), sized("--precision", "fp16", "--gpus", 8)
    assert eight["samples_per_s"] == pytest.approx(16621, rel=0.01)  # DLE's measured 8 x A100 AMP
    assert sized("--precision", "fp16", "--gpus", 8, "--scaling-efficiency", 1)["samples_per_s"] == 8 * one["samples_per_s"]


@pytest.mark.parametrize(("epochs", "hours", "gpus"), [(90, 30, 1), (90, 10, 2), (90, 1, 16)])
def test_gpus_to_train_in_time(epochs, hours, gpus):
    """A100 AMP, 2,470/s one GPU, 84 % scaling beyond: 90 ImageNet epochs need 1,068/s in 30 h,
    3,203/s in 10 h, 32,029/s in 1 h."""
    s = size(SizingSpec(model="resnet50", precision="fp16", epochs=epochs, hours=hours))
    assert s.gpus_for_target == gpus
    needed = epochs * 1_281_167 / (hours * 3600)
    rate = lambda n: 2470 * (n if n == 1 else n * 6.72 / 8)  # noqa: E731
    assert rate(gpus) >= needed and (gpus == 1 or rate(gpus - 1) < needed)


def test_epochs_and_hours_go_together():
    result = CliRunner().invoke(app, ["size", "--model", "resnet50", "--epochs", "90"])
    assert result.exit_code == 2 and "give epochs and hours together" in result.stderr


@pytest.mark.parametrize(("given", "taken"), [("tf32", "fp32"), ("amp", "fp16"), ("bf16", "bf16")])
def test_nvidia_precision_names(given, taken):
    data = sized("--gpu", "NVIDIA H100 80GB HBM3", "--precision", given)
    assert (data["inputs"]["precision"], data["gpu"]["name"]) == (taken, "h100-sxm")
