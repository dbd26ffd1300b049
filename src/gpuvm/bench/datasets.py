"""Datasets a campaign writes before it runs: a run's `dataset` (N JPEG files of about K KB) in its
`data` directory, on every machine that runs one of its points on files, where missing.

A marker file in the directory, `.gpuvm-dataset`, holds the spec the files were written for:
present and equal, nothing is written; absent, the directory must be empty (gpuvm never writes
into a dataset it did not make); `writing <spec>` (a write cut short) is written again; another
spec is an error naming both. The first machine writes alone, then the others at once: on a shared
mount the first writes the files and the others find its marker; on local disks each writes its own.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import PurePosixPath

from gpuvm.bench.campaign import LOCAL, PlannedPoint
from gpuvm.bench.commands import BUNDLED
from gpuvm.errors import RemoteCommandError
from gpuvm.executors.base import Executor, last_line
from gpuvm.executors.group import GroupResult, at_once, run_group
from gpuvm.runbook.benchmarks import Dataset
from gpuvm.ticker import Ticker

MARKER = ".gpuvm-dataset"
TIMEOUT = 3600  # seconds for one machine to write one dataset


@dataclass(frozen=True)
class DatasetWrite:
    path: str  # the run's `data`: absolute, or relative to the workdir
    files: int
    file_kb: float
    python: str
    targets: tuple[str, ...]  # guest VM names, or LOCAL

    @property
    def spec(self) -> str:
        return json.dumps({"files": self.files, "file_kb": self.file_kb})

    def describe(self) -> str:
        return f"dataset {self.path}: {self.files} files of {self.file_kb:g} KB, written where missing on " + \
            ", ".join(self.targets)


def planned_datasets(points: Sequence[PlannedPoint]) -> list[DatasetWrite]:
    """Each dataset the points read from files, with every machine that reads it (pure; a --local
    point has no guests: this machine)."""
    found: dict[str, tuple[Dataset, str, dict[str, None]]] = {}
    for point in points:
        run = point.run
        if run.dataset is not None and point.data != "synthetic":
            _, _, targets = found.setdefault(run.data, (run.dataset, run.python, {}))
            targets.update(dict.fromkeys(point.guests or (LOCAL,)))
    return [DatasetWrite(path, dataset.files, dataset.file_kb, python, tuple(targets))
            for path, (dataset, python, targets) in found.items()]


def write_script(workdir: str, dataset: DatasetWrite, program: str) -> str:
    """Check the marker, write the files when they are missing, then the marker. Prints `present`
    or `written`; exits 3 (and says why) where it will not write."""
    path, marker, want = shlex.quote(dataset.path), shlex.quote(str(PurePosixPath(dataset.path) / MARKER)), \
        shlex.quote(dataset.spec)
    write = " ".join(shlex.quote(str(word)) for word in (dataset.python, program, "--write-dataset", dataset.path,
                                                         "--files", dataset.files, "--file-kb", f"{dataset.file_kb:g}"))
    return (f"cd {shlex.quote(workdir)} && want={want} && have=$(cat {marker} 2>/dev/null); "
            f'case "$have" in '
            f'"$want") echo present; exit 0;; '
            f'"writing $want") ;; '
            f'"") if [ -n "$(ls -A {path} 2>/dev/null)" ]; then '
            f"echo {path}: not empty, and not a dataset gpuvm wrote: refusing to write into it; exit 3; fi;; "
            f'*) echo {path}" holds another dataset ($have): remove it, or give the run another data path"; '
            f"exit 3;; esac; "
            f'mkdir -p {path} && echo "writing $want" > {marker} && {write} >/dev/null && echo "$want" > {marker} '
            f"&& echo written")


def write_datasets(executors: Mapping[str, Executor], datasets: Sequence[DatasetWrite], workdir: str,
                   local: bool, note: Callable[[str], None] = lambda line: None) -> None:
    """Write every dataset where it is missing; `note` hears `dataset PATH: written on vm1; present
    on vm2`. Raises one error naming each machine that could not."""
    failures: dict[str, Exception] = {}
    for dataset in datasets:
        program = str(BUNDLED["pytorch_train"]) if local else BUNDLED["pytorch_train"].name
        script = write_script(workdir, dataset, program)

        def write(target: str) -> str:
            result = executors[target].run_script(script, timeout=TIMEOUT, check=False)
            if result.exit_code != 0:
                raise RemoteCommandError(f"dataset {dataset.path}: {last_line(result.stdout + result.stderr)}")
            return last_line(result.stdout)

        first, rest = dataset.targets[0], dataset.targets[1:]
        outcomes: dict[str, str] = {}
        for wave in ((first,), rest) if rest else ((first,),):
            with Ticker(note, lambda s, wave=wave: f"dataset {dataset.path}: checking or writing on "
                                                   f"{', '.join(wave)}: {s:.0f} s"):
                written = run_group({t: t for t in wave}, write, at_once(wave), name="dataset")
            outcomes |= written.ok
            failures |= written.failed
        by_outcome: dict[str, list[str]] = {}
        for target, outcome in outcomes.items():
            by_outcome.setdefault(outcome, []).append(target)
        if by_outcome:
            note(f"dataset {dataset.path}: " + "; ".join(f"{outcome} on {', '.join(targets)}"
                                                          for outcome, targets in by_outcome.items()))
    GroupResult(failed=failures).raise_failures()
