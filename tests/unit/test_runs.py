"""gpuvm.runs: what `plan`, `apply` and `verify` decide, with vCenter, SSH and the engine mocked."""

from __future__ import annotations

import os
from contextlib import contextmanager, nullcontext
from pathlib import Path
from types import SimpleNamespace

import pytest

from gpuvm import connecting, runs
from gpuvm.apply_options import ApplyOptions
from gpuvm.runbook.model import Runbook
from gpuvm.runbook.vcenters import DEFAULT_VCENTER
from gpuvm.vsphere import fleet as fleet_module
from gpuvm.vsphere.fleet import Fleet
from gpuvm.errors import DriftError, InputError, TargetFailures
from gpuvm.plan import Change, Plan
from gpuvm.steps.base import Options
from gpuvm.vsphere.tasks import Busy
from gpuvm.vsphere.facts import Inventory

RUNBOOK = Path("lab.yaml")
CHANGE = Change("vm.hardware", "train-01", "vm", "cpus", 4, 8)


def _book(mesh: bool = False):
    guests = SimpleNamespace(ssh_mesh=SimpleNamespace(enabled=mesh)) if mesh else None
    return SimpleNamespace(guests=guests, hosts=[SimpleNamespace(name="esx-02")], vms=[SimpleNamespace(name="train-01", host="esx-01")],
                           ssh=SimpleNamespace(boot_timeout=42.0), vcenter=None, vcenters=[], slurm=None)


@pytest.fixture
def world(mocker, monkeypatch, tmp_path):
    """A runbook, an inventory, and SSH targets whose cluster and reachability the test sets."""
    state = SimpleNamespace(book=_book(), cluster=None, facts={}, down={}, inventory=Inventory(), session=object(),
                            locked=None)
    state.fleet = Fleet({DEFAULT_VCENTER: state.inventory})  # one vCenter, the short form
    monkeypatch.setenv("GPUVM_STATE_DIR", str(tmp_path / "state"))

    def locks(session, hosts, run, journal=None):
        assert session is state.session
        state.locked = sorted(hosts)
        return nullcontext(mocker.Mock(name="HostLocks"))  # its lease holds: check() returns

    @contextmanager
    def remote(book, access, parallel=8, whole=None):
        state.remote_parallel = parallel
        yield state.cluster, state.facts, state.down

    mocker.patch.object(runs, "load_runbook", side_effect=lambda path, text=None: state.book)
    mocker.patch.object(runs, "observe_fleet", side_effect=lambda book, access, snapshot=None, ahead=None: state.fleet)
    mocker.patch.object(connecting, "connect", side_effect=lambda book, access, ahead=None: nullcontext(state.session))
    mocker.patch.object(fleet_module, "read_all", side_effect=lambda sessions, sent=None: ({name: state.inventory for name in sessions}, {}))
    mocker.patch.object(runs, "remote", side_effect=remote)
    mocker.patch.object(runs, "HostLocks", side_effect=locks)
    state.awaited = mocker.patch.object(runs, "await_on_vms")  # no vCenter task in flight
    state.in_flight = mocker.patch.object(runs, "on_vms", return_value=[])
    return state


def test_verify_with_targets_not_observed_is_incomplete_and_still_reports_the_drift_found(world, mocker):
    world.down = {"train-01": "connection refused", "esx-01": "Error reading SSH protocol banner"}
    plan = Plan(changes=[CHANGE], unobserved=dict(world.down))
    make_plan = mocker.patch.object(runs, "make_plan", return_value=(plan, None))
    with pytest.raises(runs.NotObserved) as caught:
        runs.verify_runbook(RUNBOOK, runs.Access())
    assert str(caught.value) == ("2 target(s) not observed; drift on the targets observed: 1 change(s):\n"
                                 "  train-01: connection refused\n  esx-01: Error reading SSH protocol banner")
    assert caught.value.exit_code == 3 and caught.value.plan is plan
    assert make_plan.call_args.args[4] == world.down  # what answered is planned: the rest is not lost


def test_verify_calls_changes_drift_and_carries_the_plan(world, mocker):
    plan = Plan(changes=[CHANGE])
    mocker.patch.object(runs, "make_plan", return_value=(plan, None))
    with pytest.raises(runs.PlanDrift) as caught:
        runs.verify_runbook(RUNBOOK, runs.Access())
    assert isinstance(caught.value, DriftError)
    assert str(caught.value) == "drift: 1 change(s) needed to match lab.yaml"
    assert caught.value.plan is plan


def test_verify_without_a_mesh_checks_no_pairs(world, mocker):
    world.cluster = mocker.Mock()
    mocker.patch.object(runs, "make_plan", return_value=(Plan(), None))
    check_mesh = mocker.patch.object(runs, "check_mesh")
    assert runs.verify_runbook(RUNBOOK, runs.Access()) == runs.Verified(mesh_guests=None)
    check_mesh.assert_not_called()


def test_verify_checks_the_mesh_of_every_guest(world, mocker):
    world.book = _book(mesh=True)
    world.cluster = mocker.Mock(**{"of_role.return_value": {"train-01": 1, "train-02": 2, "train-03": 3}})
    mocker.patch.object(runs, "make_plan", return_value=(Plan(), None))
    check_mesh = mocker.patch.object(runs, "check_mesh")
    assert runs.verify_runbook(RUNBOOK, runs.Access()).mesh_guests == 3
    check_mesh.assert_called_once_with(world.cluster)


def test_plan_from_a_snapshot_plans_without_ssh(world, mocker, tmp_path):
    make_plan = mocker.patch.object(runs, "make_plan", return_value=(Plan(), None))
    runs.plan_runbook(RUNBOOK, runs.Access(state_dir=tmp_path), snapshot=Path("lab.json"))
    make_plan.assert_called_once_with(world.book, world.fleet)
    runs.remote.assert_not_called()


def test_plan_live_passes_unreachable_guests_to_the_planner_and_reads_no_journal(world, mocker, tmp_path):
    """Issue 21, item 6: what gpuvm owns is on the objects; the journal is history, never parsed to plan."""
    world.cluster, world.facts, world.down = object(), {("guest.nic", "train-01"): "fact"}, {"train-02": "refused"}
    os.mkfifo(tmp_path / "journal.jsonl")  # opening it to read would block: the plan must not
    plan = Plan(changes=[CHANGE])
    make_plan = mocker.patch.object(runs, "make_plan", return_value=(plan, None))
    assert runs.plan_runbook(RUNBOOK, runs.Access(state_dir=tmp_path)) is plan
    make_plan.assert_called_once_with(world.book, world.fleet, world.cluster, world.facts, world.down)


def test_apply_with_nothing_to_do_shows_the_plan_and_asks_nothing(world, mocker):
    plan = Plan()
    mocker.patch.object(runs, "make_plan", return_value=(plan, None))
    apply_plan = mocker.patch.object(runs, "apply_plan")
    shown, confirm = [], mocker.Mock()
    applied = runs.apply_runbook(RUNBOOK, runs.Access(), show_plan=shown.append, confirm=confirm)
    assert shown == [plan] and not applied.ran and applied.changes_done == 0
    confirm.assert_not_called()
    apply_plan.assert_not_called()
    applied.raise_for_failures()  # nothing ran, nothing failed


def test_apply_refuses_disruption_before_asking(world, mocker):
    mocker.patch.object(runs, "make_plan", return_value=(Plan(changes=[CHANGE]), "desired"))
    mocker.patch.object(runs, "check_allowed", side_effect=InputError("refusing to apply"))
    confirm, apply_plan = mocker.Mock(), mocker.patch.object(runs, "apply_plan")
    with pytest.raises(InputError):
        runs.apply_runbook(RUNBOOK, runs.Access(), confirm=confirm)
    confirm.assert_not_called()
    apply_plan.assert_not_called()


def test_apply_stops_when_confirm_raises(world, mocker, tmp_path):
    plan = Plan(changes=[CHANGE])
    mocker.patch.object(runs, "make_plan", return_value=(plan, "desired"))
    check_allowed = mocker.patch.object(runs, "check_allowed")
    apply_plan = mocker.patch.object(runs, "apply_plan")
    with pytest.raises(KeyboardInterrupt):
        runs.apply_runbook(RUNBOOK, runs.Access(state_dir=tmp_path), ApplyOptions(allow_power_off=True),
                           confirm=mocker.Mock(side_effect=KeyboardInterrupt))
    check_allowed.assert_called_once_with(plan, "desired", ApplyOptions(allow_power_off=True))
    apply_plan.assert_not_called()


def test_apply_carries_out_the_plan_and_reports(world, mocker, tmp_path):
    world.cluster, world.down = object(), {"train-02": "refused"}
    plan = Plan(changes=[CHANGE])
    mocker.patch.object(runs, "make_plan", return_value=(plan, "desired"))
    mocker.patch.object(runs, "check_allowed")
    error = RuntimeError("boom")
    outcome = SimpleNamespace(done={"train-01": [CHANGE]}, failed={"train-02 (guest.nic)": error},
                              skipped={"train-02 (guest.mig)": "an earlier step failed on train-02"}, seconds=1.5)
    apply_plan = mocker.patch.object(runs, "apply_plan", return_value=outcome)
    progress = mocker.Mock()
    applied = runs.apply_runbook(RUNBOOK, runs.Access(state_dir=tmp_path),
                                 ApplyOptions(allow_host_reboot=True, parallel=3, shutdown_timeout=60), progress=progress)
    (called_plan, desired, context, journal, parallel, called_progress), _ = apply_plan.call_args
    assert (called_plan, desired, parallel, called_progress) == (plan, "desired", 3, progress)
    assert (context.session, context.inventory, context.cluster, context.unreachable) == \
        (world.session, world.inventory, world.cluster, world.down)
    assert (context.options.allow_power_off, context.options.allow_host_reboot) == (False, True)
    assert (context.options.shutdown_timeout, context.options.guest_boot_timeout) == (60, 42.0)
    assert world.remote_parallel == 3
    assert applied.ran and applied.journal == journal.path == tmp_path / "journal.jsonl"
    assert context.journal is journal
    assert world.locked == ["esx-01", "esx-02"]  # the runbook's hosts and its VMs' hosts, locked for the run
    assert (applied.changes_done, applied.seconds) == (1, 1.5)
    assert applied.failed == {"train-02 (guest.nic)": error}
    assert applied.skipped == {"train-02 (guest.mig)": "an earlier step failed on train-02"}
    with pytest.raises(TargetFailures, match="train-02 \\(guest.nic\\): boom"):
        applied.raise_for_failures()


def test_apply_awaits_the_tasks_in_flight_on_its_vms_before_it_observes_and_plan_notes_them(world, mocker, tmp_path):
    order = []
    world.awaited.side_effect = lambda session, vms, timeout, say: (order.append("await"), say("waiting for 1 ..."))
    mocker.patch.object(fleet_module, "read_all", side_effect=lambda sessions, sent=None: (order.append("read"), ({
        name: world.inventory for name in sessions}, {}))[1])
    mocker.patch.object(runs, "make_plan", return_value=(Plan(), None))
    world.session = SimpleNamespace(target=SimpleNamespace(url="https://vc/sdk"))
    progress = mocker.Mock()
    runs.apply_runbook(RUNBOOK, runs.Access(state_dir=tmp_path), progress=progress)
    assert order == ["await", "read"]
    session, vms, timeout, _ = world.awaited.call_args.args
    assert (session, set(vms), timeout) == (world.session, {"train-01"}, Options().task_timeout)
    progress.assert_called_once_with("vcenter", "https://vc/sdk", "waiting for 1 ...")
    world.awaited.reset_mock()
    world.in_flight.return_value = [("train-01", Busy("task-9", "VirtualMachine.reconfigure", None))]
    planned = runs.plan_runbook(RUNBOOK, runs.Access(state_dir=tmp_path))  # read-only: it notes, never waits
    world.awaited.assert_not_called()
    assert [(n.target, n.level, n.message) for n in planned.notes] == [(
        "train-01", "info", "vCenter task VirtualMachine.reconfigure (task-9) in flight: planned on the VM as it is "
                            "before the task ends; apply awaits it, then plans")]


@pytest.mark.parametrize("insecure", [True, False])
def test_connect_warns_through_the_callers_callback_when_tls_is_off(mocker, insecure):
    target = SimpleNamespace(insecure=insecure, url="https://vc.example/sdk")
    mocker.patch.object(connecting, "resolve_target", return_value=target)
    session = mocker.patch.object(connecting, "Session")
    warnings: list[str] = []
    with connecting.connect(Runbook(), connecting.Access(insecure=insecure, warn=warnings.append)):
        session.assert_called_once_with(target)
    assert warnings == ([
        "TLS certificate verification is OFF for https://vc.example/sdk: anyone on the network path can "
        "impersonate vCenter and read the password"] if insecure else [])


def test_apply_over_two_vcenters_locks_and_acts_in_each_through_its_own_session(mocker, tmp_path):
    """Issue 27: each vCenter's hosts are locked in that vCenter, and each host and VM is changed
    (its intents recorded) through its own vCenter's session; the guests through none."""
    from tests.unit.test_runbook_vcenters import TWO

    path = tmp_path / "fleet.yaml"
    path.write_text(TWO.split("guests:")[0])
    sessions = {"east": SimpleNamespace(name="east"), "west": SimpleNamespace(name="west")}
    mocker.patch.object(runs, "connect_all", return_value=nullcontext((sessions, {})))
    mocker.patch.object(fleet_module, "read_all", side_effect=lambda reached, sent=None: ({n: Inventory(source=n) for n in reached}, {}))
    locked = []

    def locks(session, hosts, run, journal=None):
        locked.append((session.name, sorted(hosts)))
        return nullcontext(mocker.Mock(name="HostLocks"))

    @contextmanager
    def remote(book, access, parallel=8, whole=None):
        yield None, {}, {}

    mocker.patch.object(runs, "HostLocks", side_effect=locks)
    mocker.patch.object(runs, "remote", side_effect=remote)
    mocker.patch.object(runs, "make_plan", return_value=(Plan(changes=[CHANGE]), "desired"))
    mocker.patch.object(runs, "check_allowed")
    outcome = SimpleNamespace(done={}, failed={}, skipped={}, seconds=0.1)
    apply_plan = mocker.patch.object(runs, "apply_plan", return_value=outcome)
    awaited = mocker.patch.object(runs, "await_on_vms")
    runs.apply_runbook(path, runs.Access(state_dir=tmp_path))
    assert locked == [("east", ["esx-e1"]), ("west", ["esx-w1"])]
    assert sorted((c.args[0].name, set(c.args[1])) for c in awaited.call_args_list) == [("east", {"vm-e1"}),
                                                                                       ("west", {"vm-w1"})]
    context, regions = apply_plan.call_args.args[2], apply_plan.call_args.kwargs["regions"]
    assert context.session is None  # guests: no vCenter
    assert {t: (c.session.name, c.inventory.source, c.intents.session.name) for t, c in regions.items()} == {
        "esx-e1": ("east", "east", "east"), "vm-e1": ("east", "east", "east"),
        "esx-w1": ("west", "west", "west"), "vm-w1": ("west", "west", "west")}
