#!/usr/bin/env python3
"""Data-parallel training of a torchvision model on synthetic data or on JPEG files: gpuvm's training benchmark.

DistributedDataParallel over NCCL on GPUs, gloo on CPUs; one process per GPU (or per CPU worker).
Rank and world size come from torchrun (RANK, WORLD_SIZE, LOCAL_RANK), Open MPI
(OMPI_COMM_WORLD_*), Horovod's launcher (HOROVOD_*) or srun (SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID); rank 0's address from MASTER_ADDR and
MASTER_PORT, which gpuvm's launchers set. Rank 0 alone prints Horovod's synthetic-benchmark lines,
so the `horovod_synthetic` parser reads them:

    Iter #0: 812.3 img/sec per GPU
    Img/sec per GPU: 815.0 +-4.1
    Total img/sec on 8 GPU(s): 6520.0 +-32.8

(± is 1.96 σ over the timed iterations; warm-up batches are excluded; on CPU it says CPU.)

With `--data-dir DIR` every step trains on JPEG files from DIR (each rank its share), read and
decoded by a DataLoader with `--workers` processes, and rank 0 also prints the data rate, averaged
like the images/s (bytes of the files consumed per timed iteration, summed over the ranks):

    Data read: 120.5 MB/s from 1000 files

`--decode-only` (with `--data-dir`) runs that data path alone, no model: the files read, decoded and
cropped in this process on one thread, timed like training; the rate per second of this process's
CPU time is one core's (unmoved by other load on the machine), which `gpuvm size` divides a GPU's
images/s by; the wall-clock rate follows:

    Decode: 412.3 images/s per core +-3.1 (CPU time; 1 thread: 398.0 images/s wall)

`--write-dataset DIR --files N --file-kb K` writes N JPEG files of about K KB and exits: random
pixels, or with `--pixels WxH` photographs' shape (ImageNet's typical 500x375: a smooth image with
noise tuned to the size, so decoding works on as many pixels as a real photograph's).
Standalone on purpose: needs only PyTorch and torchvision.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
import torchvision

PRECISIONS = {"fp32": None, "fp16": torch.float16, "bf16": torch.bfloat16}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="resnet50", help="any torchvision classification model")
    parser.add_argument("--batch-size", type=int, default=32, help="images per worker per step")
    parser.add_argument("--image-size", type=int, default=224, help="synthetic images are SIZE x SIZE")
    parser.add_argument("--num-classes", type=int, default=1000)
    parser.add_argument("--precision", choices=PRECISIONS, default="fp32",
                        help="autocast to fp16 (with a gradient scaler) or bf16")
    parser.add_argument("--channels-last", action="store_true", help="NHWC memory format")
    parser.add_argument("--compile", action="store_true", help="torch.compile the model (PyTorch 2)")
    parser.add_argument("--no-cuda", action="store_true", help="train on the CPU even with GPUs")
    parser.add_argument("--num-warmup-batches", type=int, default=10, help="untimed steps first")
    parser.add_argument("--num-batches-per-iter", type=int, default=10, help="steps per iteration")
    parser.add_argument("--num-iters", type=int, default=10, help="timed iterations")
    parser.add_argument("--data-dir", help="train on the *.jpg files under this directory (default: synthetic)")
    parser.add_argument("--workers", type=int, default=2, help="DataLoader worker processes per rank")
    parser.add_argument("--write-dataset", metavar="DIR", help="write --files JPEGs of --file-kb KB into DIR, exit")
    parser.add_argument("--files", type=int, default=1000)
    parser.add_argument("--file-kb", type=float, default=110)
    parser.add_argument("--pixels", help="WxH: write images of this size (default: random pixels, side to fit --file-kb)")
    parser.add_argument("--decode-only", action="store_true", help="time reading and decoding --data-dir alone")
    return parser.parse_args(argv)


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


def fail(message: str) -> int:
    print(f"pytorch_train: {message}", file=sys.stderr, flush=True)
    return 2


def build_model(args: argparse.Namespace) -> torch.nn.Module:
    """The classification model named `--model` (torchvision's list: classification models only)."""
    models = torchvision.models
    if args.model not in models.list_models(module=models):
        raise ValueError(f"{args.model!r} is not a torchvision classification model (try resnet50, resnet18)")
    return models.get_model(args.model, num_classes=args.num_classes)


class JpegFiles(torch.utils.data.Dataset):
    """(image tensor, label, bytes read) per file: read, decoded and cropped as ImageNet training does."""

    def __init__(self, paths: list[str], image_size: int, num_classes: int) -> None:
        from torchvision import transforms

        self.paths, self.num_classes = paths, num_classes
        self.transform = transforms.Compose([transforms.RandomResizedCrop(image_size), transforms.ToTensor()])

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, index: int):
        import io

        from PIL import Image

        with open(self.paths[index], "rb") as f:
            raw = f.read()
        image = Image.open(io.BytesIO(raw)).convert("RGB")
        return self.transform(image), index % self.num_classes, len(raw)


def batches(args: argparse.Namespace, rank: int, size: int):
    """Endless (images, labels, bytes) batches of this rank's share of the files, reshuffled each pass."""
    paths = sorted(str(p) for p in __import__("pathlib").Path(args.data_dir).rglob("*.jpg"))[rank::size]
    if len(paths) < args.batch_size:
        raise ValueError(f"{args.data_dir}: {len(paths)} *.jpg file(s) for this rank, fewer than one batch "
                         f"({args.batch_size})")
    loader = torch.utils.data.DataLoader(JpegFiles(paths, args.image_size, args.num_classes),
                                         batch_size=args.batch_size, shuffle=True, drop_last=True,
                                         num_workers=args.workers, persistent_workers=args.workers > 0)
    while True:
        yield from loader


def write_dataset(directory: str, files: int, file_kb: float, pixels: str | None = None) -> int:
    """`files` JPEGs of about `file_kb` KB: random pixels, their side chosen to fit the size; or, with
    `pixels` ("500x375"), that many pixels of a smooth gradient plus noise whose strength fits it."""
    import io
    import pathlib

    from PIL import Image

    def jpeg(width: int, height: int, noise: float, seed: int) -> bytes:
        generator = torch.Generator().manual_seed(seed)
        random = torch.randint(0, 256, (height, width, 3), dtype=torch.uint8, generator=generator)
        if noise < 1:  # a photograph's stand-in: smooth colour ramps, then noise on top
            ramp = torch.linspace(0, 255, width).expand(height, width)
            smooth = torch.stack([ramp, ramp.flip(1), torch.linspace(0, 255, height)[:, None].expand(height, width)], -1)
            random = (smooth * (1 - noise) + random.float() * noise).to(torch.uint8)
        buffer = io.BytesIO()
        Image.fromarray(random.numpy()).save(buffer, format="JPEG", quality=90)
        return buffer.getvalue()

    target = file_kb * 1000
    if pixels:
        width, height = (int(v) for v in pixels.lower().split("x"))
        low, high = 0.0, 1.0  # the noise that fits the size: bisect (larger noise, larger file)
        for _ in range(12):
            noise = (low + high) / 2
            low, high = (noise, high) if len(jpeg(width, height, noise, 0)) < target else (low, noise)
        noise = (low + high) / 2
    else:
        side, noise = 64, 1.0
        for _ in range(4):  # the encoded size grows with the area: correct the side a few times
            side = max(8, round(side * (target / len(jpeg(side, side, 1.0, 0))) ** 0.5))
        width = height = side
    out = pathlib.Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    total = 0
    for i in range(files):
        data = jpeg(width, height, noise, i)
        (out / f"{i:08d}.jpg").write_bytes(data)
        total += len(data)
    print(f"Wrote {files} files of {width} x {height} px, mean {total / files / 1000:.1f} KB, in {out}", flush=True)
    return 0


def decode_only(args: argparse.Namespace) -> int:
    """The data path without the model: batches read, decoded and cropped here on one thread, timed
    like training's steps, in images per second of this process's CPU time and of the wall clock."""
    if not args.data_dir:
        return fail("--decode-only times the files of --data-dir: give it")
    torch.set_num_threads(1)
    try:
        source = batches(argparse.Namespace(**{**vars(args), "workers": 0}), 0, 1)
    except ValueError as e:
        return fail(str(e))

    def steps(count: int) -> tuple[float, float]:
        """(CPU seconds, wall seconds) of `count` batches."""
        cpu, wall = time.process_time(), time.perf_counter()
        for _ in range(count):
            next(source)
        return time.process_time() - cpu, time.perf_counter() - wall

    steps(args.num_warmup_batches)
    images = args.batch_size * args.num_batches_per_iter
    timed = [steps(args.num_batches_per_iter) for _ in range(args.num_iters)]
    per_core = [images / cpu for cpu, _ in timed]
    mean, conf = statistics.fmean(per_core), 1.96 * statistics.pstdev(per_core)
    wall = statistics.fmean(images / seconds for _, seconds in timed)
    print(f"Decode: {mean:.1f} images/s per core +-{conf:.1f} (CPU time; 1 thread: {wall:.1f} images/s wall)", flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.write_dataset:
        return write_dataset(args.write_dataset, args.files, args.file_kb, args.pixels)
    if args.decode_only:
        try:
            return decode_only(args)
        except ValueError as e:  # files too few for a batch: one line, as the training's
            return fail(str(e))
    if args.compile and not hasattr(torch, "compile"):
        return fail(f"--compile needs torch.compile (PyTorch 2.0 or later); this is PyTorch {torch.__version__}")
    rank, size, local_rank = world()
    cuda = torch.cuda.is_available() and not args.no_cuda
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    if args.precision == "fp16" and not cuda:
        return fail("fp16 autocast needs a GPU; on the CPU use bf16 or fp32")
    if size > 1 and "MASTER_ADDR" not in os.environ:
        return fail(f"{size} workers but no MASTER_ADDR: set MASTER_ADDR/MASTER_PORT to rank 0's address")
    if cuda:
        torch.cuda.set_device(device)
        torch.backends.cudnn.benchmark = True
    if size > 1:
        os.environ.setdefault("MASTER_PORT", "29500")
        dist.init_process_group("nccl" if cuda else "gloo", rank=rank, world_size=size)

    torch.manual_seed(42)  # the same initial weights everywhere (DDP broadcasts rank 0's anyway)
    try:
        model = build_model(args).to(device)
    except ValueError as e:
        return fail(str(e))
    memory_format = torch.channels_last if args.channels_last else torch.contiguous_format
    model = model.to(memory_format=memory_format)
    if size > 1:
        model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[local_rank] if cuda else None)
    if args.compile:
        model = torch.compile(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01 * size)
    dtype = PRECISIONS[args.precision]
    scaler = torch.cuda.amp.GradScaler(enabled=args.precision == "fp16")

    generator = torch.Generator().manual_seed(1000 + rank)  # each worker its own batch
    data = torch.randn(args.batch_size, 3, args.image_size, args.image_size, generator=generator)
    data = data.to(device).contiguous(memory_format=memory_format)
    target = torch.randint(0, args.num_classes, (args.batch_size,), generator=generator).to(device)

    def autocast():
        if dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=device.type, dtype=dtype)

    source = None
    if args.data_dir:
        try:
            source = batches(args, rank, size)
        except ValueError as e:
            return fail(str(e))
    bytes_read = [0]

    def benchmark_step() -> None:
        nonlocal data, target
        if source is not None:
            images, labels, sizes = next(source)
            data = images.to(device, non_blocking=True).contiguous(memory_format=memory_format)
            target = labels.to(device, non_blocking=True)
            bytes_read[0] += int(sizes.sum())
        optimizer.zero_grad(set_to_none=True)
        with autocast():
            loss = F.cross_entropy(model(data), target)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()

    def steps(count: int) -> float:
        """Seconds for `count` steps, the device drained before the clock stops."""
        start = time.perf_counter()
        for _ in range(count):
            benchmark_step()
        if cuda:
            torch.cuda.synchronize()
        return time.perf_counter() - start

    def log(message: str) -> None:
        if rank == 0:
            print(message, flush=True)

    kind = "GPU" if cuda else "CPU"
    log(f"Model: {args.model}")
    log(f"Batch size: {args.batch_size}")
    log(f"Number of {kind}s: {size}")
    log("Running warmup...")
    steps(args.num_warmup_batches)
    log("Running benchmark...")
    img_secs, byte_rates = [], []
    for x in range(args.num_iters):
        bytes_read[0] = 0
        seconds = steps(args.num_batches_per_iter)
        img_sec = args.batch_size * args.num_batches_per_iter / seconds
        log(f"Iter #{x}: {img_sec:.1f} img/sec per {kind}")
        img_secs.append(img_sec)
        byte_rates.append(bytes_read[0] / seconds)
    mean, conf = statistics.fmean(img_secs), 1.96 * statistics.pstdev(img_secs)
    log(f"Img/sec per {kind}: {mean:.1f} +-{conf:.1f}")
    log(f"Total img/sec on {size} {kind}(s): {size * mean:.1f} +-{size * conf:.1f}")
    if source is not None:
        rate = torch.tensor([statistics.fmean(byte_rates)], dtype=torch.float64, device=device)
        if size > 1:
            dist.all_reduce(rate)
        files = len(list(__import__("pathlib").Path(args.data_dir).rglob("*.jpg")))
        log(f"Data read: {float(rate) / 1e6:.1f} MB/s from {files} files")
    if size > 1:
        dist.barrier()  # every rank past its last collective before the group goes
        dist.destroy_process_group()
        # With gloo (PyTorch 1.13, CPU) the interpreter's exit after a data-rate all_reduce hung in
        # 3 of 5 runs, both ranks past destroy_process_group (faulthandler: main thread at exit, one
        # native thread): the results are printed and flushed, so leave without that teardown.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
