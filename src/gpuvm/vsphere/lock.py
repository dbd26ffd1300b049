"""The apply lock, a fenced lease: two gpuvm runs never change the same host at once, whichever
machine, container or state directory they run from, and a run that loses its lease stops changing
anything before another run can take its hosts over.

All of it lives in vCenter, as custom attribute definitions with their values on the root folder,
timed by vCenter's clock (machines' clocks do not matter):

- `gpuvm.lease.<run>`, the run's lease: who runs it, since when, until when (`expires`), and whether
  it is still taking its locks (`taking`). Written before any host lock is taken; renewed every
  third of `ttl` by one SetField, however many hosts (4,096 hosts: one round trip, not 4,096).
- `gpuvm.lock.<host>`, the host's lock. Creating it is the test-and-set: vCenter refuses a second
  definition of one name (`AddCustomFieldDef` → DuplicateName). Its value names the run holding it.
  Its key is the fencing token: vCenter never reuses a key, so a lock broken and taken again has a
  new key; the run that held the old one finds it gone, and its removal by key can never remove the
  new one.

A lock is held while the lease of the run its value names is unexpired. A lock with no value yet is
being taken: it is held while any other run's unexpired lease says `taking` (its taker wrote that
lease before creating the lock and clears the flag only once its locks name it), so however slowly
vCenter answers, a lock being taken is never judged abandoned; a taker killed in between leaves a
lock that is stale once its lease expires. Every value is read by vsphere/records.py (`Lease`,
`Holder`, `Held`: bounded, versioned, strictly typed, a lease naming its own run); a lease gpuvm did
not write holds nothing (plan and verify warn of it). A value with its own `expires` is what gpuvm wrote
before leases, honoured until then; a value gpuvm never wrote, found by a run that needs that lock,
is replaced by such a marker quoting it (the one foreign value gpuvm replaces: the attribute is
gpuvm's lock), held for one `ttl`, and the run is refused in one line meanwhile. Liveness is expiry only: never a pid or a
host name (wrong across PID namespaces, containers and machines of one name). A stale lock is
removed by key (a run that finds it gone already gets InvalidArgument, as from vCenter) and created
again, which only one run achieves.

The fence: the holder keeps a deadline on its own clock (one that counts while the machine sleeps),
measured from before it read vCenter's time for the lease it wrote, so never later than the lease's
expiry. Every call that changes vCenter over the run's session checks it first (`Session.fence`) and
is refused with LeaseLostError (exit 8) from `margin` before the deadline on; each renewal also checks
that the run's definitions still exist. A failed renewal is logged and journaled, and retried every
`ttl`/30; when none succeeds before deadline − margin the lease is lost ("lease-lost" journaled): the
run changes nothing more, before its lease can expire for anyone else. What no client-side fence can
close is a pause longer than `margin` between the check and the call reaching vCenter.
"""

from __future__ import annotations

import getpass
import logging
import os
import socket
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from gpuvm.errors import InputError, LeaseLostError, LockedError, TaskError, listed
from gpuvm.executors.group import run_group
from gpuvm.vsphere import records
from gpuvm.vsphere.records import ROOT, Foreign, Held, Holder, Lease, Unreadable, shown
from gpuvm.vsphere.session import unfenced
from gpuvm.vsphere.tasks import call, fault_text

log = logging.getLogger(__name__)

PREFIX = "gpuvm.lock."
LEASE_PREFIX = "gpuvm.lease."
TTL = 300.0  # seconds a lease lives without renewal ($GPUVM_LOCK_TTL: tests of killed runs use a few)
SHOWN = 60  # characters of a value quoted in a message
NAMING_THREADS = 8  # SetFields at once while the locks taken are given their holder


def clock() -> float:
    """Seconds on a clock that keeps counting while the machine is suspended (a sleeping laptop's
    lease runs out in vCenter too); monotonic where there is no such clock."""
    boottime = getattr(time, "CLOCK_BOOTTIME", None)
    return time.clock_gettime(boottime) if boottime is not None else time.monotonic()


def lease_length() -> float:
    """TTL, or $GPUVM_LOCK_TTL: how long a lease lives without renewal, so how long the hosts of a run
    killed outright (SIGKILL, a crash: no release) stay locked."""
    raw = os.environ.get("GPUVM_LOCK_TTL")
    if not raw:
        return TTL
    try:
        ttl = float(raw)
    except ValueError:
        ttl = 0.0
    if not 1 <= ttl <= 86400:
        raise InputError(f"GPUVM_LOCK_TTL={raw!r}: give the lease's length in seconds, from 1 to 86400 "
                         f"(default {TTL:.0f})")
    return ttl


def read_lease(name: str, text: Any) -> Lease:
    """The lease in the value of attribute `name` (`gpuvm.lease.<run>`), as gpuvm writes it: that
    run's, strictly typed (vsphere/records.py); Unreadable otherwise."""
    lease = records.read(text, Lease)
    assert isinstance(lease, Lease)
    if LEASE_PREFIX + lease.run != name:
        raise Unreadable(f"the lease of run {lease.run} in the attribute of another")
    return lease


def lease_of(name: str, text: Any) -> Lease | None:
    """`read_lease`, None for anything else (a definition with a stranger's value holds nothing)."""
    try:
        return read_lease(name, text)
    except Unreadable:
        return None


def lock_value(text: Any) -> Holder | Held:
    """A host lock's value as gpuvm writes it: the run holding it, or a value holding it until its own
    expiry (gpuvm's marker of a foreign value, a lock from before leases); Unreadable otherwise."""
    try:
        holder = records.read(text, Holder)
    except Unreadable as error:
        try:
            holder = records.read(text, Held)
        except Unreadable:
            raise error from None
    assert isinstance(holder, (Holder, Held))
    return holder


def foreign_values(values: dict[str, str]) -> list[Foreign]:
    """The root folder's lease and lock values (attribute name → value) gpuvm did not write."""
    found = []
    for name, text in values.items():
        if not text:
            continue  # a lock being taken
        try:
            read_lease(name, text) if name.startswith(LEASE_PREFIX) else lock_value(text)
        except Unreadable as error:
            found.append(Foreign(object=ROOT, field=name, why=str(error), shown=shown(text)))
    return found


def holder_text(record: Lease | Held) -> str:
    """Who holds a lock, for one line (each part cut short: a value may come from anyone)."""
    def part(key: str) -> str:
        text = str(getattr(record, key, None) or "?")
        return text[:SHOWN] + ("…" if len(text) > SHOWN else "")

    return f"{part('who')} (run {part('run')}, since {part('since')}, until {part('expires')} unless renewed)"


@dataclass(frozen=True)
class Seen:
    """The locks and leases in vCenter, read at once: definitions by name, root values by key, the time."""

    now: datetime
    fields: dict[str, int]
    values: dict[int, str]


def look(session: Any) -> Seen:
    """The definitions, the root folder's values and vCenter's time, over `session`."""
    manager = session.content.customFieldsManager
    fields = {f.name: f.key for f in call("read custom attributes", lambda: manager.field) or []}
    root = session.content.rootFolder
    values = {v.key: v.value for v in call("read lock holders", lambda: root.customValue) or []}
    now = call("read vCenter time", lambda: session.si.CurrentTime())
    return Seen(now, fields, values)  # the time read last: a lease seen is no younger than it


def remove(session: Any, key: int) -> None:
    """Remove a definition by key; one already gone (another run removed it) is no error."""
    from pyVmomi import vim, vmodl

    try:
        session.content.customFieldsManager.RemoveCustomFieldDef(key=key)
    except (vmodl.fault.InvalidArgument, vim.fault.NotFound):  # vCenter: InvalidArgument
        pass


def who() -> str:
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # a container's uid with no passwd entry
        user = str(os.getuid())
    return f"{user}@{socket.gethostname()} pid {os.getpid()}"[-1000:]  # as a lease keeps it (records.Text)


class HostLocks:
    """`with HostLocks(session, hosts, run):` holds `gpuvm.lock.<host>` for every host under one
    renewed lease, and fences the session: a call that changes vCenter once the lease is lost raises
    LeaseLostError. `journal` (with `record(status, **extra)`) hears of failed renewals and the loss."""

    def __init__(self, session: Any, hosts: Iterable[str], run: str, ttl: float | None = None,
                 journal: Any = None):
        self.session = session
        self.hosts = sorted(set(hosts))
        self.run = run
        self.ttl = ttl if ttl is not None else lease_length()
        self.margin = self.ttl / 10  # refused this long before the deadline: a call must reach vCenter in time
        self.journal = journal
        self.who = who()
        self.since = ""
        self.held: dict[str, int] = {}  # host → lock key (its fencing token)
        self.lease_key: int | None = None
        self.deadline = 0.0  # on `clock()`: the lease surely holds until then
        self.lost: str | None = None  # why the lease was lost
        self.taking = True  # until every lock taken names this run (the lease says so meanwhile)
        self._state = threading.Lock()
        self._stop = threading.Event()
        self._renewer: threading.Thread | None = None

    @property
    def lease_name(self) -> str:
        return LEASE_PREFIX + self.run

    def __enter__(self) -> HostLocks:
        try:
            with unfenced():
                self._start_lease()
                self._renewer = threading.Thread(target=self._renew, name="gpuvm-lease", daemon=True)
                self._renewer.start()
                for host in self.hosts:
                    self._take(host)
                self._name_holder()
                self.taking = False
                try:
                    self._renew_once()  # the lease says so at once: its locks are no longer being taken
                except Exception as error:  # noqa: BLE001 - the renewer says it again at its next round
                    log.warning("gpuvm run %s: could not update its lease (%s); retrying", self.run, error)
                self.check("the first change")
        except BaseException:
            self._end()
            raise
        self.session.fence = self.check
        return self

    def __exit__(self, *exc: Any) -> None:
        self._end()

    def _end(self) -> None:
        self._stop.set()
        if self._renewer is not None:
            self._renewer.join(timeout=10)  # a renewal hung on the network is left behind (a daemon)
        if getattr(self.session, "fence", None) == self.check:
            self.session.fence = None
        self.release()

    # -- the fence ----------------------------------------------------------------------------

    def check(self, action: str = "a change") -> None:
        """Raise LeaseLostError unless the lease surely holds for another `margin` seconds."""
        if self.lost is None and clock() >= self.deadline - self.margin:
            self._lose(f"no renewal succeeded in {self.ttl - self.margin:.0f} s")
        if self.lost is not None:
            raise LeaseLostError(f"the lease on the lock of host(s) {listed(self.hosts)} was lost ({self.lost}); "
                                 f"stopped before {action}, so that no other run and this one change a host at "
                                 "once: nothing more was changed; run apply again")

    def _lose(self, why: str) -> None:
        with self._state:
            if self.lost is not None:
                return
            self.lost = why
        log.warning("gpuvm run %s: the lease on its host locks was lost (%s); it changes nothing more", self.run, why)
        self._record("lease-lost", reason=why, hosts=listed(self.hosts))

    def _record(self, status: str, **extra: Any) -> None:
        if self.journal is not None:
            try:
                self.journal.record(status, **extra)
            except Exception as error:  # noqa: BLE001 - the log line above still says it
                log.warning("could not journal %s: %s", status, error)

    # -- vCenter ------------------------------------------------------------------------------

    @property
    def _manager(self) -> Any:
        return self.session.content.customFieldsManager

    def _now(self) -> datetime:
        return call("read vCenter time", lambda: self.session.si.CurrentTime())

    def _fields(self) -> dict[str, int]:
        return {f.name: f.key for f in call("read custom attributes", lambda: self._manager.field) or []}

    def _look(self) -> Seen:
        return look(self.session)

    def _set(self, key: int, value: str) -> None:
        self._manager.SetField(entity=self.session.content.rootFolder, key=key, value=value)

    def _remove(self, key: int) -> None:
        remove(self.session, key)

    def _create(self, name: str) -> int | None:
        """The new definition's key; None when it exists already."""
        from pyVmomi import vim, vmodl

        try:
            return self._manager.AddCustomFieldDef(name=name, moType=vim.Folder).key
        except vim.fault.DuplicateName:
            return None
        except vmodl.MethodFault as fault:
            raise TaskError(f"create custom attribute {name} failed: {fault_text(fault)}") from None

    # -- the lease ----------------------------------------------------------------------------

    def _lease_value(self, now: datetime) -> str:
        expires = now + timedelta(seconds=self.ttl)
        return records.encode(Lease(run=self.run, who=self.who, since=self.since, taking=self.taking,
                                    expires=expires.isoformat(timespec="milliseconds"), hosts=len(self.hosts)))

    def _name_holder(self) -> None:
        """Every lock taken names this run (in parallel: 4,096 SetFields one by one take ~10 s here)."""
        holder = records.encode(Holder(run=self.run, who=self.who, since=self.since))

        def name_holder(key: int) -> None:
            with unfenced():
                call("name the lock's holder", lambda: self._set(key, holder))

        run_group({key: key for key in self.held.values()}, name_holder, NAMING_THREADS, name="lock").raise_first()

    def _start_lease(self) -> None:
        from pyVmomi import vmodl

        began = clock()
        now = self._now()
        self.since = now.isoformat(timespec="seconds")
        self.lease_key = self._create(self.lease_name)
        if self.lease_key is None:
            raise TaskError(f"custom attribute {self.lease_name} exists already (a run id used twice)")
        try:
            self._set(self.lease_key, self._lease_value(now))
        except vmodl.MethodFault as fault:
            raise TaskError(f"write the lease of this run failed: {fault_text(fault)}") from None
        self.deadline = began + self.ttl

    def _renew(self) -> None:
        pause, failures = self.ttl / 3, 0
        while not self._stop.wait(pause):
            try:
                self._renew_once()
                if failures and self.lost is None:
                    log.warning("gpuvm run %s: its lease was renewed after %d failed attempt(s)", self.run, failures)
                pause, failures = self.ttl / 3, 0
            except Exception as error:  # noqa: BLE001 - retried until the deadline, said each time
                if self._stop.is_set():
                    return
                left = self.deadline - self.margin - clock()
                text = str(error) or type(error).__name__
                log.warning("gpuvm run %s: renewing its lease in vCenter failed (%s); retrying; it stops changing "
                            "anything in %.0f s unless a renewal succeeds", self.run, text, max(left, 0))
                self._record("lease-renewal-failed", error=text, seconds_left=round(max(left, 0), 1))
                pause, failures = self.ttl / 30, failures + 1
            if self.lost is not None or clock() >= self.deadline - self.margin:
                if not self._stop.is_set():
                    self.check_quietly()
                return

    def check_quietly(self) -> None:
        try:
            self.check("the next change")
        except LeaseLostError:
            pass  # recorded by _lose; the run hears of it at its next change

    def _renew_once(self) -> None:
        """One round: the definitions still exist (the fence), and the lease goes on for `ttl`."""
        from pyVmomi import vmodl

        began = clock()
        with unfenced():
            now = self._now()
            fields = self._fields()
            with self._state:
                held = dict(self.held)
            gone = [host for host, key in held.items() if fields.get(PREFIX + host) != key]
            if fields.get(self.lease_name) != self.lease_key:
                gone.insert(0, f"this run's lease {self.lease_name}")
            if gone:
                self._lose(f"{listed(gone)} removed in vCenter: another run took it over, or someone deleted it")
                return
            try:
                self._set(self.lease_key, self._lease_value(now))
            except vmodl.fault.InvalidArgument:
                self._lose(f"{self.lease_name} removed in vCenter while renewing it")
                return
            except vmodl.MethodFault as fault:
                raise TaskError(f"renew the lease failed: {fault_text(fault)}") from None
        if self.lost is None:
            self.deadline = began + self.ttl

    # -- host locks ---------------------------------------------------------------------------

    def _take(self, host: str) -> None:
        key = self._create(PREFIX + host)
        if key is None:
            key = self._take_over(host)
        with self._state:
            self.held[host] = key

    def _take_over(self, host: str) -> int:
        """The lock exists: refuse while a live run holds it; break it when stale."""
        from pyVmomi import vmodl

        seen = self._look()
        key = seen.fields.get(PREFIX + host)
        if key is not None:
            self._refuse_if_held(host, key, seen)
            try:
                self._remove(key)
            except vmodl.MethodFault as fault:
                raise TaskError(f"break the stale lock of host {host} failed: {fault_text(fault)}") from None
            self._collect_expired_leases(seen)
        key = self._create(PREFIX + host)
        if key is None:
            raise LockedError(f"host {host} was locked by another gpuvm run just now; nothing was changed")
        return key

    def _refuse_if_held(self, host: str, key: int, seen: Seen) -> None:
        value = seen.values.get(key)
        if not value:  # being taken, or its taker was killed before it named itself
            takers = [lease for lease in self._leases(seen).values() if lease.taking and lease.until > seen.now]
            if takers:
                raise LockedError(f"host {host} is locked by another gpuvm run (taking its locks now): "
                                  f"{holder_text(takers[0])}; "
                                  "nothing was changed (try again when it ends)")
            return
        try:
            held = lock_value(value)
        except Unreadable:  # not what gpuvm writes
            held = self._mark(key, value, seen.now)
        if isinstance(held, Holder):
            lease = self._leases(seen).get(held.run)
            if lease is not None and lease.until > seen.now:
                raise LockedError(f"host {host} is locked by another gpuvm run: {holder_text(lease)}; "
                                  "nothing was changed (try again when it ends)")
            return
        if held.until <= seen.now:
            return
        if held.found is not None:
            raise LockedError(f"host {host}'s lock holds a value gpuvm did not write ({held.found}): it counts as "
                              f"held until {held.expires} (vCenter time), then the next run takes it over; "
                              "nothing was changed")
        raise LockedError(f"host {host} is locked by another gpuvm run: {holder_text(held)}; "
                          "nothing was changed (try again when it ends)")  # a gpuvm from before leases

    def _leases(self, seen: Seen) -> dict[str, Lease]:
        """Other runs' leases by run (a definition with no value or a stranger's value holds nothing:
        a run writes its lease before it takes any lock)."""
        found = [lease_of(name, seen.values.get(key)) for name, key in seen.fields.items()
                 if name.startswith(LEASE_PREFIX) and key != self.lease_key]
        return {lease.run: lease for lease in found if lease is not None}

    def _mark(self, key: int, value: str, now: datetime) -> Held:
        """Replace a value gpuvm did not write by a marker that quotes it and holds the lock for one ttl."""
        marker = Held(found=shown(value), since=now.isoformat(timespec="seconds"),
                      expires=(now + timedelta(seconds=self.ttl)).isoformat(timespec="seconds"))
        call("mark a foreign lock value", lambda: self._set(key, records.encode(marker)))
        return marker

    def _collect_expired_leases(self, seen: Seen) -> None:
        """Remove leases that expired (their runs stopped changing anything before then)."""
        for name, key in seen.fields.items():
            lease = lease_of(name, seen.values.get(key)) if name.startswith(LEASE_PREFIX) else None
            if lease is not None and key != self.lease_key and lease.until <= seen.now:
                try:
                    self._remove(key)
                except Exception as error:  # noqa: BLE001 - left for the next run to remove
                    log.debug("could not remove expired lease %s: %s", name, error)

    def release(self) -> None:
        """Remove this run's locks, then its lease (by key: a lock another run took over has a new one)."""
        with unfenced():
            with self._state:
                held, self.held = dict(self.held), {}
            keys = [(f"the lock of host {host}", key) for host, key in held.items()]
            if self.lease_key is not None:
                keys.append((f"lease {self.lease_name}", self.lease_key))
                self.lease_key = None
            for what, key in keys:
                try:
                    self._remove(key)
                except Exception as error:  # noqa: BLE001 - an unreleased lock is stale once its lease expires
                    log.warning("could not release %s: %s (it is taken over once its lease expires)", what, error)
