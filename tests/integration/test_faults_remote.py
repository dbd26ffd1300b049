"""The fault matrix, SSH and benchmark side: a guest stops answering and a remote command hangs in
the middle of an apply; a benchmark rank dies; the disk is full when results are written.
Each ends with a clear message naming the target and step and a non-zero exit; after one re-run
the runbook's state is reached."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from ruamel.yaml import YAML

from gpusim import Simulator
from tests.integration.test_end_to_end import lab_for_bed
from tests.integration.vcenter import LAB_MIG, env_for, reboot_hook

pytestmark = pytest.mark.integration


@pytest.fixture(autouse=True, scope="module")
def fresh_bed(testbed):
    testbed.up()
    yield
    testbed.up()


def gpuvm(env: dict, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gpuvm.cli.main", *args], env=env, capture_output=True,
                          text=True, timeout=timeout)


def journal(state: Path) -> list[dict]:
    path = state / "journal.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_guest_stops_answering_and_a_command_hangs_mid_apply(testbed, tmp_path):
    runbook = lab_for_bed(testbed, tmp_path / "lab.yaml")
    yaml = YAML()
    data = yaml.load(runbook.read_text())
    data["ssh"]["command_timeout"] = 5  # the hung command: waited out once
    data["ssh"]["boot_timeout"] = 5  # the stopped guest never comes back: do not wait long for it
    with runbook.open("w") as out:
        yaml.dump(data, out)
    state = tmp_path / "state"
    hook = reboot_hook(testbed)
    with Simulator(hosts=2, vms_per_host=2, mig=LAB_MIG, on_reboot=hook, latency={"ReconfigVM_Task": "1500ms"}) as sim:
        env = dict(os.environ, **env_for(sim), GPUVM_STATE_DIR=str(state))
        proc = subprocess.Popen([sys.executable, "-m", "gpuvm.cli.main", "apply", str(runbook), "--yes",
                                 "--allow-host-reboot"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)
        deadline = time.monotonic() + 60
        while not any(e.get("step") == "vm.hardware" for e in journal(state)):
            assert time.monotonic() < deadline and proc.poll() is None, "apply never reached the VM steps"
            time.sleep(0.05)
        testbed.stop_sshd("gpu-vm-03")  # esx-02-vm1's guest stops answering
        testbed.set_state("gpu-vm-02", "hang", ["nvidia-smi"])  # esx-01-vm2's nvidia-smi hangs
        out, err = proc.communicate(timeout=300)
        assert proc.returncode != 0, out + err
        assert "Traceback" not in err
        assert "esx-02-vm1" in err and "cannot connect" in err, err
        assert "esx-01-vm2" in err and "timed out after 5s" in err, err
        done = {(e["target"], e["step"]) for e in journal(state) if e["status"] == "done"}
        assert ("esx-01-vm1", "guest.nic") in done  # the guests that answer were configured
        assert ("esx-02-vm2", "guest.image") in done

        testbed.start_sshd("gpu-vm-03")
        testbed.set_state("gpu-vm-02", "hang", [])
        rerun = gpuvm(env, "apply", str(runbook), "--yes", "--allow-host-reboot")
        assert rerun.returncode == 0, rerun.stdout + rerun.stderr
        verify = gpuvm(env, "verify", str(runbook))
        assert verify.returncode == 0, verify.stdout + verify.stderr
        assert "all 4 guests reach each other" in verify.stdout


def local_campaign(tmp_path: Path, die: bool) -> Path:
    """Two ranks under mpirun; with `die`, rank 1 exits on purpose while rank 0 still runs."""
    rank_one = "echo rank 1 exiting on purpose >&2; exit 3" if die else "true"
    runbook = tmp_path / "campaign.yaml"
    runbook.write_text(f"""\
benchmarks:
  runs:
    - name: dies
      kind: command
      command: "sh -c 'if [ \\"$OMPI_COMM_WORLD_RANK\\" = 1 ]; then {rank_one}; fi; sleep 2; echo took 2'"
      pattern: "took ([0-9]+)"
      nodes: [2]
      repeats: 1
      timeout: 120
      mpirun_args: ["--oversubscribe"]
    - name: fine
      kind: command
      command: "sh -c 'echo took 1'"
      pattern: "took ([0-9]+)"
      nodes: [1]
      repeats: 1
      timeout: 120
""")
    return runbook


def test_benchmark_rank_dies(tmp_path):
    runbook = local_campaign(tmp_path, die=True)
    result = gpuvm(dict(os.environ), "bench", "run", str(runbook), "--local", "--out", str(tmp_path / "out"))
    assert result.returncode == 6, result.stdout + result.stderr
    assert "dies at nodes-2, repeat 1: exited" in result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    [results] = list((tmp_path / "out").glob("*/results.json"))
    data = json.loads(results.read_text())
    by_name = {b["name"]: b["points"][0]["repeats"][0] for b in data["benchmarks"]}
    assert by_name["dies"]["value"] is None and by_name["dies"]["error"]
    assert by_name["fine"]["value"] > 0  # the campaign went on
    log = (results.parent / by_name["dies"]["log"]).read_text()
    assert "exiting on purpose" in log


def test_disk_full_while_writing_results(tmp_path):
    full = tmp_path / "full"
    full.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(full)], check=True)
    try:
        subprocess.run(["dd", "if=/dev/zero", f"of={full / 'filler'}", "bs=4k", "count=64"], capture_output=True)
        runbook = local_campaign(tmp_path, die=False)
        result = gpuvm(dict(os.environ), "bench", "run", str(runbook), "--local", "--out", str(full / "out"))
        assert result.returncode != 0
        assert "No space left on device" in result.stderr and str(full) in result.stderr, result.stderr
        assert "Traceback" not in result.stderr
    finally:
        subprocess.run(["umount", str(full)], check=True)


def apply_while_the_guest_boots(testbed, env: dict, runbook: Path, err: Path) -> subprocess.CompletedProcess:
    """`apply`, with gpu-vm-04's sshd started once apply says it waits for it (its VM boots meanwhile)."""
    with err.open("w") as sink:
        run = subprocess.Popen([sys.executable, "-m", "gpuvm.cli.main", "apply", str(runbook), "--yes",
                                "--allow-host-reboot"], env=env, stdout=subprocess.PIPE, stderr=sink, text=True)
        deadline = time.monotonic() + 120
        while "waiting up to 600 s for SSH" not in err.read_text():
            assert run.poll() is None and time.monotonic() < deadline, err.read_text()
            time.sleep(0.05)
        testbed.start_sshd("gpu-vm-04")
        out = run.communicate(timeout=600)[0]
    return subprocess.CompletedProcess(run.args, run.returncode, out, err.read_text())


def test_first_deployment_with_a_guest_not_up_yet(testbed, tmp_path):
    """A guest that does not answer at plan time (its VM is off) is planned once its VM runs: apply
    waits for its SSH, then configures it. `verify` calls an unreachable guest not observed (exit 3)."""
    testbed.up()  # new test hosts: nothing configured on any guest yet
    runbook = lab_for_bed(testbed, tmp_path / "lab.yaml")
    state = tmp_path / "state"
    hook = reboot_hook(testbed)
    testbed.stop_sshd("gpu-vm-04")  # esx-02-vm2's guest OS is not up
    try:
        with Simulator(hosts=2, vms_per_host=2, mig=LAB_MIG, on_reboot=hook) as sim:
            env = dict(os.environ, **env_for(sim), GPUVM_STATE_DIR=str(state))
            planned = gpuvm(env, "plan", str(runbook))  # printed, and incomplete: exit 3
            assert planned.returncode == 3, planned.stdout + planned.stderr
            assert "esx-02-vm2: not reachable over SSH yet" in planned.stdout
            drift = gpuvm(env, "verify", str(runbook))  # not observed: the verdict is incomplete, exit 3
            assert drift.returncode == 3 and "esx-02-vm2" in drift.stderr

            applied = apply_while_the_guest_boots(testbed, env, runbook, tmp_path / "apply.err")
            assert applied.returncode == 0, applied.stdout + applied.stderr
            assert "waiting up to 600 s for SSH" in applied.stderr
            done = {(e["target"], e["step"]) for e in journal(state) if e["status"] == "done"}
            assert ("esx-02-vm2", "guest.image") in done and ("esx-02-vm2", "guest.ssh_mesh") in done
            verify = gpuvm(env, "verify", str(runbook))
            assert verify.returncode == 0, verify.stdout + verify.stderr

            # converged, then a guest stops answering although its VM runs (issue 22): the plan is not
            # "no changes" and says why; the other guests' mesh is not rewritten because a peer is
            # away (it keeps the key gpuvm verified last): the worst outcome, not observed, is exit 3
            testbed.stop_sshd("gpu-vm-04")
            unobserved = gpuvm(env, "plan", str(runbook), "--detailed-exitcode")
            assert unobserved.returncode == 3, unobserved.stdout + unobserved.stderr
            assert "Infrastructure matches the runbook" not in unobserved.stdout
            assert "guest.ssh_mesh" not in unobserved.stdout
            assert "No changes planned on the targets observed; 1 target(s) not observed: esx-02-vm2" \
                in unobserved.stdout
            assert "warning: esx-02-vm2: guest not observed although its VM runs" in unobserved.stdout
            started = time.monotonic()  # the silent guest delays nothing: its VM runs, untouched
            rest = gpuvm(env, "apply", str(runbook), "--yes")
            assert rest.returncode == 3 and "esx-02-vm2 (observe)" in rest.stderr, rest.stdout + rest.stderr
            assert "1 not observed (failed)" in rest.stdout and "1 target(s) not observed (failed)" in rest.stderr, \
                rest.stdout + rest.stderr  # counted as plan counted it
            assert time.monotonic() - started < 60 and "waiting up to" not in rest.stderr
            down = gpuvm(env, "verify", str(runbook))
            assert down.returncode == 3 and "1 target(s) not observed" in down.stderr, down.stdout + down.stderr

            changed = YAML()  # its VM planned to change: a warning that says what apply will do, and it counts
            data = changed.load(runbook.read_text())
            data["vms"][3]["cpus"] = 30
            with runbook.open("w") as out:
                changed.dump(data, out)
            planned = gpuvm(env, "plan", str(runbook), "--detailed-exitcode")
            assert planned.returncode == 3, planned.stdout + planned.stderr
            assert "esx-02-vm2: guest not observed although its VM runs" in planned.stdout
            assert "and its VM is planned to change" in planned.stdout
    finally:
        testbed.start_sshd("gpu-vm-04")


def test_an_esxi_shell_down_is_set_aside_and_the_rest_is_planned_applied_and_verified(testbed, tmp_path):
    """Issue 22, item 2: esx-01's ESXi shell does not answer while vCenter does. Plan plans the
    vSphere side and esx-02's shell, naming esx-01 not observed; apply changes esx-02 and leaves
    esx-01 and its VMs alone, listed; all three exit 3 (not observed), never "No changes"."""
    runbook = lab_for_bed(testbed, tmp_path / "lab.yaml")
    yaml = YAML()
    data = yaml.load(runbook.read_text())
    del data["guests"]  # the ESXi shells and vSphere only: quick
    with runbook.open("w") as out:
        yaml.dump(data, out)
    state = tmp_path / "state"
    testbed.stop_sshd("esx-01")
    try:
        with Simulator(hosts=2, vms_per_host=2, mig=LAB_MIG, on_reboot=reboot_hook(testbed)) as sim:
            env = dict(os.environ, **env_for(sim), GPUVM_STATE_DIR=str(state))
            planned = gpuvm(env, "plan", str(runbook), "--json")
            assert planned.returncode == 3, planned.stdout + planned.stderr
            plan = json.loads(planned.stdout)
            assert list(plan["not_observed"]) == ["esx-01"] and "Connection refused" in plan["not_observed"]["esx-01"]
            planned_on = {(c["target"], c["step"]) for c in plan["changes"]}
            assert {("esx-01", "host.passthrough"), ("esx-02", "host.passthrough")} <= planned_on
            assert not any(t == "esx-01" and s.startswith("esxi.") for t, s in planned_on)
            [note] = [n for n in plan["notes"] if n["target"] == "esx-01"]
            assert note["level"] == "warning" and "apply leaves host esx-01 and its VMs alone" in note["message"]

            applied = gpuvm(env, "apply", str(runbook), "--yes", "--allow-host-reboot")
            assert applied.returncode == 3, applied.stdout + applied.stderr
            assert "esx-01 (not observed): " in applied.stderr and "Traceback" not in applied.stderr
            assert "skipped esx-01-vm1 (vm.hardware): the ESXi shell of its host esx-01 was not observed" \
                in applied.stderr
            done = {(e["target"], e["step"]) for e in journal(state) if e["status"] == "done"}
            assert ("esx-02", "host.passthrough") in done and ("esx-02-vm1", "vm.hardware") in done
            assert not any(target.startswith("esx-01") for target, _ in done)

            verified = gpuvm(env, "verify", str(runbook))
            assert verified.returncode == 3 and "esx-01: " in verified.stderr, verified.stdout + verified.stderr
            assert "esx-01" in verified.stdout and "esx-02-vm" not in verified.stdout  # esx-02's side converged
    finally:
        testbed.start_sshd("esx-01")
