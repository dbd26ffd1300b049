"""Benchmark: the training image distributed over the SSH mesh (a pipelined tree, guest to guest) on 4,
8 and 16 guests of the test bed, against one guest-to-guest transfer and the old way through gpuvm's
machine.

One run, one bed (esxi=0, as many guests as the largest size, each with a real dockerd, the mesh set
up by guest.ssh_mesh): a random-bytes image (`--mb`, nothing to compress) imported on the builder
as the recipe's name:tag; then, measured in the same run:
- one hop: `guest_image._hop` builder → one guest (median of 3), what a round costs at best;
- the tree: `guest.image`'s apply_all to N guests (builder included), seconds, and rounds: the
  pipelined tree's levels plus any rounds for what it missed;
- the star, for contrast: the same N guests without a mesh (save to gpuvm's machine, load on each).
Operator bytes are `image_fanout.OPERATOR_BYTES`: image bytes in and out of gpuvm's machine.
Every guest shares this machine's 2 CPUs, so unshaped a round of k hops costs about k hops' CPU
and the tree cannot beat N-1 hops' work / 2 cores. Real guests each have their own NIC and CPUs:
`--mbit R` (default 40) gives every machine its own link of R Mbit/s each way (tc tbf on each
guest's veth, both ends, and on the bridge for gpuvm's machine), so a hop is bound by its link, as
on a real network; `--mbit 0` leaves the links unshaped. Goal (issue 27): tree ≤ (⌈log2 N⌉ + 1) ×
one hop, and 0 image bytes through gpuvm's machine.

Needs root (network namespaces) and docker.io; takes the benchmarks' bed lock (bedbench.py).
Run: `.venv/bin/python bench/image_fanout.py [--sizes 4,8,16] [--mb 24] [--mbit 40] [--star-up-to 16]`.
"""

from __future__ import annotations

import argparse
import math
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))
sys.path.insert(0, str(REPO / "testbed"))

from bedbench import hold_bed  # noqa: E402
from bed import BENCH_NAMES, TestBed  # noqa: E402
from fanout import small_image, start_docker, stop_docker, write_runbook  # noqa: E402

from gpuvm.executors.group import run_group  # noqa: E402
from gpuvm.image_fanout import OPERATOR_BYTES, Hop  # noqa: E402
from gpuvm.remote import build_cluster  # noqa: E402
from gpuvm.runbook.loader import load_runbook  # noqa: E402
from gpuvm.steps import guest_image, guest_ssh_mesh  # noqa: E402
from gpuvm.steps.base import Context  # noqa: E402

ROUNDS: list[int] = []
_fan_out = guest_image.fan_out


def _counting_fan_out(*args, **kwargs):
    result = _fan_out(*args, **kwargs)
    ROUNDS.append(len(result.rounds))
    return result


guest_image.fan_out = _counting_fan_out  # the tree's rounds, as the step ran them


def shape(bed: TestBed, names: list[str], mbit: int) -> None:
    """Every machine its own link of `mbit` each way: guests (both ends of their veth) and gpuvm's (the bridge)."""
    tbf = ["root", "tbf", "rate", f"{mbit}mbit", "burst", "256kb", "latency", "200ms"]
    commands = [["tc", "qdisc", "replace", "dev", bed.naming.bridge, *tbf]]
    for name in names:
        commands.append(["tc", "qdisc", "replace", "dev", bed.naming.veth_prefix + name, *tbf])  # the guest's download
        commands.append(["ip", "netns", "exec", bed.netns(name), "tc", "qdisc", "replace", "dev", "eth0", *tbf])
    for command in commands:
        subprocess.run(command, check=True, capture_output=True)


def plan(cluster, step) -> dict:
    ctx = Context(cluster=cluster)
    facts = run_group(cluster.targets, lambda t: step.observe(ctx, t), 16).raise_failures()
    return {n: step.plan(cluster.targets[n], fact) for n, fact in facts.items()}


def forget(bed: TestBed, names: list[str], ref: str) -> None:
    """The image off every named guest (the builder keeps it)."""
    for name in names:
        bed.docker(name, "image", "rm", "-f", ref, check=False)


def cluster_for(bed: TestBed, names: list[str], work: Path, mesh: bool):
    path = write_runbook(bed, names, work / f"rb-{len(names)}-{mesh}.yaml")
    if not mesh:
        path.write_text(path.read_text().replace("  ssh_mesh: {}\n", ""))
    state = work / ("state" if mesh else "state-star")  # the mesh key lives in the state directory
    state.mkdir(exist_ok=True)
    return build_cluster(load_runbook(path), state)


def distribute(bed: TestBed, names: list[str], work: Path, ref: str, mesh: bool) -> tuple[float, int, int]:
    """guest.image to `names` (the first is the builder): (seconds, rounds, operator bytes)."""
    forget(bed, names[1:], ref)
    cluster = cluster_for(bed, names, work, mesh)
    try:
        planned = plan(cluster, guest_image)
        ROUNDS.clear()
        OPERATOR_BYTES.reset()
        start = time.perf_counter()
        said: list[str] = []
        failures = guest_image.apply_all(Context(cluster=cluster, say=lambda _, line: said.append(line)), planned)
        seconds = time.perf_counter() - start
        if failures:
            raise SystemExit(f"guest.image failed on {len(failures)} of {len(names)} guests: "
                             f"{next(iter(failures.values()))}")
        levels = [int(m.group(1)) for line in said if (m := re.search(r"down a pipelined tree of (\d+) level", line))]
        return seconds, sum(levels) + (ROUNDS[0] if ROUNDS else 0), OPERATOR_BYTES.reset()
    finally:
        cluster.close()


def one_hop(bed: TestBed, names: list[str], work: Path, ref: str, want: str, repeats: int = 3) -> float:
    cluster = cluster_for(bed, names[:2], work, True)
    try:
        times = []
        for _ in range(repeats):
            forget(bed, names[1:2], ref)
            start = time.perf_counter()
            guest_image._hop(cluster, ref, want, names[0], Hop(names[0], names[1]), time.monotonic() + 3600)
            times.append(time.perf_counter() - start)
        return statistics.median(times)
    finally:
        cluster.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="4,8,16", help="guest counts, builder included (64 fits in 24 GiB)")
    parser.add_argument("--mb", type=int, default=24, help="image size in MiB (random bytes)")
    parser.add_argument("--star-up-to", type=int, default=16, help="the star for contrast only up to this many guests")
    parser.add_argument("--mbit", type=int, default=40, help="each machine's link, Mbit/s each way (0: unshaped)")
    args = parser.parse_args()
    sizes = sorted(int(s) for s in args.sizes.split(","))
    lock = hold_bed("image_fanout.py")
    if lock is None:
        return 2
    rows = []
    with tempfile.TemporaryDirectory(prefix="gpuvm-bench-fanout-") as tmp:
        work = Path(tmp)
        bed = TestBed(work / "bed", esxi=0, guests=max(sizes), names=BENCH_NAMES)
        names = [f"gpu-vm-{i:02d}" for i in range(1, max(sizes) + 1)]
        try:
            bed.up()
            start_docker(bed, names)
            cluster = cluster_for(bed, names, work, True)
            try:
                failures = guest_ssh_mesh.apply_all(Context(cluster=cluster), plan(cluster, guest_ssh_mesh))
                if failures:
                    first = str(next(iter(failures.values()))).splitlines()
                    raise SystemExit(f"mesh failed on {len(failures)} guest(s); the first: {' / '.join(first[:3])}")
                ref = cluster.targets[names[0]].image.ref  # the recipe's name:tag, as resolved for the guests
            finally:
                cluster.close()
            want = small_image(bed, names[0], ref, args.mb << 20)
            if args.mbit:
                shape(bed, names, args.mbit)
            size = int(bed.docker(names[0], "image", "inspect", "--format", "{{.Size}}", ref).stdout)
            hop = one_hop(bed, names, work, ref, want)
            print(f"  one hop: {hop:.2f} s", file=sys.stderr)
            for n in sizes:
                tree = distribute(bed, names[:n], work, ref, True)
                star = distribute(bed, names[:n], work, ref, False) if n <= args.star_up_to else None
                rows.append((n, tree, star))
                print(f"  measured {n} guests", file=sys.stderr)
        finally:
            stop_docker(bed, names)
            bed.down()
            lock.close()
    link = f"each machine's link {args.mbit} Mbit/s each way" if args.mbit else "links unshaped"
    print(f"image distribution on the test bed ({os.cpu_count()} CPUs shared by every guest; {link}), image "
          f"{size / 2**20:.1f} MiB; one guest-to-guest hop {hop:.2f} s (median of 3)")
    print(f"{'guests':>6} {'tree_s':>7} {'rounds':>6} {'bound':>5} {'tree/hop':>8} {'operator_B':>10} "
          f"{'star_s':>7} {'star_operator_B':>15}")
    for n, (tree_s, rounds, tree_b), star in rows:
        bound = math.ceil(math.log2(n)) + 1
        star_s, star_b = (f"{star[0]:.2f}", str(star[2])) if star else ("-", "-")
        print(f"{n:>6} {tree_s:>7.2f} {rounds:>6} {bound:>5} {tree_s / hop:>8.2f} {tree_b:>10} {star_s:>7} "
              f"{star_b:>15}")
    n, (tree_s, rounds, tree_b), _ = rows[-1]
    print(f"image_rounds_{n}={rounds} tree_x_hop_{n}={tree_s / hop:.2f} bound_{n}={math.ceil(math.log2(n)) + 1} "
          f"operator_image_bytes={tree_b}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
