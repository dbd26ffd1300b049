"""Reboots as vSphere does them, through the real CLI: settings pending until the host reboots, a reboot
that failed planned again, running VMs shut down for it (refused up front without --allow-power-off),
and hosts rebooted one batch at a time."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest
from pyVmomi import vim
from typer.testing import CliRunner

from gpusim import Simulator
from gpuvm.cli.main import app
from gpuvm.runbook.vcenters import VCenter
from gpuvm.vsphere.intent import IntentStore
from gpuvm.vsphere.inventory import read_inventory
from gpuvm.vsphere.session import Session, resolve_target
from tests.integration.test_vsphere_flow import LAB_FILE, vsphere_only
from tests.integration.vcenter import LAB_MIG, pyvmomi, raw_state, use_simulator

pytestmark = pytest.mark.integration
VMS = ("esx-01-vm1", "esx-01-vm2", "esx-02-vm1", "esx-02-vm2")


@pytest.fixture(scope="module")
def lab(tmp_path_factory) -> Path:
    return vsphere_only(LAB_FILE, tmp_path_factory.mktemp("runbook") / "lab.yaml")


def gpuvm(*args: str):
    return CliRunner().invoke(app, list(args), catch_exceptions=False)


def started(monkeypatch, tmp_path, **options) -> Simulator:
    sim = Simulator(hosts=2, vms_per_host=2, mig=LAB_MIG, **options)
    sim.start()
    use_simulator(monkeypatch, sim, tmp_path / "state")
    return sim


def record_intent(entity: str, act: str, why: str, **data) -> None:
    """Record an act on a host or VM as a gpuvm run does before it (govc's variables point at the simulator)."""
    with Session(resolve_target(VCenter(password_env="GPUVM_VCENTER_PASSWORD"))) as session:
        facts = read_inventory(session)
        kind, moid = (("HostSystem", facts.hosts[entity].moid) if entity in facts.hosts
                      else ("VirtualMachine", facts.vms[entity].moid))
        IntentStore(session, "c0ffee000001").record(session.ref(kind, moid), act, why, **data)


def test_a_failed_reboot_leaves_pending_settings_that_plan_and_verify_show_and_the_next_apply_reboots(
        lab, tmp_path, monkeypatch):
    booted = tmp_path / "reboots-work"
    sim = started(monkeypatch, tmp_path, on_reboot=f"test -e {booted} || {{ echo BMC lost the host; exit 1; }}")
    try:
        failed = gpuvm("apply", str(lab), "--yes", "--allow-host-reboot")
        assert failed.exit_code != 0 and "BMC lost the host" in failed.output, failed.output
        state = raw_state(sim)
        assert state["esx-02"]["graphics"] == "sharedDirect"  # configured ...
        assert ("0000:31:00.0", "shared") in state["esx-02"]["gpus_run"]  # ... but not what the GPUs run
        assert any(enabled and not active for _, enabled, active in state["esx-01"]["passthru"])
        assert not state["esx-01"]["maintenance"] and not state["esx-02"]["maintenance"]  # back in service

        replanned = json.loads(gpuvm("plan", str(lab), "--json").output)
        pending = {(c["target"], c["resource"], c["field"]) for c in replanned["changes"] if c["pending"]}
        assert ("esx-02", "GPU 0000:31:00.0", "graphicsType") in pending  # the GPUs, not only the host default
        assert ("esx-01", "pci 0000:17:00.0 (GA100 [A100 PCIe 80GB])", "passthrough") in pending
        assert {c["target"] for c in replanned["changes"] if c["step"] == "host.reboot"} == {"esx-01", "esx-02"}
        drift = gpuvm("verify", str(lab))
        assert drift.exit_code == 5 and "pending" in drift.output, drift.output

        booted.touch()  # the BMC answers again
        applied = gpuvm("apply", str(lab), "--yes", "--allow-host-reboot")
        assert applied.exit_code == 0, applied.output
        state = raw_state(sim)
        assert ("0000:31:00.0", "sharedDirect") in state["esx-02"]["gpus_run"]
        assert all(enabled == active for _, enabled, active in state["esx-01"]["passthru"])
        assert all(state[vm]["power"] == "poweredOn" for vm in VMS)
        assert gpuvm("verify", str(lab)).exit_code == 0
    finally:
        sim.stop()


def test_running_vms_refused_up_front_then_shut_down_and_hosts_rebooted_one_at_a_time(lab, tmp_path, monkeypatch):
    sim = started(monkeypatch, tmp_path, vm_power="on", latency={"RebootHost_Task": "1500ms"})
    try:
        planned = json.loads(gpuvm("plan", str(lab), "--json").output)["changes"]
        assert {c["target"]: c["after"] for c in planned if c["step"] == "host.reboot" and c["field"] == "power"} == {
            vm: f"poweredOff for the reboot of {vm[:6]}" for vm in VMS}
        before = raw_state(sim)
        refused = gpuvm("apply", str(lab), "--yes", "--allow-host-reboot")
        assert refused.exit_code == 2, refused.output
        assert "esx-01-vm1" in refused.output and "--allow-power-off" in refused.output
        assert raw_state(sim) == before, "a refused apply touched something"

        applied = gpuvm("apply", str(lab), "--yes", "--allow-host-reboot", "--allow-power-off")
        assert applied.exit_code == 0, applied.output
        state = raw_state(sim)
        assert all(state[vm]["power"] == "poweredOn" for vm in VMS)
        first, second = sorted(state[h]["booted"] for h in ("esx-01", "esx-02"))
        assert (second - first).total_seconds() >= 1.4, "hosts rebooted at the same time (--max-unavailable 1)"
        assert gpuvm("plan", str(lab), "--detailed-exitcode").exit_code == 0
        memos = [row["why"] for row in json.loads(gpuvm("locks", str(lab), "--json").output)["rows"]
                 if row["act"] == "rebooted"]
        devices = [re.findall(r"pci [0-9a-f:.]+", memo) for memo in memos]  # the memo `gpuvm locks` shows
        assert len(memos) == 2 and all(": passthrough of pci 0000:" in memo for memo in memos), memos
        assert all(named and len(named) == len(set(named)) for named in devices), memos  # each device once
    finally:
        sim.stop()


def test_a_host_left_in_maintenance_mode_by_gpuvm_is_planned_out_but_one_put_there_by_hand_is_not(
        lab, tmp_path, monkeypatch):
    sim = started(monkeypatch, tmp_path)
    try:
        assert gpuvm("apply", str(lab), "--yes", "--allow-host-reboot").exit_code == 0
        with pyvmomi(sim) as si:  # an operator takes both hosts down for service
            content = si.RetrieveContent()
            view = content.viewManager.CreateContainerView(content.rootFolder, [vim.ManagedEntity], True)
            for vm in [o for o in view.view if isinstance(o, vim.VirtualMachine)]:
                vm.PowerOffVM_Task()
            time.sleep(1)
            for host in [o for o in view.view if isinstance(o, vim.HostSystem)]:
                host.EnterMaintenanceMode_Task(timeout=0)
            view.DestroyView()
        for _ in range(100):
            if all(raw_state(sim)[h]["maintenance"] for h in ("esx-01", "esx-02")):
                break
            time.sleep(0.1)
        assert all(raw_state(sim)[h]["maintenance"] for h in ("esx-01", "esx-02"))
        record_intent("esx-02", "maintenance", "reboot of esx-02")  # as an interrupted run leaves it
        journal = tmp_path / "state" / "journal.jsonl"  # a stale journal line (the old ownership) for esx-01
        with journal.open("a") as out:
            out.write(json.dumps({"run": "x", "status": "maintenance", "host": "esx-01", "state": "entered"}) + "\n")
        planned = json.loads(gpuvm("plan", str(lab), "--json").output)["changes"]
        assert [(c["target"], c["field"], c["after"]) for c in planned if c["step"] == "host.reboot"] == [
            ("esx-02", "maintenance mode", "off")]
        applied = gpuvm("apply", str(lab), "--yes")  # esx-01's VMs cannot power on: the operator's maintenance stays
        state = raw_state(sim)
        assert state["esx-01"]["maintenance"] and not state["esx-02"]["maintenance"], applied.output
        assert "outstanding" not in gpuvm("verify", str(lab)).output  # its record cleared with the maintenance mode
    finally:
        sim.stop()


ROLLING = """\
vcenter: {user: administrator@vsphere.local, password_env: GPUVM_VCENTER_PASSWORD}
hosts:
  - {name: esx-01, passthrough: [{address: "0000:17:00.0"}], allow_maintenance: true, allow_reboot: true}
  - {name: esx-02, passthrough: [{address: "0000:17:00.0"}], allow_maintenance: true, allow_reboot: true}
vms:
  - {name: esx-01-vm1, host: esx-01, firmware: bios}
  - {name: esx-02-vm1, host: esx-02, firmware: bios}
"""


def test_rolling_reboots_bring_a_hosts_vms_back_before_the_next_host_goes_down(tmp_path, monkeypatch):
    """Issue 22, item 5: with --max-unavailable 1 no more than one host's VMs are ever down at once
    (power states polled from another session while the apply runs): the runbook's VMs, which need
    nothing else off, come back with their host, not after every host is done."""
    import threading

    runbook = tmp_path / "rb.yaml"
    runbook.write_text(ROLLING)
    with Simulator(hosts=2, vms_per_host=2, vm_power="on", latency={"RebootHost_Task": "1s"}) as sim:
        use_simulator(monkeypatch, sim, tmp_path / "state")
        samples: list[dict[str, str]] = []
        done = threading.Event()

        def poll() -> None:
            while not done.is_set():
                state = raw_state(sim)
                samples.append({vm: state[vm]["power"] for vm in VMS})
                time.sleep(0.1)

        poller = threading.Thread(target=poll)
        poller.start()
        try:
            applied = gpuvm("apply", str(runbook), "--yes", "--allow-host-reboot", "--allow-power-off",
                            "--max-unavailable", "1")
        finally:
            done.set()
            poller.join()
        assert applied.exit_code == 0, applied.output
        down = [{vm[:6] for vm, power in sample.items() if power != "poweredOn"} for sample in samples]
        assert any(down), "the poller never saw a VM stopped for its host's reboot"
        assert all(len(hosts) <= 1 for hosts in down), [sorted(h) for h in down if len(h) > 1]
        assert all(raw_state(sim)[vm]["power"] == "poweredOn" for vm in VMS)


ROLLING_HARDWARE = """\
vcenter: {user: administrator@vsphere.local, password_env: GPUVM_VCENTER_PASSWORD}
hosts:
  - {name: esx-01, passthrough: [{address: "0000:17:00.0"}], allow_maintenance: true, allow_reboot: true}
  - {name: esx-02, passthrough: [{address: "0000:17:00.0"}], allow_maintenance: true, allow_reboot: true}
vms:
  - {name: esx-01-vm1, host: esx-01, cpus: 8, gpus: {mode: dynamic, count: 1}}
  - {name: esx-02-vm1, host: esx-02, cpus: 8,
     gpus: {mode: passthrough, count: 1, addresses: ["0000:17:00.0"]}}
"""


def test_rolling_reboots_change_a_hosts_vms_while_they_are_off_and_bring_them_back_before_the_next_host(
        tmp_path, monkeypatch):
    """Issue 22, item 5: VMs that wait for their host's reboot to get new GPUs (and more CPUs, which
    need them off; the first host's by dynamic DirectPath) are changed while they are off for it and
    come back with their host: with
    --max-unavailable 1, before every power-on gpuvm makes (where the set of VMs down is largest),
    the simulator shows at most one host's VMs off."""
    import gpuvm.steps.power as power

    runbook = tmp_path / "rb.yaml"
    runbook.write_text(ROLLING_HARDWARE)
    with Simulator(hosts=2, vms_per_host=2, vm_power="on") as sim:
        use_simulator(monkeypatch, sim, tmp_path / "state")
        down: list[set[str]] = []  # hosts with a runbook VM off, just before each power-on
        run_task = power.run_task

        def watched(action, *args, **kwargs):
            if action == "PowerOnVM":
                state = raw_state(sim)
                down.append({vm[:6] for vm in ("esx-01-vm1", "esx-02-vm1") if state[vm]["power"] != "poweredOn"})
            return run_task(action, *args, **kwargs)

        monkeypatch.setattr(power, "run_task", watched)
        applied = gpuvm("apply", str(runbook), "--yes", "--allow-host-reboot", "--allow-power-off",
                        "--max-unavailable", "1")
        assert applied.exit_code == 0, applied.output
        assert down and all(len(hosts) <= 1 for hosts in down), down
        state = raw_state(sim)
        assert all(state[vm]["power"] == "poweredOn" for vm in ("esx-01-vm1", "esx-02-vm1"))
        assert gpuvm("plan", str(runbook), "--detailed-exitcode").exit_code == 0  # converged
