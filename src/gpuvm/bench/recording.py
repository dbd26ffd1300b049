"""What a campaign measured, gathered as it runs and turned into `Results` at the end.

`Outcome` is one run's figure (or error); `Recorder` keeps every repeat per point and the unit
each benchmark reports, then describes the campaign: benchmarks, ESXi hosts, VMs taking part.
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
from gpuvm.bench.results import Benchmark, Point, Repeat, Results, RunbookRef, VmInfo
from gpuvm.errors import BenchmarkError
from gpuvm.runbook.benchmarks import BenchmarkRun
from gpuvm.runbook.model import Runbook

UNITS = {"pytorch_train": "img/sec", "pytorch_allreduce": "GB/s", "tf_cnn_benchmarks": "images/sec",
         "horovod_synthetic": "img/sec", "nccl_allreduce": "GB/s", "mlperf_log": "min"}


@dataclass
class Outcome:
    value: float | None
    error: str | None
    unit: str = ""
    higher_is_better: bool = True
    per_vm: dict[str, float] | None = None


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
        self._recorded: dict[tuple[str, str], list[Repeat]] = {}
        self._units: dict[str, tuple[str, bool]] = {}

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

    def record(self, point: PlannedPoint, outcome: Outcome, log: str) -> None:
        repeat = Repeat(value=outcome.value, per_vm=outcome.per_vm, log=log, error=outcome.error)
        self._recorded.setdefault((point.run.name, point.label), []).append(repeat)

    def results(self, started: datetime, finished: datetime, software: dict, note: str | None) -> Results:
        """Every benchmark with at least one recorded repeat, in runbook order, and where it ran."""
        benchmarks = []
        for name in dict.fromkeys(point.run.name for point in self.points):
            mine = [p for p in self.points if p.run.name == name and self._recorded.get((name, p.label))]
            if not mine:
                continue
            run = mine[0].run
            unit, better = self.unit(run)
            benchmarks.append(Benchmark(
                name=name, kind=run.kind, unit=unit, higher_is_better=better, scenario=run.scenario,
                scaling=run.scaling_mode, launch=run.launch,
                points=[Point(nodes=p.nodes, gpus_per_node=p.gpus_per_node, vms=p.vms,
                              repeats=self._recorded[(name, p.label)]) for p in mine],
            ))
        return Results(
            environment="bare-metal" if self.local else "vm",
            note=note,
            runbook=RunbookRef(path=str(self.runbook.file), sha256=self.runbook.digest),
            started=started,
            finished=finished,
            hosts=self._hosts(),
            vms=self._vm_info(),
            software=software,
            benchmarks=benchmarks,
        )

    def _participants(self) -> list[str]:
        names = {g for p in self.points for g in p.guests}
        return [g.vm for g in (self.runbook.guests.hosts if self.runbook.guests else []) if g.vm in names]

    def _hosts(self) -> list[str]:
        if self.local:
            return [socket.gethostname()]
        by_vm = {vm.name: vm.host for vm in self.runbook.vms}
        return list(dict.fromkeys(by_vm[name] for name in self._participants() if name in by_vm))

    def _vm_info(self) -> list[VmInfo]:
        if self.local:
            return []
        by_vm = {vm.name: vm for vm in self.runbook.vms}
        info = []
        for name in self._participants():
            vm = by_vm.get(name)
            if vm is None or vm.cpus is None or vm.memory_gb is None:
                continue  # VmInfo needs both; the runbook left them to vSphere
            gpus = vm.gpus.count if vm.gpus is not None else 0
            info.append(VmInfo(name=vm.name, host=vm.host, gpus=gpus, cpus=vm.cpus, memory_gb=vm.memory_gb))
        return info
