"""`repeats: auto`: a point repeats until its median's 95 % interval is narrow enough, or the cap."""

from __future__ import annotations

import itertools

import pytest

from gpuvm.bench.results import load_results
from gpuvm.bench.runs import with_repeats
from gpuvm.errors import InputError
from tests.unit.test_bench_run import book, campaign, fake, horovod_output, ok, one_run


def test_tight_points_stop_at_3_repeats_and_noisy_ones_run_to_the_cap(tmp_path):
    noisy = itertools.cycle([100.0, 80.0, 120.0, 90.0, 110.0])
    figures = {"nodes-1": lambda: 100.0, "nodes-2": lambda: next(noisy)}

    def launch(call):
        point = "nodes-2" if "hostfile-b-nodes-2" in call.command else "nodes-1"
        return ok(horovod_output(figures[point]()))

    done, _ = campaign(tmp_path, one_run(kind="horovod_synthetic", nodes=[1, 2], repeats="auto", repeats_max=6),
                       {"vm1": fake("vm1", launch), "vm2": fake("vm2")})
    bench = load_results(done.results_file).benchmarks[0]
    assert [len(p.repeats) for p in bench.points] == [3, 6]
    assert done.runs_done == done.runs_total == 9
    [said] = done.notes  # the noisy point says it stopped at the cap, unsettled; the tight one nothing
    assert said.startswith("b nodes-2: repeats: auto stopped at repeats_max (6) with its median's 95 % interval ±")
    assert "wider than repeats_target ±1 %; raise repeats_max" in said


def test_failed_runs_do_not_count_towards_the_interval(tmp_path):
    answers = iter([ok("nothing\n"), ok(horovod_output(100.0)), ok(horovod_output(100.0)),
                    ok("nothing\n"), ok(horovod_output(100.0))])
    done, _ = campaign(tmp_path, one_run(kind="horovod_synthetic", repeats="auto", repeats_max=8),
                       {"vm1": fake("vm1", lambda call: next(answers)), "vm2": fake("vm2")})
    repeats = load_results(done.results_file).benchmarks[0].points[0].repeats
    assert [r.value for r in repeats] == [None, 100.0, 100.0, None, 100.0]


def test_repeats_option_overrides_every_benchmark(tmp_path):
    runbook = book(tmp_path, one_run(kind="horovod_synthetic", repeats=5))
    assert [r.repeats for r in with_repeats(runbook, "auto").benchmarks.runs] == ["auto"]
    assert [r.repeats for r in with_repeats(runbook, "7").benchmarks.runs] == [7]
    assert with_repeats(runbook, "auto").benchmarks.runs[0].most_repeats == 20
    for bad in ("0", "101", "many", "-1"):
        with pytest.raises(InputError, match="--repeats"):
            with_repeats(runbook, bad)


@pytest.mark.parametrize("fields", [{"repeats": "sometimes"}, {"repeats": "auto", "repeats_max": 2},
                                    {"repeats": "auto", "repeats_target": 0}])
def test_bad_auto_settings_are_refused(tmp_path, fields):
    with pytest.raises(InputError):
        book(tmp_path, one_run(kind="horovod_synthetic", **fields))


def test_warm_up_runs_are_recorded_apart_and_excluded_from_every_figure(tmp_path):
    from gpuvm.bench.compare import compare

    answers = iter([ok(horovod_output(10.0)), *(ok(horovod_output(100.0)) for _ in range(3))])
    done, _ = campaign(tmp_path, one_run(kind="horovod_synthetic", repeats="auto", repeats_max=5, warmup=1),
                       {"vm1": fake("vm1", lambda call: next(answers)), "vm2": fake("vm2")})
    point = load_results(done.results_file).benchmarks[0].points[0]
    assert [r.value for r in point.warmups] == [10.0] and point.warmups[0].log == "logs/b/nodes-1/warmup-1.log"
    assert [r.value for r in point.repeats] == [100.0] * 3
    spread = compare(load_results(done.results_file)).benchmarks[0].points[0].spread
    assert (spread.min, spread.warmups) == (100.0, 1)


def test_repeats_run_round_robin_after_every_warm_up():
    """Drift spreads over every point: repeat 1 of each point, then repeat 2 of each, ...; a point
    with fewer repeats drops out of the later rounds."""
    from types import SimpleNamespace

    from gpuvm.bench.runner import interleaved

    a, b = (SimpleNamespace(name=n, run=SimpleNamespace(warmup=w, most_repeats=r)) for n, w, r in (("a", 1, 3), ("b", 0, 2)))
    order = [(p.name, k, warm) for p, k, warm in interleaved([a, b])]
    assert order == [("a", 1, True), ("a", 1, False), ("b", 1, False), ("a", 2, False), ("b", 2, False), ("a", 3, False)]
