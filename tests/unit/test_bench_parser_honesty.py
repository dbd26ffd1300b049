"""Parsers refuse what they cannot read honestly: another collective's table, a latency fio never
measured, a figure that is not a number."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuvm.bench.parsers import parse_output
from gpuvm.errors import BenchmarkError

FIXTURES = Path(__file__).parents[1] / "fixtures" / "bench"


def read(name: str) -> str:
    return (FIXTURES / name).read_text()


def test_an_alltoall_table_is_not_all_reduce_bandwidth():
    text = read("nccl_alltoall.log")
    with pytest.raises(BenchmarkError, match=r"x\.log: this is alltoall_perf's output, not all_reduce_perf's"):
        parse_output("nccl_allreduce", text, "x.log")
    unnamed = text.split("\n", 1)[1]  # builds before the "Collective test starting" line
    with pytest.raises(BenchmarkError, match=r"redop is 'none'"):
        parse_output("nccl_allreduce", unnamed, "x.log")
    named = "# Collective test starting: all_reduce_perf\n" + read("nccl_allreduce_new.log")
    assert parse_output("nccl_allreduce", named).value == pytest.approx(4.1624)


def test_fio_with_gtod_reduce_has_no_latency_rather_than_zero():
    """Captured from fio 3.33 with --gtod_reduce=1: lat_ns N 0, mean 0."""
    figure = parse_output("storage", read("fio_gtod_reduce.json"))
    assert figure.value > 0 and figure.metrics["read_iops"] > 0
    assert not {"lat_mean_ms", "clat_p50_ms", "clat_p99_ms"} & set(figure.metrics)
    assert figure.detail["latency"].startswith("not measured")
    measured = parse_output("storage", read("fio_randread_group.json"))
    assert measured.metrics["lat_mean_ms"] > 0 and "latency" not in measured.detail


@pytest.mark.parametrize("printed", ["nan", "inf", "1e999"])
def test_a_figure_that_is_not_a_finite_number_fails_the_run(printed):
    with pytest.raises(BenchmarkError, match="not a finite number"):
        parse_output("command", f"rate: {printed}\n", "x.log", pattern=r"rate: (\S+)", unit="u", higher_is_better=True)
