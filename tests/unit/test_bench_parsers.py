"""Parsers against logs in the real tools' formats (tests/fixtures/bench)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpuvm.bench.parsers import PARSERS, Figure, parse_output
from gpuvm.errors import BenchmarkError, InputError

FIXTURES = Path(__file__).parents[1] / "fixtures" / "bench"


def read(name: str) -> str:
    return (FIXTURES / name).read_text()


# kind, fixture, options, value, unit, higher_is_better, expected detail subset
CASES = [
    ("tf_cnn_benchmarks", "tf_cnn_single_gpu.log", {}, 2757.21, "images/sec", True,
     {"ranks_reporting": 1, "model": "resnet50", "batch_size_per_device": 1024}),
    # 4 ranks each print the same total (already × workers): the figure is NOT their sum.
    ("tf_cnn_benchmarks", "tf_cnn_horovod_4ranks_mpirun.log", {}, 10675.09, "images/sec", True,
     {"ranks_reporting": 4, "rank_totals_min": 10675.09, "rank_totals_mean": 10675.09,
      "source": "rank 0"}),
    # Gloo prefixes; rank 1 prints first and a different total: rank 0's is taken.
    ("tf_cnn_benchmarks", "tf_cnn_horovod_2ranks_gloo.log", {}, 5391.75, "images/sec", True,
     {"ranks_reporting": 2, "rank_totals_min": 5388.12, "source": "rank 0"}),
    ("horovod_synthetic", "horovod_synthetic_pytorch_16gpu.log", {}, 3756.0, "img/sec", True,
     {"workers": 16, "device": "GPU", "per_device": 234.8, "per_device_conf": 42.0,
      "total_conf": 672.7, "model": "resnet50", "batch_size": 32}),
    ("horovod_synthetic", "horovod_synthetic_tf2_mpirun_tagged.log", {}, 5397.2, "img/sec", True,
     {"workers": 2, "per_device": 2698.6, "total_conf": 17.2, "batch_size": 256}),
    ("nccl_allreduce", "nccl_allreduce_new.log", {}, 4.1624, "GB/s", True, {"table": "new"}),
    ("nccl_allreduce", "nccl_allreduce_old.log", {}, 10.9092, "GB/s", True, {"table": "old"}),
    ("mlperf_log", "mlperf_resnet_rank_prefix.log", {}, 28.73, "min", False,
     {"submission_benchmark": "resnet", "global_batch_size": 3264, "eval_accuracy": 0.7596,
      "status": "success"}),
    ("mlperf_log", "mlperf_resnet_plain.log", {}, 28.73, "min", False,
     {"submission_benchmark": "resnet"}),
    ("command", "command_stream.log", {"pattern": r"^Triad:\s+([\d.]+)", "unit": "MB/s"},
     155813.6, "MB/s", True, {"matched": "155813.6"}),
    # last match wins; thousands separators and --tag-output prefixes are handled.
    ("command", "command_throughput.log", {"pattern": r"samples/s = ([\d,.]+)", "unit": "samples/s"},
     1318.25, "samples/s", True, {}),
    ("command", "mlperf_resnet_plain.log",
     {"pattern": r"^RESULT,IMAGE_CLASSIFICATION,,(\d+),", "unit": "s", "higher_is_better": False},
     1818.0, "s", False, {}),
]  # fmt: skip


@pytest.mark.parametrize(
    "kind, fixture, options, value, unit, higher, detail",
    CASES,
    ids=[f"{c[0]}-{c[1]}" for c in CASES],
)
def test_parser_reads_figure(kind, fixture, options, value, unit, higher, detail):
    figure = parse_output(kind, read(fixture), fixture, **options)
    assert isinstance(figure, Figure)
    assert figure.value == pytest.approx(value)
    assert figure.unit == unit
    assert figure.higher_is_better is higher
    for key, expected in detail.items():
        assert (
            figure.detail[key] == pytest.approx(expected)
            if isinstance(expected, float)
            else figure.detail[key] == expected
        )


def test_tf_cnn_never_sums_rank_totals():
    figure = parse_output("tf_cnn_benchmarks", read("tf_cnn_horovod_4ranks_mpirun.log"))
    assert figure.value < 4 * 10675.09 - 1


def test_horovod_synthetic_keeps_iterations_and_ignores_other_ranks():
    text = read("horovod_synthetic_tf2_mpirun_tagged.log") + (
        "[1,1]<stdout>:Total img/sec on 2 GPU(s): 1.0 +-0.0\n"
    )
    figure = parse_output("horovod_synthetic", text)
    assert figure.value == 5397.2
    assert figure.detail["iterations"] == [2690.3, 2701.5, 2698.8, 2703.1, 2699.4]


def test_horovod_synthetic_reads_cpu_wording():
    text = "Number of CPUs: 2\nImg/sec per CPU: 10.0 +-1.0\nTotal img/sec on 2 CPU(s): 20.0 +-2.0\n"
    figure = parse_output("horovod_synthetic", text)
    assert (figure.value, figure.detail["device"], figure.detail["workers"]) == (20.0, "CPU", 2)


def test_nccl_records_busbw_per_size():
    new = parse_output("nccl_allreduce", read("nccl_allreduce_new.log"))
    assert new.detail["busbw_by_size"][134217728] == 11.17
    assert new.detail["busbw_in_place_by_size"][134217728] == 11.29
    assert len(new.detail["busbw_by_size"]) == 25  # 8 B .. 128 MiB
    old = parse_output("nccl_allreduce", read("nccl_allreduce_old.log"))
    assert old.detail["busbw_by_size"][134217728] == 29.92


def test_mlperf_takes_first_run_start_and_its_run_stop():
    text = read("mlperf_resnet_rank_prefix.log")
    # rank 1 logs run_start 3 ms later and run_stop 2 ms later: rank 0's pair is used.
    assert parse_output("mlperf_log", text).value == pytest.approx(1_723_800 / 60_000)


ERRORS = [
    ("tf_cnn_benchmarks", "tf_cnn_oom.log", {},
     "tf_cnn_oom.log: no 'total images/sec' line found (expected tf_cnn_benchmarks output)"),
    ("tf_cnn_benchmarks", "horovod_synthetic_pytorch_16gpu.log", {}, "no 'total images/sec' line"),
    ("horovod_synthetic", "horovod_synthetic_no_total.log", {},
     "horovod_synthetic_no_total.log: no 'Total img/sec on N GPU(s)' line found"),
    ("nccl_allreduce", "nccl_allreduce_truncated.log", {},
     "nccl_allreduce_truncated.log: no '# Avg bus bandwidth' line found"),
    ("nccl_allreduce", "nccl_allreduce_wrong.log", {}, "reported wrong results at sizes 1048576"),
    ("mlperf_log", "mlperf_resnet_killed.log", {}, "mlperf_resnet_killed.log: no ':::MLLOG' run_stop"),
    ("mlperf_log", "tf_cnn_single_gpu.log", {}, "no ':::MLLOG' run_start"),
    ("mlperf_log", "mlperf_resnet_aborted.log", {}, "run_stop status is 'aborted'"),
    ("command", "command_stream.log", {"pattern": r"^Triad:\s+(GB)"}, "no line matches"),
    ("command", "command_stream.log", {"pattern": r"^(Triad):"}, "captured 'Triad', which is not a number"),
]  # fmt: skip


@pytest.mark.parametrize(
    "kind, fixture, options, message", ERRORS, ids=[f"{e[0]}-{e[1]}" for e in ERRORS]
)
def test_parser_without_figure_raises(kind, fixture, options, message):
    with pytest.raises(BenchmarkError) as caught:
        parse_output(kind, read(fixture), fixture, **options)
    assert message in str(caught.value)
    assert caught.value.exit_code == 6


def test_empty_output_names_the_log():
    for kind in ("tf_cnn_benchmarks", "horovod_synthetic", "nccl_allreduce", "mlperf_log"):
        with pytest.raises(BenchmarkError, match=r"^logs/run-1\.log: "):
            parse_output(kind, "", "logs/run-1.log")


@pytest.mark.parametrize("pattern", [r"Triad", r"(a)(b)", r"(unclosed"])
def test_command_pattern_must_have_one_group(pattern):
    with pytest.raises(InputError):
        parse_output("command", "Triad: 1", pattern=pattern)


def test_unknown_kind_lists_the_known_ones():
    with pytest.raises(InputError, match="expected one of: " + ", ".join(PARSERS)):
        parse_output("resnet", "")


# fio --output-format=json, captured from fio 3.33 (Debian bookworm) on this project's machine
def test_fio_reads_bandwidth_iops_and_latency_percentiles():
    figure = parse_output("storage", read("fio_randread_group.json"), "repeat-1.log")
    assert (figure.value, figure.unit, figure.higher_is_better) == (0.493155129, "GB/s", True)
    assert figure.metrics == pytest.approx({"read_gb_s": 0.493155129, "read_iops": 7524.9501,
                                            "lat_mean_ms": 4.246088473475, "clat_p50_ms": 3.653632,
                                            "clat_p99_ms": 12.910592, "clat_p99_9_ms": 25.034752})
    # fio keeps both --bs values of the command line in "job options"; the last one was used
    assert figure.detail == {"fio": "fio-3.33", "jobs": 1, "rw": "randread", "bs": "64k", "numjobs": "2",
                             "iodepth": "16", "direct": "1", "ioengine": "libaio"}


def test_fio_without_group_reporting_sums_jobs_and_keeps_the_worst_percentile():
    figure = parse_output("storage", read("fio_randread_two_jobs.json"))
    assert figure.value == pytest.approx((180874158 + 206379769) / 1e9)
    assert figure.metrics["read_iops"] == pytest.approx(1379.960317 + 1574.552684)
    assert figure.metrics["lat_mean_ms"] == pytest.approx((11574346.700935 * 1391 + 10145686.888258 * 1584)
                                                          / (1391 + 1584) / 1e6)
    assert figure.metrics["clat_p99_ms"] == 46.399488


@pytest.mark.parametrize("fixture, error", [
    # warnings before the report; the job's "error": 2
    ("fio_readonly_missing.log", r"x\.log: fio job\(s\) failed \(gpuvm-randread: error 2\)"),
    # no report at all: the last line says why
    ("fio_no_dir.log", r"x\.log: no fio JSON report found .*: fio: file:options\.c:1457, func=lstat"),
])  # fmt: skip
def test_fio_failures_name_the_log_and_the_cause(fixture, error):
    with pytest.raises(BenchmarkError, match=error):
        parse_output("storage", read(fixture), "x.log")


def test_fio_report_that_read_nothing_or_lacks_fields():
    report = json.loads(read("fio_randread_group.json"))
    report["jobs"][0]["read"]["total_ios"] = 0
    with pytest.raises(BenchmarkError, match="fio read nothing"):
        parse_output("storage", json.dumps(report))
    del report["jobs"][0]["read"]
    with pytest.raises(BenchmarkError, match="fio's report lacks 'read'"):
        parse_output("storage", json.dumps(report))
