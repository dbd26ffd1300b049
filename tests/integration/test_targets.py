"""`--target` against the simulator: a VM whose devices wait for its host is left out whole, its
changes listed and counted by plan, apply and verify alike; a host brings its VMs; apply on one
host leaves the other untouched; an unknown name is exit 2."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from gpusim import Simulator
from gpuvm.cli.main import app
from tests.integration.test_vsphere_flow import LAB_FILE, vsphere_only
from tests.integration.vcenter import LAB_MIG, raw_state, use_simulator

pytestmark = pytest.mark.integration


def gpuvm(*args: object):
    return CliRunner().invoke(app, [str(a) for a in args], catch_exceptions=False)


def targets(result) -> set[str]:
    return {c["target"] for c in json.loads(result.stdout)["changes"]}


def test_targets_narrow_plan_apply_and_verify(monkeypatch, tmp_path):
    with Simulator(hosts=2, vms_per_host=2, mig=LAB_MIG) as sim:
        use_simulator(monkeypatch, sim, tmp_path / "state")
        lab = vsphere_only(LAB_FILE, tmp_path / "lab.yaml")

        unknown = gpuvm("plan", lab, "--target", "esx-01", "--target", "esx-07")
        assert unknown.exit_code == 2 and "--target esx-07: no host, VM or guest of that name" in unknown.stderr

        # its GPUs wait for esx-01's reboot: nothing to carry out, but its changes are listed, and count
        alone = gpuvm("plan", lab, "--target", "esx-01-vm1", "--json", "--detailed-exitcode")
        assert alone.exit_code == 2, alone.stderr
        plan = json.loads(alone.stdout)
        assert plan["changes"] == [] and plan["summary"]["left_out"] == len(plan["left_out_changes"]) > 0
        assert {c["target"] for c in plan["left_out_changes"]} == {"esx-01-vm1"}
        assert plan["left_out"]["esx-01-vm1"].startswith("waits on host esx-01 (")
        shown = gpuvm("plan", lab, "--target", "esx-01-vm1", "--detailed-exitcode")
        assert shown.exit_code == 2 and "Infrastructure matches" not in shown.stdout
        assert "esx-01-vm1 — waits on host esx-01 (" in shown.stdout and "), not targeted" in shown.stdout
        assert f"{plan['summary']['left_out']} change(s) left out on 1 target(s): esx-01-vm1" in shown.stdout
        nothing = gpuvm("apply", lab, "--target", "esx-01-vm1", "--yes")  # applies nothing: drift remains
        assert nothing.exit_code == 5, nothing.stdout + nothing.stderr
        assert "Infrastructure matches" not in nothing.stdout and "waits on host esx-01" in nothing.stdout
        assert "drift remains" in nothing.stderr and "esx-01-vm1: waits on host esx-01" in nothing.stderr
        assert gpuvm("verify", lab, "--target", "esx-01-vm1").exit_code == 5  # the three agree

        host = gpuvm("plan", lab, "--target", "esx-01", "--json")
        assert targets(host) == {"esx-01", "esx-01-vm1", "esx-01-vm2"}

        applied = gpuvm("apply", lab, "--target", "esx-01", "--yes", "--allow-host-reboot")
        assert applied.exit_code == 0, applied.stderr
        checked = gpuvm("verify", lab, "--target", "esx-01")  # no drift there, which is all it says
        assert checked.exit_code == 0 and "No drift on the targets" in checked.stdout, checked.stdout
        assert "infrastructure matches" not in checked.stdout
        replanned = gpuvm("plan", lab, "--target", "esx-01")
        assert "No changes on the targets (other targets have changes, not targeted)." in replanned.stdout
        rest = gpuvm("plan", lab, "--json")
        assert targets(rest) == {"esx-02", "esx-02-vm1", "esx-02-vm2"}  # the other host untouched
        assert gpuvm("verify", lab, "--target", "esx-02-vm2").exit_code == 5


PENDING_REBOOT = """\
vcenter: {user: administrator@vsphere.local, password_env: GPUVM_VCENTER_PASSWORD}
hosts:
  - {name: esx-01, passthrough: [{address: "0000:17:00.0"}], allow_maintenance: true, allow_reboot: true}
vms:
  - {name: esx-01-vm1, host: esx-01, firmware: bios}
  - {name: esx-01-vm2, host: esx-01, firmware: bios}
"""


def test_a_vm_targeted_without_the_host_whose_reboot_stops_it_is_left_out_and_apply_counts_nothing(
        monkeypatch, tmp_path):
    """Issue 34, item 1: esx-01's reboot is pending (its passthrough waits for it) and stops its running
    VMs; `--target esx-01-vm2` plans neither that stop nor the power-on after it (they are the
    reboot's, esx-01 is not targeted): both are left out, with why, and apply makes and journals nothing."""
    book = tmp_path / "rb.yaml"
    book.write_text(PENDING_REBOOT)
    with Simulator(hosts=1, vms_per_host=2, vm_power="on") as sim:
        use_simulator(monkeypatch, sim, tmp_path / "state")
        alone = gpuvm("plan", book, "--target", "esx-01-vm2", "--json", "--detailed-exitcode")
        assert alone.exit_code == 2, alone.stdout + alone.stderr
        plan = json.loads(alone.stdout)
        assert plan["changes"] == [], plan["changes"]
        assert {(c["step"], c["field"]) for c in plan["left_out_changes"]} == {("host.reboot", "power"),
                                                                            ("vm.power", "power")}
        assert "waits for the reboot of esx-01, not targeted" in plan["left_out"]["esx-01-vm2"]

        applied = gpuvm("apply", book, "--target", "esx-01-vm2", "--yes", "--allow-power-off")
        assert applied.exit_code == 5, applied.stdout + applied.stderr  # drift remains, nothing applied
        assert "Applied" not in applied.stdout and "waits for the reboot of esx-01" in applied.stderr
        journal = tmp_path / "state" / "journal.jsonl"
        done = [e for e in map(json.loads, journal.read_text().splitlines()) if e.get("status") == "done"] \
            if journal.exists() else []
        assert done == [], done
        assert raw_state(sim)["esx-01-vm2"]["power"] == "poweredOn"

        host = gpuvm("plan", book, "--target", "esx-01", "--json")
        assert {(c["target"], c["step"]) for c in json.loads(host.stdout)["changes"]} >= {
            ("esx-01", "host.reboot"), ("esx-01-vm2", "host.reboot")}
        assert gpuvm("apply", book, "--target", "esx-01", "--yes", "--allow-host-reboot",
                     "--allow-power-off").exit_code == 0
        assert gpuvm("plan", book, "--target", "esx-01-vm2", "--detailed-exitcode").exit_code == 0
        assert raw_state(sim)["esx-01-vm2"]["power"] == "poweredOn"


def test_a_vm_the_runbook_wants_off_is_powered_off_on_its_own_not_for_the_reboot_of_its_host_left_out(
        monkeypatch, tmp_path):
    """esx-01's reboot pending, esx-01-vm2 running and wanted off: with esx-01 left out, its stop is not
    the reboot's but its own power-off (vm.power), which apply makes and counts alone; esx-01 untouched."""
    book = tmp_path / "rb.yaml"
    book.write_text(PENDING_REBOOT.replace("{name: esx-01-vm2, host: esx-01, firmware: bios}",
                                           "{name: esx-01-vm2, host: esx-01, firmware: bios, power: off}"))
    with Simulator(hosts=1, vms_per_host=2, vm_power="on") as sim:
        use_simulator(monkeypatch, sim, tmp_path / "state")
        host_before = raw_state(sim)["esx-01"]
        alone = gpuvm("plan", book, "--target", "esx-01-vm2", "--json", "--detailed-exitcode")
        assert alone.exit_code == 2, alone.stdout + alone.stderr
        plan = json.loads(alone.stdout)
        assert [(c["step"], c["target"], c["after"]) for c in plan["changes"]] == [
            ("vm.power", "esx-01-vm2", "poweredOff")]
        assert plan["left_out_changes"] == [] and "for the reboot" not in alone.stdout

        applied = gpuvm("apply", book, "--target", "esx-01-vm2", "--yes", "--allow-power-off")
        assert applied.exit_code == 0, applied.stdout + applied.stderr
        assert "Applied 1 of 1" in applied.stdout + applied.stderr, applied.stdout + applied.stderr
        done = [(e["step"], e["target"]) for e in map(json.loads, (tmp_path / "state" / "journal.jsonl").read_text()
                                                       .splitlines()) if e.get("status") == "done"]
        assert done == [("vm.power", "esx-01-vm2")], done
        state = raw_state(sim)
        assert state["esx-01-vm2"]["power"] == "poweredOff" and state["esx-01"] == host_before
        assert gpuvm("plan", book, "--target", "esx-01-vm2", "--detailed-exitcode").exit_code == 0
