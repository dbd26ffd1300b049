"""Benchmark: SSH mesh setup + verification on 1, 4, 8 and 16 guests of the test bed.

gpuvm's way (every guest observed, written and verified at once; one command per guest to
verify all its peers) side by side with a sequential loop measured in the same run: guests set
up one after another, then N·(N-1) verification logins one after another, each from a fresh
connection (`ssh origin ssh peer true`). Counts the SSH connections the executors open.
Goal: 16 guests in less than 3x the time of 1.

Needs root (the bed uses network namespaces); takes the benchmarks' bed lock (bedbench.py).
Run: `.venv/bin/python bench/ssh_mesh.py [--sizes 1,4,8,16]`.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))
sys.path.insert(0, str(REPO / "testbed"))

from bedbench import SshConnections, hold_bed, reset  # noqa: E402
from bed import BENCH_NAMES, TestBed  # noqa: E402

from gpuvm.steps.base import Context  # noqa: E402
from gpuvm.executors.group import run_group  # noqa: E402
from gpuvm.executors.ssh import SshExecutor  # noqa: E402
from gpuvm.journal import state_dir  # noqa: E402
from gpuvm.steps.guest_ssh_mesh import verify  # noqa: E402
from gpuvm.steps.guest_ssh_mesh.files import IDENTITY  # noqa: E402
from gpuvm.remote import build_cluster  # noqa: E402
from gpuvm.runbook.loader import load_runbook  # noqa: E402
from gpuvm.steps import guest_ssh_mesh as mesh  # noqa: E402

SSH = SshConnections.install()  # counts every SSH connection an executor opens

VERIFY_S = 0.0
_original_verify = verify.verify_mesh


def _timed_verify(*args, **kwargs):
    global VERIFY_S
    start = time.perf_counter()
    try:
        return _original_verify(*args, **kwargs)
    finally:
        VERIFY_S += time.perf_counter() - start


verify.verify_mesh = _timed_verify  # apply_all calls it through the module: time the verification part


def write_runbook(bed: TestBed, path: Path, n: int) -> Path:
    names = [f"gpu-vm-{i:02d}" for i in range(1, n + 1)]
    lines = [f"ssh: {{known_hosts: {bed.known_hosts_file}, connect_timeout: 10, command_timeout: 120}}",
             "hosts: [{name: esx-01}]", "vms:"] + [f"  - {{name: {g}, host: esx-01}}" for g in names]
    lines += ["guests:", "  ssh_mesh: {}", "  hosts:"]
    lines += [f"    - {{vm: {g}, ssh: {{address: {bed.address(g)}, user: gpuadmin, key_file: {bed.client_key}}}}}"
              for g in names]
    path.write_text("\n".join(lines) + "\n")
    return path


def gpuvm_way(bed: TestBed, n: int, work: Path) -> tuple[float, int, float]:
    global VERIFY_S
    SSH.count, VERIFY_S = 0, 0.0
    book = load_runbook(write_runbook(bed, work / f"rb-{n}.yaml", n))
    start = time.perf_counter()
    cluster = build_cluster(book, state_dir(work / f"state-par-{n}"))
    try:
        guests = cluster.of_role("guest")
        facts = run_group(guests, lambda t: mesh.observe(Context(cluster=cluster), t), max_workers=n).raise_failures()
        plans = {name: mesh.plan(guests[name], fact) for name, fact in facts.items()}
        failures = mesh.apply_all(Context(cluster=cluster), plans, parallel=n)
        if failures:
            raise SystemExit(f"mesh failed at {n}: {failures}")
    finally:
        cluster.close()
    return time.perf_counter() - start, SSH.count, VERIFY_S


def sequential_way(bed: TestBed, n: int, work: Path) -> tuple[float, int]:
    SSH.count = 0
    book = load_runbook(write_runbook(bed, work / f"rb-{n}.yaml", n))
    start = time.perf_counter()
    cluster = build_cluster(book, state_dir(work / f"state-seq-{n}"))
    try:
        guests = cluster.of_role("guest")
        for target in guests.values():  # one guest after another
            mesh.apply(Context(cluster=cluster), target, mesh.plan(target, mesh.observe(Context(cluster=cluster), target)))
        for origin, target in guests.items():  # N·(N-1) logins, one after another, fresh connection each
            for peer, other in guests.items():
                if peer == origin:
                    continue
                ex = SshExecutor(origin, target.login.address, "gpuadmin", key_file=bed.client_key,
                                 known_hosts=[bed.known_hosts_file], connect_timeout=10)
                try:
                    ex.run(["ssh", "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes",
                            "-i", f"~/.ssh/{IDENTITY}", other.login.address, "true"], timeout=60)
                finally:
                    ex.close()
    finally:
        cluster.close()
    return time.perf_counter() - start, SSH.count


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="1,4,8,16", help="guest counts (at most 16)")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    lock = hold_bed("ssh_mesh.py")
    if lock is None:
        return 2
    rows = []
    with tempfile.TemporaryDirectory(prefix="gpuvm-bench-mesh-") as tmp:
        work = Path(tmp)
        bed = TestBed(work / "bed", esxi=0, guests=max(sizes), names=BENCH_NAMES)
        try:
            bed.up()
            for n in sizes:
                reset(bed, n)
                par_s, par_conn, verify_s = gpuvm_way(bed, n, work)
                reset(bed, n)
                seq_s, seq_conn = sequential_way(bed, n, work)
                reset(bed, n)
                rows.append((n, par_s, par_conn, seq_s, seq_conn, verify_s))
                print(f"  measured {n} guest(s)", file=sys.stderr)
        finally:
            bed.down()
            lock.close()
    print(f"SSH mesh on the test bed ({os.cpu_count()} CPUs shared by every guest); seconds, SSH connections "
          "opened by the executors (mesh logins: pairs, in both columns)")
    print(f"{'guests':>6} {'pairs':>6} {'gpuvm_s':>8} {'setup_s':>8} {'verify_s':>9} {'gpuvm_conns':>11} {'serial_s':>9} "
          f"{'serial_conns':>12} {'serial/gpuvm':>12}")
    for n, par_s, par_conn, seq_s, seq_conn, verify_s in rows:
        print(f"{n:>6} {n * (n - 1):>6} {par_s:>8.2f} {par_s - verify_s:>8.2f} {verify_s:>9.2f} {par_conn:>11} "
              f"{seq_s:>9.2f} {seq_conn:>12} {seq_s / par_s:>12.1f}")
    by_n = {r[0]: r for r in rows}
    lo, hi = min(by_n), max(by_n)  # 1 and 16 by default: the goal's pair
    if hi > lo:
        print(f"growth {lo}→{hi}: {by_n[hi][1] / by_n[lo][1]:.2f}x in all, "
              f"{(by_n[hi][1] - by_n[hi][5]) / (by_n[lo][1] - by_n[lo][5]):.2f}x "
              "for setup without the N·(N-1) verification logins (goal, 1→16: < 3x)")
        print(f"mesh_s_{hi}={by_n[hi][1]:.2f} mesh_s_{lo}={by_n[lo][1]:.2f} serial_ratio={by_n[hi][3] / by_n[hi][1]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
