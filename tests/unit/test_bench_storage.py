"""The storage benchmark (fio random reads): the runbook's rules, the fio line, the campaign
recording its metrics, and `gpuvm size --results` putting the measured rate beside the one needed."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest

from gpuvm.bench.campaign import plan_campaign
from gpuvm.bench.results import load_results
from gpuvm.errors import InputError
from gpuvm.executors.base import CommandResult
from gpuvm.executors.fake import FakeExecutor
from tests.unit.test_bench_run import book, campaign, fake, one_run
from tests.unit.test_sizing import gpuvm

FIO_REPORT = (Path(__file__).parents[1] / "fixtures" / "bench" / "fio_randread_group.json").read_text()


def test_fio_line_reads_at_random_in_the_data_directory_once_per_guest(tmp_path):
    runbook = book(tmp_path, one_run(kind="storage", data="/mnt/data sets", scenario="concurrent",
                                     groups=[["vm1", "vm2"]], args=["--runtime=60"]))
    [point] = plan_campaign(runbook)
    assert point.run.launch == "none" and [job.np for job in point.jobs] == [1, 1]
    vm1, vm2 = (shlex.split(job.command) for job in point.jobs)
    assert vm1[vm1.index("fio"):] == [
        "fio", "--name=gpuvm-randread-vm1", "--directory=/mnt/data sets", "--rw=randread", "--bs=128k",
        "--ioengine=libaio", "--iodepth=16", "--numjobs=4", "--size=1g", "--direct=1", "--runtime=30",
        "--time_based", "--group_reporting", "--output-format=json", "--runtime=60"]
    assert "--name=gpuvm-randread-vm2" in vm2  # guests sharing a mount lay out files of their own


@pytest.mark.parametrize("fields, error", [
    (dict(kind="storage"), r"runs\[0\]: .*kind storage reads files: give `data`"),
    (dict(kind="storage", data="/d", launch="mpirun"), r"runs\[0\]: kind storage runs fio once per guest: launch none"),
    (dict(kind="storage", data="/d", steps=10), r"runs\[0\]: kind storage runs for a time, not steps: give fio's --runtime=SECONDS in `args`"),
    (dict(kind="storage", data="/d", nodes=[1, 2]), r"runs\[0\]\.launch: launch: none starts one process"),
])  # fmt: skip
def test_storage_runs_are_checked(tmp_path, fields, error):
    with pytest.raises(InputError, match=r"lab\.yaml:\d+: benchmarks\." + error):
        plan_campaign(book(tmp_path, one_run(**fields)))


def fio(name: str, report: str = FIO_REPORT) -> FakeExecutor:
    executor = fake(name)
    executor.responses = {re.compile(r"exec env .* fio "): CommandResult("", 0, report, ""),
                          re.compile(r"command -v fio .*\|\| echo"): CommandResult("", 0, "", ""),
                          **executor.responses}
    return executor


def test_campaign_records_read_rate_iops_and_latencies_per_vm(tmp_path):
    done, _ = campaign(tmp_path, one_run(kind="storage", data="/d", scenario="concurrent", groups=[["vm1", "vm2"]],
                                         repeats=1), {"vm1": fio("vm1"), "vm2": fio("vm2")})
    assert not done.failures
    bench = load_results(done.results_file).benchmarks[0]
    [repeat] = bench.points[0].repeats
    assert (bench.kind, bench.unit, bench.launch) == ("storage", "GB/s", "none")
    assert repeat.value == pytest.approx(2 * 0.493155129) and repeat.per_vm == {"vm1": 0.493155129,
                                                                                 "vm2": 0.493155129}
    assert repeat.metrics["vm2/read_iops"] == 7524.9501 and repeat.metrics["vm1/clat_p99_ms"] == 12.910592


def test_a_guest_without_fio_fails_before_anything_runs(tmp_path):
    missing = fake("vm1")
    missing.responses = {re.compile(r"command -v fio .*\|\| echo"): CommandResult("", 0, "fio\n", ""),
                         **missing.responses}
    with pytest.raises(Exception, match=r"fio: not found on PATH \(benchmark 'b'\)"):
        campaign(tmp_path, one_run(kind="storage", data="/d", repeats=1), {"vm1": missing})


def test_size_puts_the_measured_read_rate_beside_the_rate_needed(tmp_path):
    done, _ = campaign(tmp_path, one_run(kind="storage", data="/d", scenario="concurrent", groups=[["vm1", "vm2"]],
                                         repeats=1), {"vm1": fio("vm1"), "vm2": fio("vm2")})
    results = done.results_file.parent
    table = gpuvm("--model", "resnet50", "--gpus", 4, "--results", results)  # no images/s measured: estimated
    assert table.exit_code == 0, table.output
    assert re.search(r"storage measured\s+│ 0\.99 GB/s\s+│ fio: b, 2 VM\(s\) at once, median of 1", table.output)
    data = json.loads(gpuvm("--model", "resnet50", "--gpus", 4, "--results", results, "--json").stdout)
    [measured] = data["storage_measured"]
    assert data["throughput_basis"] == "table"  # no images/s measured: the table of published runs
    assert measured["gb_per_s"] == pytest.approx(0.9863, abs=1e-4)
    assert measured["of_needed"] == pytest.approx(0.98631 / data["storage_gb_per_s"], rel=1e-3)
    assert f"{measured['of_needed']:.2f} x what is needed" in table.output
    slower = gpuvm("--model", "resnet50", "--gpus", 4, "--results", results, "--sample-kb", 1000)  # 9.1x the rate
    assert f"only {measured['of_needed'] / (1000 / 110):.0%} of what is needed" in slower.output


def test_size_without_storage_results_measures_none(tmp_path):
    data = json.loads(gpuvm("--model", "resnet50", "--json").stdout)
    assert data["storage_measured"] == []
