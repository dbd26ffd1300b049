"""One benchmark campaign at a time on a guest (issue 22, item 9): the lock taken with `mkdir` in a
real shell (LocalExecutor, a lock directory of the test's own), held by a lease the holder renews;
liveness is the lease's expiry on the guest's clock, never a pid or a host name."""

from __future__ import annotations

import os
import socket
import subprocess
import time

import pytest

from gpuvm.bench.guest_lock import GuestLocks, holder_line
from gpuvm.errors import LeaseLostError, LockedError
from gpuvm.executors.local import LocalExecutor


@pytest.fixture
def guests():
    return {"vm1": LocalExecutor("vm1")}


def test_a_second_campaign_is_refused_naming_the_first_until_it_ends(guests, tmp_path):
    lock = str(tmp_path / "lock")
    with GuestLocks({"vm1": guests["vm1"]}, "first-campaign", lock) as first:
        with pytest.raises(LockedError) as refused:
            GuestLocks({"vm1": guests["vm1"]}, "second-campaign", lock).__enter__()
        message = str(refused.value)
        assert message.startswith("guest vm1: another benchmark campaign runs there: ")
        assert first.holder in message and "first-campaign" in message and f"@{socket.gethostname()} pid" in message
        assert refused.value.exit_code == 7
    with GuestLocks({"vm1": guests["vm1"]}, "second-campaign", lock):  # given back when the first ended
        pass
    assert not (tmp_path / "lock").exists()


def _held_by(lock, holder: str, expires: float) -> None:
    """A lock as another campaign leaves it: its holder, and its lease's end on the guest's clock."""
    lock.mkdir()
    (lock / "holder").write_text(holder + "\n")
    (lock / "expires").write_text(f"{int(expires)}\n")


def test_a_live_lease_is_refused_and_kept_whoever_holds_it(guests, tmp_path):
    """Liveness is the lease's expiry only: a holder whose pid is gone on this machine (the pid may be
    reused, or the campaign may run from another machine of the same name) still holds it."""
    lock = tmp_path / "lock"
    dead = subprocess.Popen(["true"])
    dead.wait()
    holder = holder_line("running").replace(f"pid {os.getpid()}", f"pid {dead.pid}")
    _held_by(lock, holder, time.time() + 600)
    with pytest.raises(LockedError) as refused:
        GuestLocks({"vm1": guests["vm1"]}, "mine", str(lock)).__enter__()
    assert str(refused.value).startswith("guest vm1: another benchmark campaign runs there: ")
    assert holder in str(refused.value) and refused.value.exit_code == 7
    assert (lock / "holder").read_text().strip() == holder  # not ours: kept


def test_an_expired_lease_is_taken_over_even_if_its_pid_runs_or_it_came_from_elsewhere(guests, tmp_path):
    for holder in (holder_line("crashed"),  # this very process's pid: alive, but its lease ran out
                   "gpuvm-bench-campaign abc c by ops@elsewhere pid 1 since 2026-01-01T00:00:00Z"):
        lock = tmp_path / "lock"
        _held_by(lock, holder, time.time() - 5)
        with GuestLocks({"vm1": guests["vm1"]}, "next", str(lock)) as taken:
            assert (lock / "holder").read_text().strip() == taken.holder
            assert int((lock / "expires").read_text()) >= time.time() + taken.ttl - 5
        assert not lock.exists()


def test_the_holder_renews_its_lease_and_learns_when_it_was_taken_over(guests, tmp_path, mocker):
    lock = tmp_path / "lock"
    renew = mocker.spy(GuestLocks, "renew")
    with pytest.raises(LeaseLostError, match=r"guest vm1: the campaign lock .* was taken over") as lost:
        with GuestLocks({"vm1": guests["vm1"]}, "mine", str(lock), ttl=1) as held:
            (lock / "expires").write_text("0\n")
            deadline = time.monotonic() + 5
            while renew.call_count < 2 and time.monotonic() < deadline:  # every third of ttl
                time.sleep(0.05)
            assert renew.call_count >= 2 and int((lock / "expires").read_text()) > time.time() - 1
            (lock / "holder").write_text("gpuvm-bench-campaign zzz other by ops@elsewhere pid 9 since now\n")
            held.renew()
    assert lost.value.exit_code == 8
    assert (lock / "holder").read_text().startswith("gpuvm-bench-campaign zzz")  # the other's: not removed


def test_a_lock_being_taken_without_its_lease_yet_is_held(guests, tmp_path):
    """mkdir done, lease not written yet: held (for one ttl from the directory's time), not stale."""
    lock = tmp_path / "lock"
    lock.mkdir()
    with pytest.raises(LockedError, match="holder unknown"):
        GuestLocks({"vm1": guests["vm1"]}, "mine", str(lock)).__enter__()
