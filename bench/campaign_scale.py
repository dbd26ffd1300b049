"""Benchmark: gpuvm's own overhead in a benchmark campaign at 4, 16 and 64 guests of the test bed.

One run brings up a bed of 64 guests (its own bridge, namespaces and subnet: `BENCH_NAMES`, so it
never touches the tests' bed) and, for each size N, with the guests' ~/.ssh reset first:

* plan: the guests observed and the SSH mesh planned (the guest step that applies on the bed);
* apply: the mesh written and verified on the N guests;
* campaign: `gpuvm bench run` in-process: connect, lock, read port maps, prepare (workdirs,
  hostfiles, program checks), launch one mpirun over the N guests from gpu-vm-01 (real Open MPI
  across the namespaces), parse, record every guest's environment, write the results.

The workload is `sleep 2` in every rank, each rank printing when it started and ended; its run time
is the span from the first start to the last end. gpuvm's overhead = plan + apply + campaign − that
span (mpirun's own start-up of its daemons over SSH counts as overhead: gpuvm chose to launch so).
Goal (issue 27): overhead at 64 guests ≤ 2× the overhead at 4. Also printed: gpuvm's own CPU time
(this process, every thread), and the guests' CPU time (every process their sshd started: logins,
shells, ssh clients, mpirun daemons, the workload's ranks): on the bed every guest shares this
machine's cores, so the guests' per-guest work, done at once by gpuvm, still adds up here; the
guests' CPU / the cores is the least wall time that work takes on the bed (on real guests, each
with its own cores, it is spread over them). The mesh's every-pair check is N·(N-1) logins.

Needs root; takes its own lock (not the tests' bed lock: the names differ).
Run: `.venv/bin/python bench/campaign_scale.py [--sizes 4,16,64]`.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))
sys.path.insert(0, str(REPO / "testbed"))

from bedbench import hold_bed, reset  # noqa: E402
from bed import BENCH_NAMES, TestBed  # noqa: E402

from gpuvm.engine import observe_remote  # noqa: E402
from gpuvm.journal import state_dir  # noqa: E402
from gpuvm.remote import build_cluster  # noqa: E402
from gpuvm.runbook.loader import load_runbook  # noqa: E402
from gpuvm.steps import guest_ssh_mesh as mesh  # noqa: E402
from gpuvm.steps.base import Context  # noqa: E402

SLEEP_S = 2
WORKLOAD = f"sh -c 'echo t0=$(date +%s.%N); sleep {SLEEP_S}; echo t1=$(date +%s.%N) x=1'"


def guests_cpu(bed: TestBed, n: int) -> float:
    """CPU seconds of everything the first `n` guests' sshd started and reaped (sessions end when
    gpuvm's connections close): user + system, children included, from /proc."""
    ticks = 0
    for i in range(1, n + 1):
        stat = Path(f"/proc/{bed._sshd_pid(f'gpu-vm-{i:02d}')}/stat").read_text().rsplit(")", 1)[1].split()
        ticks += sum(int(x) for x in stat[11:15])  # utime, stime, cutime, cstime
    return ticks / os.sysconf("SC_CLK_TCK")


def write_runbook(bed: TestBed, path: Path, n: int) -> Path:
    names = [f"gpu-vm-{i:02d}" for i in range(1, n + 1)]
    net = f"{bed.naming.subnet}.0/24"
    lines = [f"ssh: {{known_hosts: {bed.known_hosts_file}, connect_timeout: 10, command_timeout: 120}}",
             "hosts: [{name: esx-01}]", "vms:"] + [f"  - {{name: {g}, host: esx-01}}" for g in names]
    lines += ["guests:", "  ssh_mesh: {}", "  hosts:"]
    lines += [f"    - {{vm: {g}, ssh: {{address: {bed.address(g)}, user: gpuadmin, key_file: {bed.client_key}}}}}"
              for g in names]
    lines += ["benchmarks:", "  launcher: gpu-vm-01", "  runs:",
              f"    - {{name: sleep, kind: command, command: \"{WORKLOAD}\", pattern: \"x=([0-9])\", nodes: [{n}],",
              f"       repeats: 1, timeout: 300, mpirun_args: [-mca, oob_tcp_if_include, \"{net}\",",
              f"       -mca, btl_tcp_if_include, \"{net}\"]}}"]
    path.write_text("\n".join(lines) + "\n")
    return path


def plan_and_apply_mesh(book, work: Path, n: int) -> tuple[float, float]:
    """The mesh planned (guests observed) and applied (written, verified): seconds of each."""
    start = time.perf_counter()
    cluster = build_cluster(book, state_dir(work / f"state-{n}"))
    try:
        ctx = Context(cluster=cluster)
        facts = observe_remote(cluster, "guest").raise_failures()  # as `gpuvm plan` does: by guest, by step
        guests = cluster.of_role("guest")
        plans = {name: mesh.plan(guests[name], facts[name][mesh.STEP.name]) for name in guests}
        planned = time.perf_counter()
        failures = mesh.apply_all(ctx, plans, parallel=min(n, 64))  # `gpuvm apply --parallel N`
        if failures:
            raise SystemExit(f"mesh failed at {n} guests: {failures}")
    finally:
        cluster.close()
    return planned - start, time.perf_counter() - planned


def campaign(runbook: Path, work: Path, n: int) -> tuple[float, float]:
    """`gpuvm bench run` in-process: its seconds, and the workload's span read from its log."""
    from typer.testing import CliRunner

    from gpuvm.cli.main import app

    out = work / f"out-{n}"
    start = time.perf_counter()
    result = CliRunner().invoke(app, ["bench", "run", str(runbook), "--out", str(out),
                                      "--state-dir", str(work / f"state-{n}")], catch_exceptions=False)
    wall = time.perf_counter() - start
    logs = list(out.rglob("repeat-1.log"))
    if result.exit_code != 0 or not logs:
        raise SystemExit(f"campaign failed at {n} guests (exit {result.exit_code}):\n{result.output}\n"
                         + "".join(p.read_text()[-2000:] for p in logs))
    text = logs[0].read_text()
    starts = [float(t) for t in re.findall(r"t0=([0-9.]+)", text)]
    ends = [float(t) for t in re.findall(r"t1=([0-9.]+)", text)]
    if len(starts) != n or len(ends) != n:
        raise SystemExit(f"{n} guests: {len(starts)} ranks started, {len(ends)} ended:\n{text[-2000:]}")
    return wall, max(ends) - min(starts)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="4,16,64", help="guest counts (at most 200)")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    lock = hold_bed("campaign_scale.py")
    if lock is None:
        return 2
    rows = []
    with tempfile.TemporaryDirectory(prefix="gpuvm-bench-campaign-") as tmp:
        work = Path(tmp)
        bed = TestBed(work / "bed", esxi=0, guests=max(sizes), names=BENCH_NAMES)
        try:
            started = time.perf_counter()
            bed.up()
            print(f"  bed of {max(sizes)} guests up in {time.perf_counter() - started:.1f} s", file=sys.stderr)
            for n in sizes:
                reset(bed, n)
                runbook = write_runbook(bed, work / f"rb-{n}.yaml", n)
                cpu, guest_cpu = time.process_time(), guests_cpu(bed, n)
                plan_s, apply_s = plan_and_apply_mesh(load_runbook(runbook), work, n)
                run_s, workload_s = campaign(runbook, work, n)
                cpu_s = time.process_time() - cpu  # gpuvm's own CPU, every thread (the guests' is not in it)
                guest_cpu = guests_cpu(bed, n) - guest_cpu
                rows.append((n, plan_s, apply_s, run_s, workload_s, plan_s + apply_s + run_s - workload_s, cpu_s,
                             guest_cpu))
                print(f"  measured {n} guests", file=sys.stderr)
        finally:
            bed.down()
            lock.close()
    print(f"Campaign overhead on the test bed ({os.cpu_count()} CPUs shared by every guest); seconds. "
          f"workload: `sleep {SLEEP_S}` in every rank, its span read from the ranks' own clocks")
    print(f"{'guests':>6} {'plan_s':>7} {'apply_s':>8} {'bench_run_s':>11} {'workload_s':>10} {'overhead_s':>10} "
          f"{'gpuvm_cpu_s':>11} {'guests_cpu_s':>12}")
    for n, plan_s, apply_s, run_s, workload_s, overhead, cpu_s, guest_cpu in rows:
        print(f"{n:>6} {plan_s:>7.2f} {apply_s:>8.2f} {run_s:>11.2f} {workload_s:>10.2f} {overhead:>10.2f} {cpu_s:>11.2f} "
              f"{guest_cpu:>12.2f}")
    by_n = {r[0]: r for r in rows}
    lo, hi = min(by_n), max(by_n)  # the issue's pair, 4 and 64, by default
    if hi > lo:
        print(f"guests_cpu_{hi}={by_n[hi][7]:.2f} s: at least {by_n[hi][7] / (os.cpu_count() or 1):.2f} s of wall on "
              f"{os.cpu_count()} cores")
        print(f"overhead_{lo}={by_n[lo][5]:.2f} overhead_{hi}={by_n[hi][5]:.2f} gpuvm_cpu_{hi}_over_{lo}="
              f"{by_n[hi][6] / by_n[lo][6]:.2f} overhead_{hi}_over_{lo}={by_n[hi][5] / by_n[lo][5]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
