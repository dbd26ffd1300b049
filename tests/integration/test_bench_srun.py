"""`launch: srun` for real: gpuvm's PyTorch workload through Slurm (Debian's slurmctld, slurmd and
munge on the SSH test bed's four guests, testbed/slurm_cluster.py) across 1, 2 and 4 nodes,
submitted from gpu-vm-01 over the one SSH connection the campaign opens; `launch: sbatch` (a batch
job) on 2; a job Slurm cannot place fails with Slurm's reason; SIGTERM of `gpuvm bench run` leaves
no job in squeue, with either launch."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest

from gpuvm.bench.results import load_results
import slurm_cluster  # testbed/, on the path (conftest)
from tests.integration.test_bench_run import GUESTS, PYTHON, TRAIN_1_2_4, all_logs, bed_runbook, gpuvm, results_dir

pytestmark = pytest.mark.integration
CONTROLLER = GUESTS[0]


@pytest.fixture(scope="module")
def slurm(testbed):
    started = time.monotonic()
    slurm_cluster.start(testbed, GUESTS)
    print(f"\nSlurm up on {len(GUESTS)} guests in {time.monotonic() - started:.1f}s")
    yield testbed
    slurm_cluster.stop(testbed, GUESTS)
    for name in GUESTS:  # what the campaigns left in the guests' homes
        slurm_cluster.in_guest(testbed, name, "rm -rf /home/gpuadmin/.gpuvm-bench", check=False)


def logins(bed) -> dict[str, int]:
    """SSH logins each guest's sshd accepted so far (its log)."""
    return {name: (bed.host_dir(name) / "sshd.log").read_text(errors="replace").count("Accepted publickey")
            for name in GUESTS}


def test_pytorch_workload_through_slurm_over_one_two_and_four_nodes(slurm, tmp_path):
    runbook = bed_runbook(slurm, tmp_path / "slurm.yaml", f"""\
    - name: train-srun
      launch: srun
      srun_mpi: pmix
{TRAIN_1_2_4}
    - name: too-big
      kind: pytorch_train
      launch: srun
      python: {PYTHON}
      srun_args: ["--cpus-per-task", "64"]
      queue_timeout: 2
      repeats: 1
    - name: no-partition
      kind: pytorch_train
      launch: srun
      python: {PYTHON}
      srun_args: ["--partition", "nosuch"]
      repeats: 1
    - name: train-sbatch
      launch: sbatch
      srun_mpi: pmix
{TRAIN_1_2_4.replace("nodes: [1, 2, 4]", "nodes: [2]")}
    - name: sbatch-refused
      kind: pytorch_train
      launch: sbatch
      python: {PYTHON}
      nodes: [2]
      srun_args: ["--partition", "nosuch"]
      repeats: 1
    - name: sbatch-pending
      kind: pytorch_train
      launch: sbatch
      python: {PYTHON}
      srun_args: ["--cpus-per-task", "64"]
      queue_timeout: 2
      repeats: 1
""")
    before = logins(slurm)
    started = time.monotonic()
    result = gpuvm("bench", "run", runbook, "--out", tmp_path / "out", "--state-dir", tmp_path / "state")
    print(f"\nsrun and sbatch campaign (4 points, 4 Slurm did not start) in {time.monotonic() - started:.1f}s")
    directory = results_dir(tmp_path / "out")
    assert result.exit_code == 6, result.output + all_logs(directory)
    assert "4 of 8 benchmark run(s) failed" in result.output
    assert "too-big at nodes-1, repeat 1: exited 1: Slurm did not start the job:" in result.output

    results = load_results(directory)
    train = results.benchmark("train-srun")
    assert train.launch == "srun" and train.unit == "img/sec"
    assert [(p.nodes, [r.error for r in p.repeats]) for p in train.points] == [(1, [None]), (2, [None]), (4, [None])]
    assert all(p.repeats[0].value > 0 for p in train.points)
    jobs = [p.repeats[0].slurm_jobs for p in train.points]
    assert all(j and len(j) == 1 for j in jobs) and len({j[0] for j in jobs}) == 3  # a Slurm job each
    # what the campaign read on the other guests came through Slurm: their versions, their environment
    assert results.software["gpu-vm-04"]["python"].startswith("Python 3")
    assert sorted(train.points[2].repeats[0].environment) == list(GUESTS)
    four = (directory / train.points[2].repeats[0].log).read_text()
    assert "Total img/sec on 4 CPU(s):" in four  # rank 0 of 4 (SLURM_PROCID/NTASKS), DDP over gloo
    command = (directory / "logs/train-srun/nodes-4/command.sh").read_text()
    assert "srun --mpi=pmix --nodes=4 --nodelist=gpu-vm-01,gpu-vm-02,gpu-vm-03,gpu-vm-04" in command
    assert f"MASTER_ADDR={slurm.address(CONTROLLER)}" in command
    pending = results.benchmark("too-big").points[0].repeats[0]  # Slurm queues it: no node has 64 CPUs now
    assert pending.value is None and pending.slurm_jobs
    assert pending.error.startswith(f"exited 1: Slurm did not start the job: job {pending.slurm_jobs[0]} was pending; "
                                    "Requested partition configuration not available now")
    refused = results.benchmark("no-partition").points[0].repeats[0]
    assert refused.error == ("exited 1: Slurm did not start the job: Unable to allocate resources: "
                             "Invalid partition name specified") and refused.slurm_jobs is None


    # sbatch: a batch job, its output read back from its first node, results in the same form as srun's
    batch = results.benchmark("train-sbatch")
    assert batch.launch == "sbatch" and batch.unit == train.unit
    [two] = batch.points
    assert (two.nodes, two.repeats[0].error) == (2, None) and two.repeats[0].value > 0
    assert sorted(two.repeats[0].environment) == sorted(train.points[1].repeats[0].environment)
    assert two.repeats[0].slurm_jobs and two.repeats[0].slurm_jobs[0] not in {j[0] for j in jobs}
    assert "Total img/sec on 2 CPU(s):" in (directory / two.repeats[0].log).read_text()
    script = (directory / "logs/train-sbatch/nodes-2/sbatch.sh").read_text()
    assert "#SBATCH --nodelist=gpu-vm-01,gpu-vm-02\n" in script and "\nenv MASTER_ADDR=" in script
    refused_batch = results.benchmark("sbatch-refused").points[0].repeats[0]
    assert refused_batch.error == ("exited 1: Slurm did not start the job: Batch job submission failed: "
                                   "Invalid partition name specified") and refused_batch.slurm_jobs is None
    pending_batch = results.benchmark("sbatch-pending").points[0].repeats[0]
    assert pending_batch.error == (f"cancelled after 2s in the queue (queue_timeout): Slurm did not start the job: "
                                   f"job {pending_batch.slurm_jobs[0]} was pending; Reason=PartitionConfig")

    # one connection from this machine: the submit guest's; the other guests only through Slurm
    after = logins(slurm)
    assert {name: after[name] - before[name] for name in GUESTS} == {CONTROLLER: 1, **{g: 0 for g in GUESTS[1:]}}
    deadline = time.monotonic() + 10  # the last relayed step's job may still be COMPLETING (its epilog)
    while slurm_cluster.squeue(slurm, CONTROLLER) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert slurm_cluster.squeue(slurm, CONTROLLER) == []


def ranks() -> list[str]:
    """The job's ranks on every node (the guests share this machine's process table; srun starts
    the program by its full path)."""
    return subprocess.run(["pgrep", "-fx", "(/usr/bin/)?sleep 313"], capture_output=True, text=True).stdout.split()


@pytest.mark.parametrize("launch", ["srun", "sbatch"])
def test_sigterm_cancels_the_slurm_job_within_ten_seconds(slurm, tmp_path, launch):
    runbook = bed_runbook(slurm, tmp_path / "long.yaml", f"""\
    - name: long
      kind: command
      launch: {launch}
      command: "sleep 313"
      pattern: "took ([0-9.]+)"
      nodes: [4]
      repeats: 1
      timeout: 600
""")
    gpuvm_cli = [sys.executable, "-m", "gpuvm", "bench", "run", str(runbook), "--out", str(tmp_path / "out"),
                 "--state-dir", str(tmp_path / "state")]
    process = subprocess.Popen(gpuvm_cli, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 120
        while len(ranks()) < len(GUESTS):  # every node's rank running (not only the allocation made)
            assert process.poll() is None and time.monotonic() < deadline, process.stdout.read() if process.poll() else ""
            time.sleep(0.3)
        process.send_signal(signal.SIGTERM)
        signalled = time.monotonic()
        while slurm_cluster.squeue(slurm, CONTROLLER) and time.monotonic() - signalled < 10:
            time.sleep(0.2)
        left = slurm_cluster.squeue(slurm, CONTROLLER)
        gone_after = time.monotonic() - signalled
        output, _ = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
    print(f"\nthe {launch} job left squeue {gone_after:.1f}s after SIGTERM")
    assert left == [], f"jobs still in squeue 10 s after SIGTERM: {left}\n{output}"
    assert process.returncode == 128 + signal.SIGTERM, output
    assert "Traceback" not in output
    assert ranks() == []  # none left on any node
