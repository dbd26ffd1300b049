"""Verdicts the data support: intervals on every point and comparison, pass / fail / inconclusive
against --max-overhead (with their exit codes), and a gate that missing or invalid figures cannot
bypass. Result sets are constructed here; no benchmark runs."""

from __future__ import annotations

import json
import math

import pytest

from gpuvm.bench import stats
from gpuvm.bench.compare import VERDICT_EXIT_CODES, compare
from gpuvm.bench.results import Benchmark, Point, Repeat, Results, load_results, save_results
from gpuvm.errors import InputError
from tests.unit.factories import bench_cli

TIGHT_BM = [100.0, 100.1, 99.9, 100.05, 99.95]


def results(points: dict[int, list[float | None]], environment="vm", name="b", higher=True) -> Results:
    return Results(environment=environment, benchmarks=[Benchmark(
        name=name, kind="command", unit="u", higher_is_better=higher, scaling="weak",
        points=[Point(nodes=n, repeats=[Repeat(value=v) if v is not None else Repeat(error="exited 1")
                                        for v in vs]) for n, vs in points.items()])])


def bare_metal(points: dict[int, list[float | None]], **kw) -> Results:
    return results(points, environment="bare-metal", **kw)


def scaled(values: list[float], factor: float) -> list[float]:
    return [v * factor for v in values]


# ---------------------------------------------------------------------------- the three verdicts


def test_tight_data_with_1_percent_overhead_passes_2_percent():
    comparison = compare(results({1: scaled(TIGHT_BM, 0.99)}), bare_metal({1: TIGHT_BM}), max_overhead=0.02)
    (verdict,) = comparison.verdicts
    assert verdict.outcome == "pass" and comparison.verdict == "pass"
    low, high = verdict.overhead_ci
    assert 0.005 < low <= 0.01 <= high < 0.015
    assert str(verdict).startswith("b at 1 node: VM within 2.0 % of bare metal: yes — overhead 1.0 % (95 % CI 0.")
    assert str(verdict).endswith("%, 5 repeats each)")


def test_tight_data_with_4_percent_overhead_fails():
    comparison = compare(results({1: scaled(TIGHT_BM, 0.96)}), bare_metal({1: TIGHT_BM}), max_overhead=0.02)
    (verdict,) = comparison.verdicts
    assert (verdict.outcome, comparison.verdict) == ("fail", "fail")
    assert verdict.overhead_ci[0] > 0.02
    assert comparison.violations == [verdict]
    assert ": no — overhead 4.0 %" in str(verdict)


def test_noisy_data_with_2_percent_median_overhead_is_inconclusive():
    noisy_bm = [100.0, 92.0, 108.0, 97.0, 104.0]
    noisy_vm = [98.0, 88.0, 107.0, 95.0, 101.0]  # median 98: the same 2 % overhead, ± 8 %
    comparison = compare(results({1: noisy_vm}), bare_metal({1: noisy_bm}), max_overhead=0.02)
    (verdict,) = comparison.verdicts
    assert verdict.overhead == pytest.approx(0.02)
    assert verdict.outcome == "inconclusive" and comparison.verdict == "inconclusive"
    low, high = verdict.overhead_ci
    assert low < 0.02 < high
    assert verdict.settle is None  # the median sits on the limit: more repeats cannot settle it
    near = compare(results({1: [97, 95.5, 99.5, 96.5, 98.6]}), bare_metal({1: [100, 98, 102, 99, 101.0]}),
                   max_overhead=0.02)
    assert near.verdicts[0].outcome == "inconclusive" and near.verdicts[0].settle > 5
    assert f"about {near.verdicts[0].settle} repeats each would likely settle it" in str(near.verdicts[0])


def test_verdict_exit_codes_are_distinct_and_not_taken():
    taken = {1, 2, 3, 4, 5, 6, 7, 8, 130, 143}
    assert VERDICT_EXIT_CODES["pass"] == 0
    codes = [VERDICT_EXIT_CODES["fail"], VERDICT_EXIT_CODES["inconclusive"]]
    assert len(set(codes)) == 2 and not set(codes) & taken


def test_lower_is_better_overhead_interval():
    minutes = [60.0, 60.1, 59.9, 60.05, 59.95]
    comparison = compare(results({1: scaled(minutes, 1.05)}, higher=False), bare_metal({1: minutes}, higher=False),
                         max_overhead=0.02)
    assert comparison.verdicts[0].outcome == "fail"
    assert comparison.verdicts[0].overhead == pytest.approx(1 - 1 / 1.05)


# ------------------------------------------------------------------------- intervals per point


def test_every_point_has_an_interval_outliers_and_drift():
    drifting = [100.0, 101.0, 100.5, 95.0, 94.0, 94.5]
    with_outlier = [100.0, 100.2, 99.9, 100.1, 140.0, 100.0]
    comparison = compare(results({1: with_outlier, 2: drifting}))
    one, two = comparison.benchmarks[0].points
    assert one.spread.ci[0] <= one.spread.median <= one.spread.ci[1]
    assert one.spread.outliers == [5] and one.spread.drift is None
    assert two.spread.drift == pytest.approx(94.5 / 100.5 - 1)
    assert two.speedup_ci is not None and two.efficiency_ci == (two.speedup_ci[0] / 2, two.speedup_ci[1] / 2)
    assert one.speedup_ci is None  # the reference itself


def test_fewer_than_3_repeats_have_no_interval():
    point = compare(results({1: [139.8, 195.8]})).benchmarks[0].points[0]
    assert point.spread.ci is None and stats.median_ci([1.0, 2.0]) is None


def test_intervals_are_reproducible():
    values = [10.0, 12.0, 11.0, 13.0, 9.5, 10.5]
    assert stats.median_ci(values) == stats.median_ci(list(values))


# -------------------------------------------------------------------------- the gate's holes


def test_a_zero_vm_figure_fails_the_gate_named():
    comparison = compare(results({1: [0.0, 0.0, 0.0]}), bare_metal({1: TIGHT_BM}), max_overhead=0.02)
    (verdict,) = comparison.verdicts
    assert verdict.outcome == "fail" and "a figure of 0 cannot be compared" in str(verdict)


def test_a_point_whose_runs_all_failed_fails_the_gate_named():
    vm = results({1: scaled(TIGHT_BM, 0.99), 4: [None, None]})
    comparison = compare(vm, bare_metal({1: TIGHT_BM, 4: TIGHT_BM}), max_overhead=0.02)
    assert [(v.point, v.outcome) for v in comparison.verdicts] == [("1 node", "pass"), ("4 nodes", "fail")]
    assert "4 nodes: VM within 2.0 % of bare metal: no — no valid figure: all 2 runs failed (exited 1)" in str(
        comparison.verdicts[1])
    assert comparison.verdict == "fail"
    assert [f.label for f in comparison.benchmarks[0].failed_points] == ["4 nodes"]


def test_a_gate_with_nothing_to_check_is_not_a_pass():
    comparison = compare(results({1: TIGHT_BM}), bare_metal({1: TIGHT_BM}, name="other"), max_overhead=0.02)
    assert comparison.verdicts == [] and comparison.verdict == "inconclusive"


@pytest.mark.parametrize("figure", [math.nan, math.inf, -math.inf, 1e308])
def test_invalid_figures_are_failed_runs(figure):
    repeat = Repeat(value=figure)
    assert repeat.value is None and "invalid figure" in repeat.error
    mixed = Repeat(value=5.0, per_vm={"a": figure}, metrics={"iops": figure, "lat": 1.0})
    assert mixed.value is None and mixed.metrics == {"lat": 1.0}


@pytest.mark.parametrize("text", ["NaN", "Infinity", "1e308"])
def test_results_file_with_invalid_figures_fails_its_point(tmp_path, text):
    good = save_results(tmp_path / "vm", results({1: TIGHT_BM, 2: TIGHT_BM}))
    raw = good.read_text().replace('"value": 100.1', f'"value": {text}', 1)
    raw = raw.replace('"value": 100.0,', f'"value": {text},', 2)
    good.write_text(raw)
    loaded = load_results(tmp_path / "vm")
    errors = [r.error for r in loaded.benchmarks[0].points[0].repeats if r.error]
    assert errors and all("invalid figure" in e for e in errors)
    comparison = compare(loaded, bare_metal({1: TIGHT_BM, 2: TIGHT_BM}), max_overhead=0.02)
    json.dumps(comparison.verdicts[0].overhead)  # a plain finite number
    assert all(math.isfinite(p.spread.median) for p in comparison.benchmarks[0].points)


def test_deep_and_aliased_baselines_are_refused(tmp_path):
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(InputError, match="nested too deeply"):
        load_results(deep)
    bomb = tmp_path / "bomb.yaml"
    lines = ["a0: &a0 [1, 1, 1, 1, 1, 1, 1, 1, 1, 1]"]
    lines += [f"a{i}: &a{i} [*a{i - 1}, *a{i - 1}, *a{i - 1}, *a{i - 1}, *a{i - 1}, *a{i - 1}, *a{i - 1}, "
              f"*a{i - 1}, *a{i - 1}, *a{i - 1}]" for i in range(1, 9)]
    bomb.write_text("\n".join(lines) + "\nenvironment: vm\nbenchmarks: {}\n")
    with pytest.raises(InputError, match="YAML aliases"):
        load_results(bomb)
    deep_yaml = tmp_path / "deep.yaml"
    deep_yaml.write_text("environment: vm\nbenchmarks: " + "[" * 5000 + "]" * 5000 + "\n")
    with pytest.raises(InputError):
        load_results(deep_yaml)


# ------------------------------------------------------------------------------- the commands


@pytest.fixture
def cli():
    return bench_cli()


@pytest.mark.parametrize("factor, outcome, code", [(0.99, "pass", 0), (0.96, "fail", 9), (None, "inconclusive", 10)])
def test_compare_exit_code_and_json_tell_the_verdict(cli, tmp_path, factor, outcome, code):
    from tests.schema_check import check

    vm_values = scaled(TIGHT_BM, factor) if factor else [98.0, 88.0, 107.0, 95.0, 101.0]
    bm_values = TIGHT_BM if factor else [100.0, 92.0, 108.0, 97.0, 104.0]
    save_results(tmp_path / "vm", results({1: vm_values}))
    save_results(tmp_path / "bm", bare_metal({1: bm_values}))
    result = cli("compare", tmp_path / "vm", "--baseline", tmp_path / "bm", "--max-overhead", "2%", "--json")
    assert result.exit_code == code, result.output
    document = json.loads(result.stdout[:result.stdout.rindex("}") + 1])
    assert check(document) == "bench-compare" and document["schema"] == "gpuvm.bench-compare/2"
    assert document["verdict"] == outcome and document["verdicts"][0]["outcome"] == outcome
    low, high = document["verdicts"][0]["overhead_ci"]
    assert low < document["verdicts"][0]["overhead"] < high
    assert document["benchmarks"][0]["points"][0]["spread"]["ci"] is not None
    text = cli("compare", tmp_path / "vm", "--baseline", tmp_path / "bm", "--max-overhead", "2%")
    assert text.exit_code == code
    answer = {"pass": "yes", "fail": "no", "inconclusive": "inconclusive"}[outcome]
    assert f"b at 1 node: VM within 2.0 % of bare metal: {answer} — overhead" in " ".join(text.output.split())
    if outcome == "inconclusive":  # a campaign with repeats: auto stopped at its cap: raising the cap helps
        assert "with `repeats: auto`, a higher `repeats_max`" in " ".join(text.output.split())


def test_nan_in_results_and_benchmark_output_is_a_named_failure_not_a_traceback(cli, tmp_path):
    path = save_results(tmp_path / "vm", results({1: [1.0, 2.0, 3.0]}))
    path.write_text(path.read_text().replace("1.0,", "NaN,").replace("2.0,", "Infinity,").replace("3.0,", "1e308,"))
    save_results(tmp_path / "bm", bare_metal({1: TIGHT_BM}))
    for command in ("compare", "report"):
        result = cli(command, tmp_path / "vm", "--baseline", tmp_path / "bm", "--max-overhead", "2%")
        assert result.exit_code == 9, result.output
        assert "Traceback" not in result.output and "b at 1 node" in result.output
        assert "no valid figure: all 3 runs failed (invalid figure nan" in " ".join(result.output.split())
    from gpuvm.bench.parsers import parse_output
    from gpuvm.errors import BenchmarkError

    with pytest.raises(BenchmarkError, match="not a finite number"):
        parse_output("command", "throughput: nan\n", pattern=r"throughput: (\S+)", unit="u", higher_is_better=True)


# ---------------------------------------------------------------------------------- the plots


def test_plots_have_error_bars_from_the_intervals(tmp_path, mocker):
    from matplotlib.axes import Axes

    from gpuvm.bench.report import write_plots

    errorbar, bar = mocker.spy(Axes, "errorbar"), mocker.spy(Axes, "bar")
    vm = results({1: scaled(TIGHT_BM, 0.99), 2: scaled(TIGHT_BM, 1.9)})
    comparison = compare(vm, bare_metal({1: TIGHT_BM, 2: scaled(TIGHT_BM, 2)}))
    write_plots(comparison, tmp_path)
    one, two = comparison.benchmarks[0].points
    throughput, efficiency = (c.kwargs["yerr"] for c in errorbar.call_args_list[:2])  # then bar()'s own
    assert throughput == [[one.spread.median - one.spread.ci[0], two.spread.median - two.spread.ci[0]],
                          [one.spread.ci[1] - one.spread.median, two.spread.ci[1] - two.spread.median]]
    assert efficiency[0][0] == 0 and efficiency[0][1] == pytest.approx((two.efficiency - two.efficiency_ci[0]) * 100)
    vm_bars, bm_bars = (c.kwargs["yerr"] for c in bar.call_args_list)
    assert vm_bars[1][0] == pytest.approx(one.spread.ci[1] - one.spread.median) and vm_bars[1][0] > 0
    assert bm_bars[1][1] == pytest.approx(two.baseline_ci[1] - two.baseline)


def test_plot_names_are_unique_and_bounded(tmp_path):
    from gpuvm.bench.report import plot_stem, write_plots

    names = ["a b", "a/b", "a-b", "x" * 10_000]
    stems = [plot_stem(n) for n in names]
    assert len(set(stems)) == 4 and stems[2] == "a-b" and all(len(s) <= 80 for s in stems)
    sets = Results(environment="vm", benchmarks=[
        Benchmark(name=n, kind="command", points=[Point(nodes=k, repeats=[Repeat(value=1.0 * k)]) for k in (1, 2)])
        for n in names[:2]])
    plots = write_plots(compare(sets), tmp_path)
    assert len({path for _, path in plots}) == len(plots) == 4


def test_a_huge_benchmark_name_is_refused_at_once(tmp_path):
    path = save_results(tmp_path / "long", results({1: TIGHT_BM}))
    path.write_text(path.read_text().replace('"name": "b"', '"name": "' + "x" * 1_000_000 + '"'))
    with pytest.raises(InputError, match=r"benchmarks\[0\]\.name: String should have at most 200 characters"):
        load_results(tmp_path / "long")
