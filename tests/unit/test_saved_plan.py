"""Saved plans (gpuvm.saved_plan): the file's round trip, the objects' digests, and what makes a
saved plan stale."""

from __future__ import annotations

import json
from dataclasses import dataclass
from types import SimpleNamespace

import pytest

from gpuvm.errors import InputError
from gpuvm.plan import Change, Disruption, LeftOut, Note, Plan
from gpuvm.saved_plan import SavedPlan, made, needed_flags, object_digest, read, stale
from gpuvm.secrets import remember
from gpuvm.vsphere.facts import HostFacts, Inventory, VmFacts
from tests.schema_check import check

BOOK = SimpleNamespace(digest="a" * 64)


@dataclass(frozen=True)
class GuestFact:  # an SSH step's fact, as steps observe them
    driver: str
    modules: frozenset[str]
    expires_in: float = 3600.0  # as guest.licensing's: seconds left, moving by itself


def inventory(cpus: int = 2, disk_gb: int = 10, memory_mb: int = 1024) -> Inventory:
    return Inventory(hosts={"esx-01": HostFacts(name="esx-01", moid="host-1")},
                     vms={"vm1": VmFacts(name="vm1", moid="vm-1", host="esx-01", cpus=cpus, disk_gb=disk_gb,
                                         memory_mb=memory_mb)})


FACTS = {("guest.driver", "vm1"): GuestFact("535.1", frozenset({"nvidia", "nvidia_uvm"}))}


def a_plan() -> Plan:
    return Plan([Change("vm.hardware", "vm1", "vm1", "cpus", 2, 4, Disruption.VM_POWER_OFF, action=object()),
                 Change("host.passthrough", "esx-01", "0000:3b:00.0", "passthrough", False, True,
                        Disruption.HOST_REBOOT, action=object()),
                 Change("host.reboot", "esx-01", "esx-01", "reboot", None, "reboot", Disruption.HOST_REBOOT)],
                [Note("vm1", "vm.hardware", "a note")], {"vm2": "did not answer"},
                [LeftOut(Change("vm.power", "vm3", "vm3", "power", "off", "on"), "waits on esx-02")])


def test_the_file_reads_back_as_written_and_matches_its_schema(tmp_path):
    saved = made(BOOK, tmp_path / "rb.yaml", "two", ["esx-01"], a_plan(), inventory(), FACTS)
    file = tmp_path / "plan.json"
    file.write_text(saved.to_json())
    assert check(json.loads(file.read_text())) == "saved-plan"
    again = read(file)
    assert again == SavedPlan(str(tmp_path / "rb.yaml"), "a" * 64, again.plan, saved.objects, saved.needs, "two",
                              ("esx-01",))
    assert [c.to_dict() for c in again.plan.changes] == [c.to_dict() for c in saved.plan.changes]
    assert [c.pending for c in again.plan.changes] == [False, False, True]
    assert again.plan.notes == saved.plan.notes and again.plan.unobserved == {"vm2": "did not answer"}
    assert again.plan.left_out == saved.plan.left_out
    assert stale(again, a_plan(), inventory(), FACTS) == []


def test_a_change_of_a_step_this_gpuvm_has_not_or_on_no_target_is_refused_naming_it(tmp_path):
    data = json.loads(made(BOOK, tmp_path / "rb.yaml", None, [], a_plan(), inventory(), FACTS).to_json())
    file = tmp_path / "plan.json"
    file.write_text(json.dumps(data | {"changes": [data["changes"][0] | {"step": "vm.teleport"}]}))
    with pytest.raises(InputError, match=rf"{file}: not a valid saved plan: changes.0.step: .*'vm.teleport' is not a step"):
        read(file)
    file.write_text(json.dumps(data | {"changes": [data["changes"][0] | {"target": ""}]}))
    with pytest.raises(InputError, match=rf"{file}: not a valid saved plan: changes.0.target"):
        read(file)


def test_the_flags_a_plan_needs():
    assert needed_flags(a_plan()) == ["--allow-power-off", "--allow-host-reboot"]
    destroy = Plan([Change("vm.lifecycle", "vm1", "vm1", "state", "present", None, Disruption.VM_DESTROY)])
    assert needed_flags(destroy) == ["--allow-destroy"] and needed_flags(Plan()) == []


def test_secrets_never_reach_the_file(tmp_path):
    secret = remember("s3cr3t-licence-token")
    plan = Plan([Change("guest.licensing", "vm1", "gridd.conf", "token", None, f"token={secret}")])
    text = made(BOOK, tmp_path / "rb.yaml", None, [], plan, inventory(), {}).to_json()
    assert secret not in text and "token=" in text


def test_a_digest_changes_with_what_was_observed_of_its_object_only():
    base = object_digest("vm1", inventory(), FACTS)
    assert object_digest("vm1", inventory(), dict(FACTS)) == base
    assert object_digest("vm1", inventory(cpus=3), FACTS) != base
    assert object_digest("vm1", inventory(disk_gb=11), FACTS) == base  # grows by itself while it runs
    later = {("guest.driver", "vm1"): GuestFact("535.1", frozenset({"nvidia_uvm", "nvidia"}), expires_in=3000.0)}
    assert object_digest("vm1", inventory(), later) == base
    other_guest = {("guest.driver", "vm1"): GuestFact("550.2", frozenset({"nvidia"}))}
    assert object_digest("vm1", inventory(), other_guest) != base
    assert object_digest("esx-01", inventory(cpus=3), other_guest) == object_digest("esx-01", inventory(), FACTS)
    assert object_digest("vm9", inventory(), {}) != object_digest("vm1", inventory(), {})  # absent: absent


def test_a_plan_is_stale_naming_each_object_changed_or_planned_otherwise(tmp_path):
    saved = made(BOOK, tmp_path / "rb.yaml", None, [], a_plan(), inventory(), FACTS)
    assert stale(saved, a_plan(), inventory(disk_gb=99), FACTS) == []
    assert stale(saved, a_plan(), inventory(memory_mb=2048), FACTS) == ["vm1: changed since the plan was made"]
    cpus_now = Plan([Change("vm.hardware", "vm1", "vm1", "cpus", 3, 4, Disruption.VM_POWER_OFF), *a_plan().changes[1:]])
    assert stale(saved, cpus_now, inventory(cpus=3), FACTS) == [
        "vm1: changed since the plan was made; planned: ! vm1 cpus: 2 → 4 (VM power-off); "
        "now: ! vm1 cpus: 3 → 4 (VM power-off)"]
    fewer = Plan(a_plan().changes[1:])
    assert stale(saved, fewer, inventory(), FACTS) == [
        "vm1: planned otherwise now; planned: ! vm1 cpus: 2 → 4 (VM power-off); now: nothing"]
    more = Plan([*a_plan().changes, Change("vm.power", "vm2", "vm2", "power", "off", "on")])
    assert stale(saved, more, inventory(), FACTS) == ["vm2: planned otherwise now; planned: nothing; now: ~ vm2 power: off → on"]


def test_a_runbook_is_not_a_saved_plan_and_a_bad_saved_plan_is_refused_naming_the_file(tmp_path):
    book = tmp_path / "rb.yaml"
    book.write_text("hosts: [{name: esx-01}]\n")
    assert read(book) is None
    as_json = tmp_path / "rb.json"
    as_json.write_text('{"hosts": [{"name": "esx-01"}]}')
    assert read(as_json) is None
    other = tmp_path / "old.json"
    other.write_text('{"schema": "gpuvm.saved-plan/9"}')
    with pytest.raises(InputError, match=rf"{other}: .*another gpuvm version"):
        read(other)
    broken = tmp_path / "broken.json"
    broken.write_text('{"schema": "gpuvm.saved-plan/1", "runbook": {"path": "rb.yaml"}}')
    with pytest.raises(InputError, match=rf"{broken}: not a valid saved plan: runbook.sha256"):
        read(broken)


def test_apply_of_a_saved_plan_refuses_a_changed_runbook_or_a_flag_not_given_before_connecting(tmp_path, mocker):
    from gpuvm.apply_options import ApplyOptions
    from gpuvm.saved_plan import StalePlan, apply_saved

    book = tmp_path / "rb.yaml"
    book.write_text("hosts: []\n")
    loaded = mocker.patch("gpuvm.saved_plan.load_runbook", return_value=SimpleNamespace(digest="b" * 64))
    applied = mocker.patch("gpuvm.saved_plan.apply_loaded")
    saved = made(BOOK, book, None, ["vm1"], a_plan(), inventory(), FACTS)
    with pytest.raises(StalePlan, match=rf"the runbook {book} changed since {tmp_path}/plan.json was made"):
        apply_saved(tmp_path / "plan.json", saved, None, ApplyOptions(allow_power_off=True, allow_host_reboot=True))
    loaded.return_value = BOOK
    with pytest.raises(InputError, match="the saved plan needs --allow-host-reboot"):
        apply_saved(tmp_path / "plan.json", saved, None, ApplyOptions(allow_power_off=True))
    applied.assert_not_called()
    options = ApplyOptions(allow_power_off=True, allow_host_reboot=True)
    apply_saved(tmp_path / "plan.json", saved, None, options, progress=print)
    (args, kwargs), = applied.call_args_list
    assert args == (BOOK, None, options) and kwargs["targets"] == ("vm1",) and kwargs["progress"] is print
    with pytest.raises(StalePlan, match="vm1: changed since"):
        kwargs["check"](a_plan(), inventory(cpus=3), FACTS)


def test_show_prints_a_saved_plan_as_plan_does_and_refuses_a_runbook(tmp_path):
    from typer.testing import CliRunner

    from gpuvm.cli.main import app

    file = tmp_path / "plan.json"
    file.write_text(made(BOOK, tmp_path / "rb.yaml", "two", [], a_plan(), inventory(), FACTS).to_json())
    as_json = CliRunner().invoke(app, ["show", str(file), "--json"])
    assert as_json.exit_code == 0, as_json.output
    document = json.loads(as_json.stdout)
    assert check(document) == "plan" and document["changes"] == [c.to_dict() for c in a_plan().changes]
    text = CliRunner().invoke(app, ["show", str(file)])
    assert text.exit_code == 0 and "--setup two" in text.stdout and "--allow-power-off --allow-host-reboot" in text.stdout
    assert "cpus: 2 → 4" in text.stdout
    table = CliRunner().invoke(app, ["show", str(file), "--format", "table"])
    assert table.exit_code == 0 and "vm.hardware" in table.stdout, table.output
    (book := tmp_path / "rb.yaml").write_text("hosts: []\n")
    refused = CliRunner().invoke(app, ["show", str(book)])
    assert refused.exit_code == 2 and "not a saved plan" in refused.output


def test_plan_out_onto_its_own_runbook_is_refused_before_anything_is_read_and_show_hints_another_file(tmp_path, mocker):
    from typer.testing import CliRunner

    from gpuvm.cli.main import app

    book = tmp_path / "rb.yaml"
    book.write_text("hosts: []\nvms: []\n")
    observed = mocker.patch("gpuvm.saved_plan.plan_observed")
    for out in (book, tmp_path / "." / "rb.yaml"):
        refused = CliRunner().invoke(app, ["plan", str(book), "--out", str(out)])
        assert refused.exit_code == 2 and f"--out {out}: the runbook itself" in refused.stderr, refused.output
    observed.assert_not_called()
    assert book.read_text() == "hosts: []\nvms: []\n"
    hint = CliRunner().invoke(app, ["show", str(book)])
    assert hint.exit_code == 2 and f"gpuvm plan RUNBOOK --out {book}" not in hint.stderr
    assert "gpuvm plan RUNBOOK --out FILE" in hint.stderr


def test_a_plan_printed_with_json_is_told_from_a_saved_plan_by_apply_and_show(tmp_path):
    from typer.testing import CliRunner

    from gpuvm.cli.main import app
    from gpuvm.documents import plan_json

    printed = tmp_path / "lab.plan"
    printed.write_text(plan_json(a_plan()))
    with pytest.raises(InputError, match=rf"{printed}: a gpuvm.plan/1 document \(plan --json\), not a saved plan: "
                                         r"save one with gpuvm plan RUNBOOK --out FILE"):
        read(printed)
    for command in (["apply", str(printed), "--yes"], ["show", str(printed)]):
        refused = CliRunner().invoke(app, command)
        assert refused.exit_code == 2 and "(plan --json), not a saved plan" in refused.stderr, refused.output
        assert "unknown field" not in refused.stderr


def test_show_takes_the_formats_plan_takes_and_its_help_names_them():
    from typer.testing import CliRunner

    from gpuvm.cli.main import app

    helps = [CliRunner().invoke(app, [command, "--help"], env={"COLUMNS": "200"}).stdout for command in ("show", "plan")]
    assert all("--format [text|table]" in h or "--format <text|table>" in h for h in helps), helps


def test_apply_of_a_saved_plan_whose_runbook_is_not_there_names_the_plan_and_where_to_run_it(tmp_path, monkeypatch):
    from gpuvm.apply_options import ApplyOptions
    from gpuvm.saved_plan import apply_saved

    monkeypatch.chdir(tmp_path)
    saved = made(BOOK, "lab.yaml", None, [], a_plan(), inventory(), FACTS)
    with pytest.raises(InputError, match=r"elsewhere/lab.plan: its runbook lab.yaml is not in .*: run apply in the "
                                         r"directory plan --out ran in"):
        apply_saved(tmp_path / "elsewhere" / "lab.plan", saved, None, ApplyOptions())


def test_applys_help_says_its_argument_may_be_a_saved_plan():
    from typer.testing import CliRunner

    from gpuvm.cli.main import app

    shown = CliRunner().invoke(app, ["apply", "--help"], env={"COLUMNS": "200"}).stdout
    assert "RUNBOOK|FILE" in shown and "The runbook (YAML), or a plan saved by `plan --out`" in shown
