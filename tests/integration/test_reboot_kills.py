"""Apply killed inside the disruptive call (issue 21, Done when): at each boundary of entering maintenance
mode for a reboot — intent recorded (before the task), task started (vCenter still entering: latency),
task finished, intent cleared — by SIGKILL and SIGTERM, timed on the journal the running apply writes.
Between the kill and the re-run `verify` is honest (non-zero, naming the unfinished acts recorded on
the objects); one more `apply` with the same flags converges: no host in maintenance mode, no VM
off, no record left, `verify` clean.

One host with a GPU whose passthrough waits for a reboot, a VM of the runbook's and one it does not
manage (stopped for the reboot and owed its power-on), both running."""

from __future__ import annotations

import functools
import json
import os
import signal
import subprocess
import sys
import time

import pytest
from typer.testing import CliRunner

from gpusim import Simulator
from gpuvm import runs
from gpuvm.cli.main import app
from gpuvm.outstanding import MEMOS
from gpuvm.runbook.vcenters import VCenter
from gpuvm.steps import host_reboot
from gpuvm.steps.base import Options
from gpuvm.vsphere import tasks
from gpuvm.vsphere.intent import IntentStore
from gpuvm.vsphere.inventory import read_inventory
from gpuvm.vsphere.session import Session, resolve_target
from tests.integration.vcenter import KILLED_RUN_LEASE, once_unlocked, raw_state, use_simulator

pytestmark = pytest.mark.integration

RUNBOOK = """\
vcenter: {user: administrator@vsphere.local, password_env: GPUVM_VCENTER_PASSWORD}
hosts:
  - {name: esx-01, passthrough: [{address: "0000:17:00.0"}], allow_maintenance: true, allow_reboot: true}
vms: [{name: esx-01-vm1, host: esx-01, firmware: bios}]
"""
FLAGS = ("--yes", "--allow-host-reboot", "--allow-power-off")
BOUNDARIES = {  # journal entry the kill follows
    "intent-recorded": {"status": "intent", "act": "maintenance", "state": "recorded"},
    "task-started": {"status": "maintenance", "state": "entering"},
    "task-finished": {"status": "maintenance", "state": "entered"},
    "intent-cleared": {"status": "intent", "act": "maintenance", "state": "cleared"},
}
SIGNALS = [signal.SIGKILL, signal.SIGTERM]


def gpuvm(*args: str):
    return CliRunner().invoke(app, list(args), catch_exceptions=False)


def entries(journal) -> list[dict]:
    text = journal.read_text() if journal.exists() else ""
    return [json.loads(line) for line in text.splitlines(keepends=True) if line.endswith("\n")]


def intents() -> dict[str, list[str]]:
    """The acts recorded on every host and VM (read as any run reads them)."""
    with Session(resolve_target(VCenter(password_env="GPUVM_VCENTER_PASSWORD"))) as session:
        facts = read_inventory(session)
    objects = {**{h.name: h.intents for h in facts.hosts.values()}, **{v.name: v.intents for v in facts.vms.values()}}
    unfinished = {name: sorted(set(acts) - MEMOS) for name, acts in objects.items()}  # a memo is a finished act
    return {name: acts for name, acts in unfinished.items() if acts}


def converged(state: dict) -> bool:
    return (not state["esx-01"]["maintenance"] and all(state[vm]["power"] == "poweredOn" for vm in ("esx-01-vm1", "esx-01-vm2"))
            and not intents())


@pytest.fixture
def runbook(tmp_path):
    path = tmp_path / "rb.yaml"
    path.write_text(RUNBOOK)
    return path


@pytest.mark.parametrize("sig", SIGNALS, ids=[s.name for s in SIGNALS])
@pytest.mark.parametrize("boundary", list(BOUNDARIES))
def test_apply_killed_inside_the_reboot_is_honest_then_converges_on_one_rerun(runbook, tmp_path, monkeypatch,
                                                                               boundary, sig):
    journal = tmp_path / "state" / "journal.jsonl"
    with Simulator(hosts=1, vms_per_host=2, vm_power="on", latency={"EnterMaintenanceMode_Task": "800ms"}) as sim:
        use_simulator(monkeypatch, sim, tmp_path / "state")
        lease = KILLED_RUN_LEASE if sig == signal.SIGKILL else {}  # its locks hold until its lease expires
        run = subprocess.Popen([sys.executable, "-m", "gpuvm.cli.main", "apply", str(runbook), *FLAGS],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=dict(os.environ, **lease))
        wanted = BOUNDARIES[boundary]
        deadline = time.monotonic() + 30
        while not any(wanted.items() <= entry.items() for entry in entries(journal)):
            assert run.poll() is None and time.monotonic() < deadline, run.communicate()[0]
            time.sleep(0.002)
        run.send_signal(sig)
        output = run.communicate(timeout=60)[0]
        assert run.returncode in (-signal.SIGKILL, 128 + signal.SIGTERM), output
        if boundary == "task-started":
            time.sleep(1.0)  # vCenter finishes entering after the client is gone

        held = intents()
        if sig == signal.SIGKILL and boundary != "intent-cleared":
            assert "maintenance" in held.get("esx-01", []), held  # the record the killed run made is on the host
        verified = gpuvm("verify", str(runbook))
        now = raw_state(sim)  # SIGTERM lets the host under way finish: its VMs may all be back already
        done = converged(now) and all(enabled == active for _, enabled, active in now["esx-01"]["passthru"])
        assert (verified.exit_code == 0) == done, f"verify after a kill at {boundary}:\n{verified.output}"
        if sig == signal.SIGKILL:
            assert not done and verified.exit_code != 0, verified.output
        for name, acts in held.items():  # every unfinished act is named, with its run
            assert all(f"{name}: gpuvm intent {act!r} outstanding" in verified.output for act in acts), verified.output

        again = once_unlocked(lambda: gpuvm("apply", str(runbook), *FLAGS), lambda r: r.exit_code)
        assert again.exit_code == 0, output + "\n--- re-run:\n" + again.output
        state = raw_state(sim)
        assert converged(state), (state["esx-01"], {vm: state[vm]["power"] for vm in ("esx-01-vm1", "esx-01-vm2")},
                                  intents())
        assert all(enabled == active for address, enabled, active in state["esx-01"]["passthru"]
                   if address == "0000:17:00.0")
        final = gpuvm("verify", str(runbook))
        assert final.exit_code == 0, final.output


def test_an_enter_task_past_gpuvms_timeout_is_canceled_or_when_it_completes_anyway_undone_by_the_next_run(
        runbook, tmp_path, monkeypatch):
    """gpuvm's own task timeout (1 s) runs out while vCenter still enters (2 s): the task is canceled and
    the run undoes itself. Where vCenter goes on regardless (a cancel it ignores), the host enters
    after the run ended: its record says it is gpuvm's, so verify names it and the next run takes
    the host out (before: classed as someone else's and kept in maintenance mode for ever)."""
    with Simulator(hosts=1, vms_per_host=1, latency={"EnterMaintenanceMode_Task": "2s"}) as sim:
        use_simulator(monkeypatch, sim, tmp_path / "state")
        with monkeypatch.context() as short:
            short.setattr(runs, "Options", functools.partial(Options, task_timeout=1))
            failed = gpuvm("apply", str(runbook), "--yes", "--allow-host-reboot")
            assert failed.exit_code == 4 and "EnterMaintenanceMode did not finish within 1 s" in failed.output, failed.output
            time.sleep(1.5)
            assert not raw_state(sim)["esx-01"]["maintenance"] and intents() == {}  # canceled, and undone

            short.setattr(host_reboot, "_finish", lambda task, action, timeout: tasks.wait(task, action, timeout))
            short.setattr(host_reboot, "CANCEL_GRACE_S", 0.0)
            assert gpuvm("apply", str(runbook), "--yes", "--allow-host-reboot").exit_code == 4
        deadline = time.monotonic() + 5
        while not raw_state(sim)["esx-01"]["maintenance"]:  # vCenter completes the task the run gave up on
            assert time.monotonic() < deadline
            time.sleep(0.1)
        verified = gpuvm("verify", str(runbook))
        assert verified.exit_code == 5 and "esx-01: gpuvm intent 'maintenance' outstanding" in verified.output

        again = gpuvm("apply", str(runbook), "--yes", "--allow-host-reboot")
        assert again.exit_code == 0, again.output
        assert not raw_state(sim)["esx-01"]["maintenance"] and intents() == {}
        assert gpuvm("verify", str(runbook)).exit_code == 0


def test_verify_names_every_outstanding_intent_even_with_nothing_to_change(tmp_path, monkeypatch):
    """An act no step plans for (here a clone record on the runbook's VM) is still drift; a memo kept
    on purpose after its act (the host's "rebooted") is not."""
    runbook = tmp_path / "rb.yaml"
    runbook.write_text(RUNBOOK.replace('passthrough: [{address: "0000:17:00.0"}], ', "")
                       .replace("firmware: bios}", "firmware: bios, power: \"off\"}"))
    with Simulator(hosts=1, vms_per_host=2) as sim:
        use_simulator(monkeypatch, sim, tmp_path / "state")
        assert gpuvm("verify", str(runbook)).exit_code == 0
        with Session(resolve_target(VCenter(password_env="GPUVM_VCENTER_PASSWORD"))) as session:
            facts = read_inventory(session)
            store = IntentStore(session, "5c1d00000000")
            vm = session.ref("VirtualMachine", facts.vms["esx-01-vm2"].moid)  # on the runbook's host, not in it
            store.record(vm, "clone esx-01-vm3", "clone esx-01-vm3 under way", vm="esx-01-vm3")
            store.record(session.ref("HostSystem", facts.hosts["esx-01"].moid), "rebooted", "rebooted for 1 change",
                         booted=facts.hosts["esx-01"].booted, changes=[["0123456789ab"]])
            verified = gpuvm("verify", str(runbook))
            assert verified.exit_code == 5, verified.output
            assert "esx-01-vm2: gpuvm intent 'clone esx-01-vm3' outstanding: recorded by run 5c1d00000000" in verified.output
            assert "clone esx-01-vm3 under way" in verified.output and "'rebooted'" not in verified.output
            assert "esx-01-vm2: gpuvm intent 'clone esx-01-vm3'" in gpuvm("plan", str(runbook)).output  # plan too
            store.clear(vm, "clone esx-01-vm3")
        assert gpuvm("verify", str(runbook)).exit_code == 0
