#!/usr/bin/env python3
"""All-reduce bandwidth over torch.distributed (NCCL on GPUs, gloo on CPUs), like nccl-tests.

Sizes are swept as nccl-tests' all_reduce_perf sweeps them (`-b 8 -e 128M -f 2`: 8 B to 128 MiB,
doubling) and rank 0 prints its table and footer, so the `nccl_allreduce` parser reads both:

    #       size         count      type   redop    root     time   algbw   busbw #wrong ...
             8             2     float     sum      -1    42.00    0.00    0.00      0 ...
    # Avg bus bandwidth    : 4.1624

As nccl-tests' PERFORMANCE.md defines them: time is the mean of `-n` timed all-reduces (after
`-w` untimed ones; here the slowest rank's mean), algbw = size / time, busbw = algbw * 2(n-1)/n,
and the average is over every size, out-of-place and in-place. torch.distributed reduces in place
only, so "out-of-place" copies the input into a separate output buffer first (the copy is timed).
#wrong counts the elements off after one more all-reduce of known values. Rank and world come
from torchrun, Open MPI or Horovod's launcher, as in pytorch_train.py; MASTER_ADDR/PORT are set
by gpuvm's launchers.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import time

import torch
import torch.distributed as dist

UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
ELEMENT = 4  # float32


def size_arg(text: str) -> int:
    """`8`, `64K`, `128M`, `8G` → bytes."""
    number, unit = (text[:-1], text[-1].upper()) if text[-1:].upper() in UNITS else (text, "")
    try:
        return int(number) * UNITS[unit]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size such as 8, 64K, 128M or 8G") from None


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-b", "--minbytes", type=size_arg, default=8)
    parser.add_argument("-e", "--maxbytes", type=size_arg, default=128 << 20)
    parser.add_argument("-f", "--stepfactor", type=int, default=2)
    parser.add_argument("-n", "--iters", type=int, default=20)
    parser.add_argument("-w", "--warmup_iters", type=int, default=5)
    parser.add_argument("--no-cuda", action="store_true", help="use the CPU and gloo even with GPUs")
    args = parser.parse_args(argv)
    if args.stepfactor < 2 or args.minbytes < ELEMENT or args.maxbytes < args.minbytes:
        parser.error("need -f >= 2 and 4 <= -b <= -e")
    return args


def world() -> tuple[int, int, int]:
    """(rank, world size, local rank) from torchrun's, Open MPI's, Horovod's or srun's environment."""
    for prefix, rank, size, local in (("", "RANK", "WORLD_SIZE", "LOCAL_RANK"),
                                      ("OMPI_COMM_WORLD_", "RANK", "SIZE", "LOCAL_RANK"),
                                      ("HOROVOD_", "RANK", "SIZE", "LOCAL_RANK"),
                                      ("SLURM_", "PROCID", "NTASKS", "LOCALID")):
        if prefix + rank in os.environ and prefix + size in os.environ:
            return (int(os.environ[prefix + rank]), int(os.environ[prefix + size]),
                    int(os.environ.get(prefix + local, "0")))
    return 0, 1, 0


def sizes(args: argparse.Namespace) -> list[int]:
    out, size = [], args.minbytes
    while size <= args.maxbytes:
        out.append(size // ELEMENT * ELEMENT)
        size *= args.stepfactor
    return out


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    rank, nranks, local_rank = world()
    cuda = torch.cuda.is_available() and not args.no_cuda
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    if nranks > 1 and "MASTER_ADDR" not in os.environ:
        print(f"pytorch_allreduce: {nranks} workers but no MASTER_ADDR: set MASTER_ADDR/MASTER_PORT to rank 0's "
              "address", file=sys.stderr, flush=True)
        return 2
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29500")
    dist.init_process_group("nccl" if cuda else "gloo", rank=rank, world_size=nranks)

    def log(message: str) -> None:
        if rank == 0:
            print(message, flush=True)

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize()

    def timed(count: int, source: torch.Tensor, output: torch.Tensor, in_place: bool) -> float:
        """Mean seconds per all-reduce over `count`, the slowest rank's."""
        dist.barrier()
        start = time.perf_counter()
        for _ in range(count):
            if not in_place:
                output.copy_(source)
            dist.all_reduce(output)
        sync()
        elapsed = torch.tensor([(time.perf_counter() - start) / max(count, 1)], dtype=torch.float64, device=device)
        dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
        return float(elapsed.item())

    def wrong(count: int) -> int:
        """Elements off after all-reducing rank+1 everywhere (exact in float32 at these sizes)."""
        values = torch.full((count,), float(rank + 1), device=device)
        dist.all_reduce(values)
        return int((values != nranks * (nranks + 1) / 2).sum().item())

    hosts: list = [None] * nranks
    dist.all_gather_object(hosts, (rank, os.getpid(), socket.gethostname(), local_rank, str(device)))
    log(f"# nThread 1 nGpus 1 minBytes {args.minbytes} maxBytes {args.maxbytes} step: {args.stepfactor}(factor) "
        f"warmup iters: {args.warmup_iters} iters: {args.iters} agg iters: 1 validation: 1 graph: 0")
    log("#")
    log("# Using devices")
    for r, pid, host, local, where in hosts:
        log(f"#  Rank {r:2d} Group  0 Pid {pid:6d} on {host:>10} device {local:2d} [{where}] "
            f"torch.distributed {dist.get_backend()}")
    log("#")
    log(f"#{'out-of-place':>62}{'in-place':>35}")
    log(f"#{'size':>11}{'count':>14}{'type':>10}{'redop':>8}{'root':>8}"
        f"{'time':>9}{'algbw':>8}{'busbw':>8}{'#wrong':>7}{'time':>9}{'algbw':>8}{'busbw':>8}{'#wrong':>7}")
    log(f"#{'(B)':>11}{'(elements)':>14}{'':>26}{'(us)':>9}{'(GB/s)':>8}{'(GB/s)':>8}{'':>7}"
        f"{'(us)':>9}{'(GB/s)':>8}{'(GB/s)':>8}")
    factor = 2 * (nranks - 1) / nranks
    busbws = []
    for size in sizes(args):
        count = size // ELEMENT
        source = torch.zeros(count, device=device)
        output = torch.zeros(count, device=device)
        row = f"{size:12d}{count:14d}{'float':>10}{'sum':>8}{-1:8d}"
        for in_place in (False, True):
            timed(args.warmup_iters, source, output, in_place)
            seconds = timed(args.iters, source, output, in_place)
            algbw = size / seconds / 1e9
            busbw = algbw * factor
            busbws.append(busbw)
            row += f"{seconds * 1e6:9.2f}{algbw:8.2f}{busbw:8.2f}{wrong(count):7d}"
        log(row)
    log("# Out of bounds values : 0 OK")
    log(f"# Avg bus bandwidth    : {sum(busbws) / len(busbws):.4f} ")
    log("#")
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
