"""Two or more applies at once (issue 11, item 1): the lock in vCenter lets one run change the hosts
and refuses the others before they touch anything; a VM's reconfigure is pinned to the changeVersion
it was checked against, so even without the lock a device can never be added twice."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from datetime import timedelta

import pytest
from pyVmomi import vim
from typer.testing import CliRunner

from gpusim import Simulator
from gpuvm import runs
from gpuvm.cli.main import app
from gpuvm.vsphere import lock
from gpuvm.vsphere.tasks import fault_text
from tests.integration.test_vsphere_flow import LAB_FILE, vsphere_only
from tests.integration.vcenter import LAB_MIG, pyvmomi, raw_state, use_simulator

pytestmark = pytest.mark.integration


@pytest.fixture
def lab(tmp_path, monkeypatch):
    runbook = vsphere_only(LAB_FILE, tmp_path / "lab.yaml")
    with Simulator(hosts=2, vms_per_host=2, mig=LAB_MIG, latency={"ReconfigVM_Task": "1500ms"}) as sim:
        use_simulator(monkeypatch, sim, tmp_path / "state")
        yield sim, runbook


def lock_fields(sim) -> dict[str, str]:
    with pyvmomi(sim) as si:
        content = si.RetrieveContent()
        names = {f.key: f.name for f in content.customFieldsManager.field or []}
        values = {v.key: v.value for v in content.rootFolder.customValue or []}
        return {names[k]: values.get(k, "") for k in names if names[k].startswith("gpuvm.lock.")}


def test_three_applies_at_once_one_runs_the_others_are_refused_and_no_device_doubles(lab, tmp_path):
    sim, runbook = lab
    before = raw_state(sim)
    runs = [subprocess.Popen([sys.executable, "-m", "gpuvm.cli.main", "apply", str(runbook), "--yes",
                              "--allow-host-reboot"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             env=dict(os.environ, GPUVM_STATE_DIR=str(tmp_path / f"state-{i}")))  # 3 machines' worth
            for i in range(3)]
    outputs = [run.communicate(timeout=300)[0] for run in runs]
    codes = sorted(run.returncode for run in runs)
    assert codes == [0, 7, 7], "\n---\n".join(outputs)
    for output, run in zip(outputs, runs):
        if run.returncode == 7:  # one clear refusal, before anything was shown or touched
            assert output.count("error:") == 1 and output.startswith("error:"), output
            assert "is locked by another gpuvm run" in " ".join(output.split()) and "nothing was changed" in output
    state = raw_state(sim)
    for vm in ("esx-01-vm1", "esx-01-vm2", "esx-02-vm1", "esx-02-vm2"):
        assert before[vm]["pci"] != state[vm]["pci"]
        ids = [d for d in state[vm]["pci"] if not d.endswith(":")]  # a named device appears once, never twice
        assert len(ids) == len(set(ids)), f"{vm} has a doubled device: {state[vm]['pci']}"
    assert lock_fields(sim) == {}, "the locks outlived the run"
    verified = CliRunner().invoke(app, ["verify", str(runbook)])  # a doubled device would be drift (one to remove)
    assert verified.exit_code == 0, verified.output


def hold(sim, host: str, expires_in: float, before_leases: bool = False) -> None:
    """A lock as another gpuvm run (elsewhere) holds it, its lease expiring `expires_in` seconds from
    now; `before_leases`: as gpuvm wrote it before leases (its expiry on the lock itself)."""
    with pyvmomi(sim) as si:
        content = si.RetrieveContent()
        manager = content.customFieldsManager
        expires = (si.CurrentTime() + timedelta(seconds=expires_in)).isoformat(timespec="seconds")
        holder = {"run": "0badc0ffee00", "who": "ops@jumphost pid 4242", "since": "2026-11-23T09:00:00+00:00"}
        if not before_leases:
            key = manager.AddCustomFieldDef(name="gpuvm.lease.0badc0ffee00", moType=vim.Folder).key
            manager.SetField(entity=content.rootFolder, key=key, value=json.dumps(
                {"v": 1, **holder, "expires": expires, "taking": False, "hosts": 1}))
        key = manager.AddCustomFieldDef(name=f"gpuvm.lock.{host}", moType=vim.Folder).key
        manager.SetField(entity=content.rootFolder, key=key,
                         value=json.dumps({**holder, "expires": expires} if before_leases else holder))


@pytest.mark.parametrize("before_leases", [False, True], ids=["lease", "gpuvm before leases"])
def test_a_lock_held_by_another_run_refuses_the_apply_until_it_expires(lab, before_leases):
    sim, runbook = lab
    hold(sim, "esx-02", expires_in=3600, before_leases=before_leases)
    before = raw_state(sim)
    refused = CliRunner().invoke(app, ["apply", str(runbook), "--yes", "--allow-host-reboot"])
    assert refused.exit_code == 7, refused.output
    assert ("host esx-02 is locked by another gpuvm run: ops@jumphost pid 4242 (run 0badc0ffee00"
            in " ".join(refused.output.split()))
    assert raw_state(sim) == before and list(lock_fields(sim)) == ["gpuvm.lock.esx-02"]  # ours released, theirs kept


def test_an_expired_lock_is_taken_over(lab):
    sim, runbook = lab
    hold(sim, "esx-01", expires_in=-60)  # its holder was killed and stopped renewing its lease
    applied = CliRunner().invoke(app, ["apply", str(runbook), "--yes", "--allow-host-reboot"])
    assert applied.exit_code == 0, applied.output
    assert lock_fields(sim) == {} and "gpuvm.lease.0badc0ffee00" not in field_names(sim)  # the expired lease too


def test_a_reconfigure_pinned_to_an_old_change_version_is_refused(lab):
    """gpusim, like vSphere: ReconfigVM_Task with a spec.changeVersion that is no longer the VM's fails
    with ConcurrentAccess, and every reconfigure gives the VM a new changeVersion."""
    sim, _ = lab
    with pyvmomi(sim) as si:
        content = si.RetrieveContent()
        view = content.viewManager.CreateContainerView(content.rootFolder, [vim.VirtualMachine], True)
        vm = next(v for v in view.view if v.name == "esx-01-vm1")
        first = vm.config.changeVersion
        assert first

        def reconfigure(version: str) -> vim.Task:
            task = vm.ReconfigVM_Task(vim.vm.ConfigSpec(numCPUs=8, changeVersion=version))
            while task.info.state in ("queued", "running"):
                time.sleep(0.1)
            return task

        assert reconfigure(first).info.state == "success"
        assert vm.config.changeVersion != first
        stale = reconfigure(first)
        assert stale.info.state == "error" and isinstance(stale.info.error, vim.fault.ConcurrentAccess)
        assert "concurrent modification" in fault_text(stale.info.error)
        view.DestroyView()


def test_a_run_whose_lock_another_run_broke_stops_with_exit_8_and_the_next_run_converges(lab, tmp_path, mocker):
    """The lock's key is the fence: once it is gone from vCenter (another run judged it stale and took it,
    or someone deleted it), the run's next renewal sees it and the run changes nothing more."""
    sim, runbook = lab
    make_plan = runs.make_plan

    def plan_then_lose_the_locks(*args, **kwargs):
        planned = make_plan(*args, **kwargs)
        with pyvmomi(sim) as si:
            manager = si.RetrieveContent().customFieldsManager
            for field in manager.field or []:
                if field.name.startswith("gpuvm.lock."):
                    manager.RemoveCustomFieldDef(key=field.key)
        time.sleep(1.0)  # two renewal rounds of a 1.5 s lease
        return planned

    mocker.patch.object(lock, "TTL", 1.5)
    mocker.patch.object(runs, "make_plan", side_effect=plan_then_lose_the_locks)
    before = raw_state(sim)
    stopped = CliRunner().invoke(app, ["apply", str(runbook), "--yes", "--allow-host-reboot"])
    assert stopped.exit_code == 8, stopped.output
    error = stopped.output[stopped.output.index("error:"):]
    assert error.count("error:") == 1 and "lease on the lock of host(s) esx-01, esx-02 was lost" in " ".join(error.split())
    assert "Traceback" not in stopped.output
    assert raw_state(sim) == before, "a change was made after the lease was lost"
    journal = [json.loads(line) for line in (tmp_path / "state" / "journal.jsonl").read_text().splitlines()]
    assert [e["status"] for e in journal if e["status"] == "lease-lost"] == ["lease-lost"], journal
    assert lock_fields(sim) == {} and not [f for f in field_names(sim) if f.startswith("gpuvm.lease.")]

    mocker.stopall()
    again = CliRunner().invoke(app, ["apply", str(runbook), "--yes", "--allow-host-reboot"])
    assert again.exit_code == 0, again.output
    verified = CliRunner().invoke(app, ["verify", str(runbook)])
    assert verified.exit_code == 0, verified.output


def field_names(sim) -> list[str]:
    with pyvmomi(sim) as si:
        return [f.name for f in si.RetrieveContent().customFieldsManager.field or []]
