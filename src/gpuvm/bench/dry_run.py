"""The `bench run --dry-run` text: the datasets a campaign writes where missing, and every point's
launcher, hostfile and command line (and batch script, for sbatch; secrets redacted). Words the
plan; runs nothing."""

from __future__ import annotations

from collections.abc import Sequence

from gpuvm.bench.campaign import PlannedPoint
from gpuvm.bench.commands import launch_script
from gpuvm.bench.datasets import planned_datasets
from gpuvm.runbook.benchmarks import BenchmarkRun
from gpuvm.secrets import redact


def describe(points: Sequence[PlannedPoint], workdir: str) -> list[str]:
    """The dry-run text: the datasets to write where missing, every point's launcher, hostfile and
    command line."""
    lines = [dataset.describe() for dataset in planned_datasets(points)]
    for point in points:
        where = f" in setup {point.setup}" if point.setup else ""
        lines.append(f"{point.run.name} {point.label}{where}: {_repeats(point.run)} repeat(s)"
                     + (f" after {point.run.warmup} warm-up(s)" if point.run.warmup else ""))
        for vm, settings in point.guest_network:
            lines.append(f"  network on {vm} (derived from ibdev2netdev): "
                         + (" ".join(f"{k}={v}" for k, v in settings) or "none (no rdma_ports)"))
        for job in point.jobs:
            hosts = ", ".join(f"{a} slots={s}" for a, s in job.hosts)
            where = (f"through Slurm on {', '.join(job.nodes)}" if job.nodes else f"hostfile {job.hostfile}: {hosts}")
            lines.append(f"  on {job.launcher} ({where})")
            lines.append(f"    {redact(launch_script(workdir, job.command))}")
            if job.batch is not None:  # launch sbatch: the script on sbatch's stdin
                lines.extend(f"      {line}" for line in redact(job.batch).splitlines())
    return lines


def _repeats(run: BenchmarkRun) -> str:
    if run.repeats == "auto":
        return f"3 to {run.repeats_max} (auto: until the 95 % interval is within ±{run.repeats_target * 100:g}%)"
    return str(run.repeats)
