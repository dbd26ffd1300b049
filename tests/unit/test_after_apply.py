"""Guests of VMs the plan creates: their guest steps planned from the runbook alone, marked known
after apply, and counted as changes (exit 2, not 3); apply carries none of them out, observes the
guests once their VMs run and plans them for real (gpuvm.after_apply, the engine)."""

from __future__ import annotations

import dataclasses
import json
import textwrap

import pytest

from gpuvm import engine
from gpuvm.cli.main import plan_exit_code
from gpuvm.documents import plan_json
from gpuvm.errors import ConnectError, HostKeyError
from gpuvm.executors.group import GroupResult
from gpuvm.journal import Journal
from gpuvm.plan import Change, Plan
from gpuvm.remote import RemoteOptions, build_cluster
from gpuvm.render import change_line, plan_summary
from gpuvm.runbook.loader import load_runbook
from gpuvm.steps.base import Context
from gpuvm.vsphere.facts import DatastoreFacts
from tests.unit.factories import inventory, r750xa, vm

RUNBOOK = """
hosts:
  - {name: esx-01}
vms:
  - {name: old-1, host: esx-01}
  - {name: new-1, host: esx-01, template: ubuntu}
guests:
  ssh_mesh: {}
  hosts:
    - {vm: old-1, ssh: {address: 10.0.0.11, user: root}}
    - {vm: new-1, ssh: {address: 10.0.0.12, user: root}}
"""


@pytest.fixture
def lab(tmp_path):
    path = tmp_path / "rb.yaml"
    path.write_text(textwrap.dedent(RUNBOOK))
    book = load_runbook(path)
    facts = inventory([r750xa("esx-01")], [vm("old-1", power_state="poweredOn", firmware="efi")])
    facts.templates = {"ubuntu": vm("ubuntu", moid="vm-ubuntu", datastores=["datastore1"], disk_gb=40)}
    facts.datastores = {"datastore1": DatastoreFacts(name="datastore1", moid="ds-1", free_gb=10000)}
    cluster = build_cluster(book, tmp_path, RemoteOptions(executor_factory=lambda n, a: None))
    return book, facts, cluster


def _down(name: str, error: type[ConnectError] = ConnectError) -> ConnectError:
    return error(f"{name}: cannot connect to its address: Connection refused")


def test_the_guest_of_a_vm_the_plan_creates_is_known_after_apply_and_exits_2(lab):
    book, facts, cluster = lab
    plan, _ = engine.make_plan(book, facts, cluster, {}, {"new-1": _down("new-1")})
    assert any(c.target == "new-1" and c.step == "vm.lifecycle" for c in plan.changes)
    later = [c for c in plan.changes if c.known_after_apply]
    wanted = [s.name for s in engine.STEPS if s.role == "guest" and s.wanted(cluster.targets["new-1"])]
    assert [(c.target, c.step) for c in later] == [("new-1", step) for step in wanted] != []
    assert "guest.ssh_mesh" in wanted  # the runbook asks for a mesh: planned on the new guest too
    assert plan.unobserved == {} and plan.complete
    assert plan_exit_code(plan, detailed=True) == 2 and plan_exit_code(plan, detailed=False) == 0
    note = next(n for n in plan.notes if n.target == "new-1" and n.step == "observe")
    assert note.level == "info" and "known after apply" in note.message
    assert change_line(later[0]) == "+ guest setup: as the runbook asks (known after apply)"
    assert f"{len(later)} known after apply" in plan_summary(plan)
    data = json.loads(plan_json(plan))
    assert data["summary"]["known_after_apply"] == len(later) and data["summary"]["not_observed"] == 0
    assert [c["known_after_apply"] for c in data["changes"] if c["target"] == "new-1"][-1] is True


def test_a_guest_of_an_existing_vm_or_one_answering_wrong_is_still_not_observed(lab):
    book, facts, cluster = lab
    plan, _ = engine.make_plan(book, facts, cluster, {}, {"old-1": _down("old-1")})
    assert list(plan.unobserved) == ["old-1"] and not any(c.known_after_apply for c in plan.changes)
    assert plan_exit_code(plan, detailed=True) == 3
    refused, _ = engine.make_plan(book, facts, cluster, {}, {"new-1": _down("new-1", HostKeyError)})
    assert list(refused.unobserved) == ["new-1"] and not any(c.known_after_apply for c in refused.changes)
    assert plan_exit_code(refused, detailed=True) == 3  # something answers at its address with a key refused


def test_apply_never_carries_out_a_change_known_after_apply_and_plans_the_guest_once_observed(lab, mocker, tmp_path):
    book, facts, cluster = lab
    plan, desired = engine.make_plan(book, facts, cluster, {}, {"new-1": _down("new-1")})
    plan.changes = [c for c in plan.changes if c.target == "new-1" and c.step in ("vm.power", "guest.ssh_mesh")]
    assert [c.known_after_apply for c in plan.changes] == [False, True]
    applied = []
    steps = [s if s.name not in ("vm.power", "guest.ssh_mesh") else
             dataclasses.replace(s, apply=lambda ctx, t, cs: applied.extend(cs), apply_all=None,
                                 plan=lambda t, fact: [Change("guest.ssh_mesh", t.name, "mesh", "key", None, "k")])
             for s in engine.STEPS]
    mocker.patch.object(engine, "STEPS", steps)
    mocker.patch.object(engine, "_wait_for_ssh")
    mocker.patch.object(engine, "observe_remote", return_value=GroupResult(
        {"new-1": {"guest.ssh_mesh": "fact"}, "old-1": {}}, {}))
    state = tmp_path / "state"
    state.mkdir()
    outcome = engine.apply_plan(plan, desired, Context(cluster=cluster, unreachable={"new-1": "refused"}),
                                Journal(state))
    assert not outcome.failed and "new-1" in outcome.observed
    assert [(c.step, c.known_after_apply) for c in applied] == [("vm.power", False), ("guest.ssh_mesh", False)]
    assert not any(c.known_after_apply for c in plan.changes)  # the plan as carried out: the guest's real changes
