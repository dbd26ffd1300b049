"""What a campaign measured, gathered as it runs and turned into `Results` at the end.

`Outcome` is one run's figure (or error); `Recorder` keeps every repeat per point and the unit
each benchmark reports, then describes the campaign: benchmarks, ESXi hosts, VMs taking part (per
setup, in a campaign with setups: `add_stage` tells it each setup's runbook and points).
`Campaign` is what the CLI is told: where the results are, the failed runs, whether it was cut
short; `results_directory` is where a new campaign writes.
"""

from __future__ import annotations

import socket
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from gpuvm.bench.campaign import PlannedPoint
from gpuvm.bench.results import Benchmark, Point, Repeat, Results, RunbookRef, SetupInfo, VmInfo
from gpuvm.errors import BenchmarkError
from gpuvm.runbook.benchmarks import BenchmarkRun
from gpuvm.runbook.model import Runbook

UNITS = {"pytorch_train": "img/sec", "pytorch_allreduce": "GB/s", "tf_cnn_benchmarks": "images/sec",
         "horovod_synthetic": "img/sec", "nccl_allreduce": "GB/s", "mlperf_log": "min", "storage": "GB/s"}


@dataclass
class Outcome:
    value: float | None
    error: str | None
    unit: str = ""
    higher_is_better: bool = True
    per_vm: dict[str, float] | None = None
    metrics: dict[str, float] | None = None
    slurm_jobs: list[int] | None = None  # launch srun: the Slurm job id of each of its jobs


@dataclass
class Failure:
    bench: str
    point: str
    repeat: int
    log: str
    error: str

    def __str__(self) -> str:
        return f"{self.bench} at {self.point}, repeat {self.repeat}: {self.error} (log: {self.log})"


@dataclass
class Campaign:
    """What a campaign did: where the results are, which runs failed, whether it was cut short."""

    directory: Path
    results_file: Path | None = None
    failures: list[Failure] = field(default_factory=list)
    interrupted: bool = False
    runs_done: int = 0
    runs_total: int = 0
    notes: list[str] = field(default_factory=list)  # what results.json's note says besides an interruption

    def note(self) -> str | None:
        interrupted = [f"interrupted: {self.runs_done} of {self.runs_total} run(s) done"] if self.interrupted else []
        return "; ".join(interrupted + self.notes) or None

    def raise_for_failures(self) -> None:
        if self.failures:
            lines = "\n  ".join(str(f) for f in self.failures)
            raise BenchmarkError(f"{len(self.failures)} of {self.runs_done} benchmark run(s) failed "
                                 f"(results: {self.results_file}):\n  {lines}")


def results_directory(out: Path, runbook: Runbook, now: datetime | None = None) -> Path:
    """`<out>/<runbook stem>-<UTC timestamp>`, made unique if a campaign started the same second."""
    stamp = (now or datetime.now(UTC)).strftime("%Y%m%dT%H%M%SZ")
    base = Path(out) / f"{runbook.file.stem}-{stamp}"
    candidate, n = base, 1
    while candidate.exists():
        n += 1
        candidate = base.with_name(f"{base.name}-{n}")
    return candidate


class Recorder:
    """Every recorded repeat, by benchmark and point, and the unit each benchmark's parser saw."""

    def __init__(self, runbook: Runbook, points: Sequence[PlannedPoint], local: bool):
        self.runbook = runbook
        self.points = list(points)
        self.local = local
        self._recorded: dict[tuple[str, str | None, str], list[Repeat]] = {}
        self._warmups: dict[tuple[str, str | None, str], list[Repeat]] = {}
        self._units: dict[str, tuple[str, bool]] = {}
        self._setups: dict[str, tuple[Runbook, list[PlannedPoint]]] = {}

    def add_stage(self, setup: str, runbook: Runbook, points: Sequence[PlannedPoint]) -> None:
        """A setup's points, and its runbook (whose VMs took part in it)."""
        self._setups[setup] = (runbook, list(points))
        self.points.extend(points)

    def remember_unit(self, run: BenchmarkRun, unit: str, higher_is_better: bool) -> None:
        """The first figure parsed for a benchmark fixes its unit."""
        self._units.setdefault(run.name, (unit, higher_is_better))

    def unit(self, run: BenchmarkRun) -> tuple[str, bool]:
        """The benchmark's unit and direction: as parsed, else as the runbook or its kind says."""
        if run.name in self._units:
            return self._units[run.name]
        if run.kind == "command":
            return run.unit, run.higher_is_better
        return UNITS.get(run.kind, ""), run.kind != "mlperf_log"

    def record(self, point: PlannedPoint, outcome: Outcome, log: str, warmup: bool = False) -> Repeat:
        """A repeat of the point, or (`warmup`) a warm-up run: recorded apart, never compared.
        Returns it (the runner adds its `environment` once read)."""
        repeat = Repeat(value=outcome.value, per_vm=outcome.per_vm, metrics=outcome.metrics or None, log=log,
                        error=outcome.error, slurm_jobs=outcome.slurm_jobs)
        (self._warmups if warmup else self._recorded).setdefault(_key(point), []).append(repeat)
        return repeat

    def values(self, point: PlannedPoint) -> list[float]:
        """The figures the point's recorded repeats gave, in the order they ran."""
        return [r.value for r in self._recorded.get(_key(point), []) if r.value is not None]

    def results(self, started: datetime, finished: datetime, software: dict, note: str | None) -> Results:
        """Every benchmark with at least one recorded repeat, in runbook order, and where it ran."""
        benchmarks = []
        for name in dict.fromkeys(point.run.name for point in self.points):
            mine = [p for p in self.points if p.run.name == name and self._recorded.get(_key(p))]
            if not mine:
                continue
            run = mine[0].run
            unit, better = self.unit(run)
            benchmarks.append(Benchmark(
                name=name, kind=run.kind, unit=unit, higher_is_better=better, scenario=run.scenario,
                scaling=run.scaling_mode, launch=run.launch, dataset=run.dataset,
                points=[Point(nodes=p.nodes, gpus_per_node=p.gpus_per_node, vms=p.vms, setup=p.setup,
                              network_mapping=p.mapping, network=dict(p.network),  # type: ignore[arg-type]
                              data=p.data,  # type: ignore[arg-type]
                              repeats=self._recorded[_key(p)], warmups=self._warmups.get(_key(p), []))
                        for p in mine],
            ))
        return Results(
            environment="bare-metal" if self.local else "vm",
            note=note,
            runbook=RunbookRef(path=str(self.runbook.file), sha256=self.runbook.digest),
            started=started,
            finished=finished,
            hosts=self._hosts(),
            vms=[] if self._setups else self._vm_info(self.runbook, self.points),
            setups=[SetupInfo(name=name, hosts=self._hosts(book, points), vms=self._vm_info(book, points))
                    for name, (book, points) in self._setups.items()],
            software=software,
            benchmarks=benchmarks,
        )

    def _hosts(self, runbook: Runbook | None = None, points: Sequence[PlannedPoint] | None = None) -> list[str]:
        if self.local:
            return [socket.gethostname()]
        if runbook is None:  # the whole campaign: every setup's hosts
            stages = list(self._setups.values()) or [(self.runbook, self.points)]
            return list(dict.fromkeys(h for book, pts in stages for h in self._hosts(book, pts)))
        by_vm = {vm.name: vm.host for vm in runbook.vms}
        return list(dict.fromkeys(by_vm[name] for name in _participants(runbook, points or []) if name in by_vm))

    def _vm_info(self, runbook: Runbook, points: Sequence[PlannedPoint]) -> list[VmInfo]:
        if self.local:
            return []
        by_vm = {vm.name: vm for vm in runbook.vms}
        info = []
        for name in _participants(runbook, points):
            vm = by_vm.get(name)
            if vm is None or vm.cpus is None or vm.memory_gb is None:
                continue  # VmInfo needs both; the runbook left them to vSphere
            gpus = vm.gpus.count if vm.gpus is not None else 0
            info.append(VmInfo(name=vm.name, host=vm.host, gpus=gpus, cpus=vm.cpus, memory_gb=vm.memory_gb))
        return info


def _key(point: PlannedPoint) -> tuple[str, str | None, str]:
    return (point.run.name, point.setup, point.label)


def _participants(runbook: Runbook, points: Sequence[PlannedPoint]) -> list[str]:
    names = {g for p in points for g in p.guests}
    return [g.vm for g in (runbook.guests.hosts if runbook.guests else []) if g.vm in names]
