"""Apply stopped at every step boundary (issue 11): SIGKILL, and SIGTERM or SIGINT (in turn), sent when the running
apply journals the first change of a step (or gpuvm entering a host's maintenance mode), read from the
journal file it writes; one re-run converges, then plan shows no change and verify is clean.

The interrupted step's vSphere calls run on the simulator with latency, so that step lasts long enough
for the signal to land in it; the steps before it and the re-run's others go at full speed (latency on
every step made each case wait it out several times over for nothing the case asserts). The lab's
plan has changes in exactly the steps of BOUNDARIES (checked)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from pyVmomi import vim
from typer.testing import CliRunner

from gpusim import Simulator
from gpuvm.cli.main import app
from gpuvm.engine import STEPS
from tests.integration.test_vsphere_flow import LAB_FILE, vsphere_only
from tests.integration.vcenter import KILLED_RUN_LEASE, LAB_MIG, once_unlocked, pyvmomi, raw_state, use_simulator

pytestmark = pytest.mark.integration
STEP_CALLS = {"host.passthrough": ("UpdatePassthruConfig",), "host.graphics": ("UpdateGraphicsConfig",),
              "host.reboot": ("EnterMaintenanceMode_Task", "RebootHost_Task"), "vm.hardware": ("ReconfigVM_Task",),
              "vm.advanced": ("ReconfigVM_Task",), "vm.power": ("PowerOnVM_Task",)}  # each step's slow calls
MAINTENANCE = ("host.reboot", "maintenance")  # gpuvm has just put a host in maintenance mode
BOUNDARIES = [("host.passthrough", "started"), ("host.graphics", "started"), ("host.reboot", "started"), MAINTENANCE,
              ("vm.hardware", "started"), ("vm.advanced", "started"), ("vm.power", "started")]
ORDER = [step.name for step in STEPS]


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    return vsphere_only(LAB_FILE, tmp_path_factory.mktemp("runbook") / "lab.yaml")


def gpuvm(*args: str):
    return CliRunner().invoke(app, list(args), catch_exceptions=False)


def entries(journal) -> list[dict]:
    """The journal so far; a line being written is not read yet."""
    text = journal.read_text() if journal.exists() else ""
    return [json.loads(line) for line in text.splitlines(keepends=True) if line.endswith("\n")]


def reached(entry: dict, step: str, status: str) -> bool:
    if status == "maintenance":
        return entry["status"] == "maintenance" and entry["state"] == "entered"
    return entry["status"] == status and entry.get("step") == step


def test_the_boundaries_are_the_steps_with_changes(lab, tmp_path, monkeypatch):
    with Simulator(hosts=2, vms_per_host=2, mig=LAB_MIG) as sim:
        use_simulator(monkeypatch, sim, tmp_path / "state")
        steps = {c["step"] for c in json.loads(gpuvm("plan", str(lab), "--json").output)["changes"]}
    assert steps == {step for step, status in BOUNDARIES if status == "started"}


# SIGKILL at every boundary; a clean stop at every boundary too, by SIGTERM and SIGINT in turn: gpuvm
# handles both with one handler (cli/common.py `_interrupt`, checked in tests/unit/test_cli_signals.py),
# so a boundary stopped by one asserts what it would by the other.
CASES = [(step, status, sig) for i, (step, status) in enumerate(BOUNDARIES)
         for sig in (signal.SIGKILL, (signal.SIGTERM, signal.SIGINT)[i % 2])]


@pytest.mark.parametrize("step, status, sig", CASES, ids=[f"{s}-{w}-{g.name}" for s, w, g in CASES])
def test_apply_stopped_at_a_step_boundary_converges_on_one_rerun(lab, tmp_path, monkeypatch, step, status, sig):
    journal = tmp_path / "state" / "journal.jsonl"
    latency = {method: "150ms" for method in STEP_CALLS[step]}
    with Simulator(hosts=2, vms_per_host=2, mig=LAB_MIG, latency=latency) as sim:
        use_simulator(monkeypatch, sim, tmp_path / "state")
        lease = KILLED_RUN_LEASE if sig == signal.SIGKILL else {}  # its locks hold until its lease expires
        run = subprocess.Popen([sys.executable, "-m", "gpuvm.cli.main", "apply", str(lab), "--yes",
                                "--allow-host-reboot"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               env=dict(os.environ, **lease))
        deadline = time.monotonic() + 60
        while not any(reached(e, step, status) for e in entries(journal)):
            assert run.poll() is None and time.monotonic() < deadline, run.communicate()[0]
            time.sleep(0.01)
        run.send_signal(sig)
        output = run.communicate(timeout=60)[0]
        stopped = entries(journal)
        if sig == signal.SIGKILL:
            assert run.returncode == -signal.SIGKILL, output
        else:  # stopped cleanly: its end journaled, no later step begun, no traceback
            assert run.returncode == 128 + sig and "interrupted" in output and "Traceback" not in output, output
            assert stopped[-1]["status"] == "run-end" and stopped[-1]["interrupted"] == "KeyboardInterrupt", stopped[-3:]
        begun = {e["step"] for e in stopped if e["status"] == "started"}
        assert max(ORDER.index(s) for s in begun) == ORDER.index(step), f"later steps begun: {begun}"
        if (step, status) == MAINTENANCE and sig == signal.SIGKILL:  # left in maintenance mode: planned out
            assert raw_state(sim)["esx-01"]["maintenance"]
            planned = json.loads(gpuvm("plan", str(lab), "--json").output)["changes"]
            assert any(c["target"] == "esx-01" and c["step"] == "host.reboot" for c in planned)
            assert gpuvm("verify", str(lab)).exit_code == 5

        # at once: a task the signal left in flight is vSphere's to finish, and the re-run awaits it before it plans
        again = once_unlocked(lambda: gpuvm("apply", str(lab), "--yes", "--allow-host-reboot"), lambda r: r.exit_code)
        assert again.exit_code == 0, output + "\n--- re-run:\n" + again.output
        state = raw_state(sim)
        assert not state["esx-01"]["maintenance"] and not state["esx-02"]["maintenance"]
        assert all(enabled == active for _, enabled, active in state["esx-01"]["passthru"])
        planned = gpuvm("plan", str(lab), "--detailed-exitcode")
        assert planned.exit_code == 0, planned.output
        verified = gpuvm("verify", str(lab))
        assert verified.exit_code == 0, verified.output


def test_a_power_on_a_killed_run_left_running_is_waited_for_not_repeated(tmp_path, monkeypatch):
    """Killed while vSphere powers a VM on, the run leaves that task running; the re-run still
    observes the VM off and plans the power-on. It must wait for the task and find the VM on, not
    start a second one that vSphere refuses (InvalidPowerState: the CI flake of the SIGKILL case)."""
    runbook = tmp_path / "rb.yaml"
    runbook.write_text("vcenter: {user: administrator@vsphere.local, password_env: GPUVM_VCENTER_PASSWORD}\n"
                       "hosts: [{name: esx-01}]\nvms: [{name: esx-01-vm1, host: esx-01, firmware: bios}]\n")
    with Simulator(hosts=1, vms_per_host=1, latency={"PowerOnVM_Task": "3s"}) as sim:
        use_simulator(monkeypatch, sim, tmp_path / "state")
        with pyvmomi(sim) as si:
            content = si.RetrieveContent()
            view = content.viewManager.CreateContainerView(content.rootFolder, [vim.VirtualMachine], True)
            view.view[0].PowerOnVM_Task()  # not waited for: the killed run's last call
            view.DestroyView()
        applied = gpuvm("apply", str(runbook), "--yes")
        assert applied.exit_code == 0, applied.output
        assert raw_state(sim)["esx-01-vm1"]["power"] == "poweredOn"
        assert gpuvm("plan", str(runbook), "--detailed-exitcode").exit_code == 0
