"""Benchmark: `gpuvm plan` over a state directory whose journal has 1,000,000 lines, next to the
same plan over an empty state directory (issue 21, item 6: under 1 s more).

One process per plan, as a user runs it, against the simulator (`--hosts` hosts with
`--vms-per-host` VMs each); the two state directories alternate, and each figure is the median of
`--runs` runs. The journal's lines are entries as `apply` writes them (a `host.passthrough` change
each, ~300 bytes: ~300 MB for a million). `--src` measures another tree's gpuvm (e.g. an older
checkout's `src`, for the figure before). Run: `.venv/bin/python bench/journal_scale.py
[--lines 1000000] [--runs 5] [--hosts 16] [--vms-per-host 4] [--src DIR]`. Exits 1 when the
difference is 1 s or more.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "simulator"))

from gpusim import Simulator  # noqa: E402

GOAL_S = 1.0


def write_runbook(path: Path, hosts: int, vms_per_host: int) -> None:
    lines = ["vcenter: {password_env: GPUVM_VCENTER_PASSWORD}", "hosts:"]
    lines += [f"  - {{name: esx-{h:02d}, passthrough: [{{model: A100}}], allow_maintenance: true, allow_reboot: true}}"
              for h in range(1, hosts + 1)]
    lines.append("vms:")
    lines += [f"  - {{name: esx-{h:02d}-vm{v}, host: esx-{h:02d}, cpus: 16, gpus: {{mode: passthrough, count: 1}}}}"
              for h in range(1, hosts + 1) for v in range(1, vms_per_host + 1)]
    path.write_text("\n".join(lines) + "\n")


def write_journal(path: Path, lines: int) -> int:
    """`lines` entries as an apply writes them; returns the file's size in bytes."""
    entry = {"time": "2026-11-25T12:00:00.000+00:00", "run": "0123456789ab", "status": "done",
             "step": "host.passthrough", "target": "esx-01", "resource": "pci 0000:17:00.0 (GA100 [A100 PCIe 80GB])",
             "field": "passthrough", "before": "off", "after": "active", "disruption": "host-reboot"}
    chunk = 10_000
    with path.open("w") as out:
        for start in range(0, lines, chunk):
            rows = []
            for i in range(start, min(start + chunk, lines)):
                entry["target"] = f"esx-{i % 512:02d}"
                rows.append(json.dumps(entry))
            out.write("\n".join(rows) + "\n")
    return path.stat().st_size


def timed_plan(runbook: Path, env: dict[str, str], state: Path) -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "gpuvm.cli.main", "plan", str(runbook)], check=True,
                   stdout=subprocess.DEVNULL, env={**env, "GPUVM_STATE_DIR": str(state)})
    return time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--lines", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--hosts", type=int, default=16)
    parser.add_argument("--vms-per-host", type=int, default=4)
    parser.add_argument("--src", type=Path, default=REPO / "src", help="the gpuvm sources measured")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        runbook = work / "rb.yaml"
        write_runbook(runbook, args.hosts, args.vms_per_host)
        empty, full = work / "empty", work / "full"
        empty.mkdir(mode=0o700)
        full.mkdir(mode=0o700)
        started = time.perf_counter()
        size = write_journal(full / "journal.jsonl", args.lines)
        print(f"journal: {args.lines:,} lines, {size / 2**20:.0f} MiB, written in {time.perf_counter() - started:.1f} s",
              file=sys.stderr)
        with Simulator(hosts=args.hosts, vms_per_host=args.vms_per_host) as sim:
            env = {**os.environ, "GOVC_URL": sim.url, "GOVC_TLS_CA_CERTS": str(sim.cert_file),
                   "GOVC_USERNAME": sim.username, "GPUVM_VCENTER_PASSWORD": sim.password,
                   "PYTHONPATH": str(args.src.resolve()), "COLUMNS": "160"}
            times: dict[str, list[float]] = {"empty": [], "full": []}
            timed_plan(runbook, env, empty)  # warm-up: imports compiled, simulator's first answers
            for _ in range(args.runs):
                times["empty"].append(timed_plan(runbook, env, empty))
                times["full"].append(timed_plan(runbook, env, full))
    empty_s, full_s = statistics.median(times["empty"]), statistics.median(times["full"])
    difference = full_s - empty_s
    print(f"gpuvm plan, {args.hosts} hosts x {args.vms_per_host} VMs, medians of {args.runs} alternating runs "
          f"(sources: {args.src}):")
    print(f"  empty state directory        {empty_s:6.2f} s")
    print(f"  journal of {args.lines:>9,} lines  {full_s:6.2f} s")
    print(f"  difference                   {difference:+6.2f} s (goal < {GOAL_S:.0f} s: "
          f"{'met' if difference < GOAL_S else 'NOT met'})")
    print(f"journal_lines={args.lines} empty_s={empty_s:.3f} full_s={full_s:.3f} difference_s={difference:.3f}")
    return 0 if difference < GOAL_S else 1


if __name__ == "__main__":
    sys.exit(main())
