"""Results files and the pure comparison, including the Dell study's published numbers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpuvm.bench.compare import check_overhead, compare
from gpuvm.bench.results import Benchmark, Point, Repeat, Results, load_results, save_results
from gpuvm.errors import InputError

REPO = Path(__file__).parents[2]
STUDY_VM = REPO / "playbooks" / "results" / "study-vm"
STUDY_BM = REPO / "playbooks" / "results" / "study-baremetal.yaml"


def scaling(
    values: dict[int, list[float]], higher_is_better=True, scaling="weak", name="b"
) -> Benchmark:
    return Benchmark(
        name=name, kind="command", unit="u", higher_is_better=higher_is_better, scaling=scaling,
        points=[Point(nodes=n, repeats=[Repeat(value=v) for v in vs]) for n, vs in values.items()],
    )  # fmt: skip


def results(*benchmarks: Benchmark, environment="vm") -> Results:
    return Results(environment=environment, benchmarks=list(benchmarks))


# ------------------------------------------------------------------------------------ the study


def test_study_numbers():
    comparison = compare(load_results(STUDY_VM), load_results(STUDY_BM))
    bench = next(b for b in comparison.benchmarks if b.name == "resnet50-scaling")
    by_nodes = {p.nodes: p for p in bench.points}
    assert bench.scaling == "weak"
    assert f"{by_nodes[2].speedup:.3f}" == "1.956"
    assert f"{by_nodes[4].speedup:.3f}" == "3.872"
    assert f"{by_nodes[2].efficiency * 100:.1f}" == "97.8"
    assert f"{by_nodes[4].efficiency * 100:.1f}" == "96.8"
    assert f"{by_nodes[4].ratio * 100:.1f}" == "98.7"
    assert f"{by_nodes[4].overhead * 100:.1f}" == "1.3"
    assert by_nodes[1].baseline is None and by_nodes[2].baseline is None  # only 4 nodes published


def test_study_concurrent_scenario():
    comparison = compare(load_results(STUDY_VM))
    bench = next(b for b in comparison.benchmarks if b.name == "resnet50-concurrent")
    assert [(p.label, p.total) for p in bench.points] == [
        ("1 VM × 2 GPUs", 5500.0),
        ("2 VMs × 1 GPU", 5400.0),
        ("2 VMs × 2 GPUs", 11000.0),
    ]
    assert bench.points[1].per_vm == {"vm-1": 2700.0, "vm-2": 2700.0}
    assert all(p.speedup is None for p in bench.points)


def test_study_files_say_they_are_published_figures():
    vm, bm = load_results(STUDY_VM), load_results(STUDY_BM)
    assert "not a gpuvm run" in vm.note and "not a gpuvm run" in bm.note
    assert "no point has a confidence interval" in vm.note and "no confidence interval" in bm.note
    assert all(p.spread.ci is None for b in compare(vm, bm).benchmarks for p in b.points)  # the digits stay
    assert bm.environment == "bare-metal" and vm.environment == "vm"
    assert [(p.nodes, p.repeats[0].value) for p in bm.benchmarks[0].points] == [(4, 10818.0)]


# -------------------------------------------------------------------------------- statistics


def test_median_and_spread_of_repeats():
    point = compare(results(scaling({1: [10.0, 12.0, 11.0, 30.0]}))).benchmarks[0].points[0]
    assert (point.spread.median, point.spread.min, point.spread.max) == (11.5, 10.0, 30.0)
    assert point.spread.stdev == pytest.approx(9.5350, rel=1e-4)
    assert point.spread.repeats == 4


def test_single_repeat_has_no_stdev():
    point = compare(results(scaling({1: [10.0]}))).benchmarks[0].points[0]
    assert point.spread.stdev is None


@pytest.mark.parametrize(
    "values, higher, speedups, efficiencies",
    [
        ({1: [100.0], 2: [190.0], 4: [360.0]}, True, [1.0, 1.9, 3.6], [1.0, 0.95, 0.9]),
        # time to train: lower is better, speedup inverts
        ({1: [60.0], 2: [32.0], 4: [20.0]}, False, [1.0, 1.875, 3.0], [1.0, 0.9375, 0.75]),
        # no 1-node point: relative to the smallest
        ({2: [200.0], 4: [380.0], 8: [720.0]}, True, [1.0, 1.9, 3.6], [1.0, 0.95, 0.9]),
    ],
)
def test_speedup_and_efficiency(values, higher, speedups, efficiencies):
    bench = compare(results(scaling(values, higher_is_better=higher))).benchmarks[0]
    assert [p.speedup for p in bench.points] == pytest.approx(speedups)
    assert [p.efficiency for p in bench.points] == pytest.approx(efficiencies)
    assert bench.reference_nodes == min(values)


def test_strong_scaling_is_reported_as_such():
    bench = compare(results(scaling({1: [100.0], 2: [150.0]}, scaling="strong"))).benchmarks[0]
    assert bench.scaling == "strong"
    assert bench.points[1].efficiency == pytest.approx(0.75)


def test_efficiency_counts_gpus_when_they_differ_per_node():
    bench = Benchmark(
        name="b", kind="command", scaling="weak",
        points=[Point(nodes=1, gpus_per_node=2, repeats=[Repeat(value=100.0)]),
                Point(nodes=2, gpus_per_node=2, repeats=[Repeat(value=196.0)])],
    )  # fmt: skip
    assert compare(results(bench)).benchmarks[0].points[1].efficiency == pytest.approx(0.98)


# ------------------------------------------------------------------------------ vs bare metal


def test_overhead_against_baseline_one_repeat_is_no_evidence():
    """One bare-metal repeat gives no interval: a 5 % overhead point is inconclusive, not a fail."""
    vm = results(scaling({1: [98.0, 99.0, 97.0], 2: [190.0]}))
    bm = results(scaling({1: [100.0], 2: [200.0], 8: [800.0]}), environment="bare-metal")
    comparison = compare(vm, bm, max_overhead=0.02)
    one, two = comparison.benchmarks[0].points
    assert (one.ratio, one.overhead) == (pytest.approx(0.98), pytest.approx(0.02))
    assert (two.ratio, two.overhead) == (pytest.approx(0.95), pytest.approx(0.05))
    assert comparison.violations == [] and comparison.verdict == "inconclusive"
    assert [(v.point, v.outcome, v.overhead_ci) for v in comparison.verdicts] == [
        ("1 node", "inconclusive", None), ("2 nodes", "inconclusive", None)]
    assert str(comparison.verdicts[1]) == ("b at 2 nodes: VM within 2.0 % of bare metal: inconclusive — overhead 5.0 % "
                                           "(no interval: 1 repeat each, 3 needed); about 3 repeats each would "
                                           "likely settle it")
    assert [v.outcome for v in check_overhead(comparison, 0.10)] == ["inconclusive"] * 2


def test_overhead_for_lower_is_better():
    vm = results(scaling({1: [21.0]}, higher_is_better=False))
    bm = results(scaling({1: [20.0]}, higher_is_better=False), environment="bare-metal")
    point = compare(vm, bm).benchmarks[0].points[0]
    assert point.ratio == pytest.approx(20 / 21)
    assert point.overhead == pytest.approx(1 / 21)


def test_benchmarks_missing_from_baseline_have_no_ratio():
    vm = results(scaling({1: [1.0]}, name="a"))
    bm = results(scaling({1: [1.0]}, name="other"), environment="bare-metal")
    assert compare(vm, bm).benchmarks[0].points[0].ratio is None


def test_concurrent_per_vm_medians_and_total():
    bench = Benchmark(
        name="c", kind="tf_cnn_benchmarks", scenario="concurrent",
        points=[Point(nodes=1, gpus_per_node=2, vms=2, repeats=[
            Repeat(value=5400.0, per_vm={"a": 2700.0, "b": 2700.0}),
            Repeat(value=5300.0, per_vm={"a": 2600.0, "b": 2700.0}),
            Repeat(value=5550.0, per_vm={"a": 2750.0, "b": 2800.0}),
        ])],
    )  # fmt: skip
    point = compare(results(bench)).benchmarks[0].points[0]
    assert point.per_vm == {"a": 2700.0, "b": 2700.0}
    assert point.total == 5400.0
    assert point.label == "2 VMs × 1 GPU"


# ----------------------------------------------------------------------------- results files


def test_save_and_load_round_trip(tmp_path):
    original = load_results(STUDY_VM)
    path = save_results(tmp_path / "run", original)
    assert path == tmp_path / "run" / "results.json"
    assert (tmp_path / "run" / "logs").is_dir()
    assert load_results(tmp_path / "run") == original
    assert load_results(path) == original
    assert json.loads(path.read_text())["format"] == "gpuvm-results/1"


def test_short_yaml_baseline(tmp_path):
    path = tmp_path / "bm.yaml"
    path.write_text(
        "environment: bare-metal\nbenchmarks:\n"
        "  resnet50-scaling: {1: 2790, 2: 5470, 4: 10818}   # nodes: value\n"
        "  allreduce: {1: [7.7, 7.9]}\n"
    )
    loaded = load_results(path)
    bench = loaded.benchmark("resnet50-scaling")
    assert [(p.nodes, [r.value for r in p.repeats]) for p in bench.points] == [
        (1, [2790.0]), (2, [5470.0]), (4, [10818.0])
    ]  # fmt: skip
    assert [r.value for r in loaded.benchmark("allreduce").points[0].repeats] == [7.7, 7.9]


BAD_FILES = [
    ("bad.yaml", "environment: cloud\nbenchmarks:\n  a: {1: 3}\n", r"bad\.yaml:1: environment: Input should be 'vm' or 'bare-metal'"),
    ("bad.yaml", "environment: vm\nbenchmarks:\n  a: {1: 3}\n  b: {0: 3}\n", r"bad\.yaml:4: benchmarks\.b: node count 0"),
    ("bad.yaml", "environment: vm\nbenchmarks:\n  a:\n    1: fast\n", r"bad\.yaml:4: benchmarks\.a\.1: expected a number"),
    ("bad.yaml", "environment: vm\nbenchmarks:\n  a: [1, 2]\n", r"bad\.yaml:3: benchmarks\.a: expected a mapping of node count"),
    ("bad.yaml", "environment: vm\nbenchmarks: {a: {1: 2}\n", r"bad\.yaml:\d+: not valid YAML"),
    ("bad.yaml", "environment: vm\npassword: hunter2\nbenchmarks: {}\n", r"bad\.yaml:2: password: Extra inputs are not permitted"),
    ("bad.json", '{"format": "gpuvm-results/1", "environment": "vm",\n "benchmarks": [}', r"bad\.json:2: not valid JSON"),
    ("bad.json", '{"format": "other/2", "environment": "vm"}', r"bad\.json: format is 'other/2'"),
    ("bad.json", json.dumps({"format": "gpuvm-results/1", "environment": "vm", "benchmarks": [
        {"name": "a", "kind": "command", "points": [{"nodes": 1, "repeats": []}]}]}),
     r"bad\.json: benchmarks\[0\]\.points\[0\]\.repeats: List should have at least 1 item"),
    ("bad.json", json.dumps({"format": "gpuvm-results/1", "environment": "vm", "benchmarks": [
        {"name": "a", "kind": "command", "points": [{"nodes": 1, "repeats": [{"value": 1}]},
                                                     {"nodes": 1, "repeats": [{"value": 2}]}]}]}),
     r"points repeat the same configuration \[\(1,\)\]"),
]  # fmt: skip


@pytest.mark.parametrize("name, text, message", BAD_FILES)
def test_bad_results_files_name_file_line_and_field(tmp_path, name, text, message):
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(InputError, match=message) as caught:
        load_results(path)
    assert str(caught.value).startswith(str(path))


def test_missing_results(tmp_path):
    with pytest.raises(InputError, match="no results.json"):
        load_results(tmp_path)
    with pytest.raises(InputError, match="no such file"):
        load_results(tmp_path / "nope.json")
