"""Benchmark: what the container path costs: image build and ship, and the time it adds per run.

On two guests of the test bed, each with its own real dockerd: guest.image builds the CPU
training image (Debian base from `testbed/base_image.py`, Open MPI and PyTorch from the
distribution) on the builder, then ships it to the other (`docker save`, sent over SSH,
`docker load`). Then the same small PyTorch DDP (gloo) training over both guests, as two
campaigns in the same run, plain (mpirun on the guests) and `container: true` (worker containers,
mpirun inside the launcher's container), repeats interleaved; each run timed from launch to exit.

Needs root and docker.io + debootstrap; takes the benchmarks' bed lock (bedbench.py).
Run: `.venv/bin/python bench/container_path.py [--repeats 5]`. `--smoke` (seconds, for `make test`):
the mesh, a 1 MiB image of random bytes in place of the build, shipped as the built one is, and one
plain run of one batch; the build and the containerised campaign (minutes) are what
tests/integration/test_container_campaign.py runs.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))
sys.path.insert(0, str(REPO / "testbed"))

from base_image import base_tarball  # noqa: E402
from bed import BENCH_NAMES, TestBed  # noqa: E402
from bedbench import hold_bed  # noqa: E402
from fanout import small_image, start_docker  # noqa: E402

from gpuvm.bench.campaign import plan_campaign  # noqa: E402
from gpuvm.bench.runner import CampaignRunner, executors_for  # noqa: E402
from gpuvm.remote import build_cluster  # noqa: E402
from gpuvm.runbook.loader import load_runbook  # noqa: E402
from gpuvm.steps import guest_image, guest_ssh_mesh  # noqa: E402
from gpuvm.steps.base import Context  # noqa: E402

GUESTS = ["gpu-vm-01", "gpu-vm-02"]
BASE = "gpuvm-base/debian:bookworm"
BATCHES = {False: ("32", "3", "2", "1", "16"), True: ("16", "1", "1", "0", "2")}  # (--smoke): image size, iters,
# batches per iter, warm-up batches, batch size


def runbook_text(bed: TestBed, container: bool, repeats: int, smoke: bool = False) -> str:
    image_size, iters, batches, warmup, batch_size = BATCHES[smoke]
    lines = [f"ssh: {{known_hosts: {bed.known_hosts_file}}}", "hosts: [{name: esx-01}]", "vms:",
             *[f"  - {{name: {g}, host: esx-01}}" for g in GUESTS], "guests:",
             f"  image: {{name: gpuvm/ci, base: '{BASE}', mpi: distro, framework: pytorch, framework_from: distro,",
             "          ofed: inbox, horovod: null, gpus: false, build_network: host, build_timeout: 1800}",
             "  ssh_mesh: {container_port: 12345}", "  hosts:"]
    for g in GUESTS:
        h = bed.host(g)
        lines.append(f"    - {{vm: {g}, ssh: {{address: {h.address}, user: {h.user}, key_file: {h.key_file}, sudo: true}}}}")
    lines += ["benchmarks:", f"  container: {str(container).lower()}", "  runs:", "    - name: ddp", "      kind: pytorch_train",
              "      model: resnet18", "      python: python3",
              f'      args: ["--image-size", "{image_size}", "--num-iters", "{iters}", "--num-batches-per-iter", '
              f'"{batches}", "--num-warmup-batches", "{warmup}"]',
              "      env: {GLOO_SOCKET_IFNAME: eth0, OMP_NUM_THREADS: '1'}",
              f"      batch_size: {batch_size}", "      nodes: [2]", f"      repeats: {repeats}",
              '      mpirun_args: ["-mca", "btl_tcp_if_include", "eth0", "-mca", "oob_tcp_if_include", "eth0"]']
    return "\n".join(lines) + "\n"


class Timer:
    """A campaign observer: the wall time of each run, launch to exit."""

    def __init__(self):
        self.seconds: list[float] = []
        self.values: list[float | None] = []
        self._start = 0.0

    def started(self, *args) -> None:
        self._start = time.perf_counter()

    def finished(self, index, total, bench, point, label, value, unit, error) -> None:
        self.seconds.append(time.perf_counter() - self._start)
        self.values.append(value)
        if error:
            raise SystemExit(f"{bench} {point} {label}: {error}")

    def note(self, line: str) -> None:
        print(f"  {line}", file=sys.stderr)


def set_up(work: Path, bed: TestBed, small: int = 0) -> tuple[float, float, int]:
    """SSH mesh, then guest.image: (build s, ship s, image bytes). With `small`, that many random bytes
    are the image on the builder (--smoke: nothing built, the same ship)."""
    path = work / "plain.yaml"
    path.write_text(runbook_text(bed, False, 1))
    cluster = build_cluster(load_runbook(path), work / "state")
    ctx = Context(cluster=cluster)
    try:
        for step in (guest_ssh_mesh.STEP,):
            planned = {n: step.plan(t, step.observe(ctx, t)) for n, t in cluster.targets.items()}
            for name, changes in planned.items():
                if changes:
                    step.apply(ctx, cluster.targets[name], changes)
        ref = cluster.targets[GUESTS[0]].image.ref  # the recipe's name:tag, as resolved for the guests
        if small:
            small_image(bed, GUESTS[0], ref, small)
        times: dict[str, float] = {"build": 0.0}
        build, copy = guest_image._build, guest_image._copy_to

        def timed(key, fn):
            def wrapper(*args, **kwargs):
                start = time.perf_counter()
                try:
                    return fn(*args, **kwargs)
                finally:
                    times[key] = time.perf_counter() - start
            return wrapper

        guest_image._build, guest_image._copy_to = timed("build", build), timed("ship", copy)
        try:
            step = guest_image.STEP
            planned = {n: step.plan(t, step.observe(ctx, t)) for n, t in cluster.targets.items()}
            failures = step.apply_all(ctx, planned)
        finally:
            guest_image._build, guest_image._copy_to = build, copy
        if failures:
            raise SystemExit(f"guest.image failed: {failures}")
        size = int(bed.docker(GUESTS[0], "image", "inspect", "--format", "{{.Size}}", ref).stdout)
        return times["build"], times["ship"], size
    finally:
        cluster.close()


def campaign(work: Path, bed: TestBed, container: bool, repeats: int, smoke: bool = False) -> tuple[Timer, float]:
    path = work / ("container.yaml" if container else "plain.yaml")
    path.write_text(runbook_text(bed, container, repeats, smoke))
    book = load_runbook(path)
    points = plan_campaign(book)
    executors = executors_for(book, points, False, work / "state")
    timer = Timer()
    try:
        runner = CampaignRunner(book, points, executors, work / ("results-c" if container else "results-p"),
                                observer=timer)
        runner.prepare()
        start = time.perf_counter()
        runner.run()
        total = time.perf_counter() - start
    finally:
        for e in executors.values():
            e.close()
    return timer, total


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--smoke", action="store_true", help="seconds: the mesh, a 1 MiB image shipped, one plain "
                                                            "run of one batch")
    args = parser.parse_args()
    if args.smoke:
        return smoke()
    tarball = base_tarball("bookworm")
    lock = hold_bed("container_path.py")
    if lock is None:
        return 2
    with lock:
        with tempfile.TemporaryDirectory(prefix="gpuvm-bench-containers-") as tmp:
            work = Path(tmp)
            bed = TestBed(work / "bed", esxi=0, guests=len(GUESTS), names=BENCH_NAMES)
            try:
                bed.up()
                for g in GUESTS:
                    bed.start_docker(g)
                bed.docker(GUESTS[0], "import", str(tarball), BASE)
                build_s, ship_s, size = set_up(work, bed)
                rounds = {False: [], True: []}
                for container in (False, True, False, True):  # interleaved, two campaigns each
                    rounds[container].append(campaign(work, bed, container, args.repeats))
            finally:
                bed.down()
    plain = [s for timer, _ in rounds[False] for s in timer.seconds]
    boxed = [s for timer, _ in rounds[True] for s in timer.seconds]
    overhead = [total - sum(timer.seconds) for timer, total in rounds[True]]
    print(f"{'mode':<12}{'runs':>5}{'median s':>10}{'min s':>8}{'max s':>8}")
    for name, values in (("plain", plain), ("container", boxed)):
        print(f"{name:<12}{len(values):>5}{statistics.median(values):>10.2f}{min(values):>8.2f}{max(values):>8.2f}")
    added = statistics.median(boxed) - statistics.median(plain)
    print(f"image {size / 1e9:.2f} GB: build {build_s:.1f} s on {GUESTS[0]}, ship (save + load) {ship_s:.1f} s to {GUESTS[1]}")
    print(f"container campaign time outside its runs (versions, workers start + stop, results): "
          f"median {statistics.median(overhead):.2f} s")
    print(f"added_s_per_run={added:.2f} build_s={build_s:.1f} ship_s={ship_s:.1f} image_gb={size / 1e9:.2f}")
    return 0


def smoke() -> int:
    """The script's own path at a size of seconds: bed, mesh, a small image shipped, one plain run."""
    lock = hold_bed("container_path.py")
    if lock is None:
        return 2
    with lock, tempfile.TemporaryDirectory(prefix="gpuvm-bench-containers-") as tmp:
        work = Path(tmp)
        bed = TestBed(work / "bed", esxi=0, guests=len(GUESTS), names=BENCH_NAMES)
        try:
            bed.up()
            start_docker(bed, GUESTS)
            _, ship_s, size = set_up(work, bed, small=1 << 20)
            timer, total = campaign(work, bed, False, 1, smoke=True)
        finally:
            bed.down()
    print(f"smoke: image of {size / 2**20:.1f} MiB shipped in {ship_s:.2f} s; one plain run {timer.seconds[0]:.2f} s, "
          f"campaign {total:.2f} s (no build, no containers)")
    print(f"ship_s={ship_s:.2f} plain_s_per_run={timer.seconds[0]:.2f} campaign_s={total:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
