#!/usr/bin/env python3
"""Data-parallel training of a small NumPy MLP over MPI, on synthetic data: a real CPU workload.

Each rank computes gradients on its own batch; `MPI.COMM_WORLD.Allreduce` sums them and every rank
applies the average, as Horovod does. Rank 0 alone prints the same lines as Horovod's synthetic
benchmarks run on CPU, so the `horovod_synthetic` parser reads both:

    Iter #0: 5123.4 img/sec per CPU
    Img/sec per CPU: 5101.2 +-88.1
    Total img/sec on 2 CPU(s): 10202.4 +-176.2

(± is 1.96 σ over the timed iterations; warm-up batches are excluded.)

Standalone on purpose: needs only the standard library, NumPy and mpi4py, so it runs with the
distribution's Python in a guest (`mpirun -np 2 /usr/bin/python3 mpi_synthetic.py`).
"""

from __future__ import annotations

import argparse
import os
import sys
import timeit

# One BLAS thread per rank: ranks are the parallelism; more threads would fight over cores.
for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import numpy as np  # noqa: E402
from mpi4py import MPI  # noqa: E402

INPUTS = 784  # a 28x28 "image"
CLASSES = 10
DEVICE = "CPU"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch-size", type=int, default=64, help="images per rank per step")
    parser.add_argument("--num-iters", type=int, default=10, help="timed iterations")
    parser.add_argument("--num-batches-per-iter", type=int, default=10, help="steps per iteration")
    parser.add_argument("--num-warmup-batches", type=int, default=10, help="untimed steps first")
    parser.add_argument("--hidden", type=int, default=256, help="hidden layer width")
    parser.add_argument("--learning-rate", type=float, default=0.05)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--die-on-rank", type=int, default=None,
                        help="fault injection: this rank exits with status 3 after the warm-up")
    return parser.parse_args(argv)


class Mlp:
    """784 → hidden (ReLU) → 10, softmax cross-entropy; parameters live in one flat buffer."""

    def __init__(self, hidden: int, rng: np.random.Generator):
        shapes = [(INPUTS, hidden), (hidden,), (hidden, CLASSES), (CLASSES,)]
        sizes = [int(np.prod(s)) for s in shapes]
        self.flat = np.zeros(sum(sizes), dtype=np.float32)
        self.grad = np.zeros_like(self.flat)
        self.params, self.grads, offset = [], [], 0
        for shape, size in zip(shapes, sizes, strict=True):
            self.params.append(self.flat[offset : offset + size].reshape(shape))
            self.grads.append(self.grad[offset : offset + size].reshape(shape))
            offset += size
        self.params[0][...] = rng.normal(0, np.sqrt(2 / INPUTS), shapes[0])
        self.params[2][...] = rng.normal(0, np.sqrt(2 / hidden), shapes[2])

    def gradients(self, x: np.ndarray, labels: np.ndarray) -> float:
        """Fill `self.grad` with d(loss)/d(params) for the batch; return the loss."""
        w1, b1, w2, b2 = self.params
        g1, gb1, g2, gb2 = self.grads
        h = np.maximum(x @ w1 + b1, 0)
        logits = h @ w2 + b2
        logits -= logits.max(axis=1, keepdims=True)
        p = np.exp(logits)
        p /= p.sum(axis=1, keepdims=True)
        n = len(x)
        loss = float(-np.log(p[np.arange(n), labels] + 1e-9).mean())
        p[np.arange(n), labels] -= 1
        p /= n
        g2[...] = h.T @ p
        gb2[...] = p.sum(axis=0)
        dh = (p @ w2.T) * (h > 0)
        g1[...] = x.T @ dh
        gb1[...] = dh.sum(axis=0)
        return loss


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    # Same initial weights everywhere (as hvd.broadcast_parameters would give); own data per rank.
    model = Mlp(args.hidden, np.random.default_rng(args.seed))
    rng = np.random.default_rng(args.seed + 1 + rank)
    data = rng.standard_normal((args.batch_size, INPUTS), dtype=np.float32)
    labels = rng.integers(0, CLASSES, args.batch_size)
    summed = np.empty_like(model.grad)

    def log(message: str) -> None:
        if rank == 0:
            print(message, flush=True)

    def benchmark_step() -> None:
        model.gradients(data, labels)
        comm.Allreduce(model.grad, summed, op=MPI.SUM)
        model.flat -= args.learning_rate * (summed / size)

    log("Model: numpy-mlp")
    log(f"Batch size: {args.batch_size}")
    log(f"Number of {DEVICE}s: {size}")
    log("Running warmup...")
    timeit.timeit(benchmark_step, number=args.num_warmup_batches)
    log("Running benchmark...")
    if args.die_on_rank == rank:
        print(f"rank {rank}: exiting on purpose (--die-on-rank)", file=sys.stderr, flush=True)
        os._exit(3)
    img_secs = []
    for x in range(args.num_iters):
        comm.Barrier()
        time = timeit.timeit(benchmark_step, number=args.num_batches_per_iter)
        img_sec = args.batch_size * args.num_batches_per_iter / time
        log(f"Iter #{x}: {img_sec:.1f} img/sec per {DEVICE}")
        img_secs.append(img_sec)
    mean, conf = float(np.mean(img_secs)), 1.96 * float(np.std(img_secs))
    log(f"Img/sec per {DEVICE}: {mean:.1f} +-{conf:.1f}")
    log(f"Total img/sec on {size} {DEVICE}(s): {size * mean:.1f} +-{size * conf:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
