"""Every benchmark script of bench/ run at a smoke size, seconds each, so none can rot unseen (issue 33,
item 9: `bench/ssh_mesh.py` had crashed since a refactor, and nothing ran it).

Each runs as `make bench` runs it, a process of this Python, at the smallest size that still takes
its whole path (simulator, test bed, docker, PyTorch), and must exit 0 with its figures on its last
line (`key=value ...`, as bench/fleet.py reads them). The bed benchmarks use their own bed
(testbed/bed.py's BENCH_NAMES) and lock, beside the tests' bed; they need root, as the tests' bed does.
A script added to bench/ without a case here fails `test_every_bench_script_has_a_smoke_case`.
They run three at a time (the bed's four one after another, on their lock): about 45 s in all.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
ONE_PLAN = ["--vms-per-host", "1", "--runs", "1"]
SMOKE = {  # script: its arguments at smoke size
    "apply_parallel.py": ["--vms", "8", "--latency", "1ms"],
    "campaign_scale.py": ["--sizes", "1,2"],
    "cli_startup.py": ["--runs", "1"],
    "container_path.py": ["--smoke"],
    "fleet.py": ["--hosts", "2", *ONE_PLAN, "--parts", "wire_floor.py"],
    "image_fanout.py": ["--sizes", "2", "--mb", "1", "--mbit", "0", "--star-up-to", "2"],
    "journal_scale.py": ["--lines", "1000", "--runs", "1", "--hosts", "2", "--vms-per-host", "1"],
    "lock_renewal.py": ["--hosts", "8", "--rounds", "1"],
    "operator_wait.py": ["--vcenters", "2", "--hosts", "2", *ONE_PLAN],
    "plan_scaling.py": ["--sizes", "2", *ONE_PLAN],
    "plan_vcenters.py": ["--vcenters", "2", "--hosts", "2", *ONE_PLAN],
    "pytorch_workloads.py": ["--steps", "5", "--warmup", "1", "--repeats", "1", "--image-size", "16", "--batch-size", "2"],
    "render_plan.py": ["--runs", "1", "--sizes", "10,100"],
    "runbook_load.py": ["--hosts", "4", "--runs", "1"],
    "slurm_launch.py": ["--sizes", "1,2"],
    "ssh_mesh.py": ["--sizes", "1,2"],
    "wire_floor.py": ["--hosts", "2", *ONE_PLAN],
}


def bench_scripts() -> list[str]:
    """The scripts of bench/ (a module without a `__main__` block, like bedbench.py, is a helper)."""
    return sorted(p.name for p in BENCH.glob("*.py") if 'if __name__ == "__main__":' in p.read_text())


def test_every_bench_script_has_a_smoke_case():
    assert bench_scripts() == sorted(SMOKE), "give each bench/ script a case in SMOKE (arguments of a few seconds)"


def fleet_reader():
    """bench/fleet.py, which reads the scripts' last lines for the fleet campaign: read here the same way."""
    spec = importlib.util.spec_from_file_location("bench_fleet_reader", BENCH / "fleet.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the file runs
    spec.loader.exec_module(module)
    return module


FLEET = fleet_reader()


BED = ("container_path.py", "image_fanout.py", "campaign_scale.py", "ssh_mesh.py", "slurm_launch.py")  # first: one after another


@pytest.fixture(scope="module")
def runs(request):
    """Every selected script started at once, three running at a time: script → its finished process."""
    selected = {item.callspec.params["script"] for item in request.session.items
                if getattr(item, "originalname", None) == "test_bench_script_runs_at_smoke_size"}

    def run(script: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, str(BENCH / script), *SMOKE[script]], capture_output=True, text=True,
                              timeout=300, cwd=BENCH.parent)

    with ThreadPoolExecutor(max_workers=3) as pool:
        order = [s for s in [*BED, *sorted(set(SMOKE) - set(BED))] if s in selected]
        yield {script: pool.submit(run, script) for script in order}


@pytest.mark.parametrize("script", sorted(SMOKE))
def test_bench_script_runs_at_smoke_size(runs: dict[str, Future], script):
    result = runs[script].result()
    said = f"stdout:\n{result.stdout[-3000:]}\nstderr:\n{result.stderr[-3000:]}"
    assert result.returncode == 0, said
    found = FLEET.last_line_figures(result.stdout.splitlines())
    assert any(FLEET.is_number(v) for v in found.values()), f"no figures on the last line\n{said}"
    assert all(FLEET.is_number(v) or v == "NA" for v in found.values()), said  # NA: fleet's parts not run
