"""`launch: srun`: the srun line, the submit guest, Slurm's job id and refusals, scancel on a stop,
and the guests reached through Slurm instead of an SSH connection each."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from gpuvm.bench.campaign import plan_campaign
from gpuvm.bench.results import load_results
from gpuvm.bench.runner import CampaignRunner, executors_for
from gpuvm.bench.slurm import SlurmRelay, refusal
from gpuvm.errors import InputError
from gpuvm.executors.base import CommandResult
from gpuvm.executors.fake import FakeExecutor
from tests.unit.test_bench_run import INFRA, Script, book, horovod_output, ok, one_run

NO_GPUS = INFRA.replace(", gpus: {mode: passthrough, count: 2}", "").replace(", gpus: {mode: passthrough, count: 1}", "")

# srun 22.05's own words (Debian bookworm), from a 2-node cluster: 3 nodes asked, then 64 CPUs on one
PENDING_3_NODES = """\
srun: Requested partition configuration not available now
srun: job 2 queued and waiting for resources
srun: error: Unable to allocate resources: Requested nodes are busy
"""
INVALID = "srun: error: Unable to allocate resources: Requested node configuration is not available\n"


def test_srun_line_names_the_nodes_in_runbook_order_and_is_submitted_from_the_launcher(tmp_path):
    runbook = book(tmp_path, "launcher: vm3\n" + one_run(kind="pytorch_train", launch="srun", nodes=[1, 3],
                                                          gpus_per_vm=1), infra=NO_GPUS)  # --mpi: the cluster's
    one, three = plan_campaign(runbook)
    assert [j.launcher for p in (one, three) for j in p.jobs] == ["vm3", "vm3"]  # the submit guest
    assert one.jobs[0].nodes == ("vm3",) and three.jobs[0].nodes == ("vm1", "vm2", "vm3")
    assert three.guests == ("vm1", "vm2", "vm3")
    assert three.jobs[0].command == (
        "env MASTER_ADDR=10.0.0.1 MASTER_PORT=29500 NCCL_DEBUG=INFO 'NCCL_SOCKET_IFNAME=^lo,docker0' "
        "srun --nodes=3 --nodelist=vm1,vm2,vm3 --ntasks-per-node=1 --immediate=300 "
        "--kill-on-bad-exit=1 python3 pytorch_train.py --model resnet50 --batch-size 64 --precision fp32")


def test_without_a_launcher_srun_is_submitted_from_the_slurm_controller(tmp_path):
    runbook = book(tmp_path, one_run(kind="pytorch_train", launch="srun", nodes=[2], gpus_per_vm=1),
                   infra=NO_GPUS + "slurm: {controller: vm2, cgroup: null}\n")
    assert [j.launcher for p in plan_campaign(runbook) for j in p.jobs] == ["vm2"]


def test_srun_asks_for_gpus_only_where_the_vms_have_some(tmp_path):
    with_gpus = book(tmp_path, one_run(kind="nccl_allreduce", launch="srun", srun_mpi="pmi2", nodes=[2],
                                       gpus_per_vm=2, queue_timeout=30, srun_args=["--partition", "gpu"]))
    [point] = plan_campaign(with_gpus)
    assert ("srun --mpi=pmi2 --nodes=2 --nodelist=vm1,vm2 --ntasks-per-node=2 --gpus-per-node=2 --immediate=30 "
            "--kill-on-bad-exit=1 --partition gpu all_reduce_perf") in point.jobs[0].command
    (tmp_path / "b").mkdir()
    without = book(tmp_path / "b", one_run(kind="nccl_allreduce", launch="srun", nodes=[2]), infra=NO_GPUS)
    assert "--gpus-per-node" not in plan_campaign(without)[0].jobs[0].command


@pytest.mark.parametrize("fields, error", [
    ({"launch": "mpirun", "srun_args": ["-p", "x"]}, "`srun_args` is read only with launch: srun"),
    ({"launch": "srun", "mpirun_args": ["-x", "A"]}, "`mpirun_args` is read only with launch: mpirun or torchrun"),
    ({"launch": "srun", "srun_mpi": "openmpi"}, "srun_mpi"),
])
def test_srun_fields_are_checked(tmp_path, fields, error):
    with pytest.raises(InputError, match=re.escape(error)):
        book(tmp_path, one_run(kind="pytorch_train", **fields))


def test_srun_refuses_containers_and_local(tmp_path):
    with pytest.raises(InputError, match="launch: srun starts the ranks on the guests themselves"):
        plan_campaign(book(tmp_path, "container: true\n" + one_run(kind="pytorch_train", launch="srun")))
    with pytest.raises(InputError, match="--local has none"):
        plan_campaign(book(tmp_path, one_run(kind="pytorch_train", launch="srun")), local=True)


def test_refusal_is_slurms_own_reason():
    assert refusal(PENDING_3_NODES) == ("Slurm did not start the job: job 2 was pending; Requested partition "
                                        "configuration not available now; Unable to allocate resources: Requested "
                                        "nodes are busy")
    assert refusal(INVALID) == "Slurm did not start the job: Unable to allocate resources: Requested node " \
                               "configuration is not available"
    assert refusal("Total img/sec on 2 CPU(s): 10.0 +-1.0\nsrun: error: gpu-vm-02: task 1: Exited with exit code 1\n") is None


def slurm_fake(name: str, launch, job_id: str = "17\n") -> FakeExecutor:
    return FakeExecutor(name, {
        re.compile(r"exec env .*srun "): launch,
        re.compile(r"^squeue -h --states=all --name=gpuvm-run-\w+ -o %i"): ok(job_id),
        re.compile(r"^scancel --name=gpuvm-run-\w+"): ok(),
        re.compile(r"^mkdir -p"): ok(),
        re.compile(r"(test -e|command -v) .* \|\| echo"): ok(),
        re.compile(r"--version|nvidia-smi"): ok(),
    })


def run_campaign(tmp_path: Path, section: str, executors: dict):
    runbook = book(tmp_path, section, infra=NO_GPUS)
    runner = CampaignRunner(runbook, plan_campaign(runbook), executors, tmp_path / "results")
    runner.prepare()
    return runner.run()


def test_job_id_recorded_and_job_named_after_its_run(tmp_path):
    vm1 = slurm_fake("vm1", Script(ok(horovod_output(50.0, 2))))
    done = run_campaign(tmp_path, one_run(kind="pytorch_train", launch="srun", nodes=[2], repeats=1),
                        {"vm1": vm1, "vm2": FakeExecutor("vm2", {re.compile("."): ok()})})
    [repeat] = load_results(done.results_file).benchmarks[0].points[0].repeats
    assert (repeat.value, repeat.slurm_jobs, repeat.error) == (50.0, [17], None)
    assert not [path for path in vm1.files if "hostfile" in path]  # srun's nodes are on its line
    [launched] = [c.command for c in vm1.calls if "srun" in c.command and "exec" in c.command]
    pidfile = re.search(r"echo \$\$ > (gpuvm-run-\w+)\.pid", launched).group(1)
    assert f"&& SLURM_JOB_NAME={pidfile} exec env " in launched  # the job's name: its run's token
    assert any(c.command.startswith(f"squeue -h --states=all --name={pidfile} ") for c in vm1.calls)


def test_a_job_slurm_did_not_start_fails_with_slurms_reason(tmp_path):
    vm1 = slurm_fake("vm1", Script(CommandResult("", 1, PENDING_3_NODES, "")), job_id="")
    done = run_campaign(tmp_path, one_run(kind="pytorch_train", launch="srun", nodes=[2], repeats=1),
                        {"vm1": vm1, "vm2": FakeExecutor("vm2", {re.compile("."): ok()})})
    [failure] = done.failures
    assert failure.error == ("exited 1: Slurm did not start the job: job 2 was pending; Requested partition "
                             "configuration not available now; Unable to allocate resources: Requested nodes are busy")
    assert load_results(done.results_file).benchmarks[0].points[0].repeats[0].slurm_jobs is None


def test_ctrl_c_cancels_the_slurm_job_before_stopping_srun(tmp_path):
    vm1 = slurm_fake("vm1", Script(KeyboardInterrupt()))
    done = run_campaign(tmp_path, one_run(kind="pytorch_train", launch="srun", nodes=[2], repeats=1),
                        {"vm1": vm1, "vm2": FakeExecutor("vm2", {re.compile("."): ok()})})
    assert done.interrupted
    launched = next(c.command for c in vm1.calls if "exec env" in c.command)
    name = re.search(r"SLURM_JOB_NAME=(gpuvm-run-\w+)", launched).group(1)
    stop = next(c.command for c in vm1.calls if c.command.startswith("scancel"))
    assert stop.startswith(f"scancel --name={name} ") and f"squeue -h --name={name} -o %i" in stop  # waits it out
    assert stop.index("scancel") < stop.index("kill -TERM")


def test_a_slurm_campaign_connects_to_its_submit_guest_only(tmp_path, mocker):
    opened = mocker.patch("gpuvm.remote.ssh_executor", side_effect=lambda rb, sd, o, name, *a: FakeExecutor(name))
    runbook = book(tmp_path, "launcher: vm2\n" + one_run(kind="pytorch_train", launch="srun", nodes=[4]), infra=NO_GPUS)
    executors = executors_for(runbook, plan_campaign(runbook), False, tmp_path)
    assert [call.args[3] for call in opened.call_args_list] == ["vm2"]
    assert sorted(executors) == ["vm1", "vm2", "vm3", "vm4"]
    relay = executors["vm4"]
    assert isinstance(relay, SlurmRelay) and relay.submit is executors["vm2"]
    # a mixed campaign keeps an SSH connection per guest (mpirun needs them)
    (tmp_path / "m").mkdir()
    mixed = book(tmp_path / "m", "runs:\n    - {name: a, kind: pytorch_train, launch: srun, nodes: [2]}\n"
                                 "    - {name: b, kind: pytorch_train, nodes: [2]}\n", infra=NO_GPUS)
    opened.reset_mock()
    executors_for(mixed, plan_campaign(mixed), False, tmp_path)
    assert sorted(call.args[3] for call in opened.call_args_list) == ["vm1", "vm2"]


def test_relay_runs_each_command_as_a_one_task_step_on_its_node_with_stdin():
    submit = FakeExecutor("vm1", {re.compile(r"^srun "): ok("hi\n")})
    relay = SlurmRelay("vm4", "vm4", submit)
    relay.put(b"data", ".gpuvm-bench/x.py", mode=0o755)
    assert relay.run(["echo", "hi"]).stdout == "hi\n"
    put, echo = submit.calls
    assert put.command.startswith("srun --nodes=1 --ntasks=1 --nodelist=vm4 --immediate=60 --job-name=gpuvm-relay sh -c ")
    assert put.stdin == b"data" and "x.py" in put.command
    assert echo.command.endswith("sh -c 'echo hi'")
    submit.responses = {re.compile("."): CommandResult("", 3, "", "srun: error: vm4: task 0: Exited with exit code 3")}
    with pytest.raises(Exception, match=r"^vm4: `echo hi` exited 3: srun: error"):
        relay.run(["echo", "hi"])


def test_concurrent_srun_jobs_are_one_step_per_vm_submitted_from_the_launcher(tmp_path):
    runbook = book(tmp_path, one_run(kind="pytorch_train", launch="srun", scenario="concurrent",
                                     groups=[["vm2", "vm4"]], gpus_per_vm=1), infra=NO_GPUS)
    [point] = plan_campaign(runbook)
    assert [(j.launcher, j.vm, j.nodes) for j in point.jobs] == [("vm1", "vm2", ("vm2",)), ("vm1", "vm4", ("vm4",))]
    assert "MASTER_ADDR=10.0.0.4" in point.jobs[1].command  # each job its own rank 0
    assert "--nodes=1 --nodelist=vm4 --ntasks-per-node=1" in point.jobs[1].command


def test_dry_run_shows_the_srun_line(tmp_path):
    from gpuvm.bench.dry_run import describe

    runbook = book(tmp_path, one_run(kind="pytorch_train", launch="srun", srun_mpi="pmix", nodes=[2]), infra=NO_GPUS)
    text = "\n".join(describe(plan_campaign(runbook), ".gpuvm-bench"))
    assert "  on vm1 (through Slurm on vm1, vm2)\n" in text and "hostfile" not in text
    assert "srun --mpi=pmix --nodes=2 --nodelist=vm1,vm2" in text


def test_a_submit_guest_not_reached_is_told_once_as_the_slurm_submit_guest(tmp_path, mocker):
    """Every other guest is reached through the submit guest: when it does not answer, the campaign says
    so once (exit 3), not once per guest under another guest's name."""
    from gpuvm.bench.guest_lock import GuestLocks
    from gpuvm.errors import ConnectError

    down = mocker.MagicMock(spec=FakeExecutor("vm2"))
    down.name = "vm2"
    down.run_script.side_effect = ConnectError("vm2: cannot connect to 10.0.0.2:22: timed out")
    mocker.patch("gpuvm.remote.ssh_executor", return_value=down)
    runbook = book(tmp_path, "launcher: vm2\n" + one_run(kind="pytorch_train", launch="srun", nodes=[4]), infra=NO_GPUS)
    executors = executors_for(runbook, plan_campaign(runbook), False, tmp_path)
    with pytest.raises(ConnectError) as refused:
        with GuestLocks(executors, "campaign"):
            pass
    text = str(refused.value)
    assert refused.value.exit_code == 3
    assert text.count("cannot connect to 10.0.0.2:22: timed out") == 1, text
    assert text.count("the Slurm submit guest vm2") == 1 and "vm1: vm2" not in text, text
    assert all(guest in text for guest in ("vm1", "vm3", "vm4")), text  # the guests it stands between
