"""One campaign at a time on a guest: a lock each guest holds for the campaign that measures on it.

Two `gpuvm bench run`s on the same guests would share ports (the ranks of one connect to the
other's rendezvous) and load (one records figures measured under the other's as clean results).
So before it prepares anything, a campaign takes `/tmp/gpuvm-bench.lock` on every guest taking
part (`mkdir`: atomic, whoever runs it; /tmp: shared by the guest's users and emptied by a reboot),
writing who holds it (`holder`) and until when (`expires`, on the guest's own clock) into it; a
second campaign is refused (LockedError, exit 7) naming the guest and the holder.

The lock is a lease, as in vsphere/lock.py: the holder renews it every third of `ttl` while the
campaign runs and gives it back when the campaign ends (also after Ctrl-C or an error). Liveness is
expiry only, never a pid or a host name (a pid is reused, and a holder on another machine, or in
another container of one name, cannot be asked): a lock whose lease ran out is stale, its holder
killed or cut off, and is taken over by one campaign (`takeover`, a second `mkdir`, lets one taker
at a time rewrite it). A lock being taken (made, lease not written yet) is held for one `ttl` from
the directory's time. A holder whose lock was taken over (its renewals stopped for a whole ttl)
learns it at its next renewal: `check()` raises LeaseLostError (exit 8) when the campaign ends.
"""

from __future__ import annotations

import getpass
import logging
import math
import os
import shlex
import socket
import threading
import uuid
from collections.abc import Mapping
from datetime import UTC, datetime

from gpuvm.bench.slurm import SubmitUnreachable, one_per_submit
from gpuvm.errors import GpuvmError, LeaseLostError, LockedError
from gpuvm.executors.base import Executor
from gpuvm.executors.group import GroupResult, at_once, run_group
from gpuvm.runbook.strict import shown

log = logging.getLogger(__name__)

LOCK_DIR = "/tmp/gpuvm-bench.lock"
BUSY = 75  # the acquire script's exit code when another campaign holds the lock
LOST = 76  # the renew script's exit code when the lock is no longer this campaign's
PREFIX = "gpuvm-bench-campaign"
TTL_S = 120.0  # a lease's length; renewed every third of it


def holder_line(campaign: str) -> str:
    """Who holds a lock: `gpuvm-bench-campaign <token> <campaign> by user@host pid N since T` (for
    people: the token makes it unique; nothing reads the pid or the host)."""
    since = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return (f"{PREFIX} {uuid.uuid4().hex[:12]} {campaign} by {getpass.getuser()}@{socket.gethostname()} "
            f"pid {os.getpid()} since {since}")


def _write_lease(d: str, holder: str, ttl: int) -> str:
    """Shell: the holder and the lease's end, each file replaced whole (a reader never sees half)."""
    return (f"printf '%s\\n' {shlex.quote(holder)} > {d}/holder.new && mv -f {d}/holder.new {d}/holder && "
            f"echo $(( $(date +%s) + {ttl} )) > {d}/expires.new && mv -f {d}/expires.new {d}/expires")


def acquire_script(lock_dir: str, holder: str, ttl: int) -> str:
    """Exit 0: taken (made, or a stale one taken over); BUSY: held, its holder printed."""
    d = shlex.quote(lock_dir)
    live = (f"[ \"$(date +%s)\" -lt \"$(cat {d}/expires 2>/dev/null || echo $(( $(stat -c %Y {d}) + {ttl} )))\" ]")
    busy = f"head -c 300 {d}/holder 2>/dev/null; exit {BUSY}"
    return (f"if mkdir {d} 2>/dev/null; then {_write_lease(d, holder, ttl)}; exit; fi; "
            f"if {live}; then {busy}; fi; "
            # a taker killed inside its takeover leaves `takeover`: stale after one ttl too
            f"t=$(stat -c %Y {d}/takeover 2>/dev/null) && [ $(( $(date +%s) - t )) -gt {ttl} ] && rmdir {d}/takeover; "
            f"mkdir {d}/takeover 2>/dev/null || {{ {busy}; }}; "
            f"if {live}; then rmdir {d}/takeover; {busy}; fi; "  # taken over by another meanwhile
            f"{_write_lease(d, holder, ttl)}; s=$?; rmdir {d}/takeover; exit $s")


def renew_script(lock_dir: str, holder: str, ttl: int) -> str:
    """Extends the lease while the lock is still this campaign's; else exit LOST."""
    d = shlex.quote(lock_dir)
    return (f'[ "$(cat {d}/holder 2>/dev/null)" = {shlex.quote(holder)} ] || exit {LOST}; '
            f"echo $(( $(date +%s) + {ttl} )) > {d}/expires.new && mv -f {d}/expires.new {d}/expires")


def release_script(lock_dir: str, holder: str) -> str:
    """Removes the lock only while it is still this campaign's."""
    d = shlex.quote(lock_dir)
    return f'[ "$(cat {d}/holder 2>/dev/null)" = {shlex.quote(holder)} ] && rm -rf {d}; true'


class GuestLocks:
    """`with GuestLocks(executors, "campaign name"):` holds the lock on every guest (all or none)."""

    def __init__(self, executors: Mapping[str, Executor], campaign: str, lock_dir: str = LOCK_DIR,
                 ttl: float = TTL_S):
        self.executors = executors
        self.lock_dir = lock_dir
        self.holder = holder_line(campaign)
        self.ttl = max(1, math.ceil(ttl))  # whole seconds: the guest's `date +%s`
        self.held: list[str] = []
        self.lost: dict[str, str] = {}  # guests whose lock another campaign took over → why
        self._stop = threading.Event()
        self._renewer: threading.Thread | None = None

    def _acquire(self, target: str) -> str | None:
        """None when taken; else who holds it."""
        result = self.executors[target].run_script(acquire_script(self.lock_dir, self.holder, self.ttl),
                                                   timeout=60, check=False)
        if result.exit_code == 0:
            return None
        other = result.stdout.strip()
        if result.exit_code != BUSY:
            return f"cannot take the campaign lock {self.lock_dir}: {shown(result.stderr.strip() or other, 200)}"
        return (f"another benchmark campaign runs there: {shown(other or 'holder unknown', 200)}; wait for it "
                f"to end (a campaign that died leaves it for at most {self.ttl} s)")

    def __enter__(self) -> GuestLocks:
        outcome = run_group({t: t for t in sorted(self.executors)}, self._acquire, at_once(self.executors), name="lock")
        self.held = [t for t, why in outcome.ok.items() if why is None]
        refused = {t: why for t, why in outcome.ok.items() if why is not None}
        if outcome.failed or refused:
            self.release()
        failed = one_per_submit(outcome.failed)  # a Slurm submit guest that does not answer: told once
        if len(failed) == 1 and isinstance(only := next(iter(failed.values())), SubmitUnreachable):
            raise only
        GroupResult(outcome.ok, failed).raise_failures()  # a guest that does not answer: its own error (and exit code)
        if refused:
            raise LockedError("; ".join(f"guest {t}: {why}" for t, why in refused.items()))
        self._renewer = threading.Thread(target=self._renew_every, name="gpuvm-guest-lease", daemon=True)
        self._renewer.start()
        return self

    def _renew_every(self) -> None:
        while not self._stop.wait(self.ttl / 3):
            self.renew()

    def renew(self) -> None:
        """Extend the lease on every guest held. A guest that does not answer now is tried again next
        time (its lease runs out after a whole ttl of silence); one taken over is recorded in `lost`."""
        for target in [t for t in self.held if t not in self.lost]:
            try:
                result = self.executors[target].run_script(renew_script(self.lock_dir, self.holder, self.ttl),
                                                           timeout=max(5.0, self.ttl / 3), check=False)
            except (GpuvmError, OSError) as e:
                log.warning("guest %s: renewing the campaign lock failed: %s", target, e)
                continue
            if result.exit_code == LOST:
                self.lost[target] = f"the campaign lock {self.lock_dir} was taken over by another campaign " \
                                    "(this one's lease ran out): its figures may be measured under that one's load"

    def check(self) -> None:
        """LeaseLostError naming the guests whose lock another campaign took over."""
        if self.lost:
            raise LeaseLostError("; ".join(f"guest {t}: {why}" for t, why in self.lost.items()))

    def __exit__(self, kind: object, *exc: object) -> None:
        self.release()
        if kind is None:
            self.check()

    def release(self) -> None:
        """Best effort: a guest that does not answer keeps the lock until its lease runs out."""
        self._stop.set()
        if self._renewer is not None and self._renewer is not threading.current_thread():
            self._renewer.join()
        for target in [t for t in self.held if t not in self.lost]:
            try:
                self.executors[target].run_script(release_script(self.lock_dir, self.holder), timeout=60, check=False)
            except (GpuvmError, OSError):
                pass
        self.held = []
