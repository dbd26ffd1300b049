"""The one renderer: plan tables, summaries, JSON, and secrets scrubbed from all of them."""

from __future__ import annotations

import io
import json

from rich.console import Console

from gpuvm.plan import WHOLE_RUN, Change, Disruption, Note, Plan
from gpuvm.steps.host_passthrough import SetPassthrough
from gpuvm.steps.vm_hardware import RemoveDevice
from gpuvm.documents import plan_json
from gpuvm.render import NO_CHANGES, plan_summary, print_plan
from gpuvm.secrets import remember


def plan() -> Plan:
    return Plan(changes=[
        Change("host.passthrough", "esx-01", "pci 0000:17:00.0", "passthrough", "off", "active", Disruption.HOST_REBOOT,
               SetPassthrough("0000:17:00.0", True, False)),
        Change("vm.hardware", "vm1", "pci device (new)", "device", None, "0000:17:00.0", Disruption.VM_POWER_OFF,
               action=RemoveDevice(-100)),
        Change("vm.power", "vm1", "vm", "power", "poweredOff", "poweredOn"),
    ], notes=[Note("vm1", "resolve", "4 NVLinked GPUs in one VM")])


def rendered(p: Plan, form: str = "table", width: int = 200) -> str:
    console = Console(width=width, record=True, file=io.StringIO())
    print_plan(console, p, form)
    return console.export_text()


def test_summary_counts_targets_and_disruptions():
    assert plan_summary(plan()) == "Plan: 3 change(s) on 2 target(s) (1 need VM power-off, 1 need host reboot)."
    assert plan_summary(Plan()) == NO_CHANGES


def test_table_marks_disruptive_rows_and_shows_none_for_missing_values():
    text = rendered(plan())
    row = next(line for line in text.splitlines() if "host.passthrough" in line)
    assert "! needs host reboot" in row and "off" in row and "active" in row
    assert "(none)" in next(line for line in text.splitlines() if "vm.hardware" in line)
    assert "warning: vm1: 4 NVLinked GPUs in one VM" in text


def test_a_setting_made_before_that_waits_for_the_reboot_is_marked_pending():
    waiting = plan()
    waiting.changes.append(Change("host.graphics", "esx-01", "GPU 0000:31:00.0", "graphicsType", "shared",
                                  "sharedDirect", Disruption.HOST_REBOOT))
    row = next(line for line in rendered(waiting).splitlines() if "host.graphics" in line)
    assert "! pending: needs host reboot" in row
    assert "    ! GPU 0000:31:00.0 graphicsType: shared → sharedDirect (pending: host reboot)" in \
        rendered(waiting, "text").splitlines()
    assert plan_summary(waiting) == ("Plan: 4 change(s) on 2 target(s) (1 need VM power-off, "
                                     "2 need host reboot of which 1 pending).")
    assert json.loads(plan_json(waiting))["summary"]["pending"] == 1
    assert [c["pending"] for c in json.loads(plan_json(waiting))["changes"]] == [False, False, False, True]


def test_empty_plan_says_so_explicitly():
    assert rendered(Plan()).strip() == NO_CHANGES
    assert rendered(Plan(), "text").strip() == NO_CHANGES


def test_json_has_changes_notes_and_summary_but_no_apply_spec():
    data = json.loads(plan_json(plan()))
    assert data["schema"] == "gpuvm.plan/1"
    assert data["summary"] == {"changes": 3, "targets": 2, "vm_power_off": 1, "host_reboot": 1, "vm_destroy": 0, "pending": 0,
                               "not_observed": 0, "left_out": 0, "known_after_apply": 0}
    assert data["changes"][1] == {"step": "vm.hardware", "target": "vm1", "resource": "pci device (new)",
                                  "field": "device", "before": None, "after": "0000:17:00.0",
                                  "disruption": "vm-power-off", "pending": False, "known_after_apply": False}


def test_secrets_are_scrubbed_from_tables_and_json():
    remember("hunter2-canary")
    leaky = Plan(changes=[Change("vm.advanced", "vm1", "extraConfig", "guestinfo.x", None, "hunter2-canary")])
    assert "hunter2-canary" not in rendered(leaky)
    assert "hunter2-canary" not in rendered(leaky, "text")
    assert "hunter2-canary" not in plan_json(leaky)


def test_a_target_not_observed_is_not_a_clean_plan():
    unobserved = Plan(unobserved={"gpu-vm-02": "cannot connect to 10.0.0.12:22"})
    assert plan_summary(unobserved) == ("No changes planned on the targets observed; "
                                        "1 target(s) not observed: gpu-vm-02. The plan is incomplete.")
    assert json.loads(plan_json(unobserved))["summary"]["not_observed"] == 1
    with_changes = plan()
    with_changes.unobserved = {"gpu-vm-02": "timed out"}
    assert plan_summary(with_changes).endswith("1 need host reboot). 1 target(s) not observed: gpu-vm-02.")


def test_text_groups_changes_by_target_then_step_with_a_mark_per_change():
    removed = Change("vm.hardware", "vm1", "pci device 3", "device", "0000:b1:00.0", None)
    lines = rendered(Plan(changes=[*plan().changes, removed]), "text").splitlines()
    assert lines[:7] == [
        "esx-01",
        "  host.passthrough",
        "    ! pci 0000:17:00.0 passthrough: off → active (host reboot)",
        "vm1",
        "  vm.hardware",
        "    ! pci device (new) device: 0000:17:00.0 (VM power-off)",
        "    - pci device 3 device: 0000:b1:00.0 (removed)",
    ]
    assert lines[7:9] == ["  vm.power", "    ~ vm power: poweredOff → poweredOn"]
    added = Change("vm.advanced", "vm1", "extraConfig", "numa.nodeAffinity", None, "0")
    assert "    + extraConfig numa.nodeAffinity: 0" in rendered(Plan(changes=[added]), "text").splitlines()


def test_a_note_about_the_whole_run_names_no_target():
    """Not `info: -: not targeted: ...` (a note of the run, not of a target named "-")."""
    p = Plan(notes=[Note(WHOLE_RUN, "targeting", "not targeted: 4 change(s) on esx-02", level="info"),
                    Note("vm1", "resolve", "4 NVLinked GPUs in one VM")])
    lines = rendered(p, "text").splitlines()
    assert "info: not targeted: 4 change(s) on esx-02" in lines
    assert "warning: vm1: 4 NVLinked GPUs in one VM" in lines


def test_a_change_known_after_apply_says_so_in_text_table_and_json():
    later = Plan(changes=[Change("guest.ssh_mesh", "train-01", "guest", "setup", None, "as the runbook asks",
                                known_after_apply=True)])
    assert "    + guest setup: as the runbook asks (known after apply)" in rendered(later, "text").splitlines()
    row = next(line for line in rendered(later).splitlines() if "guest.ssh_mesh" in line)
    assert "as the runbook asks (known after apply)" in row
    assert plan_summary(later) == "Plan: 1 change(s) on 1 target(s) (1 known after apply)."
    assert json.loads(plan_json(later))["changes"][0]["known_after_apply"] is True


def test_no_changes_on_the_targets_does_not_say_the_infrastructure_matches_when_others_have_changes():
    from gpuvm.plan import NOT_TARGETED

    narrowed = Plan(notes=[Note(WHOLE_RUN, NOT_TARGETED, "not targeted: 13 change(s) on esx-01, vm1", level="info")])
    assert plan_summary(narrowed) == "No changes on the targets (other targets have changes, not targeted)."
    assert plan_summary(Plan(notes=[Note("vm1", "resolve", "a warning")])) == NO_CHANGES


def test_a_note_longer_than_the_console_stays_on_one_line_in_a_pipe_or_a_log():
    message = "which GPUs are NVLink-bridged is not known " * 6
    text = rendered(Plan(notes=[Note("vm1", "resolve", message)]), "text", width=100)
    assert f"warning: vm1: {message}".rstrip() in [line.rstrip() for line in text.splitlines()]
