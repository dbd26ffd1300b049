"""gpuvm's PyTorch workloads measured through `gpuvm bench run`, next to a bare PyTorch loop.

    .venv/bin/python bench/pytorch_workloads.py                 # overhead: workload vs bare loop, here
    .venv/bin/python bench/pytorch_workloads.py --bed           # + 1/2/4 SSH test hosts and all-reduce (root)
    .venv/bin/python bench/pytorch_workloads.py --model resnet50 --batch-size 256 --precision bf16 \
        --image-size 224 --channels-last                        # on a GPU machine

The overhead part runs `gpuvm bench run --local` (kind pytorch_train, launch none: one process) and
then the same model, batch, precision and memory format in a bare training loop (no gpuvm, no DDP),
each timed over the same number of steps after the same warm-up, and prints both and their ratio.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
GPUVM = [str(Path(sys.executable).parent / "gpuvm")]

BARE_LOOP = """
import contextlib, sys, time, torch, torch.nn.functional as F, torchvision
model_name, batch, size, precision, channels_last, warmup, steps = sys.argv[1:8]
batch, size, warmup, steps = int(batch), int(size), int(warmup), int(steps)
cuda = torch.cuda.is_available()
device = torch.device("cuda" if cuda else "cpu")
fmt = torch.channels_last if channels_last == "1" else torch.contiguous_format
model = torchvision.models.get_model(model_name, num_classes=1000).to(device).to(memory_format=fmt)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
dtype = {"fp32": None, "fp16": torch.float16, "bf16": torch.bfloat16}[precision]
scaler = torch.cuda.amp.GradScaler(enabled=precision == "fp16")
data = torch.randn(batch, 3, size, size).to(device).contiguous(memory_format=fmt)
target = torch.randint(0, 1000, (batch,)).to(device)
def step():
    opt.zero_grad(set_to_none=True)
    with torch.autocast(device.type, dtype=dtype) if dtype else contextlib.nullcontext():
        loss = F.cross_entropy(model(data), target)
    scaler.scale(loss).backward(); scaler.step(opt); scaler.update()
for _ in range(warmup): step()
if cuda: torch.cuda.synchronize()
start = time.perf_counter()
for _ in range(steps): step()
if cuda: torch.cuda.synchronize()
print(batch * steps / (time.perf_counter() - start))
"""


def run_gpuvm(runbook: Path, out: Path, *extra: str) -> dict:
    result = subprocess.run([*GPUVM, "bench", "run", str(runbook), "--out", str(out), *extra],
                            capture_output=True, text=True)
    if result.returncode != 0:
        sys.exit(f"gpuvm bench run failed:\n{result.stdout}\n{result.stderr}")
    [directory] = [p for p in out.iterdir() if p.is_dir()]
    return json.loads((directory / "results.json").read_text())


def overhead(args: argparse.Namespace, work: Path) -> None:
    iters, per_iter, warmup = 5, args.steps // 5, args.warmup
    runbook = work / "overhead.yaml"
    runbook.write_text(f"""\
benchmarks:
  runs:
    - name: train
      kind: pytorch_train
      launch: none
      python: {args.python}
      model: {args.model}
      batch_size: {args.batch_size}
      precision: {args.precision}
      channels_last: {str(args.channels_last).lower()}
      args: ["--image-size", "{args.image_size}", "--num-iters", "{iters}", "--num-batches-per-iter", "{per_iter}",
             "--num-warmup-batches", "{warmup}"]
      repeats: {args.repeats}
      timeout: 3600
""")
    results = run_gpuvm(runbook, work / "overhead", "--local")
    workload = [r["value"] for r in results["benchmarks"][0]["points"][0]["repeats"]]
    bare = []
    for _ in range(args.repeats):
        line = subprocess.run([args.python, "-c", BARE_LOOP, args.model, str(args.batch_size), str(args.image_size),
                               args.precision, "1" if args.channels_last else "0", str(warmup),
                               str(iters * per_iter)], capture_output=True, text=True, check=True).stdout
        bare.append(float(line.split()[-1]))
    best_w, best_b = max(workload), max(bare)
    print(f"model {args.model} batch {args.batch_size} image {args.image_size} precision {args.precision} "
          f"channels_last {args.channels_last}: {iters * per_iter} timed steps after {warmup}, "
          f"best of {args.repeats}")
    print(f"{'':<24}{'img/s runs':>40}{'best':>10}")
    print(f"{'gpuvm pytorch_train':<24}{' '.join(f'{v:.1f}' for v in workload):>40}{best_w:>10.1f}")
    print(f"{'bare PyTorch loop':<24}{' '.join(f'{v:.1f}' for v in bare):>40}{best_b:>10.1f}")
    print(f"workload_img_s={best_w:.1f} bare_img_s={best_b:.1f} ratio={best_w / best_b:.3f}")


def bed(args: argparse.Namespace, work: Path) -> None:
    """The PyTorch workloads over 1, 2 and 4 SSH test hosts (one gpuvm bench run), and all-reduce."""
    sys.path.insert(0, str(REPO / "testbed"))
    sys.path.insert(0, str(REPO / "tests" / "integration"))
    import fcntl

    from bed import TestBed
    from test_bench_run import GUESTS, bed_runbook, keyless_mesh

    lock = open("/tmp/gpuvm-testbed.lock", "w")
    fcntl.flock(lock, fcntl.LOCK_EX)
    testbed = TestBed(work / "bed", esxi=2, guests=4)
    testbed.up()
    try:
        small = ["--image-size", "32", "--num-iters", "5", "--num-batches-per-iter", "3", "--num-warmup-batches", "2"]
        mpi = ["-mca", "btl_tcp_if_include", "10.250.0.0/24", "-mca", "oob_tcp_if_include", "10.250.0.0/24"]
        runbook = bed_runbook(testbed, work / "bed.yaml", f"""\
    - {{name: resnet18, kind: pytorch_train, model: resnet18, python: /usr/bin/python3, batch_size: 16,
       args: {small}, nodes: [1, 2, 4], repeats: {args.repeats}, timeout: 900,
       env: {{OMP_NUM_THREADS: "1"}}, mpirun_args: {mpi}}}
    - {{name: allreduce, kind: pytorch_allreduce, python: /usr/bin/python3, args: ["-e", "32M"],
       nodes: [2, 4], repeats: {args.repeats}, timeout: 900, env: {{OMP_NUM_THREADS: "1"}}, mpirun_args: {mpi}}}
""")
        with keyless_mesh(testbed):
            results = run_gpuvm(runbook, work / "bed-out", "--state-dir", str(work / "state"))
        print(f"\nSSH test hosts ({', '.join(GUESTS)}: namespaces sharing this machine's CPUs), "
              f"median of {args.repeats}")
        for bench in results["benchmarks"]:
            for point in bench["points"]:
                values = sorted(r["value"] for r in point["repeats"])
                print(f"{bench['name']:<12}{point['nodes']} node(s){values[len(values) // 2]:>12.3f} {bench['unit']}")
    finally:
        testbed.down()
        lock.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="resnet18")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--image-size", type=int, default=64)
    parser.add_argument("--precision", default="fp32", choices=["fp32", "fp16", "bf16"])
    parser.add_argument("--channels-last", action="store_true")
    parser.add_argument("--steps", type=int, default=20, help="timed steps (five iterations)")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--python", default="/usr/bin/python3", help="the interpreter with torch, torchvision")
    parser.add_argument("--bed", action="store_true", help="also 1/2/4 SSH test hosts and all-reduce (root)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="gpuvm-bench-pt-") as tmp:
        overhead(args, Path(tmp))
        if args.bed:
            bed(args, Path(tmp))


if __name__ == "__main__":
    main()
