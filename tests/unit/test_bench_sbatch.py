"""`launch: sbatch`: each point a Slurm batch job (templates/bench/sbatch.j2 around the srun line),
its id from `sbatch --parsable`, waited for by polling `scontrol show job` (bench/batch.py), its
output read back from its batch host, Slurm's reason when it never started, scancel on a stop."""

from __future__ import annotations

import io
import re

import pytest

from gpuvm.bench.batch import parse_job, run_batch
from gpuvm.bench.campaign import plan_campaign
from gpuvm.bench.results import load_results
from gpuvm.bench.slurm import refusal
from gpuvm.errors import ConnectError, InputError
from gpuvm.executors.base import CommandResult
from gpuvm.executors.fake import FakeExecutor
from tests.unit.test_bench_run import Script, book, horovod_output, ok, one_run
from tests.unit.test_bench_srun import NO_GPUS, run_campaign


def test_sbatch_point_is_a_batch_script_around_the_srun_line(tmp_path):
    runbook = book(tmp_path, one_run(kind="pytorch_train", launch="sbatch", srun_mpi="pmix", nodes=[2],
                                     timeout=90, srun_args=["--partition", "gpu"]), infra=NO_GPUS)
    [point] = plan_campaign(runbook)
    [job] = point.jobs
    assert job.launcher == "vm1" and job.nodes == ("vm1", "vm2")
    assert job.command == "sbatch --parsable --partition gpu"  # the script on its stdin
    assert job.batch.splitlines() == [
        "#!/bin/sh",
        "#SBATCH --nodes=2",
        "#SBATCH --nodelist=vm1,vm2",
        "#SBATCH --ntasks-per-node=1",
        "#SBATCH --time=2",  # minutes: the point's timeout, rounded up
        "#SBATCH --output=gpuvm-batch-%j.out",
        "env MASTER_ADDR=10.0.0.1 MASTER_PORT=29500 NCCL_DEBUG=INFO 'NCCL_SOCKET_IFNAME=^lo,docker0' "
        "srun --mpi=pmix --nodes=2 --nodelist=vm1,vm2 --ntasks-per-node=1 --kill-on-bad-exit=1 "
        "python3 pytorch_train.py --model resnet50 --batch-size 64 --precision fp32",
    ]


# `scontrol show job -o` lines of Slurm 22.05 (Debian bookworm), cut to the fields gpuvm reads
def scontrol(state: str, reason: str = "None", exit_code: str = "0:0", host: str = "vm2", job: int = 17) -> str:
    batch_host = host if state != "PENDING" else "(null)"
    return (f"JobId={job} JobName=gpuvm-run-1a2b3c4d UserId=gpuadmin(1000) GroupId=gpuadmin(1000) MCS_label=N/A "
            f"Priority=1 Nice=0 Account=(null) QOS=(null) JobState={state} Reason={reason} Dependency=(null) "
            f"Requeue=1 Restarts=0 BatchFlag=1 Reboot=0 ExitCode={exit_code} RunTime=00:00:03 TimeLimit=00:02:00 "
            f"Partition=debug NodeList=vm1,vm2 BatchHost={batch_host} NumNodes=2 NumCPUs=2 NumTasks=2 "
            f"WorkDir=/home/gpuadmin/.gpuvm-bench StdErr=/home/gpuadmin/.gpuvm-bench/gpuvm-batch-{job}.out "
            f"StdIn=/dev/null StdOut=/home/gpuadmin/.gpuvm-bench/gpuvm-batch-{job}.out Power=\n")


REFUSED = "sbatch: error: Batch job submission failed: Node count specification invalid\n"


def test_scontrols_line_is_read_into_the_jobs_state():
    running = parse_job(scontrol("RUNNING"))
    assert (running.id, running.state, running.ended, running.batch_host) == (17, "RUNNING", False, "vm2")
    assert running.output == "/home/gpuadmin/.gpuvm-bench/gpuvm-batch-17.out"
    failed = parse_job(scontrol("FAILED", "NonZeroExitCode", "1:0"))
    assert (failed.ended, failed.succeeded, failed.exit_code) == (True, False, "1:0")
    pending = parse_job(scontrol("PENDING", "PartitionNodeLimit"))
    assert (pending.reason, pending.batch_host, pending.ended) == ("PartitionNodeLimit", None, False)
    assert parse_job(scontrol("COMPLETED")).succeeded
    assert parse_job("slurm_load_jobs error: Invalid job id specified\n") is None


def test_refusal_reads_sbatchs_error_and_a_pending_jobs_reason():
    assert refusal(REFUSED) == "Slurm did not start the job: Batch job submission failed: Node count specification invalid"
    assert refusal("17\n" + scontrol("PENDING", "Resources")) == \
        "Slurm did not start the job: job 17 was pending; Reason=Resources"
    assert refusal("17\n" + scontrol("COMPLETED")) is None


def test_sbatch_run_fields_and_local_are_checked(tmp_path):
    with pytest.raises(InputError, match=re.escape("launch: sbatch submits to the guests' Slurm; --local has none")):
        plan_campaign(book(tmp_path, one_run(kind="pytorch_train", launch="sbatch")), local=True)
    with pytest.raises(InputError, match="launch: sbatch starts the ranks on the guests themselves"):
        plan_campaign(book(tmp_path, "container: true\n" + one_run(kind="pytorch_train", launch="sbatch")))


def batch_fake(name: str, polls, submitted=None) -> FakeExecutor:
    return FakeExecutor(name, {
        re.compile(r"exec sbatch --parsable"): submitted or ok("17\n"),
        re.compile(r"scontrol show job -o 17"): polls,
        re.compile(r"^cat /home/gpuadmin/.gpuvm-bench/gpuvm-batch-17.out && rm -f"): ok(horovod_output(50.0, 2)),
        re.compile(r"^scancel --name=gpuvm-run-\w+"): ok(),
        re.compile(r"^mkdir -p"): ok(),
        re.compile(r"(test -e|command -v) .* \|\| echo"): ok(),
        re.compile(r"--version|nvidia-smi"): ok(),
    })


LAST = "[1,0]<stdout>:Total img/sec on 2 GPU(s): 50.0 +-1.0"
SECTION = one_run(kind="pytorch_train", launch="sbatch", nodes=[2], repeats=1)


def test_the_job_is_submitted_waited_for_and_its_output_read_on_its_batch_host(tmp_path):
    vm1 = batch_fake("vm1", Script(ok(scontrol("PENDING", "Resources")), ok(scontrol("RUNNING")),
                                   ok(scontrol("COMPLETED"))))
    vm2 = batch_fake("vm2", None)
    done = run_campaign(tmp_path, SECTION, {"vm1": vm1, "vm2": vm2})
    [repeat] = load_results(done.results_file).benchmarks[0].points[0].repeats
    assert (repeat.value, repeat.slurm_jobs, repeat.error) == (50.0, [17], None)
    submit = next(c for c in vm1.calls if "exec sbatch" in c.command)
    name = re.search(r"echo \$\$ > (gpuvm-run-\w+)\.pid", submit.command).group(1)
    assert f"&& SBATCH_JOB_NAME={name} exec sbatch --parsable 2>&1" in submit.command
    assert submit.stdin.decode().startswith("#!/bin/sh\n#SBATCH --nodes=2\n")  # the script, on sbatch's stdin
    assert [c.command for c in vm2.calls if c.command.startswith("cat ")]  # BatchHost=vm2 wrote the output
    assert not [c for c in vm1.calls if c.command.startswith("cat ")]
    log = (done.results_file.parent / repeat.log).read_text()
    assert log == horovod_output(50.0, 2)  # the job's output alone
    batch = (done.results_file.parent / "logs/b/nodes-2/sbatch.sh").read_text()
    assert "#SBATCH --nodelist=vm1,vm2" in batch  # what sbatch read, kept with the logs


def test_a_lost_session_costs_one_poll_and_the_wait_goes_on(tmp_path, mocker):
    mocker.patch("gpuvm.bench.batch.LOST_RETRY", 0.01)
    vm1 = batch_fake("vm1", Script(ConnectError("vm1: lost the connection to 10.0.0.1:22"),
                                   ok(scontrol("COMPLETED", host="vm1"))))
    done = run_campaign(tmp_path, SECTION, {"vm1": vm1, "vm2": batch_fake("vm2", None)})
    [repeat] = load_results(done.results_file).benchmarks[0].points[0].repeats
    assert (repeat.value, repeat.error) == (50.0, None)
    assert not [c for c in vm1.calls if c.command.startswith("scancel")]  # the job was left to run


@pytest.mark.parametrize("submitted, polls, error", [
    (CommandResult("", 1, REFUSED, ""), None,
     "exited 1: Slurm did not start the job: Batch job submission failed: Node count specification invalid"),
    (None, ok(scontrol("FAILED", "NonZeroExitCode", "1:0")), f"exited 1: {LAST}"),  # the output's last line
    (None, ok(scontrol("TIMEOUT", "TimeLimit", "0:15")), f"Slurm job 17 ended TIMEOUT: {LAST}"),
    (None, ok("slurm_load_jobs error: Invalid job id specified\n"), "Slurm no longer knows job 17"),
])
def test_a_job_that_slurm_refused_or_that_failed_is_a_failed_point(tmp_path, submitted, polls, error):
    vm2 = batch_fake("vm2", None)
    done = run_campaign(tmp_path, SECTION, {"vm1": batch_fake("vm1", polls, submitted), "vm2": vm2})
    [failure] = done.failures
    assert failure.error == error
    assert load_results(done.results_file).benchmarks[0].points[0].repeats[0].slurm_jobs == (None if submitted else [17])


def test_a_job_pending_past_queue_timeout_is_cancelled_with_slurms_reason(tmp_path):
    runbook = book(tmp_path, one_run(kind="pytorch_train", launch="sbatch", nodes=[2], queue_timeout=30), infra=NO_GPUS)
    [point] = plan_campaign(runbook)
    now = [0.0]

    def poll(call):  # each poll takes 10 s
        now[0] += 10
        return ok(scontrol("PENDING", "PartitionNodeLimit"))

    vm1 = batch_fake("vm1", poll)
    sink = io.BytesIO()
    job = run_batch({"vm1": vm1}, "vm1", "exec sbatch --parsable", point.jobs[0].batch, point.run,
                    "gpuvm-run-1a2b3c4d.pid", sink, clock=lambda: now[0])
    assert (job.id, job.error) == (17, "cancelled after 30s in the queue (queue_timeout)")
    polls = [c.command for c in vm1.calls if "scontrol" in c.command]
    assert len(polls) == 3  # at 10, 20 and 30 s
    assert vm1.calls[-1].command.startswith("scancel --name=gpuvm-run-1a2b3c4d ")
    assert sink.getvalue().decode() == scontrol("PENDING", "PartitionNodeLimit")  # Slurm's words, for the log
    assert refusal(sink.getvalue().decode()) == "Slurm did not start the job: job 17 was pending; Reason=PartitionNodeLimit"


def test_ctrl_c_while_waiting_cancels_the_job_and_kills_nothing_on_the_submit_guest(tmp_path):
    vm1 = batch_fake("vm1", Script(ok(scontrol("RUNNING")), KeyboardInterrupt()))
    done = run_campaign(tmp_path, SECTION, {"vm1": vm1, "vm2": batch_fake("vm2", None)})
    assert done.interrupted
    name = re.search(r"SBATCH_JOB_NAME=(gpuvm-run-\w+)", next(c.command for c in vm1.calls if "exec sbatch" in c.command))[1]
    stop = next(c.command for c in vm1.calls if c.command.startswith("scancel"))
    assert stop.startswith(f"scancel --name={name} ") and f"squeue -h --name={name} -o %i" in stop
    assert "kill" not in stop  # sbatch ended at submission: its pid may be another process's by now


def test_dry_run_shows_the_submission_and_the_batch_script(tmp_path):
    from gpuvm.bench.dry_run import describe

    runbook = book(tmp_path, one_run(kind="pytorch_train", launch="sbatch", nodes=[2]), infra=NO_GPUS)
    text = "\n".join(describe(plan_campaign(runbook), ".gpuvm-bench"))
    assert "  on vm1 (through Slurm on vm1, vm2)\n" in text and "exec sbatch --parsable 2>&1\n" in text
    assert "\n      #SBATCH --nodelist=vm1,vm2\n" in text and "\n      env MASTER_ADDR=10.0.0.1 " in text
