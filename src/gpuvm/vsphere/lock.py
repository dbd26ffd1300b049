"""The apply lock: two gpuvm runs never change the same hosts at once, whichever machine or state
directory they run from, because the lock lives in vCenter itself.

One custom attribute definition per host, `gpuvm.lock.<host>`. Creating it is the test-and-set:
vCenter refuses a second definition of the same name (`AddCustomFieldDef` → DuplicateName), so of
two runs only one gets it. Its value, set on the root folder, says who holds it and until when
(a Folder attribute; vCenter's clock, so machines' clocks do not matter); the holder renews it every third of `ttl`
while it runs. A lock is stale once it expires (its holder stopped renewing it: killed, powered
off), or at once when its holder ran on this machine and its process is gone: the next run removes
the definition and creates it again (of two runs doing so, only one creates it). Locks are taken in name order, all or none, and removed when the run ends.
"""

from __future__ import annotations

import getpass
import json
import os
import socket
import threading
import time
from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Any

from gpuvm.errors import LockedError, TaskError
from gpuvm.vsphere.tasks import call, fault_text

PREFIX = "gpuvm.lock."
TTL = 300.0  # seconds a lock lives without renewal
UNSET_GRACE = 5.0  # seconds a definition may exist without its value (the taker is between two calls)


def holder_text(holder: dict[str, Any] | None) -> str:
    if not holder:
        return "a run that recorded no holder"
    return (f"{holder.get('who', '?')} (run {holder.get('run', '?')}, since {holder.get('since', '?')}, "
            f"until {holder.get('expires', '?')} unless renewed)")


class HostLocks:
    """`with HostLocks(session, hosts, run):` holds `gpuvm.lock.<host>` for every host, renewed."""

    def __init__(self, session: Any, hosts: Iterable[str], run: str, ttl: float = TTL):
        self.session = session
        self.hosts = sorted(set(hosts))
        self.run = run
        self.ttl = ttl
        self.machine, self.pid = socket.gethostname(), os.getpid()
        self.who = f"{getpass.getuser()}@{self.machine} pid {self.pid}"
        self.since = ""
        self.held: dict[str, int] = {}  # host → field key
        self._stop = threading.Event()
        self._renewer: threading.Thread | None = None

    def __enter__(self) -> HostLocks:
        now = self._now()
        self.since = now.isoformat(timespec="seconds")
        holder = self._holder(now)
        try:
            for host in self.hosts:
                self._take(host, holder)
        except BaseException:
            self.release()
            raise
        self._renewer = threading.Thread(target=self._renew, name="gpuvm-lock", daemon=True)
        self._renewer.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        if self._renewer is not None:
            self._renewer.join(timeout=30)
        self.release()

    # -- vCenter ------------------------------------------------------------------------------

    @property
    def _manager(self) -> Any:
        return self.session.content.customFieldsManager

    def _now(self) -> datetime:
        return call("read vCenter time", lambda: self.session.si.CurrentTime())

    def _fields(self) -> dict[str, int]:
        return {f.name: f.key for f in call("read custom attributes", lambda: self._manager.field) or []}

    def _value(self, key: int) -> dict[str, Any] | None:
        root = self.session.content.rootFolder
        values = [v.value for v in call("read lock holder", lambda: root.customValue) or [] if v.key == key]
        try:
            return json.loads(values[-1]) if values else None
        except ValueError:
            return None

    def _holder(self, now: datetime) -> str:
        """This run as a lock's value, valid for `ttl` from `now` (vCenter's time, read once a round)."""
        expires = now + timedelta(seconds=self.ttl)
        return json.dumps({"run": self.run, "who": self.who, "machine": self.machine, "pid": self.pid,
                           "since": self.since, "expires": expires.isoformat(timespec="seconds")})

    def _set(self, key: int, holder: str) -> None:
        call("set lock holder", lambda: self._manager.SetField(entity=self.session.content.rootFolder,
                                                               key=key, value=holder))

    def _create(self, host: str) -> int | None:
        """The new definition's key; None when it exists already."""
        from pyVmomi import vim, vmodl

        try:
            return self._manager.AddCustomFieldDef(name=PREFIX + host, moType=vim.Folder).key
        except vim.fault.DuplicateName:
            return None
        except vmodl.MethodFault as fault:
            raise TaskError(f"take the lock of host {host} failed: {fault_text(fault)}") from None

    def _take(self, host: str, holder: str) -> None:
        key = self._create(host)
        if key is None:
            key = self._take_over(host)
        self.held[host] = key
        self._set(key, holder)

    def _take_over(self, host: str) -> int:
        """The lock exists: refuse while its holder keeps it; take it when it has expired."""
        from pyVmomi import vim, vmodl

        deadline = time.monotonic() + UNSET_GRACE
        while True:
            old = self._fields().get(PREFIX + host)
            if old is None:  # released meanwhile
                holder = None
                break
            holder = self._value(old)
            if holder is not None or time.monotonic() >= deadline:
                break
            time.sleep(0.5)
        if old is not None:
            expires = holder and holder.get("expires")
            if expires and datetime.fromisoformat(expires) > self._now() and not self._gone(holder):
                raise LockedError(f"host {host} is locked by another gpuvm run: {holder_text(holder)}; "
                                  "nothing was changed (try again when it ends)")
            try:  # stale: its holder stopped renewing it
                self._manager.RemoveCustomFieldDef(key=old)
            except vim.fault.NotFound:
                pass  # another run broke it first
            except vmodl.MethodFault as fault:
                raise TaskError(f"break the stale lock of host {host} failed: {fault_text(fault)}") from None
        key = self._create(host)
        if key is None:
            raise LockedError(f"host {host} was locked by another gpuvm run just now; nothing was changed")
        return key

    def _gone(self, holder: dict[str, Any]) -> bool:
        """The holder ran on this machine and its process no longer exists."""
        if holder.get("machine") != self.machine or not isinstance(holder.get("pid"), int):
            return False
        try:
            os.kill(holder["pid"], 0)
        except ProcessLookupError:
            return True
        except OSError:
            return False
        return False

    def _renew(self) -> None:
        while not self._stop.wait(self.ttl / 3):
            try:
                holder = self._holder(self._now())
                for key in list(self.held.values()):
                    self._set(key, holder)
            except Exception:  # noqa: BLE001 - a missed renewal is retried; the lock lasts ttl
                pass

    def release(self) -> None:
        """Remove the locks this run holds (not one another run took over after it expired)."""
        for host, key in list(self.held.items()):
            try:
                holder = self._value(key)
                if holder is None or holder.get("run") == self.run:
                    call("release lock", lambda: self._manager.RemoveCustomFieldDef(key=key))
            except Exception:  # noqa: BLE001 - best effort: an unreleased lock expires after ttl
                pass
            del self.held[host]
