"""`gpuvm bench run`: plan a benchmark campaign from the runbook, run it, keep every figure.

Three stages, as elsewhere in gpuvm:

* `plan_campaign` (pure): runbook + `benchmarks` → the points to measure, each with the exact
  command lines (rendered from `templates/bench/*.j2`, every value shell-quoted) and hostfiles.
  `--dry-run` prints this and touches nothing.
* `prepare`: create the workdir on every guest taking part, upload files, write hostfiles.
* `run_campaign`: every point's warm-up runs and repeats, one after the other, output streamed to
  `logs/<bench>/<point>/repeat-<k>.log` and parsed by the kind's parser. A failed run (non-zero
  exit, timeout, no figure) is recorded with its error and the campaign goes on. Ctrl-C stops
  the running job and still writes what was measured.

Each job is started as `cd WORKDIR && echo $$ > PIDFILE && exec mpirun ... 2>&1`: the shell is
its session's process-group leader (sshd and LocalExecutor both start commands in a new session)
and `exec` keeps its pid, so `kill -- -PID` on the guest reaches mpirun and its local ranks, and
mpirun tears the remote ranks down. That is how a timeout (for root logins, where sshd ignores
the session signal) and Ctrl-C stop the job.
"""

from __future__ import annotations

import getpass
import os
import re
import shlex
import socket
import threading
import uuid
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path, PurePosixPath
from typing import Any, Protocol

from gpuvm.bench.spec import (
    DEFAULT_MODELS,
    DEFAULT_PROGRAMS,
    BenchmarkRun,
    BenchmarkSpec,
    check_benchmarks,
    gpus_per_vm,
    guests_in_order,
    upload_source,
)
from gpuvm.errors import BenchmarkError, GpuvmError, InputError
from gpuvm.executors.base import Executor
from gpuvm.runbook.model import Runbook
from gpuvm.secrets import redact

LOCAL = "local"  # the executor name of this machine (--local)
WORKLOAD = Path(__file__).resolve().parent / "workloads" / "mpi_synthetic.py"
PIDFILE = "gpuvm-run.pid"  # per job: gpuvm-run-<token>.pid
STOP_GRACE = 60  # seconds past a run's timeout before the executor gives up on it
DEFAULT_ENV = {"NCCL_DEBUG": "INFO", "NCCL_SOCKET_IFNAME": "^lo,docker0"}
UNITS = {"tf_cnn_benchmarks": "images/sec", "horovod_synthetic": "img/sec", "nccl_allreduce": "GB/s",
         "mlperf_log": "min"}


# ------------------------------------------------------------------------------------ rendering


class Shell(str):
    """Shell text that goes into a template as is (everything else is quoted)."""


def _quote(value: Any) -> str:
    """Every `{{ value }}` in a bench template: shell-quoted; lists become quoted words."""
    if isinstance(value, Shell):
        return value
    if value is None:
        return ""
    if isinstance(value, list | tuple):
        return " ".join(shlex.quote(str(v)) for v in value)
    return shlex.quote(str(value))


_env_lock = threading.Lock()
_envs: dict[bool, Any] = {}


def image_ref(image: Any) -> str:
    from gpuvm.steps.guest_docker import image_ref as ref  # the name guest.docker gave the image

    return ref(image)


def container_run_args(image: Any) -> list[str]:
    from gpuvm.steps.guest_docker import container_run_args as args

    return args(image)


def _environment(shell: bool = True):
    import jinja2

    from gpuvm.bench.report import templates_dir

    with _env_lock:
        if shell not in _envs:
            _envs[shell] = jinja2.Environment(
                loader=jinja2.FileSystemLoader(templates_dir() / "bench"),
                undefined=jinja2.StrictUndefined,
                trim_blocks=not shell,  # shell templates: one word group per line, blank lines dropped
                lstrip_blocks=True,
                keep_trailing_newline=False,
                autoescape=False,
                finalize=_quote if shell else None,
            )
        return _envs[shell]


def render_words(template: str, **context: Any) -> Shell:
    """Render a bench template; its non-empty lines are joined into one command line."""
    text = _environment().get_template(template).render(**context)
    return Shell(" ".join(line.strip() for line in text.splitlines() if line.strip()))


def render_hostfile(hosts: Sequence[tuple[str, int]]) -> str:
    return _environment(shell=False).get_template("hostfile.j2").render(hosts=hosts).rstrip("\n") + "\n"


def render_user_command(runbook: Runbook, index: int, command: str, context: dict[str, Any]) -> Shell:
    """The run's `command` with its jinja2 variables filled in (quoted); errors name the field."""
    import jinja2

    try:
        template = _environment().from_string(command)
        return Shell(template.render(**context).strip())
    except jinja2.TemplateError as e:
        known = ", ".join(sorted(k for k in context if not k.startswith("_")))
        raise runbook.error(("benchmarks", "runs", index, "command"),
                            f"cannot render: {e.message or e} (variables: {known})") from None


def uses_workload(command: str | None) -> bool:
    """Whether a command template refers to `workload` (then the bundled workload is uploaded)."""
    if command is None:
        return False
    import jinja2.meta

    try:
        return "workload" in jinja2.meta.find_undeclared_variables(_environment().parse(command))
    except Exception:  # a syntax error is reported when the command is rendered
        return False


# --------------------------------------------------------------------------------------- plan


@dataclass(frozen=True)
class Job:
    """One mpirun (or docker run) started on `launcher`; for concurrent points, one per VM."""

    launcher: str  # guest VM name, or LOCAL
    hosts: tuple[tuple[str, int], ...]  # hostfile lines: address, slots
    hostfile: str  # path relative to the workdir
    np: int
    batch_size: int  # per GPU
    command: Shell
    vm: str | None = None  # concurrent: the VM this job's figure belongs to
    container: str | None = None  # docker container name, when containerised


@dataclass(frozen=True)
class PlannedPoint:
    run: BenchmarkRun
    index: int  # the run's position in benchmarks.runs
    label: str  # directory name: nodes-2, group-1-vm1+vm2
    nodes: int
    gpus_per_node: int
    vms: int
    jobs: tuple[Job, ...]
    guests: tuple[str, ...]  # every guest taking part (uploads go to each)

    @property
    def concurrent(self) -> bool:
        return self.run.scenario == "concurrent"


@dataclass(frozen=True)
class Upload:
    target: str  # guest VM name or LOCAL
    source: Path
    destination: str  # absolute, or relative to the workdir
    mode: int


def select_runs(spec: BenchmarkSpec, only: Sequence[str] = ()) -> list[tuple[int, BenchmarkRun]]:
    names = [r.name for r in spec.runs]
    unknown = [n for n in only if n not in names]
    if unknown:
        raise InputError(f"--only {', '.join(unknown)}: no such benchmark (the runbook has: {', '.join(names)})")
    return [(i, r) for i, r in enumerate(spec.runs) if not only or r.name in only]


def plan_campaign(runbook: Runbook, *, local: bool = False, only: Sequence[str] = (),
                  local_root: bool | None = None) -> list[PlannedPoint]:
    """Every point to measure, with its rendered commands. Pure: reads only the runbook."""
    spec = check_benchmarks(runbook, local=local)
    if local_root is None:
        local_root = os.geteuid() == 0
    points: list[PlannedPoint] = []
    for index, run in select_runs(spec, only):
        if run.scenario == "scaling":
            points.extend(_scaling_points(runbook, spec, index, run, local, local_root))
        else:
            points.extend(_concurrent_points(runbook, spec, index, run))
    return points


def _scaling_points(runbook: Runbook, spec: BenchmarkSpec, index: int, run: BenchmarkRun, local: bool,
                    local_root: bool) -> list[PlannedPoint]:
    ordered = [] if local else guests_in_order(runbook, spec.launcher)
    points = []
    for nodes in run.node_counts:
        label = f"nodes-{nodes}"
        if local:
            per_vm = run.gpus_per_vm or 1
            hosts: tuple[tuple[str, int], ...] = (("localhost", nodes * per_vm),)
            launcher, root, guests = LOCAL, local_root, ()
        else:
            chosen = ordered[:nodes]
            per_vm = gpus_per_vm(run, chosen, runbook, ("benchmarks", "runs", index))
            hosts = tuple((g.ssh.address, per_vm) for g in chosen)
            launcher, root, guests = chosen[0].vm, chosen[0].ssh.user == "root", tuple(g.vm for g in chosen)
        job = _job(runbook, spec, index, run, label, launcher, hosts, nodes, per_vm, root, local)
        points.append(PlannedPoint(run, index, label, nodes, per_vm, nodes, (job,), guests))
    return points


def _concurrent_points(runbook: Runbook, spec: BenchmarkSpec, index: int, run: BenchmarkRun) -> list[PlannedPoint]:
    guests = {g.vm: g for g in runbook.guests.hosts} if runbook.guests else {}
    vm_hosts = {vm.name: vm.host for vm in runbook.vms}
    points, keys = [], {}
    for j, group in enumerate(run.groups or [], 1):
        members = [guests[name] for name in group]
        per_vm = gpus_per_vm(run, members, runbook, ("benchmarks", "runs", index))
        nodes = len({vm_hosts.get(g.vm, g.vm) for g in members})
        total = per_vm * len(members)
        if total % nodes:
            raise runbook.error(("benchmarks", "runs", index, "groups", j - 1),
                                f"{total} GPUs do not spread evenly over {nodes} ESXi hosts")
        key = (nodes, total // nodes, len(members))
        if key in keys:
            raise runbook.error(("benchmarks", "runs", index, "groups", j - 1),
                                f"same configuration as group {keys[key]} ({len(members)} VM(s) × {per_vm} GPU(s) "
                                f"on {nodes} host(s)); results could not tell them apart")
        keys[key] = j
        label = f"group-{j}-" + "+".join(group)
        jobs = tuple(
            _job(runbook, spec, index, run, label, g.vm, (("localhost", per_vm),), 1, per_vm,
                 g.ssh.user == "root", False, vm=g.vm)
            for g in members
        )
        points.append(PlannedPoint(run, index, label, nodes, total // nodes, len(members), jobs, tuple(group)))
    return points


def _job(runbook: Runbook, spec: BenchmarkSpec, index: int, run: BenchmarkRun, label: str, launcher: str,
         hosts: tuple[tuple[str, int], ...], nodes: int, per_vm: int, root: bool, local: bool,
         vm: str | None = None) -> Job:
    np = sum(slots for _, slots in hosts)
    batch = run.per_gpu_batch(np if run.scenario == "scaling" else per_vm)
    hostfile = f"hostfile-{run.name}-{label}"
    container = spec.container and not local
    context = _program_context(run, np=np, nodes=nodes, per_vm=per_vm, batch=batch, hostfile=hostfile,
                               local=local)
    if run.command is not None:
        program = render_user_command(runbook, index, run.command, context)
    else:
        program = render_words(f"{run.kind}.j2", **context)
    image = runbook.guests.image if runbook.guests else None
    rsh_port = None
    if container and runbook.guests is not None:
        mesh = runbook.guests.ssh_mesh
        rsh_port = (mesh.container_port if mesh else None) or (image.sshd_port if image else None)
    if run.launch == "horovodrun":
        inner = render_words("horovodrun.j2", np=np, hosts=[f"{a}:{n}" for a, n in hosts],
                             env={**DEFAULT_ENV, **run.env}, rsh_port=rsh_port, program=program)
    else:
        inner = render_words(
            "mpirun.j2",
            allow_run_as_root=root or container,
            np=np,
            hostfile=hostfile,
            env={**DEFAULT_ENV, **run.env},
            mpirun_args=list(run.mpirun_args),
            rsh_port=rsh_port,
            program=program,
        )
    name = None
    if container and image is not None:
        name = re.sub(r"[^A-Za-z0-9_.-]", "-", f"gpuvm-{run.name}-{label}")[:120]
        command = render_words("docker.j2", container_name=name, run_args=container_run_args(image),
                               docker_args=list(spec.docker_args), image=image_ref(image), inner=inner)
    else:
        command = inner
    return Job(launcher, hosts, hostfile, np, batch, command, vm=vm, container=name)


def _program_context(run: BenchmarkRun, *, np: int, nodes: int, per_vm: int, batch: int, hostfile: str,
                     local: bool) -> dict[str, Any]:
    program = run.program or DEFAULT_PROGRAMS.get(run.variant, "")
    return {
        "name": run.name,
        "kind": run.kind,
        "framework": run.framework or ("tensorflow" if run.kind == "horovod_synthetic" else None),
        "model": run.model or DEFAULT_MODELS.get(run.variant, ""),
        "batch_size": batch,  # per GPU
        "global_batch_size": batch * np,
        "precision": run.precision,
        "fp16": run.precision == "fp16",
        "data": run.data,
        "steps": run.steps,
        "args": list(run.args),
        "python": run.python,
        "program": program,
        "np": np,
        "nodes": nodes,
        "gpus_per_vm": per_vm,
        "hostfile": hostfile,
        "workdir": Shell('"$PWD"'),  # the job runs in its workdir: expanded on the launcher
        "workload": str(WORKLOAD) if local else WORKLOAD.name,
    }


def uploads(runbook: Runbook, points: Sequence[PlannedPoint], local: bool) -> list[Upload]:
    """Files to copy before the campaign: each run's `upload` (and the bundled workload if its
    command uses `{{ workload }}` on guests) to every guest the run uses, once each."""
    seen: dict[tuple[str, str], Upload] = {}
    for point in points:
        targets = (LOCAL,) if local else point.guests
        files = [(upload_source(runbook, src), dst) for src, dst in point.run.upload.items()]
        if not local and uses_workload(point.run.command):
            files.append((WORKLOAD, WORKLOAD.name))
        for source, destination in files:
            mode = 0o755 if os.access(source, os.X_OK) else 0o644
            for target in targets:
                seen.setdefault((target, destination), Upload(target, source, destination, mode))
    return list(seen.values())


def launch_script(workdir: str, command: str, pidfile: str = PIDFILE) -> str:
    """The job as run on its launcher: a process-group leader that records its pid, then mpirun.

    Older pid files go first, so a stop never reads the pid of a job that ended long ago."""
    return (f"cd {shlex.quote(workdir)} && rm -f gpuvm-run*.pid && echo $$ > {shlex.quote(pidfile)} "
            f"&& exec {command} 2>&1")


def stop_script(workdir: str, container: str | None = None, pidfile: str = PIDFILE) -> str:
    """Stop the job started by `launch_script` in `workdir`: TERM its process group, then KILL."""
    pidfile = shlex.quote(str(PurePosixPath(workdir) / pidfile))
    script = (
        f'pid=$(cat {pidfile} 2>/dev/null) && [ -n "$pid" ] && {{ '
        f"env kill -TERM -- -$pid 2>/dev/null; i=0; "
        f"while env kill -0 -- -$pid 2>/dev/null && [ $i -lt 10 ]; do sleep 0.5; i=$((i+1)); done; "
        f"env kill -KILL -- -$pid 2>/dev/null; }}; rm -f {pidfile}"
    )
    if container:
        script += f"; docker rm -f {shlex.quote(container)} >/dev/null 2>&1"
    return script + "; true"


# ----------------------------------------------------------------------------------- running


class Observer(Protocol):
    """What the campaign reports as it goes (the CLI draws a progress display from it)."""

    def started(self, index: int, total: int, bench: str, point: str, label: str) -> None: ...

    def finished(self, index: int, total: int, bench: str, point: str, label: str,
                 value: float | None, unit: str, error: str | None) -> None: ...


class _Silent:
    def started(self, *args: Any) -> None:
        pass

    def finished(self, *args: Any) -> None:
        pass


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


@dataclass
class _Outcome:
    value: float | None
    error: str | None
    unit: str = ""
    higher_is_better: bool = True
    per_vm: dict[str, float] | None = None


def results_directory(out: Path, runbook: Runbook, now: datetime | None = None) -> Path:
    """`<out>/<runbook stem>-<UTC timestamp>`, made unique if a campaign started the same second."""
    stamp = (now or datetime.now(UTC)).strftime("%Y%m%dT%H%M%SZ")
    base = Path(out) / f"{runbook.file.stem}-{stamp}"
    candidate, n = base, 1
    while candidate.exists():
        n += 1
        candidate = base.with_name(f"{base.name}-{n}")
    return candidate


class CampaignRunner:
    """Runs planned points with one executor per launcher (guest VM name, or LOCAL)."""

    def __init__(self, runbook: Runbook, points: Sequence[PlannedPoint], executors: Mapping[str, Executor],
                 directory: Path, *, local: bool = False, observer: Observer | None = None):
        self.runbook = runbook
        self.spec: BenchmarkSpec = runbook.benchmarks  # type: ignore[assignment]
        self.points = list(points)
        self.executors = executors
        self.directory = Path(directory)
        self.local = local
        self.observer = observer or _Silent()
        self.workdir = str((self.directory / "work").resolve()) if local else self.spec.workdir
        self._recorded: dict[tuple[str, str], list] = {}
        self._units: dict[str, tuple[str, bool]] = {}

    # -- stages -----------------------------------------------------------------------------

    def prepare(self) -> None:
        """Workdirs, uploads and hostfiles on every launcher and participant. Errors propagate:
        nothing has been measured yet."""
        targets = [LOCAL] if self.local else sorted(
            {g for p in self.points for g in p.guests} | {j.launcher for p in self.points for j in p.jobs})
        for target in targets:
            self.executors[target].run(["mkdir", "-p", self.workdir], timeout=60)
        for upload in uploads(self.runbook, self.points, self.local):
            path = str(PurePosixPath(self.workdir) / upload.destination)
            executor = self.executors[upload.target]
            executor.run(["mkdir", "-p", str(PurePosixPath(path).parent)], timeout=60)
            executor.put(upload.source.read_bytes(), path, mode=upload.mode)
        for point in self.points:
            for job in point.jobs:
                self.executors[job.launcher].put(render_hostfile(job.hosts).encode(),
                                                 str(PurePosixPath(self.workdir) / job.hostfile))

    def software(self) -> dict[str, dict[str, str]]:
        """Versions every guest taking part reports (best effort: a missing tool is left out)."""
        targets = [LOCAL] if self.local else sorted(
            {g for p in self.points for g in p.guests} | {j.launcher for p in self.points for j in p.jobs})
        image = self.runbook.guests.image if (self.spec.container and self.runbook.guests) else None

        def versions(target: str) -> dict[str, str]:
            executor, found = self.executors[target], {}
            probes: list[tuple[str, list[str]]] = [
                ("mpirun", ["mpirun", "--version"]),
                ("nvidia_driver", ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"]),
                ("python", ["python3", "--version"]),
            ]
            if image is not None and not self.local:
                probes.append(("image", ["docker", "image", "inspect", "--format", "{{.Id}}", image_ref(image)]))
                found["image_name"] = reference
            for key, argv in probes:
                try:
                    result = executor.run(argv, timeout=30, check=False)
                except GpuvmError:
                    continue
                text = (result.stdout.strip() or result.stderr.strip()).splitlines()
                if result.exit_code == 0 and text:
                    found[key] = redact(text[0].strip())[:200]
            return found

        with ThreadPoolExecutor(max_workers=8, thread_name_prefix="gpuvm-versions") as pool:
            return dict(zip(targets, pool.map(versions, targets), strict=True))

    def run(self, now: Callable[[], datetime] = lambda: datetime.now(UTC)) -> Campaign:
        """Every point, warm-ups then repeats; results written at the end, even after Ctrl-C."""
        from gpuvm.bench.results import save_results

        started = now()
        campaign = Campaign(self.directory)
        schedule = [(p, k, warm) for p in self.points
                    for warm, count in ((True, p.run.warmup), (False, p.run.repeats)) for k in range(1, count + 1)]
        campaign.runs_total = sum(1 for _, _, warm in schedule if not warm)
        software: dict[str, dict[str, str]] = {}
        try:
            software = self.software()
            for index, (point, k, warm) in enumerate(schedule, 1):
                label = f"warm-up {k}" if warm else f"repeat {k}"
                self.observer.started(index, len(schedule), point.run.name, point.label, label)
                outcome, log = self._run_point(point, f"warmup-{k}" if warm else f"repeat-{k}")
                self.observer.finished(index, len(schedule), point.run.name, point.label, label,
                                       outcome.value, outcome.unit, outcome.error)
                if warm:
                    continue
                campaign.runs_done += 1
                self._record(point, outcome, log)
                if outcome.error is not None:
                    campaign.failures.append(Failure(point.run.name, point.label, k, log, outcome.error))
        except KeyboardInterrupt:
            campaign.interrupted = True
        finally:
            results = self._results(started, now(), software, campaign)
            campaign.results_file = save_results(self.directory, results)
        return campaign

    # -- one run ----------------------------------------------------------------------------

    def _run_point(self, point: PlannedPoint, stem: str) -> tuple[_Outcome, str]:
        base = self.directory / "logs" / point.run.name / point.label
        base.mkdir(parents=True, exist_ok=True)
        if not point.concurrent:
            job = point.jobs[0]
            (base / "command.sh").write_text(redact(launch_script(self.workdir, job.command)) + "\n")
            log = base / f"{stem}.log"
            return self._run_job(point, job, log, _pidfile()), self._relative(log)
        (base / stem).mkdir(exist_ok=True)
        for job in point.jobs:
            (base / f"command-{job.vm}.sh").write_text(redact(launch_script(self.workdir, job.command)) + "\n")
        pool = ThreadPoolExecutor(max_workers=len(point.jobs), thread_name_prefix="gpuvm-bench")
        pidfiles = {job.vm: _pidfile() for job in point.jobs}
        futures = {job.vm: pool.submit(self._run_job, point, job, base / stem / f"{job.vm}.log", pidfiles[job.vm])
                   for job in point.jobs}
        try:
            outcomes = {vm: future.result() for vm, future in futures.items()}
        except KeyboardInterrupt:
            for job in point.jobs:
                self._stop(job, pidfiles[job.vm])
            pool.shutdown(wait=False, cancel_futures=True)
            raise
        pool.shutdown(wait=True)
        errors = [f"{vm}: {o.error}" for vm, o in outcomes.items() if o.error is not None]
        first = next(iter(outcomes.values()))
        if errors:
            return _Outcome(None, "; ".join(errors), first.unit, first.higher_is_better), self._relative(base / stem)
        per_vm = {vm: o.value for vm, o in outcomes.items() if o.value is not None}
        return (_Outcome(sum(per_vm.values()), None, first.unit, first.higher_is_better, per_vm),
                self._relative(base / stem) + "/")

    def _run_job(self, point: PlannedPoint, job: Job, log: Path, pidfile: str) -> _Outcome:
        from gpuvm.bench.parsers import parse_output

        run = point.run
        executor = self.executors[job.launcher]
        script = launch_script(self.workdir, job.command, pidfile)
        error = None
        # Our own timeout: TERM lets mpirun take its ranks down (Open MPI puts each local rank in
        # its own process group, so the executor's SIGKILL of mpirun's group would orphan them);
        # the executor's timeout, a minute later, is only the backstop.
        expired = threading.Event()

        def expire() -> None:
            expired.set()
            self._stop(job, pidfile)

        watchdog = threading.Timer(run.timeout, expire)
        watchdog.daemon = True
        with open(log, "wb") as sink:
            watchdog.start()
            try:
                result = executor.run_script(script, timeout=run.timeout + STOP_GRACE, check=False, stdout_to=sink)
                if expired.is_set():
                    error = f"timed out after {run.timeout:g}s; the job was stopped"
                elif result.exit_code != 0:
                    error = f"exited {result.exit_code}"
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
        if error is not None:
            last = _last_line(text)
            return self._failed(run, f"{error}" + (f": {last}" if last else ""))
        options: dict[str, Any] = {}
        if run.kind == "command":
            options = {"pattern": run.pattern, "unit": run.unit, "higher_is_better": run.higher_is_better}
        try:
            figure = parse_output(run.kind, text, log=self._relative(log), **options)
        except GpuvmError as e:
            return self._failed(run, str(e))
        self._units.setdefault(run.name, (figure.unit, figure.higher_is_better))
        return _Outcome(figure.value, None, figure.unit, figure.higher_is_better)

    def _failed(self, run: BenchmarkRun, error: str) -> _Outcome:
        unit, better = self._unit(run)
        return _Outcome(None, redact(error), unit, better)

    def _stop(self, job: Job, pidfile: str) -> None:
        """Best effort: end the job's processes on its launcher (it may be unreachable)."""
        try:
            self.executors[job.launcher].run_script(stop_script(self.workdir, job.container, pidfile),
                                                    timeout=30, check=False)
        except (GpuvmError, OSError):
            pass

    # -- results ----------------------------------------------------------------------------

    def _unit(self, run: BenchmarkRun) -> tuple[str, bool]:
        if run.name in self._units:
            return self._units[run.name]
        if run.kind == "command":
            return run.unit, run.higher_is_better
        return UNITS.get(run.kind, ""), run.kind != "mlperf_log"

    def _record(self, point: PlannedPoint, outcome: _Outcome, log: str) -> None:
        from gpuvm.bench.results import Repeat

        repeat = Repeat(value=outcome.value, per_vm=outcome.per_vm, log=log, error=outcome.error)
        self._recorded.setdefault((point.run.name, point.label), []).append(repeat)

    def _results(self, started: datetime, finished: datetime, software: dict, campaign: Campaign):
        from gpuvm.bench.results import Benchmark, Point, Results, RunbookRef

        benchmarks, seen = [], []
        for point in self.points:
            if point.run.name not in seen:
                seen.append(point.run.name)
        for name in seen:
            mine = [p for p in self.points if p.run.name == name and self._recorded.get((name, p.label))]
            if not mine:
                continue
            run = mine[0].run
            unit, better = self._unit(run)
            benchmarks.append(Benchmark(
                name=name, kind=run.kind, unit=unit, higher_is_better=better, scenario=run.scenario,
                scaling=run.scaling_mode,
                points=[Point(nodes=p.nodes, gpus_per_node=p.gpus_per_node, vms=p.vms,
                              repeats=self._recorded[(name, p.label)]) for p in mine],
            ))
        note = None
        if campaign.interrupted:
            note = f"interrupted: {campaign.runs_done} of {campaign.runs_total} run(s) done"
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

    def _vm_info(self) -> list:
        from gpuvm.bench.results import VmInfo

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

    def _relative(self, path: Path) -> str:
        try:
            return str(Path(path).relative_to(self.directory))
        except ValueError:
            return str(path)


def _pidfile() -> str:
    return f"gpuvm-run-{uuid.uuid4().hex[:8]}.pid"


def _redact_file(path: Path) -> str:
    """The log's text, with every known secret masked in the file too."""
    raw = path.read_bytes().decode(errors="replace")
    clean = redact(raw)
    if clean != raw:
        path.write_text(clean, encoding="utf-8")
    return clean


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1][:300] if lines else ""


# ------------------------------------------------------------------------------------- entry


def executors_for(runbook: Runbook, points: Sequence[PlannedPoint], local: bool, state_dir: Path,
                  accept_new_host_keys: bool = False) -> dict[str, Executor]:
    """LocalExecutor for --local, else an SSH executor per guest taking part (lazy connections)."""
    if local:
        from gpuvm.executors.local import LocalExecutor

        return {LOCAL: LocalExecutor(f"{LOCAL} ({getpass.getuser()}@{socket.gethostname()})")}
    from gpuvm.remote import RemoteOptions, ssh_executor

    wanted = {g for p in points for g in p.guests} | {j.launcher for p in points for j in p.jobs}
    executors: dict[str, Executor] = {}
    options = RemoteOptions(accept_new_host_keys=accept_new_host_keys)
    for i, guest in enumerate(runbook.guests.hosts if runbook.guests else []):
        if guest.vm in wanted:
            executors[guest.vm] = ssh_executor(runbook, state_dir, options, guest.vm, guest.ssh,
                                               ("guests", "hosts", i, "ssh"))
    return executors


def describe(points: Sequence[PlannedPoint], workdir: str) -> list[str]:
    """The dry-run text: every point's launcher, hostfile and command line."""
    lines = []
    for point in points:
        lines.append(f"{point.run.name} {point.label}: {point.run.repeats} repeat(s)"
                     + (f" after {point.run.warmup} warm-up(s)" if point.run.warmup else ""))
        for job in point.jobs:
            hosts = ", ".join(f"{a} slots={s}" for a, s in job.hosts)
            lines.append(f"  on {job.launcher} (hostfile {job.hostfile}: {hosts})")
            lines.append(f"    {redact(launch_script(workdir, job.command))}")
    return lines
