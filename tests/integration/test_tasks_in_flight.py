"""vSphere tasks a killed apply left running (issue 21, item 4b): the re-run awaits them instead of
starting them again. An upgrade still running is waited for, then found done (not AlreadyUpgraded);
a clone still running is waited for and its VM adopted (not a second clone, which vCenter refuses
with DuplicateName, as gpusim does)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from pyVmomi import vim
from typer.testing import CliRunner

from gpusim import Simulator
from gpuvm.cli.main import app
from tests.integration.test_vm_lifecycle import runbook as clone_runbook
from tests.integration.vcenter import KILLED_RUN_LEASE, env_for, once_unlocked, pyvmomi, raw_state, use_simulator

pytestmark = pytest.mark.integration


def gpuvm(*args: str):
    return CliRunner().invoke(app, list(args), catch_exceptions=False)


def running_tasks(sim: Simulator, name: str) -> list[vim.Task]:
    """The tasks of kind `name` ("VirtualMachine.upgradeVm", ".cloneVm") vCenter runs now."""
    with pyvmomi(sim) as si:
        tasks = si.content.taskManager.recentTask
        return [t for t in tasks if t.info.descriptionId == name and t.info.state in ("queued", "running")]


def killed_mid_task(sim: Simulator, runbook: Path, state: Path, task: str, *flags: str) -> None:
    """Start `apply`, SIGKILL it once vCenter runs its `task`, and leave that task running."""
    env = dict(os.environ, **env_for(sim), GPUVM_STATE_DIR=str(state), **KILLED_RUN_LEASE)  # its locks hold until its lease expires
    run = subprocess.Popen([sys.executable, "-m", "gpuvm.cli.main", "apply", str(runbook), "--yes", *flags], env=env,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 60
    while not running_tasks(sim, task):
        assert run.poll() is None and time.monotonic() < deadline, run.communicate()[0]
        time.sleep(0.05)
    run.kill()
    run.communicate(timeout=30)
    assert running_tasks(sim, task), "the task ended before the kill: the test proves nothing"


def vms_named(sim: Simulator, name: str) -> int:
    with pyvmomi(sim) as si:
        view = si.content.viewManager.CreateContainerView(si.content.rootFolder, [vim.VirtualMachine], True)
        try:
            return sum(1 for vm in view.view if vm.name == name)
        finally:
            view.DestroyView()


def test_an_upgrade_a_killed_run_left_running_is_awaited_not_planned_again(tmp_path, monkeypatch):
    book = tmp_path / "rb.yaml"
    book.write_text("vcenter: {user: administrator@vsphere.local, password_env: GPUVM_VCENTER_PASSWORD}\n"
                    "hosts: [{name: esx-01}]\n"
                    "vms: [{name: esx-01-vm1, host: esx-01, firmware: bios, hardware_version: vmx-19}]\n")
    with Simulator(hosts=1, vms_per_host=1, vm_version="vmx-15", latency={"UpgradeVM_Task": "6s"}) as sim:
        use_simulator(monkeypatch, sim, tmp_path / "state")
        killed_mid_task(sim, book, tmp_path / "state", "VirtualMachine.upgradeVm")
        assert running_tasks(sim, "VirtualMachine.upgradeVm")  # still under way when the killed run's lease ends
        again = once_unlocked(lambda: gpuvm("apply", str(book), "--yes"), lambda r: r.exit_code)
        assert again.exit_code == 0, again.output
        assert "AlreadyUpgraded" not in again.output
        assert raw_state(sim)["esx-01-vm1"]["version"] == "vmx-19"
        assert gpuvm("plan", str(book), "--detailed-exitcode").exit_code == 0


def test_a_clone_a_killed_run_left_running_is_awaited_and_adopted_not_started_again(tmp_path, monkeypatch):
    book = clone_runbook(tmp_path, [{"name": "train-1", "host": "esx-01", "ip": 101}])
    with Simulator(hosts=2, vms_per_host=1, rebind=True, templates=["ubuntu-gpu"],
                   latency={"CloneVM_Task": "6s"}) as sim:
        use_simulator(monkeypatch, sim, tmp_path / "state")
        killed_mid_task(sim, book, tmp_path / "state", "VirtualMachine.cloneVm")
        again = once_unlocked(lambda: gpuvm("apply", str(book), "--yes"), lambda r: r.exit_code)
        assert again.exit_code == 0, again.output
        assert vms_named(sim, "train-1") == 1
        assert raw_state(sim)["train-1"]["power"] == "poweredOn"
        with pyvmomi(sim) as si:
            template = si.content.searchIndex.FindByInventoryPath("DC0/vm/ubuntu-gpu")
            assert not [v for v in template.customValue if "clone" in str(v.value)], "the clone intent was left"
        assert gpuvm("plan", str(book), "--detailed-exitcode").exit_code == 0


def test_vcenter_refuses_a_clone_to_a_name_the_folder_has_or_is_cloning(tmp_path):
    with Simulator(hosts=1, vms_per_host=1, templates=["ubuntu-gpu"], latency={"CloneVM_Task": "1s"}) as sim:
        with pyvmomi(sim) as si:
            template = si.content.searchIndex.FindByInventoryPath("DC0/vm/ubuntu-gpu")
            spec = vim.vm.CloneSpec(powerOn=False, template=False, location=vim.vm.RelocateSpec())
            first = template.CloneVM_Task(folder=template.parent, name="train-1", spec=spec)
            second = template.CloneVM_Task(folder=template.parent, name="train-1", spec=spec)  # still in flight
            existing = template.CloneVM_Task(folder=template.parent, name="esx-01-vm1", spec=spec)
            deadline = time.monotonic() + 20
            while any(t.info.state in ("queued", "running") for t in (first, second, existing)):
                assert time.monotonic() < deadline
                time.sleep(0.1)
            assert first.info.state == "success"
            for task, name in ((second, "train-1"), (existing, "esx-01-vm1")):
                assert task.info.state == "error" and isinstance(task.info.error, vim.fault.DuplicateName)
                assert task.info.error.msg == f"The name '{name}' already exists."
        assert vms_named(sim, "train-1") == 1


def record_clone_intent(sim: Simulator, monkeypatch, **data) -> None:
    """What a run killed inside a clone left on the template (see vm_lifecycle._start_clone)."""
    from gpuvm.runbook.vcenters import VCenter
    from gpuvm.vsphere.intent import IntentStore
    from gpuvm.vsphere.session import Session, resolve_target

    with Session(resolve_target(VCenter(password_env="GPUVM_VCENTER_PASSWORD"))) as session:
        template = session.content.searchIndex.FindByInventoryPath("DC0/vm/ubuntu-gpu")
        IntentStore(session, "c0ffee000002").record(template, "clone train-1", "clone to train-1", vm="train-1", **data)


def test_killed_before_the_clone_task_was_recorded_the_template_tasks_are_awaited(tmp_path, monkeypatch):
    """Killed between CloneVM_Task and recording its task: the clone runs, its intent has no task.
    The re-run waits for what runs on the template and adopts the VM."""
    book = clone_runbook(tmp_path, [{"name": "train-1", "host": "esx-01", "ip": 101}])
    with Simulator(hosts=2, vms_per_host=1, rebind=True, templates=["ubuntu-gpu"],
                   latency={"CloneVM_Task": "2s"}) as sim:
        use_simulator(monkeypatch, sim, tmp_path / "state")
        record_clone_intent(sim, monkeypatch)
        with pyvmomi(sim) as si:
            template = si.content.searchIndex.FindByInventoryPath("DC0/vm/ubuntu-gpu")
            template.CloneVM_Task(folder=template.parent, name="train-1", spec=vim.vm.CloneSpec(
                powerOn=False, template=False, location=vim.vm.RelocateSpec()))
        planned = gpuvm("plan", str(book))
        assert "began at" in planned.output and "awaited first" in planned.output, planned.output
        again = once_unlocked(lambda: gpuvm("apply", str(book), "--yes"), lambda r: r.exit_code)
        assert again.exit_code == 0, again.output
        assert vms_named(sim, "train-1") == 1
        assert gpuvm("plan", str(book), "--detailed-exitcode").exit_code == 0


def test_a_clone_intent_left_after_the_clone_is_drift_and_cleared(tmp_path, monkeypatch):
    """Killed after the clone ended, before its intent was cleared: the VM exists; plan and verify show
    the intent, apply clears it."""
    book = clone_runbook(tmp_path, [{"name": "train-1", "host": "esx-01", "ip": 101}])
    with Simulator(hosts=2, vms_per_host=1, rebind=True, templates=["ubuntu-gpu"]) as sim:
        use_simulator(monkeypatch, sim, tmp_path / "state")
        assert gpuvm("apply", str(book), "--yes").exit_code == 0
        record_clone_intent(sim, monkeypatch, task="task-1")
        assert gpuvm("verify", str(book)).exit_code == 5
        planned = gpuvm("plan", str(book))
        assert "template ubuntu-gpu" in planned.output and "clone intent" in planned.output, planned.output
        assert gpuvm("apply", str(book), "--yes").exit_code == 0
        assert vms_named(sim, "train-1") == 1
        assert gpuvm("verify", str(book)).exit_code == 0


PASSTHROUGH = ("vcenter: {user: administrator@vsphere.local, password_env: GPUVM_VCENTER_PASSWORD}\n"
               "hosts: [{name: esx-01, passthrough: [{model: A100}], allow_maintenance: true, allow_reboot: true}]\n"
               "vms: [{name: esx-01-vm1, host: esx-01, memory_gb: 16, gpus: {mode: passthrough, count: 1}}]\n")


def test_a_reconfigure_a_stopped_run_left_in_flight_is_awaited_before_the_rerun_plans(tmp_path, monkeypatch):
    """Stopped (SIGTERM) while vSphere adds a GPU to a VM, the run leaves that ReconfigVM running; the
    operator re-runs at once. `plan` notes the task; the re-run waits for it before observing, so its
    plan sees the GPU added and one run converges (planned first, vm.hardware refused the VM whose devices changed
    since the plan: 'run apply again')."""
    book = tmp_path / "rb.yaml"
    book.write_text(PASSTHROUGH)
    state = tmp_path / "state"
    with Simulator(hosts=1, vms_per_host=1, latency={"ReconfigVM_Task": "4s"}) as sim:
        use_simulator(monkeypatch, sim, state)
        run = subprocess.Popen([sys.executable, "-m", "gpuvm.cli.main", "apply", str(book), "--yes",
                                "--allow-host-reboot"], env=dict(os.environ, GPUVM_STATE_DIR=str(state)),
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        deadline = time.monotonic() + 60
        while not running_tasks(sim, "VirtualMachine.reconfigVm"):
            assert run.poll() is None and time.monotonic() < deadline, run.communicate()[0]
            time.sleep(0.05)
        run.send_signal(signal.SIGTERM)
        stopped = run.communicate(timeout=30)[0]
        assert run.returncode == 128 + signal.SIGTERM, stopped
        planned = gpuvm("plan", str(book))  # read-only: it notes the task, and does not wait
        assert "esx-01-vm1: vCenter task VirtualMachine.reconfigVm (task-" in planned.output, planned.output
        assert running_tasks(sim, "VirtualMachine.reconfigVm"), "the task ended before the re-run: the test proves nothing"
        again = gpuvm("apply", str(book), "--yes", "--allow-host-reboot")
        assert again.exit_code == 0, stopped + "\n--- re-run:\n" + again.output
        assert "waiting for 1 vCenter task(s) in flight: esx-01-vm1 VirtualMachine.reconfigVm" in again.output
        assert len(raw_state(sim)["esx-01-vm1"]["pci"]) == 1
        assert gpuvm("plan", str(book), "--detailed-exitcode").exit_code == 0
