"""One campaign at a time on a guest: a lock each guest holds for the campaign that measures on it.

Two `gpuvm bench run`s on the same guests would share ports (the ranks of one connect to the
other's rendezvous) and load (one records figures measured under the other's as clean results).
So before it prepares anything, a campaign takes `/tmp/gpuvm-bench.lock` on every guest taking
part (`mkdir`: atomic, whoever runs it; /tmp: shared by the guest's users and emptied by a reboot),
writing who holds it into it; a second campaign is refused (LockedError, exit 7) naming the holder.
The lock is given back when the campaign ends, also after Ctrl-C or an error. A lock whose holder
was a gpuvm process on this machine that is gone (killed) is taken over; any other is left to the
user, whom the message tells how to remove it.
"""

from __future__ import annotations

import getpass
import os
import shlex
import socket
import uuid
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime

from gpuvm.bench.fan_out import at_once
from gpuvm.errors import GpuvmError, LockedError, TargetFailures
from gpuvm.executors.base import Executor
from gpuvm.runbook.strict import shown

LOCK_DIR = "/tmp/gpuvm-bench.lock"
BUSY = 75  # the acquire script's exit code when another campaign holds the lock
PREFIX = "gpuvm-bench-campaign"


def holder_line(campaign: str) -> str:
    """Who holds a lock: `gpuvm-bench-campaign <token> <campaign> by user@host pid N since T`."""
    since = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return (f"{PREFIX} {uuid.uuid4().hex[:12]} {campaign} by {getpass.getuser()}@{socket.gethostname()} "
            f"pid {os.getpid()} since {since}")


def acquire_script(lock_dir: str, holder: str) -> str:
    d = shlex.quote(lock_dir)
    return (f"if mkdir {d} 2>/dev/null; then printf '%s\\n' {shlex.quote(holder)} > {d}/holder; "
            f"else head -c 300 {d}/holder 2>/dev/null; exit {BUSY}; fi")


def release_script(lock_dir: str, holder: str) -> str:
    """Removes the lock only while it is still this campaign's."""
    d = shlex.quote(lock_dir)
    return f'[ "$(cat {d}/holder 2>/dev/null)" = {shlex.quote(holder)} ] && rm -rf {d}; true'


def _gone(holder: str) -> bool:
    """Whether the holder was a gpuvm process on this machine that no longer runs."""
    words = holder.split()
    if len(words) < 7 or words[0] != PREFIX or words[-4] != "pid" or not words[-3].isdigit():
        return False
    if words[-5].rpartition("@")[2] != socket.gethostname():
        return False
    try:
        os.kill(int(words[-3]), 0)
    except ProcessLookupError:
        return True
    except OSError:
        return False
    return False


class GuestLocks:
    """`with GuestLocks(executors, "campaign name"):` holds the lock on every guest (all or none)."""

    def __init__(self, executors: Mapping[str, Executor], campaign: str, lock_dir: str = LOCK_DIR):
        self.executors = executors
        self.lock_dir = lock_dir
        self.holder = holder_line(campaign)
        self.held: list[str] = []

    def _acquire(self, target: str) -> str | None:
        """None when taken; else who holds it."""
        executor = self.executors[target]
        for _ in range(2):
            result = executor.run_script(acquire_script(self.lock_dir, self.holder), timeout=60, check=False)
            if result.exit_code == 0:
                return None
            other = result.stdout.strip()
            if result.exit_code != BUSY:
                return f"cannot take the campaign lock {self.lock_dir}: {shown(result.stderr.strip() or other, 200)}"
            if not _gone(other):
                return (f"another benchmark campaign runs there: {shown(other or 'holder unknown', 200)}; wait for "
                        f"it to end, or remove {self.lock_dir} on the guest if it is gone")
            executor.run_script(release_script(self.lock_dir, other), timeout=60, check=False)  # its gpuvm died
        return f"the campaign lock {self.lock_dir} was taken over by another campaign"

    def __enter__(self) -> GuestLocks:
        targets = sorted(self.executors)
        with ThreadPoolExecutor(max_workers=at_once(targets), thread_name_prefix="gpuvm-lock") as pool:
            outcomes = dict(zip(targets, pool.map(self._attempt, targets), strict=True))
        self.held = [t for t, why in outcomes.items() if why is None]
        failed = {t: e for t, e in outcomes.items() if isinstance(e, GpuvmError)}
        refused = {t: why for t, why in outcomes.items() if isinstance(why, str)}
        if failed or refused:
            self.release()
        if failed:  # a guest that does not answer: its own error (and exit code)
            raise TargetFailures(failed)
        if refused:
            raise LockedError("; ".join(f"guest {t}: {why}" for t, why in refused.items()))
        return self

    def _attempt(self, target: str) -> str | GpuvmError | None:
        try:
            return self._acquire(target)
        except GpuvmError as e:
            return e

    def __exit__(self, *exc: object) -> None:
        self.release()

    def release(self) -> None:
        """Best effort: a guest that does not answer keeps the lock until it is removed or rebooted."""
        for target in self.held:
            try:
                self.executors[target].run_script(release_script(self.lock_dir, self.holder), timeout=60, check=False)
            except (GpuvmError, OSError):
                pass
        self.held = []
