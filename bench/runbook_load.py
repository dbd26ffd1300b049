"""Benchmark: loading a runbook of 512 hosts x 8 VMs (4,096 VMs), next to ruamel.yaml's round-trip
loader reading the same text (what the loader used for every runbook before fast_yaml) in the same
run. Wall and CPU seconds, median of `--runs`. Run: `.venv/bin/python bench/runbook_load.py
[--hosts 512] [--runs 5]`."""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))
sys.path.insert(0, str(REPO / "bench"))

from plan_scaling import write_runbook  # noqa: E402

from gpuvm.runbook.loader import load_runbook  # noqa: E402


def timed(fn, runs: int) -> tuple[float, float]:
    wall, cpu = [], []
    for _ in range(runs):
        start, start_cpu = time.perf_counter(), time.process_time()
        fn()
        wall.append(time.perf_counter() - start)
        cpu.append(time.process_time() - start_cpu)
    return statistics.median(wall), statistics.median(cpu)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--hosts", type=int, default=512)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    from ruamel.yaml import YAML

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "rb.yaml"
        write_runbook(path, args.hosts, 8)
        vms = len(load_runbook(path).vms)
        load_s, load_cpu = timed(lambda: load_runbook(path), args.runs)
        text = path.read_text()
        ruamel_s, ruamel_cpu = timed(lambda: YAML(typ="rt").load(text), max(1, args.runs // 2))
    print(f"{'reader':<34} {'wall s':>7} {'CPU s':>7}")
    print(f"{'load_runbook (validated)':<34} {load_s:>7.3f} {load_cpu:>7.3f}")
    print(f"{'ruamel round-trip parse alone':<34} {ruamel_s:>7.3f} {ruamel_cpu:>7.3f}")
    print(f"vms={vms} load_s={load_s:.3f} load_cpu_s={load_cpu:.3f} ruamel_ratio={ruamel_s / load_s:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
