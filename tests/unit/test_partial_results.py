"""Partial results are results (issue 22): an SSH target that does not answer is set aside and
named, never the end of the plan; apply leaves what depends on it alone and goes on with the rest;
only the guests whose VM this run restarted are waited for; a missing SSH key is the runbook's
error, naming its line and the targets that use it. Executors are fakes; vSphere is not involved."""

from __future__ import annotations

import dataclasses
import textwrap
import time

import pytest

from gpuvm import engine
from gpuvm.errors import ConnectError, HostKeyError, InputError, TargetFailures
from gpuvm.executors.base import CommandResult
from gpuvm.executors.fake import FakeExecutor, ok
from gpuvm.executors.group import GroupResult
from gpuvm.journal import Journal
from gpuvm.plan import Change, Plan
from gpuvm.remote import RemoteOptions, build_cluster
from gpuvm.desired import Desired, DesiredHost, DesiredVm
from gpuvm.runbook.loader import load_runbook
from gpuvm.steps import esxi_ats, guest_nic, host_passthrough, vm_advanced
from gpuvm.steps.base import Context, Options
from gpuvm.untrusted import UntrustedValueError
from tests.unit.factories import inventory, r750xa, vm

RUNBOOK = """
hosts:
  - {name: esx-01, ats: true, ssh: {address: 10.0.0.1, user: root}}
  - {name: esx-02, ats: true, ssh: {address: 10.0.0.2, user: root}}
vms:
  - {name: vm-1, host: esx-01}
  - {name: vm-2, host: esx-02}
  - {name: vm-3, host: esx-02}
guests:
  hosts:
    - {vm: vm-1, ssh: {address: 10.0.0.11, user: root}}
    - {vm: vm-2, ssh: {address: 10.0.0.12, user: root}}
    - {vm: vm-3, ssh: {address: 10.0.0.13, user: root}}
"""


class Hostile(FakeExecutor):
    """A guest answering a value that is not what it names."""

    def _execute(self, command, timeout, check, stdin, stdout_to):
        raise UntrustedValueError("`ibdev2netdev` answered 'x$(y)' as an interface name, which is not one")


class Down(FakeExecutor):
    """An SSH target that does not answer (the banner never comes), or offers a wrong host key."""

    def __init__(self, name: str, error: type[ConnectError] = ConnectError):
        super().__init__(name)
        self.error = error

    def _execute(self, command, timeout, check, stdin, stdout_to):
        raise self.error(f"{self.name}: cannot connect to 10.0.0.1:22: Error reading SSH protocol banner")


def _cluster(tmp_path, executors: dict):
    path = tmp_path / "rb.yaml"
    path.write_text(textwrap.dedent(RUNBOOK))
    return build_cluster(load_runbook(path), tmp_path, RemoteOptions(executor_factory=lambda n, a: executors[n]))


def _observed(mocker) -> None:
    """SSH steps that every target wants and that observe cheaply: `true` (the fakes decide)."""
    def observe(ctx, target):
        ctx.cluster.executors[target.name].run(["true"])
        return "fact"
    steps = [dataclasses.replace(s, observe=observe, wanted=lambda t: True) if s.over_ssh else s
             for s in engine.STEPS]
    mocker.patch.object(engine, "STEPS", steps)


def test_an_esxi_shell_that_does_not_answer_is_set_aside_and_the_rest_is_observed(tmp_path, mocker):
    _observed(mocker)
    fakes = {"esx-01": Down("esx-01"), "esx-02": FakeExecutor("esx-02", {"true": ok("true")}),
             **{g: FakeExecutor(g, {"true": ok("true")}) for g in ("vm-1", "vm-2", "vm-3")}}
    facts, down = engine.observe_reachable(_cluster(tmp_path, fakes))
    assert list(down) == ["esx-01"] and "Error reading SSH protocol banner" in str(down["esx-01"])
    assert {target for _, target in facts} == {"esx-02", "vm-1", "vm-2", "vm-3"}



def test_a_target_answering_what_gpuvm_cannot_use_is_not_observed_alone(tmp_path, mocker):
    """A wrong host key, an untrusted value or a failed command set that target aside with why (never
    trusted, never "not up yet": an error note), and the others are observed and planned."""
    _observed(mocker)
    fakes = {"esx-01": Down("esx-01", HostKeyError), "esx-02": FakeExecutor("esx-02", {"true": ok("true")}),
             "vm-1": Hostile("vm-1"), "vm-2": FakeExecutor("vm-2", {"true": ok("true")}),
             "vm-3": FakeExecutor("vm-3", {"true": CommandResult("true", 1, "", "boom")})}
    facts, down = engine.observe_reachable(_cluster(tmp_path, fakes))
    assert {target for _, target in facts} == {"esx-02", "vm-2"}
    assert sorted(down) == ["esx-01", "vm-1", "vm-3"]
    assert all(isinstance(e, ConnectError) and e.exit_code == 3 for e in down.values())
    assert isinstance(down["esx-01"], HostKeyError) and "answered 'x$(y)'" in str(down["vm-1"])

    on = {"power_state": "poweredOn"}
    plan, _ = engine.make_plan(load_runbook(tmp_path / "rb.yaml"),
                               inventory([r750xa("esx-01"), r750xa("esx-02")],
                                         [vm("vm-1", **on), vm("vm-2", "esx-02", **on), vm("vm-3", "esx-02", **on)]),
                               unreachable=down)
    notes = {n.target: n for n in plan.notes if n.step == "observe"}
    assert {name: note.level for name, note in notes.items()} == {"esx-01": "error", "vm-1": "error", "vm-3": "error"}
    assert "Error reading SSH protocol banner" in notes["esx-01"].message and "not observed" in notes["vm-1"].message
    assert sorted(plan.unobserved) == ["esx-01", "vm-1", "vm-3"]


def test_unobserved_notes_say_what_apply_does_and_warn_when_nothing_explains_the_silence():
    on = {"power_state": "poweredOn"}
    facts = inventory([r750xa("esx-01")], [vm("vm-1", **on), vm("vm-2", **on), vm("vm-3", power_state="poweredOff")])
    plan = Plan(changes=[Change(vm_advanced.NAME, "vm-2", "vm", "extraConfig x", None, "1")])
    notes = {name: engine.unobserved_note(name, role, "refused", plan, facts)
             for name, role in (("esx-01", "esxi"), ("vm-1", "guest"), ("vm-2", "guest"), ("vm-3", "guest"))}
    assert notes["esx-01"].level == "warning" and "apply leaves host esx-01 and its VMs alone" in notes["esx-01"].message
    assert notes["vm-1"].level == "warning" and "although its VM runs" in notes["vm-1"].message
    assert notes["vm-2"].level == "warning" and "its VM is planned to change (1 change(s))" in notes["vm-2"].message
    assert notes["vm-3"].level == "info"  # its VM is off: expected to be away


@pytest.fixture
def lab(tmp_path, mocker):
    """esx-01's shell is down; vm-1's guest is down although its VM runs (untouched); vm-2's VM is
    changed by this run (its guest answers). The steps' applies are mocks."""
    applied = mocker.Mock()
    steps = {s.name: dataclasses.replace(s, apply=applied, apply_all=None)
             for s in (esxi_ats.STEP, host_passthrough.STEP, vm_advanced.STEP)}
    steps[guest_nic.NAME] = dataclasses.replace(guest_nic.STEP, apply=applied, plan=lambda target, fact: [
        Change(guest_nic.NAME, target.name, "nic", "mtu", 1500, 9000)])
    mocker.patch.object(engine, "STEPS", [steps.get(s.name, s) for s in engine.STEPS])
    answers = {"true": ok("true")}
    fakes = {"esx-01": Down("esx-01"), "esx-02": FakeExecutor("esx-02", answers), "vm-1": Down("vm-1"),
             "vm-2": FakeExecutor("vm-2", answers), "vm-3": FakeExecutor("vm-3", answers)}
    cluster = _cluster(tmp_path, fakes)
    mocker.patch.object(engine, "observe_remote", return_value=GroupResult(  # as during apply: vm-1 still down
        {g: {guest_nic.NAME: "fact"} for g in ("vm-2", "vm-3")},
        {"vm-1": ConnectError("vm-1: cannot connect to 10.0.0.11:22: Connection refused")}))
    desired = Desired(hosts={h: DesiredHost(h, [], None, False) for h in ("esx-01", "esx-02")},
                      vms={v: DesiredVm(v, h, None, None, "efi", True, [], {}, "on")
                           for v, h in (("vm-1", "esx-01"), ("vm-2", "esx-02"), ("vm-3", "esx-02"))})
    plan = Plan([Change(host_passthrough.NAME, "esx-01", "pci", "passthru", False, True),
                 Change(host_passthrough.NAME, "esx-02", "pci", "passthru", False, True),
                 Change(vm_advanced.NAME, "vm-1", "vm", "x", None, "1"),
                 Change(vm_advanced.NAME, "vm-2", "vm", "x", None, "1"),
                 Change(guest_nic.NAME, "vm-3", "nic", "mtu", 1500, 9000)],
                unobserved={"esx-01": "banner", "vm-1": "refused"})
    state = tmp_path / "state"
    state.mkdir()
    ctx = Context(options=Options(guest_boot_timeout=8), cluster=cluster,
                  unreachable=dict(plan.unobserved))
    return plan, desired, ctx, applied, Journal(state)


def test_apply_skips_what_depends_on_a_shell_not_observed_and_waits_only_for_guests_it_restarted(lab, mocker):
    plan, desired, ctx, applied, journal = lab
    waited = mocker.spy(engine, "_wait_for_ssh")
    start = time.monotonic()
    outcome = engine.apply_plan(plan, desired, ctx, journal)
    assert time.monotonic() - start < 5  # vm-1's guest (its VM untouched) does not hold the run for boot_timeout
    assert waited.call_args.args[1] == {"vm-2"}  # only the guest whose VM this run changed
    done = sorted((call.args[1].name, call.args[2][0].step) for call in applied.call_args_list)
    assert done == [("esx-02", host_passthrough.NAME), ("vm-2", guest_nic.NAME), ("vm-2", vm_advanced.NAME),
                    ("vm-3", guest_nic.NAME)]
    assert list(outcome.failed) == ["vm-1 (observe)"]  # not observed to the end: it counts
    assert outcome.skipped == {
        "esx-01 (host.passthrough)": "the ESXi shell of esx-01 was not observed (its ESXi steps could not be planned)",
        "vm-1 (vm.advanced)": "the ESXi shell of its host esx-01 was not observed"}
    assert "vm-2" in outcome.observed and "vm-1" not in outcome.observed


def test_a_missing_key_file_names_the_runbooks_line_and_every_target_that_logs_in_with_it(tmp_path):
    good = tmp_path / "good_key"
    good.write_text("key")
    path = tmp_path / "rb.yaml"
    path.write_text(textwrap.dedent(f"""\
        hosts: [{{name: esx-01}}]
        vms: [{{name: vm-1, host: esx-01}}, {{name: vm-2, host: esx-01}}, {{name: vm-3, host: esx-01}}]
        guests:
          hosts:
            - vm: vm-1
              ssh: {{address: 10.0.0.11, key_file: {good}}}
            - vm: vm-2
              ssh: {{address: 10.0.0.12, key_file: keys/gone}}
            - vm: vm-3
              ssh: {{address: 10.0.0.13, key_file: keys/gone}}
        """))
    with pytest.raises(InputError) as refused:
        build_cluster(load_runbook(path), tmp_path)
    assert str(refused.value) == (f"{path}:8: guests.hosts[1].ssh.key_file: {tmp_path}/keys/gone does not exist: "
                                  "the SSH key gpuvm logs in to vm-2, vm-3 with")
    assert refused.value.exit_code == 2


def test_a_restarted_guest_offering_a_refused_host_key_is_not_waited_for(tmp_path, mocker):
    """It answers, with a key gpuvm does not trust: waiting boot_timeout for it helps nothing (the
    observation that follows fails it, not observed, with the key's error)."""
    fakes = {"esx-01": FakeExecutor("esx-01"), "esx-02": FakeExecutor("esx-02"), "vm-1": Down("vm-1", HostKeyError),
             "vm-2": FakeExecutor("vm-2"), "vm-3": FakeExecutor("vm-3")}
    sleep = mocker.patch.object(engine.time, "sleep")
    engine._wait_for_ssh(_cluster(tmp_path, fakes), {"vm-1"}, 2, None)
    sleep.assert_not_called()
