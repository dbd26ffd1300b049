"""The apply lock as a fenced lease (issue 21, item 3), against the simulator: a run whose renewals
fail stops changing anything before another run can take its hosts over; liveness is expiry only
(never a pid or a hostname); a lock value gpuvm did not write is refused in one clear line and
held for a bounded time; a lock being taken while vCenter is slow is never broken; and breaking a
stale lock that another run broke first is no error."""

from __future__ import annotations

import json
import socket
import subprocess
import threading
import time
import uuid
from contextlib import contextmanager
from datetime import timedelta
from typing import Any, Iterator

import pytest
from pyVmomi import vim, vmodl

from gpusim import Simulator
from gpuvm.errors import GpuvmError, LockedError
from gpuvm.vsphere.lock import HostLocks
from gpuvm.vsphere.session import Session, Target
from gpuvm.vsphere.tasks import call
from tests.integration.vcenter import pyvmomi

pytestmark = pytest.mark.integration

TTL = 3.0  # seconds: short leases keep these tests fast


@pytest.fixture(scope="module")
def sim() -> Iterator[Simulator]:
    with Simulator(hosts=1, vms_per_host=1) as sim:
        yield sim


@contextmanager
def session_of(sim: Simulator) -> Iterator[Session]:
    """gpuvm's own session (the one a run's lease guards)."""
    target = Target(host=sim.host, port=sim.port, path="/sdk", user=sim.username, password=sim.password,
                    insecure=False, ca_file=sim.cert_file)
    with Session(target) as session:
        yield session


def a_host() -> str:
    """A host name no other test locks (the module shares one simulator)."""
    return f"esx-{uuid.uuid4().hex[:8]}"


def plant(sim: Simulator, host: str, value: str | None) -> None:
    """A lock on `host` as something else left it: its definition, and `value` on the root folder."""
    with pyvmomi(sim) as si:
        content = si.RetrieveContent()
        key = content.customFieldsManager.AddCustomFieldDef(name=f"gpuvm.lock.{host}", moType=vim.Folder).key
        if value is not None:
            content.customFieldsManager.SetField(entity=content.rootFolder, key=key, value=value)


def lock_value(sim: Simulator, host: str) -> str | None:
    with pyvmomi(sim) as si:
        content = si.RetrieveContent()
        keys = [f.key for f in content.customFieldsManager.field or [] if f.name == f"gpuvm.lock.{host}"]
        values = [v.value for v in content.rootFolder.customValue or [] if keys and v.key == keys[0]]
        return values[0] if values else None


def vcenter_time(sim: Simulator) -> Any:
    with pyvmomi(sim) as si:
        return si.CurrentTime()


def cut_off_clock(session: Session) -> None:
    """vCenter's time can no longer be read over `session` (a renewal's first call): its renewals fail."""
    def unreachable() -> Any:
        raise OSError("Network is unreachable")

    object.__setattr__(session.si, "CurrentTime", unreachable)  # pyVmomi's objects refuse plain assignment


def reconfigure(session: Session, note: str) -> None:
    """A change to the simulator's one VM: what a run does to a host it holds. Without latency gpusim
    makes it before it answers."""
    content = session.content
    view = content.viewManager.CreateContainerView(content.rootFolder, [vim.VirtualMachine], True)
    try:
        vm = view.view[0]
        call("ReconfigVM", lambda: vm.ReconfigVM_Task(vim.vm.ConfigSpec(annotation=note)))
    finally:
        view.DestroyView()


def test_failed_renewals_stop_the_run_before_another_run_takes_over(sim, caplog):
    host = a_host()
    changes: list[float] = []  # when each of the first run's changes was surely made
    taken: list[float] = []  # when the second run began the attempt that took the host over
    stopped: list[GpuvmError] = []
    with session_of(sim) as first, session_of(sim) as second:
        with HostLocks(first, [host], "f1a57f1a57f1", ttl=TTL):
            cut_off_clock(first)

            def take_over() -> None:
                end = time.monotonic() + 4 * TTL
                while time.monotonic() < end:
                    began = time.monotonic()
                    try:
                        with HostLocks(second, [host], "5ec0d05ec0d0", ttl=TTL):
                            taken.append(began)
                            return
                    except LockedError:
                        time.sleep(0.1)

            other = threading.Thread(target=take_over)
            other.start()
            end = time.monotonic() + 4 * TTL
            while time.monotonic() < end and not stopped:
                try:
                    reconfigure(first, f"change {len(changes)}")
                    changes.append(time.monotonic())
                except GpuvmError as error:
                    stopped.append(error)
                time.sleep(0.05)
            other.join()
    assert taken, "the second run never took the host over"
    assert changes and max(changes) < taken[0], "the first run changed the host after the second took it over"
    assert stopped and stopped[0].exit_code == 8, stopped
    assert "lease" in str(stopped[0]) and host in str(stopped[0]), stopped[0]
    renewals = [r for r in caplog.records if "renew" in r.getMessage() and r.levelname in ("WARNING", "ERROR")]
    assert renewals, "a failed renewal went unsaid"


def test_a_read_is_still_allowed_after_the_lease_is_lost_and_a_change_is_refused(sim):
    host = a_host()
    with session_of(sim) as session, HostLocks(session, [host], "00000000000a", ttl=TTL):
        cut_off_clock(session)
        time.sleep(TTL)  # past the deadline, renewals failing all the while
        with pytest.raises(GpuvmError) as refused:
            reconfigure(session, "too late")
        assert refused.value.exit_code == 8
        assert session.content.rootFolder.name  # reads go on (release, recovery reads)


def dead_pid() -> int:
    process = subprocess.Popen(["true"])
    process.wait()
    return process.pid


def lease(sim: Simulator, run: str, who: str, expires_in: float, taking: bool = False) -> None:
    """Another run's lease, as gpuvm writes it."""
    with pyvmomi(sim) as si:
        content = si.RetrieveContent()
        key = content.customFieldsManager.AddCustomFieldDef(name=f"gpuvm.lease.{run}", moType=vim.Folder).key
        expires = si.CurrentTime() + timedelta(seconds=expires_in)
        content.customFieldsManager.SetField(entity=content.rootFolder, key=key, value=json.dumps(
            {"v": 1, "run": run, "who": who, "since": "2026-11-23T09:00:00+00:00", "taking": taking,
             "expires": expires.isoformat(timespec="milliseconds"), "hosts": 1}))


@pytest.mark.parametrize("held_by", ["a lease", "gpuvm before leases"])
def test_a_live_lock_naming_this_machine_and_a_dead_pid_is_not_broken(sim, held_by):
    """Another container or PID namespace (or another machine of the same name) holds it: its pid
    means nothing here, and it is unexpired."""
    host, run, who = a_host(), uuid.uuid4().hex[:12], f"ops@{socket.gethostname()} pid {dead_pid()}"
    if held_by == "a lease":
        lease(sim, run, who, expires_in=3600)
        plant(sim, host, json.dumps({"run": run, "who": who, "since": "2026-11-23T09:00:00+00:00"}))
    else:
        expires = vcenter_time(sim) + timedelta(seconds=3600)
        plant(sim, host, json.dumps({"run": run, "who": who, "machine": socket.gethostname(), "pid": dead_pid(),
                                     "since": "2026-11-23T09:00:00+00:00",
                                     "expires": expires.isoformat(timespec="seconds")}))
    with session_of(sim) as session, pytest.raises(LockedError, match=f"host {host} is locked by another gpuvm run"):
        with HostLocks(session, [host], "00000000000b", ttl=TTL):
            pass


def test_a_lock_with_no_value_is_held_while_a_run_takes_its_locks_then_stale_when_its_lease_ends(sim):
    """A run killed between creating a lock and naming itself on it leaves a lock with no value."""
    host, run = a_host(), uuid.uuid4().hex[:12]
    lease(sim, run, "ops@elsewhere pid 7", expires_in=2.0, taking=True)
    plant(sim, host, None)
    with session_of(sim) as session:
        with pytest.raises(LockedError, match=rf"host {host} is locked by another gpuvm run \(taking its locks now\): ops@elsewhere"):
            with HostLocks(session, [host], "00000000000c", ttl=TTL):
                pass
        time.sleep(2.1)  # the taker's lease expired
        with HostLocks(session, [host], "00000000000d", ttl=TTL) as locks:
            assert host in locks.held
    assert f"gpuvm.lease.{run}" not in field_names(sim)  # the expired lease was removed with its lock


def test_the_lock_calls_fault_as_vcenter_does(sim):
    with pyvmomi(sim) as si:
        manager = si.RetrieveContent().customFieldsManager
        key = manager.AddCustomFieldDef(name="gpuvm.lock.fault-check", moType=vim.Folder).key
        with pytest.raises(vim.fault.DuplicateName) as duplicate:
            manager.AddCustomFieldDef(name="gpuvm.lock.fault-check", moType=vim.Folder)
        assert duplicate.value.msg == "The name 'gpuvm.lock.fault-check' already exists."
        manager.RemoveCustomFieldDef(key=key)
        for gone in (lambda: manager.RemoveCustomFieldDef(key=key),
                     lambda: manager.SetField(entity=si.RetrieveContent().rootFolder, key=key, value="x")):
            with pytest.raises(vmodl.fault.InvalidArgument) as invalid:
                gone()
            assert invalid.value.msg == "A specified parameter was not correct: key"


GARBAGE = {
    "not JSON": "held by Bob, ask him",
    "a list": "[1, 2]",
    "a number for expires": '{"run": "r", "expires": 5}',
    "words for expires": '{"run": "r", "expires": "yesterday"}',
    "no time zone": '{"run": "r", "expires": "2030-01-01T00:00:00"}',
    "missing fields": '{"run": "r"}',
    "deeply nested": "[" * 100_000,
    "huge": '{"run": "' + "x" * (2 << 20) + '"}',
}


@pytest.mark.parametrize("value", GARBAGE.values(), ids=GARBAGE.keys())
def test_a_lock_value_gpuvm_did_not_write_is_refused_clearly_then_held_for_a_bounded_time(sim, value):
    host = a_host()
    plant(sim, host, value)
    with session_of(sim) as session:
        with pytest.raises(LockedError) as refused:
            with HostLocks(session, [host], "00000000000e", ttl=1.0):
                pass
        message = str(refused.value)
        assert f"host {host}" in message and "did not write" in message and "\n" not in message, message
        assert len(message) < 400, message
        if value == GARBAGE["not JSON"]:  # one case is enough to wait out
            time.sleep(1.5)  # held no longer than a lease
            with HostLocks(session, [host], "00000000000f", ttl=1.0):
                pass
            assert lock_value(sim, host) is None  # released


def test_breaking_a_stale_lock_another_run_broke_first_is_no_error(sim):
    """vCenter answers RemoveCustomFieldDef of a key that is gone with InvalidArgument."""
    host = a_host()
    expired = vcenter_time(sim) - timedelta(seconds=60)
    plant(sim, host, json.dumps({"run": "dead", "who": "ops@elsewhere", "since": "2026-11-23T09:00:00+00:00",
                                 "expires": expired.isoformat(timespec="seconds")}))
    with session_of(sim) as session:
        manager = session.content.customFieldsManager
        remove = manager.RemoveCustomFieldDef

        def another_run_first(key: int) -> None:
            with pyvmomi(sim) as si:  # the other run breaks it just before this one does
                si.RetrieveContent().customFieldsManager.RemoveCustomFieldDef(key=key)
            remove(key=key)

        object.__setattr__(manager, "RemoveCustomFieldDef", another_run_first)
        with HostLocks(session, [host], "000000000010", ttl=TTL) as locks:
            assert host in locks.held


@pytest.fixture
def slow_fields() -> Iterator[Simulator]:
    with Simulator(hosts=1, vms_per_host=1, latency={"SetField": "3s"}) as sim:
        yield sim


def test_a_lock_being_taken_while_vcenter_is_slow_is_not_broken(slow_fields):
    """vCenter takes 3 s to answer the taker's SetField: a second run must not judge the lock stale."""
    sim, host = slow_fields, "esx-01"
    results: dict[str, Any] = {}
    second_done = threading.Event()

    def take(name: str, hold: threading.Event | None = None) -> None:
        with session_of(sim) as session:
            try:
                with HostLocks(session, [host], name, ttl=30):
                    results[name] = "held"
                    if hold is not None:
                        hold.wait(30)
            except GpuvmError as error:
                results[name] = error

    first = threading.Thread(target=take, args=("f1a57f1a57f1", second_done))
    first.start()
    end = time.monotonic() + 15
    while time.monotonic() < end and f"gpuvm.lock.{host}" not in field_names(sim):
        time.sleep(0.1)
    take("5ec0d05ec0d0")  # the first run's definition exists; what says who holds it may be on its way
    second_done.set()
    first.join()
    assert results.get("f1a57f1a57f1") == "held", results
    assert isinstance(results.get("5ec0d05ec0d0"), LockedError), results


def field_names(sim: Simulator) -> list[str]:
    with pyvmomi(sim) as si:
        return [f.name for f in si.RetrieveContent().customFieldsManager.field or []]
