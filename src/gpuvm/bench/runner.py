"""Running a planned campaign (`gpuvm bench run`), after `campaign.plan_campaign`:

* `prepare`: create the workdir on every guest taking part, upload files, write hostfiles, and
  check that every program a run names is there (all guests at once, one error naming each).
* `run`: every point's warm-up runs, then the repeats round-robin (repeat 1 of every point, then
  repeat 2, ...: `interleaved`), one after the other, output streamed to
  `logs/<bench>/<point>/repeat-<k>.log` and parsed by the kind's parser; after each repeat, the
  environment of every machine that ran it is recorded with it (gpuvm.bench.environment). A
  failed run (non-zero exit, timeout, no figure) is recorded with its error and the campaign goes
  on. Ctrl-C stops the running job (see `commands.stop_script`) and still writes what was measured.
"""

from __future__ import annotations

import getpass
import shlex
from statistics import median
import socket
import threading
import uuid
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path, PurePosixPath
from typing import Any, Protocol

from gpuvm.bench.batch import run_batch
from gpuvm.bench.campaign import LOCAL, Job, PlannedPoint, container_sshd_port, has_rdma, taking_part, uploads
from gpuvm.bench.commands import (
    DEFAULT_PROGRAMS,
    PYTHON_KINDS,
    bundled_program,
    launch_script,
    render_hostfile,
    stop_script,
    worker_start_script,
    worker_stop_script,
)
from gpuvm.bench.environment import capture
from gpuvm.bench.datasets import planned_datasets, write_datasets
from gpuvm.bench.network import rank_script
from gpuvm.bench.parsers import parse_output
from gpuvm.bench.parsers.failure import failure_line
from gpuvm.bench.recording import Campaign, Failure, Outcome, Recorder
from gpuvm.bench.results import Environment, save_results
from gpuvm.bench.slurm import SlurmRelay, cancel_script, job_env, job_id_script, node_name, parse_job_id, refusal, submit_guest
from gpuvm.bench.software import software_versions
from gpuvm.bench.stats import half_width, median_ci
from gpuvm.errors import GpuvmError, InputError, RemoteCommandError
from gpuvm.executors.base import Executor, last_line
from gpuvm.executors.group import GroupResult, at_once, run_group
from gpuvm.files import UPLOAD_BYTES, read_capped, writing
from gpuvm.image import image_ref
from gpuvm.names import file_stem
from gpuvm.runbook.benchmarks import BenchmarkRun, BenchmarkSpec
from gpuvm.runbook.model import Runbook
from gpuvm.secrets import redact

STOP_GRACE = 60  # seconds past a run's timeout before the executor gives up on it


class Observer(Protocol):
    """What the campaign reports as it goes (the CLI draws a progress display from it)."""

    def started(self, index: int, total: int, bench: str, point: str, label: str) -> None: ...

    def finished(self, index: int, total: int, bench: str, point: str, label: str,
                 value: float | None, unit: str, error: str | None) -> None: ...

    def note(self, line: str) -> None: ...  # what was prepared (datasets written or found)


class _Silent:
    def started(self, *args: Any) -> None:
        pass

    def finished(self, *args: Any) -> None:
        pass

    def note(self, line: str) -> None:
        pass


def executors_for(runbook: Runbook, points: Sequence[PlannedPoint], local: bool, state_dir: Path,
                  accept_new_host_keys: bool = False) -> dict[str, Executor]:
    """LocalExecutor for --local, else an SSH executor per guest taking part (lazy connections).
    A campaign launched through Slurm alone connects to its submit guest only and reaches the
    others through Slurm (bench/slurm.py)."""
    if local:
        from gpuvm.executors.local import LocalExecutor

        return {LOCAL: LocalExecutor(f"{LOCAL} ({getpass.getuser()}@{socket.gethostname()})")}
    from gpuvm.remote import RemoteOptions, ssh_executor

    wanted = taking_part(points)
    through_slurm = bool(points) and all(p.run.through_slurm for p in points)
    submit = submit_guest(runbook) if through_slurm else None
    executors: dict[str, Executor] = {}
    options = RemoteOptions(accept_new_host_keys=accept_new_host_keys)
    guests = runbook.guests.hosts if runbook.guests else []
    for i, guest in enumerate(guests):
        if guest.vm in wanted and (submit is None or guest.vm == submit):
            executors[guest.vm] = ssh_executor(runbook, state_dir, options, guest.vm, guest.ssh,
                                               ("guests", "hosts", i, "ssh"))
    for guest in guests:
        if submit is not None and guest.vm in wanted and guest.vm != submit:
            executors[guest.vm] = SlurmRelay(guest.vm, node_name(guest), executors[submit])
    return executors


class CampaignRunner:
    """Runs planned points with one executor per launcher (guest VM name, or LOCAL)."""

    def __init__(self, runbook: Runbook, points: Sequence[PlannedPoint], executors: Mapping[str, Executor],
                 directory: Path, *, local: bool = False, observer: Observer | None = None,
                 recorder: Recorder | None = None):
        self.runbook = runbook
        self.spec: BenchmarkSpec = runbook.benchmarks  # type: ignore[assignment]
        self.points = list(points)
        self.executors = executors
        self.directory = Path(directory)
        self.local = local
        self.observer = observer or _Silent()
        self.workdir = str((self.directory / "work").resolve()) if local else self.spec.workdir
        self.recorder = recorder or Recorder(runbook, self.points, local)  # shared by a campaign's setups

    def _targets(self) -> list[str]:
        return [LOCAL] if self.local else sorted(taking_part(self.points))

    def prepare(self) -> None:
        """Workdirs, uploads, hostfiles and datasets on every launcher and participant. Errors
        propagate: nothing has been measured yet."""
        targets = self._targets()
        run_group({t: t for t in targets}, lambda t: self.executors[t].run(["mkdir", "-p", self.workdir], timeout=60),
                  at_once(targets), name="prepare").raise_first()
        for upload in uploads(self.runbook, self.points, self.local):
            path = str(PurePosixPath(self.workdir) / upload.destination)
            executor = self.executors[upload.target]
            executor.run(["mkdir", "-p", str(PurePosixPath(path).parent)], timeout=60)
            executor.put(read_capped(upload.source, UPLOAD_BYTES, "upload"), path, mode=upload.mode)
        for point in self.points:
            for job in point.jobs:
                if not job.nodes:  # srun's nodes are on its command line
                    self.executors[job.launcher].put(render_hostfile(job.hosts).encode(),
                                                     str(PurePosixPath(self.workdir) / job.hostfile))
            script = next((job.network_script for job in point.jobs if job.network_script), None)
            for vm, settings in point.guest_network if script else ():  # each guest its own values
                self.executors[vm].put(rank_script(dict(settings)).encode(),
                                       str(PurePosixPath(self.workdir) / script), mode=0o755)
        self.check_programs()
        write_datasets(self.executors, planned_datasets(self.points), self.workdir, self.local,
                       self.observer.note)

    def check_programs(self) -> None:
        """What every run needs, looked for on every machine that runs it before anything runs:
        its program and interpreter (`test -e` for a file, `command -v` for a name on PATH), its
        data directory (unless gpuvm writes a dataset there), and in a containerised campaign the
        training image. One script per machine, all machines at once; raises one error naming each
        machine and what it lacks (InputError, exit 2: nothing was measured; `gpuvm apply` or the
        runbook fixes it)."""
        wanted: dict[str, dict[str, tuple[str, str]]] = {}  # target → {token: (probe, what is missing)}
        for point in self.points:
            for target in [LOCAL] if self.local else point.guests:
                needs = wanted.setdefault(target, {})
                for path in _programs(point.run, containerised=self.spec.container and not self.local):
                    needs.setdefault(path, (_probe(path), f"{_where(path, self.workdir)} (benchmark "
                                                          f"'{point.run.name}')"))
                if (data := _data_directory(point.run, self.containerised)) is not None:
                    needs.setdefault("data:" + data, (f"test -d {shlex.quote(data)}", f"the data directory {data} "
                                                      f"does not exist on {_guest(target)} (benchmark "
                                                      f"'{point.run.name}')"))
        if self.containerised:
            ref = image_ref(self.runbook.guests.image)  # type: ignore[union-attr]
            for target in self._targets():
                wanted.setdefault(target, {})["image:" + ref] = (
                    f"docker image inspect {shlex.quote(ref)}",
                    f"image {ref} is not on {_guest(target)}: build it first with `gpuvm apply`")

        def missing(target: str) -> list[str]:
            tests = "; ".join(f"{probe} >/dev/null 2>&1 || echo {shlex.quote(token)}"
                              for token, (probe, _) in wanted[target].items())
            script = f"cd {shlex.quote(self.workdir)} && {{ {tests}; }}"
            result = self.executors[target].run_script(script, timeout=60)
            return [line for line in result.stdout.splitlines() if line in wanted[target]]

        wanted = {target: needs for target, needs in wanted.items() if needs}
        absent = run_group({t: t for t in wanted}, missing, at_once(wanted), name="check").raise_first()
        GroupResult(failed={target: InputError("; ".join(wanted[target][token][1] for token in tokens))
                            for target, tokens in absent.items() if tokens}).raise_failures()

    @property
    def containerised(self) -> bool:
        return bool(self.spec.container and self.runbook.guests and self.runbook.guests.image and not self.local)

    def start_workers(self) -> None:
        """A worker container (sshd with the mesh key) on every guest taking part, all at once.
        A guest that cannot start one fails the campaign before anything runs."""
        if not self.containerised:
            return
        image, port = self.runbook.guests.image, container_sshd_port(self.runbook)  # type: ignore[union-attr]

        def start(target: str) -> str | None:
            script = worker_start_script(self.workdir, image, self.spec.docker_args, port,  # type: ignore[arg-type]
                                         rdma=has_rdma(self.runbook, target))
            result = self.executors[target].run_script(script, timeout=120, check=False)
            return None if result.exit_code == 0 else f"{target}: {last_line(result.stdout + result.stderr)}"

        started = run_group({t: t for t in self._targets()}, start, at_once(self._targets()), name="workers").raise_first()
        errors = [e for e in started.values() if e]
        if errors:
            raise RemoteCommandError(redact("cannot start the worker containers (sshd): " + "; ".join(errors)))

    def stop_workers(self) -> dict[str, str]:
        """Remove the worker containers (best effort); the guests where one is left, with why."""
        if not self.containerised:
            return {}

        def stop(target: str) -> str | None:
            try:
                result = self.executors[target].run_script(worker_stop_script(), timeout=60, check=False)
            except (GpuvmError, OSError) as e:
                return str(e)
            return None if result.exit_code == 0 else (last_line(result.stdout + result.stderr) or "still there")

        left = run_group({t: t for t in self._targets()}, stop, at_once(self._targets()), name="workers").raise_first()
        return {t: why for t, why in left.items() if why}

    def software(self) -> dict[str, dict[str, str]]:
        """Versions every guest taking part reports (best effort: a missing tool is left out)."""
        image = self.runbook.guests.image if self.containerised else None  # type: ignore[union-attr]
        return software_versions(self.executors, self._targets(), image)

    def run(self, now: Callable[[], datetime] = lambda: datetime.now(UTC)) -> Campaign:
        """Every point, warm-ups then repeats; results written at the end, even after Ctrl-C."""
        started = now()
        campaign = Campaign(self.directory)
        software: dict[str, dict[str, str]] = {}
        try:
            self.measure(campaign, software)
        finally:
            campaign.results_file = self.save(campaign, started, now(), software)
        return campaign

    def save(self, campaign: Campaign, started: datetime, finished: datetime,
             software: dict[str, dict[str, str]]) -> Path:
        return save_results(self.directory, self.recorder.results(started, finished, software, campaign.note()))

    def measure(self, campaign: Campaign, software: dict[str, dict[str, str]]) -> None:
        """Every point's warm-ups and repeats, recorded; `software` gets the guests' versions.
        A point with `repeats: auto` stops once its interval is narrow enough (`settled`).
        Ctrl-C marks the campaign interrupted and returns."""
        schedule = interleaved(self.points)
        campaign.runs_total += sum(1 for _, _, warm in schedule if not warm)
        try:
            software.update(self.software())
            self.start_workers()
            index = 0
            while index < len(schedule):
                point, k, warm = schedule[index]
                index += 1
                label = f"warm-up {k}" if warm else f"repeat {k}"
                shown = f"{point.setup}/{point.label}" if point.setup else point.label
                self.observer.started(index, len(schedule), point.run.name, shown, label)
                outcome, log = self._run_point(point, f"warmup-{k}" if warm else f"repeat-{k}")
                self.observer.finished(index, len(schedule), point.run.name, shown, label,
                                       outcome.value, outcome.unit, outcome.error)
                if warm:
                    self.recorder.record(point, outcome, log, warmup=True)
                    continue
                campaign.runs_done += 1
                repeat = self.recorder.record(point, outcome, log)  # kept even if Ctrl-C comes next
                repeat.environment = self.environment(point) or None
                if outcome.error is not None:
                    where = f"{point.setup}: {point.label}" if point.setup else point.label
                    campaign.failures.append(Failure(point.run.name, where, k, log, outcome.error))
                if settled(point.run, self.recorder.values(point)):
                    rest = [entry for entry in schedule[index:] if entry[0] is not point]
                    campaign.runs_total -= len(schedule) - index - len(rest)
                    schedule[index:] = rest
                elif point.run.repeats == "auto" and k == point.run.repeats_max:
                    said = unsettled_at_cap(point.run, shown, self.recorder.values(point))
                    self.observer.note(said)
                    campaign.notes.append(said)
        except KeyboardInterrupt:
            campaign.interrupted = True
        finally:
            if left := self.stop_workers():
                campaign.notes.append("worker containers left running on " + ", ".join(
                    f"{t} ({why})" for t, why in left.items()))

    def environment(self, point: PlannedPoint) -> dict[str, Environment]:
        """The environment of each machine that ran the point, read right after a repeat (one
        script each, all at once, best effort)."""
        return capture(self.executors, [LOCAL] if self.local else sorted(point.guests), local=self.local)

    def _run_point(self, point: PlannedPoint, stem: str) -> tuple[Outcome, str]:
        base = self.directory / "logs" / point.run.name / (point.setup or "") / point.label
        with writing(base, "logs"):
            base.mkdir(parents=True, exist_ok=True)
            if point.concurrent:
                (base / stem).mkdir(exist_ok=True)
            for job in point.jobs:
                suffix = f"-{file_stem(job.vm)}" if point.concurrent else ""
                (base / f"command{suffix}.sh").write_text(redact(launch_script(self.workdir, job.command)) + "\n")
                if job.batch is not None:  # launch sbatch: what sbatch read
                    (base / f"sbatch{suffix}.sh").write_text(redact(job.batch))
        if not point.concurrent:
            log = base / f"{stem}.log"
            return self._run_job(point, point.jobs[0], log, _pidfile()), self._relative(log)
        pidfiles = {job.vm: _pidfile() for job in point.jobs}

        def stop_all() -> None:  # Ctrl-C: the jobs' ranks are stopped, then their threads end
            for job in point.jobs:
                self._stop(job, pidfiles[job.vm])

        outcomes = run_group({job.vm: job for job in point.jobs},
                             lambda job: self._run_job(point, job, base / stem / f"{file_stem(job.vm)}.log", pidfiles[job.vm]),
                             len(point.jobs), name="bench", on_interrupt=stop_all).raise_first()
        errors = [f"{vm}: {o.error}" for vm, o in outcomes.items() if o.error is not None]
        first = next(iter(outcomes.values()))
        jobs = [j for o in outcomes.values() for j in o.slurm_jobs or []] or None
        if errors:
            return (Outcome(None, "; ".join(errors), first.unit, first.higher_is_better, slurm_jobs=jobs),
                    self._relative(base / stem))
        per_vm = {vm: o.value for vm, o in outcomes.items() if o.value is not None}
        metrics = {f"{vm}/{name}": value for vm, o in outcomes.items() for name, value in (o.metrics or {}).items()}
        return (Outcome(sum(per_vm.values()), None, first.unit, first.higher_is_better, per_vm, metrics, jobs),
                self._relative(base / stem) + "/")

    def _run_job(self, point: PlannedPoint, job: Job, log: Path, pidfile: str) -> Outcome:
        run = point.run
        executor = self.executors[job.launcher]
        named = job_env(pidfile, run.launch) if job.nodes else ""  # a Slurm job: named after its run
        script = launch_script(self.workdir, job.command, pidfile, env=named)
        error, batch_id = None, None  # batch_id: launch sbatch's job id, as sbatch said it
        # Our own timeout: TERM lets mpirun take its ranks down (Open MPI puts each local rank in
        # its own process group, so the executor's SIGKILL of mpirun's group would orphan them);
        # the executor's timeout, a minute later, is only the backstop.
        expired = threading.Event()

        def expire() -> None:
            expired.set()
            self._stop(job, pidfile)

        watchdog = threading.Timer(run.timeout, expire)
        watchdog.daemon = True
        with writing(log, "a log"):
            sink = open(log, "wb")
        with sink:
            watchdog.start()
            try:
                if job.batch is not None:
                    batch = run_batch(self.executors, job.launcher, script, job.batch, run, pidfile, sink)
                    error, batch_id = batch.error, batch.id
                else:
                    result = executor.run_script(script, timeout=run.timeout + STOP_GRACE, check=False, stdout_to=sink)
                    error = f"exited {result.exit_code}" if result.exit_code != 0 else None
                if expired.is_set():
                    error = f"timed out after {run.timeout:g}s; the job was stopped"
            except KeyboardInterrupt:
                watchdog.cancel()
                self._stop(job, pidfile)
                raise
            except GpuvmError as e:  # the backstop timeout, or the connection dropped
                error = str(e)
                self._stop(job, pidfile)
            finally:
                watchdog.cancel()
        text = _redact_file(log)
        jobs = [batch_id] if batch_id is not None else self._slurm_job(job, pidfile)
        if error is not None:
            last = (refusal(text) if job.nodes else None) or failure_line(text)[:300]
            return self._failed(run, f"{error}" + (f": {last}" if last else ""), jobs)
        options: dict[str, Any] = {}
        if run.kind == "command":
            options = {"pattern": run.pattern, "unit": run.unit, "higher_is_better": run.higher_is_better}
        try:
            figure = parse_output(run.kind, text, log=self._relative(log), **options)
        except GpuvmError as e:
            return self._failed(run, str(e), jobs)
        self.recorder.remember_unit(run, figure.unit, figure.higher_is_better)
        return Outcome(figure.value, None, figure.unit, figure.higher_is_better, metrics=dict(figure.metrics),
                       slurm_jobs=jobs)

    def _failed(self, run: BenchmarkRun, error: str, slurm_jobs: list[int] | None = None) -> Outcome:
        unit, better = self.recorder.unit(run)
        return Outcome(None, redact(error), unit, better, slurm_jobs=slurm_jobs)

    def _slurm_job(self, job: Job, pidfile: str) -> list[int] | None:
        """launch srun: the id of the Slurm job that ran (best effort; None when Slurm never made one)."""
        if not job.nodes:
            return None
        try:
            said = self.executors[job.launcher].run_script(job_id_script(pidfile), timeout=30, check=False)
        except (GpuvmError, OSError):
            return None
        found = parse_job_id(said.stdout)
        return [found] if found is not None else None

    def _stop(self, job: Job, pidfile: str) -> None:
        """Best effort: end the job's processes on its launcher (it may be unreachable); a Slurm
        job is cancelled first (its ranks are on other nodes), and gone from squeue on return."""
        script = stop_script(self.workdir, job.container, pidfile)
        if job.batch is not None:  # nothing of it runs on the launcher: sbatch ended at submission
            script = cancel_script(pidfile) + f"; rm -f {shlex.quote(str(PurePosixPath(self.workdir) / pidfile))}"
        elif job.nodes:
            script = cancel_script(pidfile) + "; " + script
        try:
            self.executors[job.launcher].run_script(script, timeout=30, check=False)
        except (GpuvmError, OSError):
            pass

    def _relative(self, path: Path) -> str:
        try:
            return str(Path(path).relative_to(self.directory))
        except ValueError:
            return str(path)


def interleaved(points: Sequence[PlannedPoint]) -> list[tuple[PlannedPoint, int, bool]]:
    """(point, k, warm-up?) in the order they run: every point's warm-ups, then round-robin
    repeats: repeat 1 of every point, then repeat 2 of every point, ... A slow drift of the
    machine (heat, a neighbour's load, a page cache filling) then spreads over every point
    instead of biasing the points that happened to run last."""
    warmups = [(p, k, True) for p in points for k in range(1, p.run.warmup + 1)]
    rounds = max((p.run.most_repeats for p in points), default=0)
    repeats = [(p, k, False) for k in range(1, rounds + 1) for p in points if k <= p.run.most_repeats]
    return warmups + repeats


def settled(run: BenchmarkRun, values: Sequence[float]) -> bool:
    """`repeats: auto`: the figures so far have a 95 % interval within ± `repeats_target` of their
    median (so at least 3 of them). Runs that failed give no figure and do not count."""
    if run.repeats != "auto":
        return False
    width = half_width(median_ci(values), median(values)) if values else None
    return width is not None and width <= run.repeats_target


def unsettled_at_cap(run: BenchmarkRun, point: str, values: Sequence[float]) -> str:
    """What a `repeats: auto` point that ran `repeats_max` repeats without settling says."""
    width = half_width(median_ci(values), median(values)) if values else None
    spread = f"±{width * 100:.1f} %" if width is not None else f"none ({len(values)} figure(s))"
    return (f"{run.name} {point}: repeats: auto stopped at repeats_max ({run.repeats_max}) with its median's 95 % "
            f"interval {spread}, wider than repeats_target ±{run.repeats_target * 100:g} %; raise repeats_max "
            f"to narrow it")


def _programs(run: BenchmarkRun, containerised: bool) -> list[str]:
    """What a run needs on each machine: its program (a file for Python kinds, a file or a name on
    PATH for the others) and its interpreter. Inside a container only the workdir (mounted at the
    same path) is the guest's, so only paths relative to it are checked."""
    if run.command is not None:
        return []  # the user's own shell text
    paths = []
    program = None if bundled_program(run) else run.program or DEFAULT_PROGRAMS.get(run.variant)
    if program:
        python_file = run.kind in PYTHON_KINDS and "/" not in program  # `python3 x.py`: the workdir's
        paths.append(f"./{program}" if python_file else program)
    if run.kind in PYTHON_KINDS:
        paths.append(run.python)
    if containerised:
        paths = [p for p in paths if "/" in p and not p.startswith("/")]
    return paths


def _data_directory(run: BenchmarkRun, containerised: bool) -> str | None:
    """The directory a run reads its files in, where it must exist already: not when gpuvm writes a
    dataset there, nor inside a container (where the guest's paths are what docker_args mount)."""
    if run.data == "synthetic" or run.dataset is not None or containerised:
        return None
    return run.data


def _guest(target: str) -> str:
    return "this machine" if target == LOCAL else f"guest {target}"


def _probe(path: str) -> str:
    """`test -e` for a path, `command -v` for a bare name (looked up on PATH)."""
    return f"test -e {shlex.quote(path)}" if "/" in path else f"command -v {shlex.quote(path)}"


def _where(path: str, workdir: str) -> str:
    if "/" not in path:
        return f"{path}: not found on PATH"
    return f"{path}: no such file" + ("" if path.startswith("/") else f" in {workdir}")


def _pidfile() -> str:
    return f"gpuvm-run-{uuid.uuid4().hex[:8]}.pid"


def _redact_file(path: Path) -> str:
    """The log's text, with every known secret masked in the file too."""
    raw = path.read_bytes().decode(errors="replace")
    clean = redact(raw)
    if clean != raw:
        path.write_text(clean, encoding="utf-8")
    return clean

