"""Benchmark: `gpuvm plan` over several vCenters against the plan of one of them, in the same run.

Four simulators (vc1-esx-01 ... vc4-esx-NN, `gpusim -host-prefix`), each with N hosts × 8 VMs; one
runbook naming all four (`vcenters:`), one naming the first only (`vcenter:`, the short form). Both
are planned as a user runs them (one `gpuvm plan` process each), alternately; each figure is the
median and the best of `--runs` runs. Issue 27's goal on the 2-core machine: the four-vCenter plan
≤ 2.5× the one-vCenter plan (4× the work on 2 cores: 2× is the floor). Run: `.venv/bin/python
bench/plan_vcenters.py [--hosts 512] [--vcenters 4] [--vms-per-host 8] [--runs 3]`. The last line is
`multi_vcenter_x_single=R`.
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
sys.path.insert(0, str(REPO / "simulator"))

from gpusim import Simulator  # noqa: E402

GPUVM = str(Path(sys.executable).parent / "gpuvm")


def _entries(prefix: str, vcenter: str | None, hosts: int, vms_per_host: int) -> tuple[list[str], list[str]]:
    """The runbook's hosts and VMs of one vCenter (as bench/plan_scaling.py declares them)."""
    named = f", vcenter: {vcenter}" if vcenter else ""
    host_lines, vm_lines = [], []
    for h in range(1, hosts + 1):
        host = f"{prefix}esx-{h:02d}"
        host_lines.append(f"  - {{name: {host}{named}, passthrough: [{{model: A100}}], allow_maintenance: true, "
                          "allow_reboot: true}")
        for v in range(1, vms_per_host + 1):
            gpus = ", gpus: {mode: passthrough, count: 1}" if v <= 4 else ""
            vm_lines.append(f"  - {{name: {host}-vm{v}, host: {host}, cpus: 16, memory_gb: 64{gpus}}}")
    return host_lines, vm_lines


def start_fleet(stack: ExitStack, args: argparse.Namespace, state: Path) -> tuple[dict[str, Simulator], dict[str, str]]:
    """`args.vcenters` simulators vc1… of `args.hosts` x `args.vms_per_host` each (closed with `stack`),
    and the environment a gpuvm process needs for them (their passwords, `state`, 160 columns)."""
    started = time.perf_counter()
    sims = {name: stack.enter_context(Simulator(hosts=args.hosts, vms_per_host=args.vms_per_host,
                                                host_prefix=f"{name}-", password=f"{name}-pass"))
            for name in (f"vc{i}" for i in range(1, args.vcenters + 1))}
    print(f"{args.vcenters} simulators × {args.hosts} hosts up in {time.perf_counter() - started:.0f} s",
          file=sys.stderr, flush=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("GOVC_")}
    env |= {f"{name.upper()}_PASSWORD": sim.password for name, sim in sims.items()}
    return sims, env | {"GPUVM_STATE_DIR": str(state), "COLUMNS": "160"}


def write_runbooks(work: Path, sims: dict[str, Simulator], hosts: int, vms_per_host: int) -> tuple[Path, Path]:
    """(the runbook of every vCenter, the runbook of the first alone)."""
    many = ["vcenters:"]
    host_lines, vm_lines = [], []
    for name, sim in sims.items():
        many.append(f"  - {{name: {name}, url: '{sim.url}', user: '{sim.username}', password_env: {name.upper()}_PASSWORD, "
                    f"ca_file: '{sim.cert_file}'}}")
        h, v = _entries(f"{name}-", name, hosts, vms_per_host)
        host_lines += h
        vm_lines += v
    (work / "many.yaml").write_text("\n".join([*many, "hosts:", *host_lines, "vms:", *vm_lines]) + "\n")
    first, sim = next(iter(sims.items()))
    h, v = _entries(f"{first}-", None, hosts, vms_per_host)
    one = [f"vcenter: {{url: '{sim.url}', user: '{sim.username}', password_env: {first.upper()}_PASSWORD, "
           f"ca_file: '{sim.cert_file}'}}", "hosts:", *h, "vms:", *v]
    (work / "one.yaml").write_text("\n".join(one) + "\n")
    return work / "many.yaml", work / "one.yaml"


def timed_plan(runbook: Path, env: dict[str, str]) -> float:
    start = time.perf_counter()
    done = subprocess.run([GPUVM, "plan", str(runbook)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"gpuvm plan {runbook} failed ({done.returncode}): {done.stderr.decode()[-2000:]}")
    return seconds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--hosts", type=int, default=512, help="hosts per vCenter")
    parser.add_argument("--vcenters", type=int, default=4)
    parser.add_argument("--vms-per-host", type=int, default=8)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp, ExitStack() as stack:
        sims, env = start_fleet(stack, args, Path(tmp) / "state")
        many, one = write_runbooks(Path(tmp), sims, args.hosts, args.vms_per_host)
        samples: dict[str, list[float]] = {"one": [], "many": []}
        for _ in range(args.runs):
            samples["one"].append(timed_plan(one, env))
            samples["many"].append(timed_plan(many, env))
    one_s, many_s = statistics.median(samples["one"]), statistics.median(samples["many"])
    best = min(samples["many"]) / min(samples["one"])
    vms = args.hosts * args.vms_per_host
    print(f"`gpuvm plan` as a whole process (login, read, plan, render, logout), {args.runs} run(s) each, "
          f"alternating; load average at the end: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    print(f"1 vCenter  × {args.hosts} hosts × {args.vms_per_host} VMs ({vms} VMs): median {one_s:.2f} s, "
          f"runs {', '.join(f'{s:.2f}' for s in samples['one'])}")
    print(f"{args.vcenters} vCenters × {args.hosts} hosts × {args.vms_per_host} VMs ({args.vcenters * vms} VMs): "
          f"median {many_s:.2f} s, runs {', '.join(f'{s:.2f}' for s in samples['many'])}")
    print(f"ratio of medians {many_s / one_s:.2f}; of the best runs {best:.2f} (the figure below: the best run "
          "is the least disturbed by other work on a shared machine)")
    print(f"multi_vcenter_x_single={best:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
