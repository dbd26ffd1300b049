"""Benchmark: printing a plan of 1,000 and 10,000 changes (as `gpuvm plan` does, to a pipe at 160
columns) in both formats, text (grouped by target) and table, and as JSON.
Run: `.venv/bin/python bench/render_plan.py [--runs 3] [--sizes 1000,10000]`. Goal: 10,000 changes as
text in ≤ 0.5 s."""

from __future__ import annotations

import argparse
import io
import statistics
import time

from rich.console import Console

from gpuvm.documents import plan_json
from gpuvm.plan import Change, Disruption, Plan
from gpuvm.render import print_plan


def fleet_plan(changes: int) -> Plan:
    """`changes` changes shaped like the demo's: 12 per VM, 8 VMs a host, a reboot on every host."""
    plan = Plan()
    for i in range(changes):
        vm, host = f"esx-{i // 96:03d}-vm{i // 12 % 8}", f"esx-{i // 96:03d}"
        kind = i % 12
        if kind == 0:
            plan.changes.append(Change("host.passthrough", host, f"pci 0000:{i % 256:02x}:00.0 (GA100 [A100 PCIe 80GB])",
                                       "passthrough", "off", "active", Disruption.HOST_REBOOT, action=object()))
        elif kind < 6:
            plan.changes.append(Change("vm.hardware", vm, "vm", "cpus", 4, 32))
        else:
            plan.changes.append(Change("vm.advanced", vm, "extraConfig", "pciPassthru.64bitMMIOSizeGB", None, "512"))
    return plan


def timed(render, runs: int) -> float:
    samples = []
    for _ in range(runs):
        start = time.perf_counter()
        render()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--sizes", default="1000,10000", help="changes in each plan")
    args = parser.parse_args()
    figures = {}
    for size in sorted(int(s) for s in args.sizes.split(",")):
        plan = fleet_plan(size)
        for form in ("text", "table"):
            seconds = timed(lambda: print_plan(Console(file=io.StringIO(), width=160), plan, form), args.runs)
            print(f"{size:>6} changes, {form:<5}: {seconds:.3f} s")
            figures[f"{form}_s_{size}"] = seconds
        figures[f"json_s_{size}"] = timed(lambda: plan_json(plan), args.runs)
        print(f"{size:>6} changes, json : {figures[f'json_s_{size}']:.3f} s")
    print(" ".join(f"{key}={value:.3f}" for key, value in list(figures.items())[-3:]))  # the largest plan's
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
