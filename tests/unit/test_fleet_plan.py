"""Several vCenters planned apart (each vCenter's part where its inventory was read, fleet_plan.py):
the same plan as make_plan over the fleet, and each part made in its own child process."""

from __future__ import annotations

import os
from types import SimpleNamespace

import pytest

from gpuvm import engine, fleet_plan
from gpuvm.errors import ConnectError, GpuvmError, InputError
from gpuvm.vsphere import fleet as fleet_module
from gpuvm.vsphere.facts import Inventory
from gpuvm.vsphere.fleet import Fleet, read_all
from gpuvm.vsphere.intent import Intent
from tests.unit.factories import inventory, r750xa, vm
from gpuvm.runbook.loader import load_runbook
from tests.unit.test_runbook_vcenters import TWO


def _book(tmp_path):
    """Two vCenters, each a GPU host (passthrough, reboots allowed) and a VM with a GPU; no guests."""
    gpu = "passthrough: [{model: A100}], allow_maintenance: true, allow_reboot: true}"
    text = (TWO.split("guests:")[0].replace("vcenter: east}", f"vcenter: east, {gpu}")
            .replace("vcenter: west}\nvms", f"vcenter: west, {gpu}\nvms")
            .replace("host: esx-e1}", "host: esx-e1, cpus: 8, gpus: {mode: passthrough, count: 1}}")
            .replace("vcenter: west}\n", "vcenter: west, cpus: 8, gpus: {mode: passthrough, count: 1}}\n"))
    path = tmp_path / "fleet.yaml"
    path.write_text(text)
    return load_runbook(path)


def _inventories():
    """East: a GPU host whose passthrough is off (changes in several steps, a reboot) and an
    unfinished act of an earlier run (an outstanding note); west: its VM to resize and power on."""
    act = Intent(run="run-1", why="enabling passthrough")
    east = inventory([r750xa("esx-e1", intents={"host.passthrough": act})], [vm("vm-e1", "esx-e1", firmware="efi")])
    west = inventory([r750xa("esx-w1", enabled=True, active=True)], [vm("vm-w1", "esx-w1", cpus=2, firmware="efi")])
    return {"east": east, "west": west}


def _same(apart, together):
    assert [repr(c) for c in apart.changes] == [repr(c) for c in together.changes]  # actions too, in order
    assert apart.notes == together.notes and apart.unobserved == together.unobserved
    assert apart.left_out == together.left_out


def test_the_parts_planned_apart_merge_into_the_plan_of_the_whole_fleet(tmp_path):
    book = _book(tmp_path)
    together, _ = engine.make_plan(book, Fleet(_inventories()))
    parts = [fleet_plan.plan_part(book.part(name), known) for name, known in _inventories().items()]
    apart = fleet_plan.merged(parts, {})
    assert {c.target for c in apart.changes} >= {"esx-e1", "vm-e1", "vm-w1"} and len({c.step for c in apart.changes}) > 2
    assert any(n.target == "esx-e1" for n in apart.notes), apart.notes  # the unfinished act
    _same(apart, together)


def test_a_vcenter_not_reached_is_not_observed_in_the_merged_plan_too(tmp_path):
    book = _book(tmp_path)
    west = _inventories()["west"]
    fleet = Fleet.of(book, {"west": west}, {"east": ConnectError("https://vc-east/sdk: cannot connect")})
    together, _ = engine.make_plan(book.part("west"), fleet)
    apart = fleet_plan.merged([fleet_plan.plan_part(book.part("west"), _inventories()["west"])], fleet.unobserved)
    assert set(apart.unobserved) == {"esx-e1", "vm-e1"}
    _same(apart, together)


def test_only_several_vcenters_without_ssh_targets_are_planned_apart(tmp_path):
    assert fleet_plan.apart(_book(tmp_path))
    assert not fleet_plan.apart(_book(tmp_path).part("west").model_copy(update={"vcenters": None}))
    path = tmp_path / "guests.yaml"
    path.write_text(TWO)
    assert not fleet_plan.apart(load_runbook(path))  # guests: their facts feed the host steps


class _Session:
    def __init__(self, target):
        self.target = target

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return None


@pytest.fixture
def sessions(mocker):
    mocker.patch.object(fleet_module, "Session", _Session)
    mocker.patch.object(fleet_module, "read_inventory", lambda session, alone, sent=None: Inventory(source=session.target.url))
    return {name: _Session(SimpleNamespace(url=f"https://vc-{name}/sdk")) for name in ("east", "west", "north")}


def test_each_vcenters_work_runs_in_the_process_that_read_it_and_its_result_comes_back(sessions):
    results, lost = read_all(sessions, lambda name, known: (name, os.getpid(), known.source))
    assert lost == {}
    assert list(results) == ["east", "west", "north"]
    assert [r[0] for r in results.values()] == list(results) and [r[2] for r in results.values()] == [
        "https://vc-east/sdk", "https://vc-west/sdk", "https://vc-north/sdk"]
    pids = [r[1] for r in results.values()]
    assert pids[0] == os.getpid() and len({*pids[1:]} - {os.getpid()}) == 2  # the others: a child each


def test_a_childs_work_failing_raises_its_error_in_the_parent(sessions):
    def work(name, known):
        if name == "north":
            raise InputError(f"runbook.yaml:7: vms[3]: no template '{name}-ubuntu'")
        return name

    with pytest.raises(InputError, match=r"^runbook.yaml:7: vms\[3\]: no template 'north-ubuntu'$"):
        read_all(sessions, work)

    def unpicklable(name, known):
        if name == "west":
            raise GpuvmError(lambda: None)  # its argument does not pickle: its text comes back
        return name

    with pytest.raises(GpuvmError, match=r"^https://vc-west/sdk: <function"):
        read_all(sessions, unpicklable)


def test_vcenters_that_stop_answering_while_read_come_back_lost_not_raised(sessions, mocker):
    """Issue 33: a read that times out (a ConnectError, vsphere/bounded.py) leaves its vCenter not
    observed, whether read here (east) or in a child (north); the others' results come back."""
    def read(session, alone, sent=None):
        if session.target.url != "https://vc-west/sdk":
            raise ConnectError(f"{session.target.url}: did not answer RetrievePropertiesEx within 3 s")
        return Inventory(source=session.target.url)

    mocker.patch.object(fleet_module, "read_inventory", read)
    results, lost = read_all(sessions, lambda name, known: known.source)
    assert results == {"west": "https://vc-west/sdk"}
    assert {name: str(e) for name, e in lost.items()} == {
        name: f"https://vc-{name}/sdk: did not answer RetrievePropertiesEx within 3 s" for name in ("east", "north")}
    assert all(isinstance(e, ConnectError) for e in lost.values())


def test_a_fleet_read_leaves_a_vcenter_silent_while_read_not_observed(tmp_path, mocker):
    book = _book(tmp_path)
    silent = ConnectError("https://vc-east/sdk: did not answer RetrievePropertiesEx within 3 s")
    mocker.patch.object(fleet_module, "read_all", return_value=({"west": _inventories()["west"]}, {"east": silent}))
    fleet = Fleet.read(book, {"east": None, "west": None}, {})
    assert list(fleet.inventories) == ["west"] and fleet.down == {"east": silent}
    assert fleet.unobserved == {name: f"vCenter east not reached: {silent}" for name in ("esx-e1", "vm-e1")}


def test_one_vcenter_silent_while_read_is_the_runs_error(tmp_path, mocker):
    book = load_runbook(_one(tmp_path))
    silent = ConnectError("https://vc/sdk: did not answer RetrievePropertiesEx within 3 s")
    mocker.patch.object(fleet_module, "read_all", return_value=({}, {"default": silent}))
    with pytest.raises(ConnectError) as raised:
        Fleet.read(book, {"default": None}, {})
    assert raised.value is silent


def _one(tmp_path):
    path = tmp_path / "one.yaml"
    path.write_text("vcenter: {url: 'https://vc/sdk', user: u, password_env: P}\nhosts: [{name: esx-01}]\n")
    return path
