"""Benchmark: start-up time of `gpuvm --help` and of `gpuvm validate playbooks/lab.yaml` (heavy
imports — pyvmomi, fabric, matplotlib — are deferred to the commands that need them), next to a bare
`python -c pass` measured in the same run. Run: `.venv/bin/python bench/cli_startup.py [--runs 20]`."""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path


def timed(argv: list[str], runs: int) -> float:
    samples = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run(argv, check=True, stdout=subprocess.DEVNULL)
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args()
    gpuvm = str(Path(sys.executable).parent / "gpuvm")
    python_s = timed([sys.executable, "-c", "pass"], args.runs)
    help_s = timed([gpuvm, "--help"], args.runs)
    validate_s = timed([gpuvm, "validate", str(Path(__file__).resolve().parents[1] / "playbooks" / "lab.yaml")], args.runs)
    heavy = subprocess.run([sys.executable, "-c", "import gpuvm.cli.main, sys; "
                            "print(sorted(m for m in ('pyVmomi', 'fabric', 'paramiko', 'matplotlib', 'numpy') if m in sys.modules))"],
                           capture_output=True, text=True, check=True).stdout.strip()
    print(f"{'command':<24} {'median s':>9}")
    print(f"{'python -c pass':<24} {python_s:>9.3f}")
    print(f"{'gpuvm --help':<24} {help_s:>9.3f}")
    print(f"{'gpuvm validate lab.yaml':<24} {validate_s:>9.3f}")
    print(f"heavy modules imported by the CLI at start: {heavy}")
    print(f"help_s={help_s:.3f} validate_s={validate_s:.3f} python_s={python_s:.3f} "
          f"overhead_ratio={help_s / python_s:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
