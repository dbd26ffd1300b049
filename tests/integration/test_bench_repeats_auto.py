"""`repeats: auto` on the SSH test bed: a steady figure stops after 3 repeats, a noisy one runs to
the cap (the verdicts on such data: tests/unit/test_bench_verdicts.py)."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from gpuvm.bench.results import load_results
from gpuvm.cli.main import app
from tests.integration.test_bench_run import bed_runbook

pytestmark = pytest.mark.integration

# one random byte (0-255) added to 100: a spread of ±60 % around the median
NOISY = "sh -c 'echo throughput: $(( $(od -An -N1 -tu1 /dev/urandom) + 100 ))'"


def gpuvm(*args):
    return CliRunner().invoke(app, [str(a) for a in args], catch_exceptions=False)


def test_auto_repeats_stop_early_on_steady_figures_and_run_to_the_cap_on_noisy_ones(testbed, tmp_path):
    runs = "".join(f"""\
    - name: {name}
      kind: command
      launch: none
      command: {json.dumps(command)}
      pattern: "throughput: ([0-9.]+)"
      unit: u
      nodes: [1]
      repeats: auto
      repeats_max: 5
      repeats_target: 0.001  # ±0.1 %: random bytes never settle by chance
      timeout: 30
""" for name, command in (("steady", "echo throughput: 100"), ("noisy", NOISY)))
    runbook = bed_runbook(testbed, tmp_path / "auto.yaml", runs)
    result = gpuvm("bench", "run", runbook, "--out", tmp_path / "out", "--state-dir", tmp_path / "state",
                   "--accept-new-host-keys")
    assert result.exit_code == 0, result.output
    [directory] = [p for p in (tmp_path / "out").iterdir() if p.is_dir()]
    results = load_results(directory)
    repeats = {b.name: [r.value for r in b.points[0].repeats] for b in results.benchmarks}
    assert repeats["steady"] == [100.0] * 3
    assert len(repeats["noisy"]) == 5 and len(set(repeats["noisy"])) > 1
    # every repeat carries its guest's environment, read over SSH (no GPU tools there: load only)
    environments = [r.environment for b in results.benchmarks for r in b.points[0].repeats]
    assert all(env and len(next(iter(env.values())).load) == 3 for env in environments)
