"""The engine over several vCenters: each vCenter's hosts and VMs planned against its own inventory
and applied through its own context; the targets of a vCenter not reached are not observed."""

from __future__ import annotations

from gpuvm import engine
from gpuvm.errors import ConnectError
from gpuvm.journal import Journal
from gpuvm.plan import Change, Plan
from gpuvm.resolve import Desired, DesiredHost
from gpuvm.runbook.loader import load_runbook
from gpuvm.steps.base import Context, Step
from gpuvm.vsphere.facts import Inventory
from gpuvm.vsphere.fleet import Fleet
from tests.unit.factories import inventory, r750xa, vm
from tests.unit.test_runbook_vcenters import TWO


def _book(tmp_path):
    path = tmp_path / "fleet.yaml"
    path.write_text(TWO.split("guests:")[0].replace("host: esx-w1, vcenter: west}", "host: esx-w1, vcenter: west, cpus: 8}"))
    return load_runbook(path)


def test_each_vcenters_vms_are_planned_against_its_own_inventory(tmp_path):
    book = _book(tmp_path)
    # east also runs a VM called vm-w1 (not the runbook's): it must not stand in for west's
    east = inventory([r750xa("esx-e1")], [vm("vm-e1", "esx-e1", firmware="efi"), vm("vm-w1", "esx-e1", cpus=2, firmware="efi")])
    west = inventory([r750xa("esx-w1")], [vm("vm-w1", "esx-w1", cpus=8, firmware="efi")])
    plan, desired = engine.make_plan(book, Fleet({"east": east, "west": west}))
    assert set(desired.hosts) == {"esx-e1", "esx-w1"} and set(desired.vms) == {"vm-e1", "vm-w1"}
    assert not [c for c in plan.changes if c.target == "vm-w1" and c.field == "cpus"], plan.changes
    alone, _ = engine.make_plan(book.part("west"), west)
    assert [c for c in plan.changes if c.target == "vm-w1"] == [c for c in alone.changes if c.target == "vm-w1"]


def test_a_vcenter_not_reached_leaves_its_targets_unobserved_and_the_other_planned(tmp_path):
    book = _book(tmp_path)
    west = inventory([r750xa("esx-w1")], [vm("vm-w1", "esx-w1", cpus=8, firmware="efi")])
    fleet = Fleet.of(book, {"west": west}, {"east": ConnectError("https://vc-east/sdk: cannot connect")})
    plan, _ = engine.make_plan(book.part("west"), fleet)
    assert set(plan.unobserved) == {"esx-e1", "vm-e1"}
    assert plan.unobserved["vm-e1"] == "vCenter east not reached: https://vc-east/sdk: cannot connect"
    assert {c.target for c in plan.changes} <= {"esx-w1", "vm-w1"} and plan.changes


def test_each_target_is_applied_through_its_vcenters_context(tmp_path, mocker):
    seen = []
    one = Step("one", "host", lambda ctx, t: None, lambda t, f: [],
               lambda ctx, t, changes: seen.append((t.name, ctx.inventory.source)))
    grouped = Step("grouped", "host", lambda ctx, t: None, lambda t, f: [], lambda ctx, t, changes: None,
                   apply_all=lambda ctx, by, parallel: seen.append((sorted(by), ctx.inventory.source)) or {})
    mocker.patch.object(engine, "_run_order", return_value=[one, grouped])
    desired = Desired(hosts={h: DesiredHost(h, [], None, False) for h in ("e1", "w1", "e2")})
    plan = Plan(changes=[Change(s, h, "x", "f", 1, 2) for s in ("one", "grouped") for h in desired.hosts])
    east, west = Context(inventory=Inventory(source="east")), Context(inventory=Inventory(source="west"))
    outcome = engine.apply_plan(plan, desired, Context(), Journal(tmp_path), parallel=1,
                                regions={"e1": east, "e2": east, "w1": west})
    assert not outcome.failed
    assert sorted(seen[:3]) == [("e1", "east"), ("e2", "east"), ("w1", "west")]
    assert seen[3:] == [(["e1", "e2"], "east"), (["w1"], "west")]  # apply_all once per vCenter


def test_a_clone_uses_its_own_vcenters_template_and_datastore_of_a_name_every_vcenter_has(tmp_path):
    """"datastore1" is in every vCenter: west's clone goes to west's (room for it), not east's (full)."""
    from gpuvm.vsphere.facts import DatastoreFacts

    book = _book(tmp_path)
    book.vms.append(book.vms[1].model_copy(update={"name": "vm-w2", "template": "ubuntu"}))
    east = inventory([r750xa("esx-e1")], [vm("vm-e1", "esx-e1", firmware="efi")])
    east.datastores = {"datastore1": DatastoreFacts(name="datastore1", moid="ds-east", free_gb=0)}
    west = inventory([r750xa("esx-w1")], [vm("vm-w1", "esx-w1", cpus=8, firmware="efi")])
    west.templates = {"ubuntu": vm("ubuntu", "esx-w1", moid="vm-west-ubuntu", datastores=["datastore1"], disk_gb=40)}
    west.datastores = {"datastore1": DatastoreFacts(name="datastore1", moid="ds-west", free_gb=10000)}
    plan, desired = engine.make_plan(book, Fleet({"east": east, "west": west}))
    created = [c for c in plan.changes if c.target == "vm-w2" and c.step == "vm.lifecycle"]
    assert created and created[0].action.clone.template == "ubuntu", plan.changes


def test_every_vcenter_down_leaves_every_target_unobserved_and_nothing_read(tmp_path):
    from gpuvm.vsphere.fleet import read_all

    book = _book(tmp_path)
    down = {name: ConnectError(f"https://vc-{name}/sdk: cannot connect") for name in ("east", "west")}
    fleet = Fleet.of(book, read_all({})[0], down)
    plan, _ = engine.make_plan(book.part(), fleet)
    assert set(plan.unobserved) == {"esx-e1", "vm-e1", "esx-w1", "vm-w1"} and not plan.changes


def test_guest_steps_run_once_over_the_guests_of_every_vcenter(tmp_path, mocker):
    """A guest is named after its VM, which `regions` maps to its vCenter: its steps still run in the
    fleet's context, and a step that orders its targets (the mesh) gets every guest of every vCenter
    at once (was: once per vCenter, so the mesh's first check failed every cross pair)."""
    from gpuvm.remote import Cluster
    from gpuvm.resolve_ssh import resolve_ssh
    from tests.unit.test_runbook_vcenters import _load

    cluster = Cluster(tmp_path, resolve_ssh(_load(tmp_path, TWO)))
    seen = []
    one = Step("one", "guest", lambda ctx, t: None, lambda t, f: [],
               lambda ctx, t, changes: seen.append((t.name, ctx.inventory.source)))
    grouped = Step("grouped", "guest", lambda ctx, t: None, lambda t, f: [], lambda ctx, t, changes: None,
                   apply_all=lambda ctx, by, parallel: seen.append((sorted(by), ctx.inventory.source)) or {})
    mocker.patch.object(engine, "_run_order", return_value=[one, grouped])
    plan = Plan(changes=[Change(s, g, "x", "f", 1, 2) for s in ("one", "grouped") for g in ("vm-e1", "vm-w1")])
    east, west = Context(inventory=Inventory(source="east")), Context(inventory=Inventory(source="west"))
    fleet = Context(inventory=Inventory(source="fleet"), cluster=cluster)
    outcome = engine.apply_plan(plan, Desired(), fleet, Journal(tmp_path), parallel=1,
                                regions={"vm-e1": east, "vm-w1": west})
    assert not outcome.failed, outcome.failed
    assert sorted(seen[:2]) == [("vm-e1", "fleet"), ("vm-w1", "fleet")]
    assert seen[2:] == [(["vm-e1", "vm-w1"], "fleet")]  # one apply_all over both vCenters' guests


def test_the_childrens_answers_are_read_as_they_come_and_taken_in_the_vcenters_order():
    """A plan part takes a tenth of a second to unpickle: the parent reads each as it comes, while
    the children still planning use the other cores, and takes them in the runbook's order."""
    import multiprocessing

    from gpuvm.vsphere.fleet import _in_order

    pipes = {name: multiprocessing.Pipe(duplex=False) for name in ("vc2", "vc3", "vc4")}
    children = {name: (None, ends[0]) for name, ends in pipes.items()}
    read, answered = [], set()

    def answer(name, pipe):
        read.append(name)
        if name == "vc4":
            pipes["vc2"][1].send_bytes(b"vc2")  # vc2, the first in order, answers last
        return "ok", pipe.recv_bytes()

    pipes["vc4"][1].send_bytes(b"vc4")
    pipes["vc3"][1].send_bytes(b"vc3")
    taken = []
    for name, (_, value) in _in_order(children, answered, answer):
        taken.append((name, value, set(answered)))
    assert read[-1] == "vc2" and set(read) == {"vc2", "vc3", "vc4"}  # vc3 and vc4 read before vc2 came
    assert [(name, value) for name, value, _ in taken] == [("vc2", b"vc2"), ("vc3", b"vc3"), ("vc4", b"vc4")]
    assert taken[0][2] == {"vc2", "vc3", "vc4"}
