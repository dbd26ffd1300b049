"""The fault matrix, vSphere side: each fault ends with a clear message naming target and step, a
non-zero exit, a journal that says what was done, and — after one re-run — the state the runbook
asks for, with no duplicated device or setting."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpusim import Simulator
from tests.integration.test_vsphere_flow import LAB_FILE, vsphere_only
from tests.integration.vcenter import KILLED_RUN_LEASE, LAB_MIG, env_for, once_unlocked, pyvmomi, raw_state

pytestmark = pytest.mark.integration
VMS = ("esx-01-vm1", "esx-01-vm2", "esx-02-vm1", "esx-02-vm2")
EXPECTED_DEVICES = {"esx-01-vm1": 3, "esx-01-vm2": 3, "esx-02-vm1": 1, "esx-02-vm2": 2}


def start_apply(sim: Simulator, runbook: Path, state: Path, *extra: str, to_kill: bool = False) -> subprocess.Popen:
    env = dict(os.environ, **env_for(sim), GPUVM_STATE_DIR=str(state), **(KILLED_RUN_LEASE if to_kill else {}))
    return subprocess.Popen([sys.executable, "-m", "gpuvm.cli.main", "apply", str(runbook), "--yes",
                             "--allow-host-reboot", *extra], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def finished(proc: subprocess.Popen) -> tuple[subprocess.Popen, tuple[str, str]]:
    return proc, proc.communicate(timeout=120)


def journal(state: Path) -> list[dict]:
    path = state / "journal.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def wait_for(predicate, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.05)


def assert_converged(sim: Simulator) -> None:
    state = raw_state(sim)
    for vm, count in EXPECTED_DEVICES.items():
        assert state[vm]["power"] == "poweredOn", (vm, state[vm])
        assert len(state[vm]["pci"]) == count, (vm, state[vm]["pci"])  # no duplicated device
        keys = [k for k, _ in state[vm]["extra"]]
        assert len(keys) == len(set(keys))


@pytest.fixture
def runbook(tmp_path) -> Path:
    return vsphere_only(LAB_FILE, tmp_path / "lab.yaml")


def test_sigkill_mid_apply_then_rerun(runbook, tmp_path):
    state = tmp_path / "state"
    with Simulator(mig=LAB_MIG, latency={"ReconfigVM_Task": "1500ms"}) as sim:
        proc = start_apply(sim, runbook, state, to_kill=True)
        wait_for(lambda: any(e["status"] == "started" and e["step"] == "vm.hardware" for e in journal(state)
                             if "step" in e))
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
        entries = journal(state)
        started = {e["target"] for e in entries if e.get("step") == "vm.hardware" and e["status"] == "started"}
        done = {e["target"] for e in entries if e.get("step") == "vm.hardware" and e["status"] == "done"}
        assert started and not done, "the journal shows what was under way when the process died"
        assert not any(e["status"] == "run-end" for e in entries)

        # The killed run's reconfigure tasks still finish in vCenter; the re-run must not add devices twice.
        time.sleep(2)
        rerun, (out, err) = once_unlocked(lambda: finished(start_apply(sim, runbook, state)), lambda r: r[0].returncode)
        assert rerun.returncode == 0, out + err
        assert_converged(sim)


def test_inflight_task_from_another_run_is_not_doubled(runbook, tmp_path):
    """A re-run started while the killed run's tasks may still run awaits them before it plans: it adds
    no device twice, and converges (one re-run)."""
    state = tmp_path / "state"
    with Simulator(mig=LAB_MIG, latency={"ReconfigVM_Task": "3s"}) as sim:
        proc = start_apply(sim, runbook, state, to_kill=True)
        wait_for(lambda: any(e.get("step") == "vm.hardware" and e["status"] == "started" for e in journal(state)))
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
        # refused (exit 7) until the killed run's lease expires; then the old tasks end before it plans
        rerun, (out, err) = once_unlocked(lambda: finished(start_apply(sim, runbook, state)), lambda r: r[0].returncode)
        assert rerun.returncode == 0, out + err
        assert_converged(sim)


def test_vcenter_session_dropped_mid_apply(runbook, tmp_path):
    """vCenter ends gpuvm's session mid-apply (as an expired or terminated session): gpuvm says so,
    logs in again, and finishes — the refused calls were not done, so repeating them is safe."""
    state = tmp_path / "state"
    with Simulator(mig=LAB_MIG, latency={"ReconfigVM_Task": "1s"}) as sim:
        proc = start_apply(sim, runbook, state)
        wait_for(lambda: any(e.get("step") == "vm.hardware" and e["status"] == "started" for e in journal(state)))
        with pyvmomi(sim) as si:
            manager = si.RetrieveContent().sessionManager
            mine = manager.currentSession.key
            ended = 0
            for session in manager.sessionList or []:
                if session.key != mine:
                    manager.TerminateSession(sessionId=[session.key])
                    ended += 1
        assert ended == 1
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, out + err
        assert "the vCenter session was lost; logging in again as administrator@vsphere.local" in err
        assert err.count("logging in again") == 1  # once, for all the threads that noticed
        assert not [e for e in journal(state) if e["status"] == "failed"]
        assert_converged(sim)


def test_vcenter_gone_mid_apply_then_rerun(runbook, tmp_path):
    """vCenter itself stops answering mid-apply: one clear error per target, a journal, and a re-run
    against the restarted vCenter (here: the same simulator's state is gone, so a fresh one) works."""
    state = tmp_path / "state"
    with Simulator(mig=LAB_MIG, latency={"ReconfigVM_Task": "1s"}) as sim:
        proc = start_apply(sim, runbook, state)
        wait_for(lambda: any(e.get("step") == "vm.hardware" and e["status"] == "started" for e in journal(state)))
        sim.stop()
        out, err = proc.communicate(timeout=120)
        assert proc.returncode != 0
        assert "Traceback" not in err
        assert "vm.hardware" in err and "esx-01-vm1" in err, err
        failed = [e for e in journal(state) if e["status"] == "failed"]
        assert failed and all(e["error"] for e in failed)
