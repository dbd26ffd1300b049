"""The shell text of a benchmark job: program, launcher (mpirun, torchrun, horovodrun or none) and
docker lines rendered from `templates/bench/*.j2` (every value shell-quoted), the hostfile, and the
scripts that start and stop a job on its launcher.

Each job is started as `cd WORKDIR && echo $$ > PIDFILE && exec mpirun ... 2>&1`: the shell is
its session's process-group leader (sshd and LocalExecutor both start commands in a new session)
and `exec` keeps its pid, so `kill -- -PID` on the guest reaches mpirun and its local ranks, and
mpirun tears the remote ranks down. That is how a timeout (for root logins, where sshd ignores
the session signal) and Ctrl-C stop the job.
"""

from __future__ import annotations

import re
import shlex
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path, PurePosixPath
from typing import Any

from gpuvm.runbook.benchmarks import BenchmarkRun
from gpuvm.runbook.model import Runbook

WORKLOADS = Path(__file__).resolve().parent / "workloads"  # shipped with gpuvm, uploaded to the guests
BUNDLED = {"pytorch_train": WORKLOADS / "pytorch_train.py", "pytorch_allreduce": WORKLOADS / "pytorch_allreduce.py"}
PIDFILE = "gpuvm-run.pid"  # per job: gpuvm-run-<token>.pid
DEFAULT_ENV = {"NCCL_DEBUG": "INFO", "NCCL_SOCKET_IFNAME": "^lo,docker0"}
MASTER_PORT = 29500  # gpuvm's PyTorch workloads under mpirun/horovodrun: rank 0 (MASTER_ADDR: the first host)
RDZV_PORT = 29400  # torchrun's c10d rendezvous on the first host
# Kinds whose program runs as `{{ python }} {{ program }}` (a file); the others run it as a command.
PYTHON_KINDS = ("pytorch_train", "pytorch_allreduce", "tf_cnn_benchmarks", "horovod_synthetic")
# The program each kind runs when the run gives no `program` (paths relative to the workdir).
DEFAULT_PROGRAMS: dict[str, str] = {
    **{kind: path.name for kind, path in BUNDLED.items()},
    "tf_cnn_benchmarks": "benchmarks/scripts/tf_cnn_benchmarks/tf_cnn_benchmarks.py",
    "horovod_synthetic/tensorflow": "tensorflow2_synthetic_benchmark.py",
    "horovod_synthetic/pytorch": "pytorch_synthetic_benchmark.py",
    "nccl_allreduce": "all_reduce_perf",
    "storage": "fio",
}
DEFAULT_MODELS = {"pytorch_train": "resnet50", "tf_cnn_benchmarks": "resnet50",
                  "horovod_synthetic/tensorflow": "ResNet50", "horovod_synthetic/pytorch": "resnet50"}


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
_envs: dict[tuple[bool, bool], Any] = {}


def _environment(shell: bool = True, sandboxed: bool = False):
    """gpuvm's templates; `sandboxed` for the runbook's own (user) templates."""
    import jinja2

    from gpuvm.templating import environment

    with _env_lock:
        if (shell, sandboxed) not in _envs:
            _envs[(shell, sandboxed)] = environment(
                "bench",
                sandboxed=sandboxed,
                undefined=jinja2.StrictUndefined,
                trim_blocks=not shell,  # shell templates: one word group per line, blank lines dropped
                lstrip_blocks=True,
                keep_trailing_newline=False,
                autoescape=False,
                finalize=_quote if shell else None,
            )
        return _envs[(shell, sandboxed)]


def _lines(template: str, context: dict[str, Any]) -> list[str]:
    text = _environment().get_template(template).render(**context)
    return [line.strip() for line in text.splitlines() if line.strip()]


def render_words(template: str, **context: Any) -> Shell:
    """Render a bench template; its non-empty lines are joined into one command line."""
    return Shell(" ".join(_lines(template, context)))


def render_script(template: str, **context: Any) -> str:
    """Render a bench template as a script: its non-empty lines, each its own."""
    return "\n".join(_lines(template, context)) + "\n"


def render_hostfile(hosts: Sequence[tuple[str, int]]) -> str:
    return _environment(shell=False).get_template("hostfile.j2").render(hosts=hosts).rstrip("\n") + "\n"


def render_user_command(runbook: Runbook, index: int, command: str, context: dict[str, Any]) -> Shell:
    """The run's `command` with its jinja2 variables filled in (quoted); errors name the field."""
    import jinja2

    try:
        template = _environment(sandboxed=True).from_string(command)
        return Shell(template.render(**context).strip())
    except jinja2.TemplateError as e:
        known = ", ".join(sorted(k for k in context if not k.startswith("_")))
        raise runbook.error(("benchmarks", "runs", index, "command"),
                            f"cannot render: {e.message or e} (variables: {known})") from None


def bundled_program(run: BenchmarkRun) -> Path | None:
    """The workload shipped with gpuvm that this run uploads and runs (its kind's, unless it names a
    `program` or gives its own `command`)."""
    if run.program is None and run.command is None:
        return BUNDLED.get(run.kind)
    return None


def program_context(run: BenchmarkRun, *, np: int, nodes: int, per_vm: int, batch: int, hostfile: str,
                    local: bool, guest: str = "") -> dict[str, Any]:
    """The variables of a program template (`<kind>.j2`) or of the run's own `command`."""
    bundled = bundled_program(run)
    program = str(bundled) if local and bundled else run.program or DEFAULT_PROGRAMS.get(run.variant, "")
    return {
        "name": run.name,
        "kind": run.kind,
        "framework": run.framework or ("tensorflow" if run.kind == "horovod_synthetic" else None),
        "model": run.model or DEFAULT_MODELS.get(run.variant, ""),
        "batch_size": batch,  # per GPU
        "global_batch_size": batch * np,
        "precision": run.precision,
        "fp16": run.precision == "fp16",
        "channels_last": run.channels_last,
        "compile": run.compile,
        "data": run.data,
        "steps": run.steps,
        "args": list(run.args),
        "python": run.python,
        "program": program,
        "np": np,
        "nodes": nodes,
        "gpus_per_vm": per_vm,
        "hostfile": hostfile,
        "guest": guest,  # the VM the job starts on (its launcher); "local" with --local
        "workdir": Shell('"$PWD"'),  # the job runs in its workdir: expanded on the launcher
    }


def launcher_command(run: BenchmarkRun, *, np: int, hosts: Sequence[tuple[str, int]], hostfile: str,
                     allow_run_as_root: bool, rsh_port: int | None, program: Shell,
                     env: Mapping[str, str] | None = None, mpirun_args: Sequence[str] = (),
                     wrapper: str | None = None, nodes: Sequence[str] = (), gpus_per_node: int | None = None) -> Shell:
    """The program under the run's launcher (`templates/bench/<launch>.j2`). `env` and
    `mpirun_args` are gpuvm's own additions; the run's own win. `wrapper`: a script in the workdir
    that every rank (torchrun: every node's torchrun) starts through (the guest's own network
    settings, bench/network.py).

    mpirun and horovodrun start every rank (and tell gpuvm's PyTorch workloads where rank 0 is:
    MASTER_ADDR, the first host). torchrun runs once per node (`--nproc_per_node` workers each,
    rendezvous on the first host); over several nodes mpirun starts it, one per node. none: the
    program alone, one process. srun: every rank through Slurm on `nodes` (Slurm node names, in
    slurm.conf's order: rank 0, MASTER_ADDR, is on the first), `gpus_per_node` GPUs asked of each;
    sbatch: that srun line, for its batch script (bench/batch.py)."""
    first = "127.0.0.1" if hosts[0][0] == "localhost" else hosts[0][0]
    env = {**DEFAULT_ENV, **(env or {}), **run.env}
    def wrapped(program: Shell) -> Shell:
        return Shell(f"{_quote(wrapper)} {program}") if wrapper else program

    if run.launch == "none":
        return render_words("none.j2", env=env, program=wrapped(program))
    if run.launch == "torchrun":
        program = wrapped(render_words("torchrun.j2", env=env, python=run.python, nnodes=len(hosts),
                                       nproc_per_node=hosts[0][1], endpoint=f"{first}:{RDZV_PORT}",
                                       rdzv_id=run.name, torchrun_args=list(run.torchrun_args), program=program))
        if len(hosts) == 1:
            return program
        np, env = len(hosts), {}
    else:
        program = wrapped(program)
        if run.kind in BUNDLED:
            env = {"MASTER_ADDR": first, "MASTER_PORT": str(MASTER_PORT), **env}
    if run.through_slurm:  # sbatch: this srun inside the batch job (its allocation made already)
        alone = run.launch == "srun"
        return render_words("srun.j2", env=env, mpi=run.srun_mpi, nodes=list(nodes), per_node=hosts[0][1],
                            gpus_per_node=gpus_per_node, immediate=int(run.queue_timeout) if alone else None,
                            srun_args=list(run.srun_args) if alone else [], program=program)
    if run.launch == "horovodrun":
        return render_words("horovodrun.j2", np=np, hosts=[f"{a}:{n}" for a, n in hosts],
                            env=env, rsh_port=rsh_port, program=program)
    return render_words(
        "mpirun.j2",
        allow_run_as_root=allow_run_as_root,
        np=np,
        per_node=run.launch == "torchrun",
        hostfile=hostfile,
        env=env,
        mpirun_args=[*mpirun_args, *run.mpirun_args],
        rsh_port=rsh_port,
        program=program,
    )


def container_name(run_name: str, label: str) -> str:
    """The docker container of one point's job (a valid container name, at most 120 characters)."""
    return re.sub(r"[^A-Za-z0-9_.-]", "-", f"gpuvm-{run_name}-{label}")[:120]


def docker_command(name: str, image: Any, docker_args: Sequence[str], inner: Shell, *, rdma: bool = True,
                   detach: bool = False) -> Shell:
    """`inner` run in the image guest.image placed, with its run options (`image.container_run_args`)."""
    from gpuvm.image import MESH_DIR, container_run_args, image_ref

    return render_words("docker.j2", container_name=name, run_args=container_run_args(image, rdma),
                        mesh_dir=MESH_DIR, docker_args=list(docker_args), image=image_ref(image), inner=inner,
                        detach=detach)


WORKER = "gpuvm-worker"  # the container running sshd on every guest of a containerised campaign


def worker_start_script(workdir: str, image: Any, docker_args: Sequence[str], port: int, *,
                        rdma: bool = True, wait: float = 30) -> str:
    """Start the guest's worker container (sshd on `port`, the mesh key, the workdir mounted),
    replacing a stale one, and wait until its sshd listens; its log is the error otherwise."""
    run = docker_command(WORKER, image, docker_args, Shell(_quote(["/usr/sbin/sshd", "-D", "-e", "-p", port])),
                         rdma=rdma, detach=True)
    tries = max(1, int(wait / 0.2))
    return (f"cd {shlex.quote(workdir)} && {{ docker rm -f {WORKER} >/dev/null 2>&1; true; }} "
            f"&& {run} >/dev/null && for i in $(seq {tries}); do "
            f"docker logs {WORKER} 2>&1 | grep -q 'Server listening' && exit 0; sleep 0.2; done; "
            f"docker logs {WORKER} 2>&1 | tail -n 5; docker rm -f {WORKER} >/dev/null 2>&1; exit 1")


def worker_stop_script() -> str:
    return f"docker rm -f {WORKER} >/dev/null 2>&1; ! docker container inspect {WORKER} >/dev/null 2>&1"


def launch_script(workdir: str, command: str, pidfile: str = PIDFILE, env: str = "") -> str:
    """The job as run on its launcher: a process-group leader that records its pid, then mpirun.
    `env`: assignments for the launcher (srun's job name, bench/slurm.py).

    Older pid files go first, so a stop never reads the pid of a job that ended long ago."""
    return (f"cd {shlex.quote(workdir)} && rm -f gpuvm-run*.pid && echo $$ > {shlex.quote(pidfile)} "
            f"&& {env + ' ' if env else ''}exec {command} 2>&1")


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
