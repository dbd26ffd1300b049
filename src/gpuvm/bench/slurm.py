"""`launch: srun`: a benchmark job through Slurm, submitted from one guest over one SSH session
(`launch: sbatch`, bench/batch.py, submits a batch job instead, named and cancelled the same way).

The job runs as `srun` on the submit guest (`submit_guest`); every other guest is reached through
Slurm too (`SlurmRelay`: uploads, checks and environment reads as one-task job steps), so a campaign
opens one SSH connection from this machine whatever its node count. Each job is named after its
run's pid file (`job_name`, given to srun as SLURM_JOB_NAME): stopping it is `scancel --name`, and its
job id is read back by that name once it ended. A job Slurm refuses, or keeps pending past
`queue_timeout` (srun --immediate), ends as a failed point with Slurm's own words (`refusal`).
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping
from typing import BinaryIO

from gpuvm.errors import ConnectError, listed
from gpuvm.executors.base import CommandResult, Executor, check_result
from gpuvm.runbook.model import Guest, Runbook

CANCEL_WAIT = 10  # seconds scancel's job may take to leave squeue
RELAY_QUEUE = 60  # seconds a relayed command's one-task job may wait for its node


def submit_guest(runbook: Runbook) -> str:
    """The guest srun runs on: `benchmarks.launcher`, else the runbook's Slurm controller
    (`slurm.controller`), else the first guest."""
    guests = runbook.guests.hosts if runbook.guests else []
    launcher = runbook.benchmarks.launcher if runbook.benchmarks else None
    return launcher or (runbook.slurm.controller if runbook.slurm else None) or guests[0].vm


def node_name(guest: Guest) -> str:
    """The guest's Slurm node name: its VM name (the guest's hostname)."""
    return guest.vm


def job_name(pidfile: str) -> str:
    """The Slurm job name of the run whose pid file is `pidfile` (gpuvm-run-<token>.pid)."""
    return pidfile.removesuffix(".pid")


def job_env(pidfile: str, launch: str = "srun") -> str:
    """The assignment in front of a job's srun (or sbatch) that names its Slurm job."""
    return f"{'SBATCH' if launch == 'sbatch' else 'SLURM'}_JOB_NAME={shlex.quote(job_name(pidfile))}"


def cancel_script(pidfile: str) -> str:
    """Cancel the job (pending or running) and wait until squeue no longer lists it."""
    name = shlex.quote(job_name(pidfile))
    return (f"scancel --name={name} 2>/dev/null; i=0; while [ $i -lt {CANCEL_WAIT * 5} ] && "
            f"[ -n \"$(squeue -h --name={name} -o %i 2>/dev/null)\" ]; do sleep 0.2; i=$((i+1)); done; true")


def job_id_script(pidfile: str) -> str:
    """The id of the job of that name (finished ones too, while slurmctld keeps them: MinJobAge)."""
    return f"squeue -h --states=all --name={shlex.quote(job_name(pidfile))} -o %i 2>/dev/null | tail -n 1"


def parse_job_id(text: str) -> int | None:
    word = text.strip()
    return int(word) if word.isdigit() else None


_REASON = re.compile(r"^s(?:run|batch): (?:error: )?(?P<said>(?:Unable to allocate resources|Requested |Job allocation \d+ has been "
                     r"revoked|Required node not available|Invalid |Batch job submission failed).*)$", re.M)
_QUEUED = re.compile(r"^srun: job (?P<id>\d+) queued and waiting for resources", re.M)
# launch sbatch: the job's `scontrol show job -o` line, logged when it was cancelled still pending
_PENDING = re.compile(r"^JobId=(?P<id>\d+) .*\bJobState=PENDING Reason=(?P<reason>\S+)", re.M)


def refusal(text: str) -> str | None:
    """What Slurm said when it did not start the job (refused it, or kept it pending past
    --immediate or queue_timeout), from srun's or sbatch's lines in the log, or the pending job's
    scontrol line (its Reason=); None when it started."""
    said = list(dict.fromkeys(m.group("said").strip() for m in _REASON.finditer(text)))
    queued = _QUEUED.search(text)
    if not said and (pending_job := _PENDING.search(text)):
        queued, said = pending_job, [f"Reason={pending_job.group('reason')}"]
    if not said:
        return None
    pending = f"job {queued.group('id')} was pending; " if queued else ""
    return f"Slurm did not start the job: {pending}" + "; ".join(said)


class SlurmRelay(Executor):
    """A guest reached through Slurm from the submit guest's executor: each command is a one-task
    job step on that node (`srun -w NODE`), its stdin passed on. No connection of its own."""

    def __init__(self, name: str, node: str, submit: Executor):
        self.name = name
        self.node = node
        self.submit = submit

    def _execute(self, command: str, timeout: float, check: bool, stdin: bytes | None,
                 stdout_to: BinaryIO | None) -> CommandResult:
        relayed = (f"srun --nodes=1 --ntasks=1 --nodelist={shlex.quote(self.node)} --immediate={RELAY_QUEUE} "
                   f"--job-name=gpuvm-relay sh -c {shlex.quote(command)}")
        try:
            result = self.submit.run_script(relayed, timeout=timeout, check=False, stdin=stdin, stdout_to=stdout_to)
        except ConnectError as e:
            raise SubmitUnreachable(self.submit.name, e, [self.name]) from None
        result = CommandResult(command, result.exit_code, result.stdout, result.stderr)
        return check_result(self.name, result) if check else result


class SubmitUnreachable(ConnectError):
    """The Slurm submit guest did not answer: neither it nor any guest relayed through it was reached."""

    def __init__(self, submit: str, cause: ConnectError, relayed: list[str]):
        self.submit, self.cause, self.relayed = submit, cause, relayed
        self.code = cause.code  # host-key stays host-key
        why = str(cause).removeprefix(f"{submit}: ")
        super().__init__(f"the Slurm submit guest {submit} cannot be reached ({why}); srun reaches "
                         f"{listed(relayed)} through it: not reached either")


def one_per_submit(failed: Mapping[str, Exception]) -> dict[str, Exception]:
    """Failures of many guests, those of the guests relayed through a submit guest that was not reached
    folded into one failure of that submit guest (its own connection error its cause)."""
    relayed: dict[str, list[str]] = {}
    causes: dict[str, ConnectError] = {}
    for error in failed.values():
        if isinstance(error, SubmitUnreachable):
            relayed.setdefault(error.submit, []).extend(error.relayed)
            causes.setdefault(error.submit, error.cause)
    kept = {t: e for t, e in failed.items() if t not in relayed and not isinstance(e, SubmitUnreachable)}
    for submit, guests in relayed.items():
        own = failed.get(submit)
        kept[submit] = SubmitUnreachable(submit, own if isinstance(own, ConnectError) else causes[submit], guests)
    return kept
