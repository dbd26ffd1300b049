"""Benchmark: where the operator waits (issue 34), in one run on the same simulators: `gpuvm
inventory` (text and `--json`) and `gpuvm plan` of one vCenter against its wire floor, and the plan of
V vCenters against the plan of one.

V simulators (vc1-esx-01 ..., as bench/plan_vcenters.py starts them) of H hosts × M VMs each. The
wire floor is bench/wire_floor.py's: a stdlib-only process that sends gpuvm's inventory read to the
first simulator and reads the answer's bytes undecoded. The CLI figures are whole processes as a user
runs them (start-up, login, read, render, logout) against the first vCenter's runbook, and the
plan of the runbook of all V. Commands alternate within each run; each figure is the median of
`--runs`. Goals (issue 34): inventory ≤ 3× the wire floor; V vCenters' plan ≤ 2.5× one's. Run:
`.venv/bin/python bench/operator_wait.py [--hosts 512] [--vcenters 4] [--vms-per-host 8] [--runs 3]
[--baseline-src DIR]` (DIR: an older gpuvm's src/, timed in the same alternation: before and after);
the last line is `inventory_x_wire_floor=R inventory_json_x_wire_floor=R plan_x_wire_floor=R
multi_vcenter_x_single=R multi_vcenter_wire_floor_x_single=R` (the last: the V floors started at once,
against one: what the simulators, which share this machine's cores, take to answer V reads at once).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))
sys.path.insert(0, str(REPO / "simulator"))
sys.path.insert(0, str(REPO / "bench"))

from plan_vcenters import start_fleet, write_runbooks  # noqa: E402
from wire_floor import FLOOR, templates  # noqa: E402

from gpuvm.runbook.loader import load_runbook  # noqa: E402
from gpuvm.vsphere.session import resolve_target  # noqa: E402

GPUVM = str(Path(sys.executable).parent / "gpuvm")


def timed(command: list[str], env: dict[str, str]) -> float:
    """Seconds of one whole process, its output thrown away; a failure ends the benchmark."""
    start = time.perf_counter()
    done = subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed ({done.returncode}): {done.stderr.decode()[-2000:]}")
    return seconds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hosts", type=int, default=512, help="hosts per vCenter")
    parser.add_argument("--vcenters", type=int, default=4)
    parser.add_argument("--vms-per-host", type=int, default=8)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--baseline-src", type=Path, help="also time the CLI commands with this src/ first on "
                        "PYTHONPATH (an older gpuvm, e.g. `git archive <commit> src | tar -x -C DIR`)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp, ExitStack() as stack:
        work = Path(tmp)
        sims, env = start_fleet(stack, args, work / "state")
        names = list(sims)
        env |= {"PYTHONPATH": str(REPO / "src"), "FLOOR_PASSWORD": sims[names[0]].password}
        many, one = write_runbooks(work, sims, args.hosts, args.vms_per_host)
        os.environ.update(env)
        floor = work / "floor.py"
        floor.write_text(FLOOR)
        floors = []  # each vCenter's floor process, with its password: all started at once for the fleet's floor
        for name, vcenter in zip(names, load_runbook(many).vcenters):
            (work / name).mkdir()
            requests = templates(sims[name], resolve_target(vcenter), work / name)
            floors.append(f"FLOOR_PASSWORD={sims[name].password} {sys.executable} -I -S {floor} {requests} >/dev/null &")
        fleet_floor = f"wire floor of {args.vcenters} at once"
        commands = {
            "wire floor": [sys.executable, "-I", "-S", str(floor), str(work / names[0] / "floor-requests.json")],
            fleet_floor: ["bash", "-c", " ".join(floors) + " wait"],
            "inventory": [GPUVM, "inventory", str(one)],
            "inventory --json": [GPUVM, "inventory", "--json", str(one)],
            "plan": [GPUVM, "plan", str(one)],
            f"plan of {args.vcenters} vCenters": [GPUVM, "plan", str(many)],
        }
        envs = {name: env for name in commands}
        if args.baseline_src:  # each command next to its baseline
            older = {**env, "PYTHONPATH": str(args.baseline_src)}
            commands = {name: command for mine, command in commands.items()
                        for name in ([mine] if mine.startswith("wire floor") else [mine, f"{mine} (baseline)"])}
            envs = {name: older if name.endswith("(baseline)") else env for name in commands}
        samples: dict[str, list[float]] = {name: [] for name in commands}
        for _ in range(args.runs):
            for name, command in commands.items():
                samples[name].append(timed(command, envs[name]))
    median = {name: statistics.median(values) for name, values in samples.items()}
    floor_s, one_s = median["wire floor"], median["plan"]
    print(f"{args.hosts} hosts × {args.vms_per_host} VMs per vCenter; whole processes, medians of {args.runs} "
          f"run(s), alternating; load average at the end: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    for name, seconds in median.items():
        runs = ", ".join(f"{s:.2f}" for s in samples[name])
        print(f"  {name:<33} {seconds:6.2f} s  x floor {seconds / floor_s:5.2f}  x plan {seconds / one_s:5.2f}  "
              f"(runs {runs})")
    if args.baseline_src:
        many_base = median[f"plan of {args.vcenters} vCenters (baseline)"] / median["plan (baseline)"]
        print(f"baseline {args.baseline_src}: inventory x floor {median['inventory (baseline)'] / floor_s:.2f}, "
              f"--json {median['inventory --json (baseline)'] / floor_s:.2f}, plan x floor "
              f"{median['plan (baseline)'] / floor_s:.2f}, {args.vcenters} vCenters x one {many_base:.2f}")
    print(f"inventory_x_wire_floor={median['inventory'] / floor_s:.2f} "
          f"inventory_json_x_wire_floor={median['inventory --json'] / floor_s:.2f} "
          f"plan_x_wire_floor={one_s / floor_s:.2f} "
          f"multi_vcenter_x_single={median[f'plan of {args.vcenters} vCenters'] / one_s:.2f} "
          f"multi_vcenter_wire_floor_x_single={median[fleet_floor] / floor_s:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
