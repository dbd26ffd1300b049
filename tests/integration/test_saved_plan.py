"""Saved plans (issue 34): `plan --out FILE` then `apply FILE` carries out exactly the plan reviewed,
and refuses, naming what changed and touching nothing, when the runbook or a planned object changed
since (`apply` used to re-plan and go ahead)."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from gpusim import Simulator
from gpuvm.cli.main import app
from tests.integration.vcenter import pyvmomi, raw_state, use_simulator
from tests.schema_check import check

pytestmark = pytest.mark.integration

RUNBOOK = ("vcenter: {user: administrator@vsphere.local, password_env: GPUVM_VCENTER_PASSWORD}\n"
           "hosts: [{name: esx-01}]\n"
           "vms: [{name: esx-01-vm1, host: esx-01, cpus: 4, power: \"off\"}]\n")


def gpuvm(*args: str):
    return CliRunner().invoke(app, list(args), catch_exceptions=False)


def reconfigure(sim: Simulator, vm_name: str, **spec: int) -> None:
    """Change a VM behind gpuvm's back, with plain pyVmomi (`numCPUs`, `memoryMB`)."""
    from pyVmomi import vim

    with pyvmomi(sim) as si:
        content = si.RetrieveContent()
        view = content.viewManager.CreateContainerView(content.rootFolder, [vim.VirtualMachine], True)
        vm = next(v for v in view.view if v.name == vm_name)
        view.DestroyView()
        task = vm.ReconfigVM_Task(spec=vim.vm.ConfigSpec(**spec))
        while task.info.state not in ("success", "error"):
            pass
        assert task.info.state == "success", task.info.error


def test_apply_of_a_saved_plan_refuses_when_a_planned_vm_or_the_runbook_changed_and_else_carries_it_out(tmp_path,
                                                                                                       monkeypatch):
    book, saved = tmp_path / "rb.yaml", tmp_path / "plan.json"
    book.write_text(RUNBOOK)
    with Simulator(hosts=1, vms_per_host=1, vm_power="off") as sim:
        use_simulator(monkeypatch, sim, tmp_path / "state")
        reconfigure(sim, "esx-01-vm1", numCPUs=2)

        planned = gpuvm("plan", str(book), "--out", str(saved))
        assert planned.exit_code == 0, planned.output
        assert "esx-01-vm1" in planned.stdout and "2 → 4" in planned.stdout
        document = json.loads(saved.read_text())
        assert check(document) == "saved-plan" and set(document["objects"]) == {"esx-01-vm1"}
        shown = gpuvm("show", str(saved))
        assert shown.exit_code == 0 and "2 → 4" in shown.stdout and str(book) in shown.stdout, shown.output

        # the VM's CPU count changed after the review: the plan is stale, nothing is touched
        reconfigure(sim, "esx-01-vm1", numCPUs=3)
        before = raw_state(sim)
        refused = gpuvm("apply", str(saved), "--yes")
        assert refused.exit_code == 2, refused.output
        assert "stale plan: plan again" in refused.output and "esx-01-vm1" in refused.output
        assert raw_state(sim) == before

        # a change the plan does not touch (its memory) is a change to a planned object all the same
        gpuvm("plan", str(book), "--out", str(saved))
        reconfigure(sim, "esx-01-vm1", memoryMB=2048)
        before = raw_state(sim)
        refused = gpuvm("apply", str(saved), "--yes")
        assert refused.exit_code == 2 and "esx-01-vm1: changed since" in refused.output, refused.output
        assert raw_state(sim) == before

        # the runbook's text changed: refused naming it, before vCenter is reached
        gpuvm("plan", str(book), "--out", str(saved))
        book.write_text(RUNBOOK + "# reviewed\n")
        refused = gpuvm("apply", str(saved), "--yes")
        assert refused.exit_code == 2 and f"the runbook {book} changed" in refused.output, refused.output
        assert raw_state(sim) == before

        # nothing changed in between: carried out, and nothing is left to do
        book.write_text(RUNBOOK)
        assert gpuvm("plan", str(book), "--out", str(saved)).exit_code == 0
        applied = gpuvm("apply", str(saved), "--yes")
        assert applied.exit_code == 0, applied.output
        assert raw_state(sim)["esx-01-vm1"]["cpus"] == 4
        assert gpuvm("plan", str(book), "--detailed-exitcode").exit_code == 0


def test_a_saved_plan_of_the_lab_hosts_vms_and_guests_is_carried_out_as_planned(testbed, tmp_path, monkeypatch):
    # the digests of ESXi shells' and guests' facts, observed twice (at plan, and under apply's locks), agree
    from tests.integration.test_end_to_end import lab_for_bed
    from tests.integration.vcenter import LAB_MIG, reboot_hook

    testbed.up()  # fresh test hosts: the lab's plan changes hosts, VMs and guests
    saved = tmp_path / "lab.plan"
    with Simulator(hosts=2, vms_per_host=2, on_reboot=reboot_hook(testbed), mig=LAB_MIG) as sim:
        use_simulator(monkeypatch, sim, tmp_path / "state")
        runbook = lab_for_bed(testbed, tmp_path / "lab.yaml")
        planned = gpuvm("plan", str(runbook), "--out", str(saved))
        assert planned.exit_code == 0, planned.output
        document = json.loads(saved.read_text())
        assert {"esx-01", "esx-01-vm1"} <= set(document["objects"]), document["objects"]
        assert any(c["step"].startswith("esxi.") for c in document["changes"])  # ESXi shells' facts, over SSH
        applied = gpuvm("apply", str(saved), "--yes", "--allow-host-reboot")
        assert applied.exit_code == 0, applied.output
        assert gpuvm("plan", str(runbook), "--detailed-exitcode").exit_code == 0
    testbed.up()  # leave fresh hosts behind
