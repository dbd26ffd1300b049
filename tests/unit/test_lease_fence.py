"""The lease's fence without a vCenter: which SOAP calls it checks, and when it refuses."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from gpuvm.errors import InputError, LeaseLostError
from gpuvm.vsphere import lock
from gpuvm.vsphere.lock import HostLocks, foreign_values, lease_of, lock_value
from gpuvm.vsphere.records import Held, Holder, Unreadable
from gpuvm.vsphere.bounded import Line, Timeouts
from gpuvm.vsphere.session import RequestCounter, _instrument, changes_vcenter, unfenced


@pytest.mark.parametrize("method", ["ReconfigVM_Task", "EnterMaintenanceMode_Task", "UpdatePassthruConfig",
                                    "SetField", "ShutdownGuest", "SomeFutureMethod"])
def test_a_change_or_an_unknown_method_is_fenced(method):
    assert changes_vcenter(method)


@pytest.mark.parametrize("method", ["RetrievePropertiesEx", "ContinueRetrievePropertiesEx", "CurrentTime", "Fetch",
                                    "CreateContainerView", "DestroyView", "Login", "QueryConfigOption"])
def test_a_read_is_not_fenced(method):
    assert not changes_vcenter(method)


def instrumented(mocker, fence):
    stub = SimpleNamespace(InvokeMethod=mocker.Mock(return_value="done"), InvokeAccessor=mocker.Mock())
    session = SimpleNamespace(fence=fence, line=Line("https://vc/sdk", Timeouts()))
    _instrument(stub, RequestCounter(), mocker.Mock(generation=0), session)
    return stub


def call(stub, method):
    return stub.InvokeMethod(None, SimpleNamespace(wsdlName=method), [])


def test_the_session_checks_the_fence_before_a_change_only(mocker):
    fence = mocker.Mock(side_effect=LeaseLostError("lost"))
    stub = instrumented(mocker, fence)
    assert call(stub, "RetrievePropertiesEx") == "done"
    with pytest.raises(LeaseLostError):
        call(stub, "PowerOnVM_Task")
    fence.assert_called_once_with("PowerOnVM_Task")
    with unfenced():  # the lease's own calls (renewing, releasing)
        assert call(stub, "SetField") == "done"


def locks_at(mocker, now: float, deadline: float, ttl: float = 300.0) -> HostLocks:
    mocker.patch.object(lock, "clock", return_value=now)
    locks = HostLocks(mocker.Mock(), ["esx-01", "esx-02"], "3f2a9c1d0e4b", ttl=ttl, journal=mocker.Mock())
    locks.deadline = deadline
    return locks


def test_a_change_inside_the_lease_passes(mocker):
    locks_at(mocker, now=1000.0, deadline=1000.0 + 31).check("ReconfigVM_Task")


def test_a_change_within_the_margin_of_the_deadline_is_refused_and_the_loss_journaled_once(mocker):
    locks = locks_at(mocker, now=1000.0, deadline=1000.0 + 29)  # margin: ttl/10 = 30 s
    for _ in range(2):
        with pytest.raises(LeaseLostError, match=r"esx-01, esx-02 was lost .*stopped before ReconfigVM_Task"):
            locks.check("ReconfigVM_Task")
    locks.journal.record.assert_called_once()
    assert locks.journal.record.call_args.args == ("lease-lost",)


def test_a_lost_lease_stays_lost_after_a_late_renewal(mocker):
    locks = locks_at(mocker, now=1000.0, deadline=990.0)
    with pytest.raises(LeaseLostError):
        locks.check()
    locks.deadline = 2000.0  # a renewal answered after all: too late, the run already stopped
    with pytest.raises(LeaseLostError):
        locks.check()


RUN = "3f2a9c1d0e4b"
LEASE = (f'{{"v": 1, "run": "{RUN}", "who": "ops@a pid 1", "since": "2026-11-25T10:00:00+00:00", '
         '"expires": "2030-01-01T00:00:00+00:00", "taking": false, "hosts": 1}')


@pytest.mark.parametrize("value", [None, 5, "", "{", "[]", "[" * 50_000, '"' + "x" * 20_000 + '"'])
def test_a_value_that_is_no_json_object_is_unreadable(value):
    assert lease_of("gpuvm.lease." + RUN, value) is None
    with pytest.raises(Unreadable):
        lock_value(value)


@pytest.mark.parametrize("value", ['{"run": "r"}', '{"run": "r", "expires": 1}', '{"run": "r", "expires": "soon"}',
                                   '{"run": "r", "expires": "2030-01-01T00:00:00"}', '{"expires": "2030-01-01T00:00:00Z"}',
                                   LEASE.replace(RUN, "run-1"),  # no gpuvm run id
                                   LEASE.replace('"v": 1', '"v": 2'),  # a version gpuvm does not know
                                   LEASE.replace('"hosts": 1', '"hosts": 1, "extra": 0'),
                                   LEASE.replace('2030-01-01T00:00:00+00:00"', '2030-01-01T00:00:00"')])  # no zone
def test_a_value_gpuvm_did_not_write_is_no_lease(value):
    assert lease_of("gpuvm.lease." + RUN, value) is None


def test_a_lease_a_holder_and_a_marker_parse_and_a_lease_names_its_own_run():
    assert lease_of("gpuvm.lease." + RUN, LEASE).run == RUN
    assert lease_of("gpuvm.lease." + RUN, LEASE.replace('"v": 1, ', "")).run == RUN  # the previous release's
    assert lease_of("gpuvm.lease.aaaaaaaaaaaa", LEASE) is None  # another run's lease in this run's attribute
    holder = lock_value(f'{{"run": "{RUN}", "who": "ops@a pid 1", "since": "2026-11-25T10:00:00+00:00"}}')
    assert isinstance(holder, Holder) and holder.run == RUN
    marker = lock_value('{"v": 1, "found": "x", "since": "2026-11-25T10:00:00Z", "expires": "2026-11-25T10:05:00Z"}')
    assert isinstance(marker, Held) and marker.found == "x"
    for value in ('{"run": "r"}', '{"run": 5, "who": "a", "since": "2026-11-25T10:00:00Z"}'):
        with pytest.raises(Unreadable):
            lock_value(value)


def test_foreign_lease_and_lock_values_are_reported_with_the_command_that_clears_them():
    found = foreign_values({"gpuvm.lease." + RUN: LEASE, "gpuvm.lease.aaaaaaaaaaaa": '{"hello": 1}',
                            "gpuvm.lock.esx-01": "[" * 9000, "gpuvm.lock.esx-02": ""})
    assert [(f.field, f.object) for f in found] == [("gpuvm.lease.aaaaaaaaaaaa", "root folder"),
                                                    ("gpuvm.lock.esx-01", "root folder")]
    assert "nested 9000 levels deep" in found[1].why and "govc fields.rm gpuvm.lock.esx-01" in found[1].message()


def test_the_lease_length_comes_from_the_environment_or_is_refused_clearly(monkeypatch):
    monkeypatch.setenv("GPUVM_LOCK_TTL", "3")
    assert lock.lease_length() == 3.0
    monkeypatch.setenv("GPUVM_LOCK_TTL", "0.1")
    with pytest.raises(InputError, match=r"GPUVM_LOCK_TTL='0.1': give the lease's length in seconds, from 1"):
        lock.lease_length()
    monkeypatch.delenv("GPUVM_LOCK_TTL")
    assert lock.lease_length() == lock.TTL == 300.0


def test_the_engine_stops_at_the_next_target_and_step_once_the_lease_is_lost(tmp_path, mocker):
    """The fence is checked before each target and step, not only at vSphere calls (SSH steps too)."""
    import dataclasses

    from gpuvm import engine
    from gpuvm.journal import Journal, past_entries
    from gpuvm.plan import Change, Plan
    from gpuvm.desired import Desired, DesiredVm
    from gpuvm.steps import vm_power
    from gpuvm.steps.base import Context

    lost = []

    def fence(before: str) -> None:
        if lost:
            raise LeaseLostError(f"lost; stopped before {before}")

    powered = mocker.Mock(side_effect=lambda ctx, target, changes: lost.append(target.name))  # lost meanwhile
    mocker.patch.object(engine, "STEPS", [dataclasses.replace(s, apply=powered, apply_all=None)
                                          if s.name == vm_power.NAME else s for s in engine.STEPS])
    vms = ["vm-1", "vm-2"]
    desired = Desired(vms={n: DesiredVm(n, "esx-01", None, None, "efi", True, [], {}, "on") for n in vms})
    plan = Plan([Change(vm_power.NAME, n, "vm", "power", "poweredOff", "poweredOn") for n in vms])
    ctx = Context(session=SimpleNamespace(fence=fence))
    with pytest.raises(LeaseLostError):
        engine.apply_plan(plan, desired, ctx, Journal(tmp_path), parallel=1)
    assert powered.call_count == 1  # the second VM was not touched
    assert past_entries(tmp_path)[-1]["interrupted"] == "LeaseLostError"
