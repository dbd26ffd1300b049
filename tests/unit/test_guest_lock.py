"""One benchmark campaign at a time on a guest (issue 22, item 9): the lock taken with `mkdir` in a
real shell (LocalExecutor, a lock directory of the test's own)."""

from __future__ import annotations

import os
import socket
import subprocess

import pytest

from gpuvm.bench.guest_lock import GuestLocks, holder_line
from gpuvm.errors import LockedError
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


def test_a_lock_held_from_another_machine_is_refused_and_kept(guests, tmp_path):
    lock = str(tmp_path / "lock")
    (tmp_path / "lock").mkdir()
    (tmp_path / "lock" / "holder").write_text("gpuvm-bench-campaign abc c by ops@elsewhere pid 1 since 2026-01-01T00:00:00Z\n")
    with pytest.raises(LockedError, match=r"ops@elsewhere pid 1 .*remove .*/lock on the guest if it is gone"):
        GuestLocks({"vm1": guests["vm1"]}, "mine", lock).__enter__()
    assert (tmp_path / "lock" / "holder").read_text().startswith("gpuvm-bench-campaign abc")  # not ours: kept


def test_a_lock_left_by_a_killed_gpuvm_on_this_machine_is_taken_over(guests, tmp_path):
    lock = tmp_path / "lock"
    dead = subprocess.Popen(["true"])
    dead.wait()
    lock.mkdir()
    (lock / "holder").write_text(holder_line("crashed").replace(f"pid {os.getpid()}", f"pid {dead.pid}") + "\n")
    with GuestLocks({"vm1": guests["vm1"]}, "next", str(lock)) as taken:
        assert (lock / "holder").read_text().strip() == taken.holder
