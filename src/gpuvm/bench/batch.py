"""`launch: sbatch`: a campaign point as a Slurm batch job, the way MLPerf and DeepOps users submit.

The batch script (`batch_script`, templates/bench/sbatch.j2) holds the srun line `launch: srun`
runs; `sbatch --parsable` takes it on its stdin on the submit guest and prints the job id at once.
gpuvm then polls `scontrol show job` (`wait_script`: a few seconds a call) until the job ended: a
poll is one short command over the campaign's connection, so a lost SSH session costs one poll,
and the next one reconnects while the job goes on in Slurm (an `sbatch --wait` would die with the
session and leave gpuvm blind to a job still running). Slurm writes the job's output on its first
node (BatchHost), not necessarily the submit guest: it is read back there (`cat`, through
SlurmRelay in a campaign through Slurm alone) into the point's log and parsed as today. A job
Slurm refuses at submission fails with sbatch's words (slurm.refusal); one pending past
`queue_timeout` is cancelled and fails with scontrol's `Reason=`.
"""

from __future__ import annotations

import math
import re
import shlex
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import BinaryIO

from gpuvm.bench.commands import Shell, render_script
from gpuvm.bench.slurm import cancel_script, parse_job_id
from gpuvm.errors import ConnectError
from gpuvm.executors.base import UNDER_WAY, Executor
from gpuvm.runbook.benchmarks import BenchmarkRun

OUTPUT = "gpuvm-batch-%j.out"  # in the job's working directory (the workdir) on its first node
POLL = 5  # seconds one `wait_script` call waits at most
LOST_RETRY = 2  # seconds between polls while the submit guest cannot be reached
RUNNING = ("PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "REQUEUED", "RESIZING", "STOPPED")


def batch_script(run: BenchmarkRun, nodes: tuple[str, ...], per_node: int, gpus_per_node: int | None,
                 srun: Shell) -> str:
    """The batch script of one job: its allocation as #SBATCH lines, then the srun line."""
    return render_script("sbatch.j2", nodes=list(nodes), per_node=per_node, gpus_per_node=gpus_per_node,
                         minutes=max(1, math.ceil(run.timeout / 60)), output=OUTPUT, srun=srun)


def submit_command(run: BenchmarkRun) -> Shell:
    """sbatch, the batch script on its stdin; `srun_args` are the allocation's (--partition ...)."""
    return Shell(shlex.join(["sbatch", "--parsable", *run.srun_args]))


@dataclass(frozen=True)
class JobState:
    """A job as `scontrol show job -o` shows it."""

    id: int
    state: str  # JobState: PENDING, RUNNING, COMPLETED, FAILED, CANCELLED, TIMEOUT, ...
    reason: str  # Reason: why it is pending (Resources, PartitionNodeLimit) or ended (NonZeroExitCode)
    exit_code: str  # ExitCode: "<status>:<signal>"
    batch_host: str | None  # the node that runs the batch script (and writes its output)
    output: str | None  # StdOut: the output file's path there
    line: str  # as scontrol printed it

    @property
    def ended(self) -> bool:
        return self.state not in RUNNING

    @property
    def succeeded(self) -> bool:
        return self.state == "COMPLETED" and self.exit_code == "0:0"


_FIELD = re.compile(r"(?:^|\s)(\w+)=(\S*)")


def parse_job(text: str) -> JobState | None:
    """The job in `scontrol show job -o ID`'s line; None when Slurm does not know it (any more)."""
    line = next((line for line in text.splitlines() if line.startswith("JobId=")), None)
    if line is None:
        return None
    fields = dict(_FIELD.findall(line))
    known = lambda name: None if fields.get(name, "(null)") in ("", "(null)") else fields[name]  # noqa: E731
    return JobState(int(fields["JobId"]), fields.get("JobState", "UNKNOWN"), fields.get("Reason", "None"),
                    fields.get("ExitCode", ""), known("BatchHost"), known("StdOut"), line)


def wait_script(job_id: int, seconds: float) -> str:
    """Up to `seconds`, until the job ended; then its `scontrol show job -o` line."""
    states = "|".join(f"*JobState={s}\\ *" for s in RUNNING)
    return (f"i=0; while :; do s=$(scontrol show job -o {job_id} 2>&1); case \"$s\" in {states}) "
            f"[ $i -lt {max(1, int(seconds * 2))} ] || break;; *) break;; esac; sleep 0.5; i=$((i+1)); done; "
            f"printf '%s\\n' \"$s\"")


@dataclass
class BatchJob:
    """One submitted job, waited for and read back (`run_batch`)."""

    id: int | None = None
    error: str | None = None  # why the point failed; None when the job completed with exit 0


def run_batch(executors: Mapping[str, Executor], submit: str, script: str, batch: str, run: BenchmarkRun,
              pidfile: str, sink: BinaryIO, clock: Callable[[], float] = time.monotonic) -> BatchJob:
    """Submit `batch` with `script` on `submit`, wait until the job ended, write its output to `sink`.
    A job still pending `queue_timeout` after its submission is cancelled (its scontrol line in the
    log: slurm.refusal reads Slurm's reason there). Gives up on a submit guest it cannot reach for
    the run's timeout and a minute."""
    executor = executors[submit]
    started = clock()
    said = executor.run_script(script, timeout=60, check=False, stdin=batch.encode())
    job = BatchJob(parse_job_id(said.stdout.strip().splitlines()[-1].split(";")[0]) if said.stdout.strip() else None)
    if said.exit_code != 0 or job.id is None:  # sbatch's words in the log (the job id is in results.json)
        sink.write(said.stdout.encode())
        job.error = f"exited {said.exit_code}"
        return job
    state = _wait(executor, job.id, run, started, clock, pidfile)
    if state is None:
        job.error = f"Slurm no longer knows job {job.id}"
        return job
    if state.state == "PENDING":  # past queue_timeout: cancelled
        sink.write(f"{state.line}\n".encode())
        job.error = f"cancelled after {run.queue_timeout:g}s in the queue (queue_timeout)"
        return job
    if state.output is not None:  # the job's output, on its batch host
        reader = executors.get(state.batch_host or "", executor)
        path = shlex.quote(state.output)
        reader.run_script(f"cat {path} && rm -f {path}", timeout=120, check=False, stdout_to=sink)
    if not state.succeeded:
        status = state.exit_code.split(":")[0]
        job.error = f"exited {status}" if state.state == "FAILED" else f"Slurm job {job.id} ended {state.state}"
    return job


def _wait(executor: Executor, job_id: int, run: BenchmarkRun, started: float, clock: Callable[[], float],
          pidfile: str) -> JobState | None:
    """Poll until the job ended, or is still pending at `queue_timeout` (then cancelled)."""
    give_up = started + run.timeout + 60
    lost: ConnectError | None = None
    while clock() < give_up:
        pending_left = started + run.queue_timeout - clock()  # then a poll returns to check the queue
        chunk = max(0.5, min(POLL, pending_left)) if pending_left > 0 else POLL
        try:
            said = executor.run_script(wait_script(job_id, chunk), timeout=POLL + 30, check=False)
        except ConnectError as e:  # the session dropped: the job goes on in Slurm; poll again
            lost = e
            if UNDER_WAY.interrupted.wait(LOST_RETRY):
                raise
            continue
        state = parse_job(said.stdout)
        if state is None or state.ended:
            return state
        if state.state == "PENDING" and clock() >= started + run.queue_timeout:
            executor.run_script(cancel_script(pidfile), timeout=30, check=False)
            return state
    raise ConnectError(f"lost Slurm job {job_id}: {lost}") if lost else ConnectError(
        f"Slurm job {job_id} did not end within {run.timeout:g}s")
