"""The storage benchmark with real fio on this machine: the figure results.json keeps is the rate fio
read at, and `gpuvm size --results` shows it beside the rate the sizing says is needed."""

from __future__ import annotations

import json
import shutil
import statistics

import pytest
from typer.testing import CliRunner

from gpuvm.bench.results import load_results
from gpuvm.cli.main import app

pytestmark = pytest.mark.integration


def gpuvm(*args):
    return CliRunner().invoke(app, [str(a) for a in args], catch_exceptions=False)


def test_fio_random_reads_recorded_and_shown_beside_the_rate_needed(tmp_path):
    if shutil.which("fio") is None:
        pytest.fail("fio is not installed: apt-get install fio (the Makefile's APT_PACKAGES has it)")
    data = tmp_path / "data"
    data.mkdir()
    (tmp_path / "disk.yaml").write_text(f"""\
benchmarks:
  runs:
    - {{name: disk, kind: storage, data: '{data}', repeats: 2, timeout: 60,
       args: [--size=8m, --numjobs=1, --iodepth=4, --runtime=1, --direct=0]}}
""")
    run = gpuvm("bench", "run", tmp_path / "disk.yaml", "--local", "--out", tmp_path / "out")
    assert run.exit_code == 0, run.output
    results_dir = next((tmp_path / "out").iterdir())
    [point] = load_results(results_dir).benchmarks[0].points
    assert sorted(p.name for p in data.iterdir()) == ["gpuvm-randread-local.0.0"]  # laid out once, reused
    for repeat in point.repeats:
        report = json.loads((results_dir / repeat.log).read_text())
        read = report["jobs"][0]["read"]
        # decimal GB/s of what fio read in its run time: the unit gpuvm size states its rate in
        assert repeat.value == pytest.approx(read["io_bytes"] / (read["runtime"] / 1e3) / 1e9, rel=0.01)
        assert repeat.metrics["read_iops"] == pytest.approx(read["total_ios"] / (read["runtime"] / 1e3), rel=0.01)
        assert 0 < repeat.metrics["clat_p50_ms"] <= repeat.metrics["clat_p99_ms"] <= repeat.metrics["clat_p99_9_ms"]
    sized = json.loads(gpuvm("size", "--model", "resnet50", "--gpus", 4, "--results", results_dir, "--json").stdout)
    [measured] = sized["storage_measured"]
    assert measured["gb_per_s"] == pytest.approx(statistics.median(r.value for r in point.repeats), rel=1e-3)
    assert measured["of_needed"] == pytest.approx(measured["gb_per_s"] / sized["storage_gb_per_s"], rel=1e-3)
