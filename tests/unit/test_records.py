"""Values gpuvm keeps in vCenter are input (issue 33, point 1): one bounded, typed reader
(vsphere/records.py); a record gpuvm cannot prove it wrote is reported, never acted on."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from hypothesis import given, settings, strategies as st

from gpuvm import engine
from gpuvm.outstanding import outstanding
from gpuvm.plan import Change, Disruption
from gpuvm.runbook.loader import load_runbook
from gpuvm.steps import reboot_memo
from gpuvm.vsphere import records
from gpuvm.vsphere.facts import Inventory
from gpuvm.vsphere.inventory import host_facts, vm_facts

INTENT, OWNED = 1, 2  # the attributes' keys
RUN = "3f2a9c1d0e4b"  # a run id as journal.Journal makes them
SINCE = "2026-11-25T16:50:17+00:00"
DEEP = "[" * 8_000 + "]" * 8_000  # 16 kB, nested 8,000 deep: json.loads recurses past Python's limit
MIG_PENDING = Change("esxi.mig", "esx-01", "GPU 0", "mig.mode", "Disabled (pending Enabled)", "Enabled (after reboot)",
                     Disruption.HOST_REBOOT)
NESTED = json.dumps({"maintenance": {"run": RUN, "why": "x", "since": SINCE, "data": json.loads("[" * 500 + "]" * 500)}})


def record(data: dict | None = None, **fields) -> dict:
    return {"run": RUN, "why": "reboot of esx-01", "since": SINCE, "data": data or {}, **fields}


def host(intent: str | None = None, owned: str | None = None, maintenance: bool = True, booted: str = SINCE):
    values = [SimpleNamespace(key=k, value=v) for k, v in ((INTENT, intent), (OWNED, owned)) if v is not None]
    return host_facts("host-1", {"name": "esx-01", "runtime.inMaintenanceMode": maintenance, "runtime.bootTime": booted,
                                 "runtime.connectionState": "connected",
                                 "customValue": values}, INTENT, OWNED)


def vm(name: str, intent: str, power: str = "poweredOff"):
    return vm_facts(f"vm-{name}", {"name": name, "runtime.host": SimpleNamespace(_moId="host-1"),
                                   "runtime.powerState": power, "customValue": [SimpleNamespace(key=INTENT, value=intent)]},
                    {"host-1": "esx-01"}, None, INTENT)


def plan_of(tmp_path, hosts, vms=()):
    book = tmp_path / "rb.yaml"
    book.write_text("hosts: [{name: esx-01, allow_maintenance: true, allow_reboot: true}]\n")
    inventory = Inventory(hosts={h.name: h for h in hosts}, vms={v.name: v for v in vms})
    return engine.make_plan(load_runbook(book), inventory)[0]


FOREIGN_HOST_VALUES = {
    "16 kB nested": DEEP,
    "nested past the limit inside a record": NESTED,
    "maintenance is a number": '{"maintenance": 42}',
    "an empty object": "{}",
    "a note": "host reserved for the storage team, ask Ana",
    "no gpuvm run id": json.dumps({"maintenance": record(run="ops")}),
    "no run at all": json.dumps({"maintenance": {"why": "mine", "since": SINCE, "data": {}}}),
    "a version gpuvm does not know": json.dumps({"maintenance": record(v=2)}),
    "a field gpuvm does not write": json.dumps({"maintenance": record(by="ops")}),
    "a time with no zone": json.dumps({"maintenance": record(since="2026-11-25T16:50:17")}),
    "data maintenance does not have": json.dumps({"maintenance": record({"hold": True})}),
    "a VM's act on a host": json.dumps({"power-off": record({"host": "esx-01", "restore": "poweredOn"})}),
}


@pytest.mark.parametrize("value", list(FOREIGN_HOST_VALUES.values()), ids=list(FOREIGN_HOST_VALUES))
def test_a_foreign_maintenance_record_is_reported_and_never_acted_on(tmp_path, value):
    """Failed before: DEEP raised RecursionError; the others planned the host out of maintenance mode."""
    plan = plan_of(tmp_path, [host(value)])
    assert plan.for_step("host.reboot") == []  # the host stays in maintenance mode: it may be an admin's
    notes = [n for n in plan.notes if n.target == "esx-01"]
    assert [n.step for n in notes] == ["foreign"], notes
    assert "gpuvm.intent holds a value gpuvm did not write" in notes[0].message
    assert "Set-Annotation -Entity esx-01 -CustomAttribute gpuvm.intent -Value ''" in notes[0].message
    assert "`apply` finishes or undoes it" not in notes[0].message


def test_gpuvms_own_maintenance_record_is_acted_on_and_the_previous_releases_too(tmp_path):
    for value in (json.dumps({"maintenance": record(v=1)}), json.dumps({"maintenance": record()})):
        plan = plan_of(tmp_path, [host(value)])
        assert [(c.field, c.after) for c in plan.for_step("host.reboot")] == [("maintenance mode", "off")]
        assert [n.step for n in plan.notes if n.target == "esx-01"] == ["intent"]


@pytest.mark.parametrize("value", [
    json.dumps({"power-off": {"why": "stopped", "data": {"restore": "poweredOn"}}}),  # names no gpuvm run
    json.dumps({"power-off": record({"host": "esx-01", "restore": "on"})}),
    json.dumps({"power-off": record({"restore": "poweredOn"})}),  # no host
    json.dumps({"maintenance": record()}),  # a host's act on a VM
])
def test_someone_elses_power_off_record_powers_no_vm_on(tmp_path, value):
    """Failed before: the VM was planned to be powered on (the record "restore"d)."""
    plan = plan_of(tmp_path, [host(maintenance=False)], [vm("build-box", value)])
    assert plan.for_step("host.reboot") == []
    assert [n.step for n in plan.notes if n.target == "build-box"] == ["foreign"]


def test_gpuvms_power_off_record_powers_the_vm_on_again(tmp_path):
    value = json.dumps({"power-off": record({"host": "esx-01", "restore": "poweredOn"}, v=1)})
    plan = plan_of(tmp_path, [host(maintenance=False)], [vm("build-box", value)])
    assert [c.after for c in plan.for_step("host.reboot")] == ["poweredOn, record cleared"]


@pytest.mark.parametrize("changes", [5, [[[["deep"]]]], [["not hex!!"]], [[1, 2]], "abc"])
def test_a_memo_whose_changes_are_not_digests_is_foreign_and_plans_no_refusal(changes):
    """Failed before: `changes` 5 raised TypeError in every plan of the host."""
    facts = host(json.dumps({"rebooted": record({"booted": SINCE, "changes": changes})}), maintenance=False)
    assert reboot_memo.still_pending(facts, [MIG_PENDING]) == []
    assert "rebooted" not in facts.intents and [f.field for f in facts.foreign] == ["gpuvm.intent"]


def test_gpuvms_memo_is_read_with_its_digests():
    digests = [reboot_memo.identity(MIG_PENDING)]
    facts = host(json.dumps({"rebooted": record({"booted": SINCE, "changes": digests}, v=1)}), maintenance=False)
    assert facts.intents["rebooted"].data == {"booted": SINCE, "changes": digests} and facts.foreign == []
    assert reboot_memo.still_pending(facts, [MIG_PENDING]) == [MIG_PENDING]


def test_an_unreadable_value_is_a_warning_not_an_unfinished_act():
    """Failed before: act "unreadable" was drift for ever ("`apply` finishes or undoes it"), verify exit 5."""
    inventory = Inventory(hosts={"esx-01": host("not json", maintenance=False)})
    notes = outstanding(inventory, ["esx-01"], [])
    assert [(n.target, n.step, n.level) for n in notes] == [("esx-01", "foreign", "warning")]
    assert "not JSON" in notes[0].message and "apply" not in notes[0].message


def test_foreign_values_on_objects_the_runbook_does_not_name_are_reported_too():
    inventory = Inventory(hosts={"esx-01": host(maintenance=False)},
                          vms={"elsewhere": vm("elsewhere", DEEP).model_copy(update={"host": "esx-09"})},
                          templates={"ubuntu": vm("ubuntu", '{"clone a": 1}')})
    assert sorted(n.target for n in outstanding(inventory, ["esx-01"], [])) == ["elsewhere", "ubuntu"]


@pytest.mark.parametrize("value", [
    json.dumps({"clone train-1": record({"vm": "train-2"})}),  # the data names another VM
    json.dumps({"clone train-1": record({"vm": "train-1", "task": "task-1; rm"})}),
    json.dumps({"clone train-1": record({"vm": "train-1", "host": "esx-01"})}),
])
def test_a_clone_record_must_name_its_own_vm(value):
    facts = vm("ubuntu", value)
    assert facts.intents == {} and [f.act for f in facts.foreign] == ["clone train-1"]
    ok = vm("ubuntu", json.dumps({"clone train-1": record({"vm": "train-1", "task": "task-7"}, v=1)}))
    assert ok.intents["clone train-1"].data == {"vm": "train-1", "task": "task-7"} and ok.foreign == []


def test_a_foreign_owned_value_owns_nothing_and_is_reported():
    facts = host(owned='{"passthrough": ["0000:17:00.0"], "released": [], "by": "ops"}', maintenance=False)
    assert facts.owned.passthrough == [] and [f.field for f in facts.foreign] == ["gpuvm.owned"]


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.text(max_size=300), st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=40).map(json.dumps)))
def test_any_value_reads_as_gpuvms_or_foreign_never_an_exception(value):
    facts = host(value, value, maintenance=False)
    kept = {f.act for f in facts.foreign}
    assert not set(facts.intents) & kept and (facts.intents or facts.foreign or value == "")


@given(st.integers(min_value=records.MAX_DEPTH + 1, max_value=2_600), st.sampled_from(["[", '{"a":']))
def test_a_value_nested_past_the_limit_is_refused_before_it_is_parsed(depth, opening):
    text = opening * depth + "1" + ("]" if opening == "[" else "}") * depth
    with pytest.raises(records.Unreadable, match=f"nested {depth} levels deep"):
        records.bounded(text)


def test_brackets_inside_strings_do_not_count_and_size_is_bounded():
    assert records.bounded(json.dumps({"why": "[[[[[[[[[[[[[[[[[[[[[[[[ \\\" {{{{{{{{{{{{"}))
    with pytest.raises(records.Unreadable, match="16,000"):
        records.bounded(json.dumps({"why": "x" * records.MAX_CHARS}))


def store_on(mocker, value: str | None, kind: str = "HostSystem"):
    from datetime import datetime, timezone

    from gpuvm.vsphere.intent import IntentStore

    session = mocker.MagicMock()
    session.content.customFieldsManager.field = [SimpleNamespace(key=INTENT, name="gpuvm.intent"),
                                                 SimpleNamespace(key=OWNED, name="gpuvm.owned")]
    session.si.CurrentTime.return_value = datetime(2026, 11, 25, 16, 50, 17, tzinfo=timezone.utc)
    entity = SimpleNamespace(_moId="host-1", _wsdlName=kind,
                             customValue=[SimpleNamespace(key=INTENT, value=value), SimpleNamespace(key=OWNED, value=value)])
    return IntentStore(session, RUN), session.content.customFieldsManager.SetField, entity


@pytest.mark.parametrize("value", [DEEP, "a note", '{"maintenance": 42}', "{}"])
def test_gpuvm_does_not_record_over_a_foreign_value_and_so_does_not_act(mocker, value):
    from gpuvm.errors import TaskError

    store, set_field, entity = store_on(mocker, value)
    with pytest.raises(TaskError, match=r"not recording intent 'maintenance' on HostSystem host-1, so not doing it: "
                                        r"gpuvm.intent holds a value gpuvm did not write"):
        store.record(entity, "maintenance", "reboot of esx-01")
    store.clear(entity, "maintenance")  # nothing of gpuvm's to clear
    set_field.assert_not_called()


def test_acts_gpuvm_did_not_write_are_kept_as_found_when_it_records_its_own(mocker):
    store, set_field, entity = store_on(mocker, json.dumps({"ops-note": {"keep": "me"}}))
    store.record(entity, "maintenance", "reboot of esx-01")
    written = json.loads(set_field.call_args.kwargs["value"])
    assert written == {"ops-note": {"keep": "me"},
                       "maintenance": {"v": 1, "run": RUN, "why": "reboot of esx-01", "since": SINCE, "data": {}}}
    assert host(set_field.call_args.kwargs["value"]).intents["maintenance"].run == RUN  # read back as gpuvm's


def test_gpuvm_does_not_overwrite_a_foreign_ownership_record(mocker):
    from gpuvm.errors import TaskError
    from gpuvm.vsphere.owned import OwnedStore

    store, set_field, entity = store_on(mocker, '{"passthrough": ["0000:17:00.0"]}')
    with pytest.raises(TaskError, match="gpuvm.owned holds a value gpuvm did not write"):
        OwnedStore(store.session, RUN).edit(entity, "record passthrough",
                                            lambda o: o.model_copy(update={"passthrough": ["0000:31:00.0"]}))
    set_field.assert_not_called()


@settings(max_examples=100, deadline=None)
@given(st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789-.", min_size=1, max_size=255))
def test_every_record_gpuvm_writes_reads_back_as_gpuvms(name):
    """What host.reboot, vm.lifecycle and the reboot memo record, with names as long as vSphere allows."""
    from gpuvm.vsphere.intent import Intent, encode, read

    def back(act, kind, why, **data):
        value = encode({act: Intent(run=RUN, why=why, since=SINCE, data=data)})
        return read(value, name, kind)

    assert back("maintenance", "host", f"reboot of {name} for pending changes").foreign == []
    assert back("power-off", "vm", f"stopped for the reboot of {name}", host=name, restore="poweredOn").foreign == []
    assert back(f"clone {name[:80]}", "vm", f"clone to {name[:80]}", vm=name[:80], task="task-12").foreign == []
    memo = back("rebooted", "host", f"rebooted for 1 change(s): mig.mode on {name}"[:200], booted=SINCE,
                changes=[reboot_memo.identity(MIG_PENDING)] * records.MAX_REMEMBERED)
    assert memo.foreign == [] and len(memo.acts["rebooted"].data["changes"]) == records.MAX_REMEMBERED


def test_verify_json_carries_the_warnings_of_a_clean_verify():
    from gpuvm.documents import verify_json
    from gpuvm.plan import Note
    from gpuvm.runs import Verified
    from tests.schema_check import check

    note = Note("esx-01", "foreign", "gpuvm.intent holds a value gpuvm did not write (not JSON: 'x')")
    document = json.loads(verify_json(verified=Verified(foreign=[note])))
    assert document["drift"] is False and document["notes"] == [
        {"target": "esx-01", "step": "foreign", "message": note.message, "level": "warning"}]
    assert check(document) == "verify"
