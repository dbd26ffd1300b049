"""Benchmark: the SSH connections a `launch: srun` campaign opens from this machine, on 4 and 16
guests of the benchmarks' bed running a real Slurm cluster (testbed/slurm_cluster.py).

Each size runs one campaign (`gpuvm bench run`, a one-line command on every node, 2 repeats) and
counts the connections twice: those gpuvm's SSH executors open, and the logins each guest's sshd
accepted. Through Slurm both stay at 1 (the submit guest) whatever the node count; mpirun's way
opens one per guest taking part. Needs root; takes the benchmarks' bed lock (bedbench.py).
Run: `.venv/bin/python bench/slurm_launch.py [--sizes 4,16]`.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))
sys.path.insert(0, str(REPO / "testbed"))

import slurm_cluster  # noqa: E402
from bed import BENCH_NAMES, TestBed  # noqa: E402
from bedbench import SshConnections, hold_bed  # noqa: E402
from typer.testing import CliRunner  # noqa: E402

from gpuvm.cli.main import app  # noqa: E402

SSH = SshConnections.install()  # counts every SSH connection an executor opens


def write_runbook(bed: TestBed, path: Path, guests: list[str]) -> Path:
    lines = [f"ssh: {{known_hosts: {bed.known_hosts_file}, connect_timeout: 10}}", "hosts: [{name: esx-01}]", "vms:"]
    lines += [f"  - {{name: {g}, host: esx-01}}" for g in guests] + ["guests:", "  hosts:"]
    lines += [f"    - {{vm: {g}, ssh: {{address: {bed.address(g)}, user: gpuadmin, key_file: {bed.client_key}}}}}"
              for g in guests]
    lines += ["benchmarks:", "  runs:", "    - name: hello", "      kind: command", "      launch: srun",
              "      command: \"sh -c 'hostname; echo took 1'\"", "      pattern: 'took ([0-9.]+)'",
              f"      nodes: [{len(guests)}]", "      repeats: 2", "      timeout: 120"]
    path.write_text("\n".join(lines) + "\n")
    return path


def logins(bed: TestBed, guests: list[str]) -> int:
    return sum((bed.host_dir(g) / "sshd.log").read_text(errors="replace").count("Accepted publickey") for g in guests)


def campaign(bed: TestBed, guests: list[str], work: Path) -> tuple[int, int, float]:
    SSH.count = 0
    before = logins(bed, guests)
    runbook = write_runbook(bed, work / f"srun-{len(guests)}.yaml", guests)
    started = time.perf_counter()
    result = CliRunner().invoke(app, ["bench", "run", str(runbook), "--out", str(work / "out"),
                                      "--state-dir", str(work / "state")], catch_exceptions=False)
    seconds = time.perf_counter() - started
    if result.exit_code != 0:
        raise SystemExit(f"campaign on {len(guests)} guests failed ({result.exit_code}):\n{result.output}")
    return SSH.count, logins(bed, guests) - before, seconds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="4,16")
    sizes = [int(s) for s in parser.parse_args().sizes.split(",")]
    lock = hold_bed("slurm_launch.py")
    if lock is None:
        return 1
    with lock, tempfile.TemporaryDirectory(prefix="gpuvm-slurm-bench-") as tmp:
        bed = TestBed(Path(tmp) / "bed", esxi=0, guests=max(sizes), names=BENCH_NAMES)
        bed.up()
        try:
            print(f"{'nodes':>5} {'executor connections':>21} {'sshd logins':>12} {'campaign s':>11}")
            figures = []
            for n in sizes:
                guests = [f"gpu-vm-{i:02d}" for i in range(1, n + 1)]
                slurm_cluster.start(bed, guests)
                try:
                    opened, accepted, seconds = campaign(bed, guests, Path(tmp))
                finally:
                    slurm_cluster.stop(bed, guests)
                print(f"{n:>5} {opened:>21} {accepted:>12} {seconds:>11.1f}", flush=True)
                figures += [f"connections_{n}={opened}", f"logins_{n}={accepted}", f"campaign_s_{n}={seconds:.1f}"]
        finally:
            bed.down()
    print(" ".join(figures))  # the last line: key=value (bench/fleet.py's reader, the smoke test)
    return 0


if __name__ == "__main__":
    sys.exit(main())
