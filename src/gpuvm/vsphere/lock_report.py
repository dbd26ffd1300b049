"""What `gpuvm locks` shows and breaks: every gpuvm lease (leases are global), the locks of the
runbook's hosts and the intents on its objects (its hosts, the VMs on them or named, the templates
named), each as one `Row`; and the break of one run's lease and locks.

Every value is read as lock.py and intent.py read it (vsphere/records.py); a value gpuvm did not
write is a "foreign" row with records.Foreign's message. Breaking a run removes its lease and the
locks naming it by key (RemoveCustomFieldDef), never its intents: the lease's key is the fence, so a
holder still alive finds it gone at its next renewal and stops before its next change (exit 8);
its intents wait for the apply that finishes or undoes their act.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any

from gpuvm.errors import ConnectError, InputError, listed
from gpuvm.names import vsphere_name
from gpuvm.runbook.model import Runbook
from gpuvm.vsphere import lock
from gpuvm.vsphere.facts import Inventory
from gpuvm.vsphere.fleet import read_all
from gpuvm.vsphere.records import REBOOTED, ROOT, RUN_ID, Foreign, Held, Holder, Lease, Unreadable, shown

KINDS = ("lease", "lock", "intent", "foreign")


@dataclass(frozen=True)
class Row:
    """One lease, lock, intent or foreign value, as `gpuvm locks` lists it."""

    vcenter: str
    kind: str  # one of KINDS
    object: str  # the run (a lease), the host (a lock), the host, VM or template (an intent)
    run: str = ""
    who: str = ""
    since: str = ""  # vCenter's time
    expires: str = ""  # vCenter's time: the lease's (a lock's is its run's)
    state: str = ""  # live, being taken, expired, stale (a lock no lease holds); intents: under way, waiting
    act: str = ""  # an intent's act; a foreign value's attribute
    why: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Objects:
    """The runbook's objects in one vCenter, by their names there."""

    hosts: set[str]
    vms: set[str]  # those named, and those on its hosts (once the inventory is read)
    templates: set[str]

    @classmethod
    def of(cls, book: Runbook) -> Objects:
        hosts = {vsphere_name(h.name) for h in book.hosts} | {vsphere_name(vm.host) for vm in book.vms}
        return cls(hosts, {vm.name for vm in book.vms}, {vm.template for vm in book.vms if vm.template})


def leases(seen: lock.Seen) -> dict[str, tuple[int, Lease | Foreign | None]]:
    """Every lease definition by name: its key, and the lease (Foreign when gpuvm did not write it;
    None with no value: its run stopped between creating it and writing it)."""
    found: dict[str, tuple[int, Lease | Foreign | None]] = {}
    for name, key in seen.fields.items():
        if not name.startswith(lock.LEASE_PREFIX):
            continue
        text = seen.values.get(key)
        try:
            found[name] = (key, lock.read_lease(name, text) if text else None)
        except Unreadable as error:
            found[name] = (key, Foreign(object=ROOT, field=name, why=str(error), shown=shown(text)))
    return found


def _live(seen: lock.Seen) -> dict[str, Lease]:
    """The runs' leases gpuvm wrote, by run."""
    return {record.run: record for _, record in leases(seen).values() if isinstance(record, Lease)}


def lease_state(lease: Lease, now: datetime) -> str:
    if lease.until <= now:
        return "expired"
    return "being taken" if lease.taking else "live"


def root_rows(vcenter: str, seen: lock.Seen, hosts: set[str]) -> list[Row]:
    """Every lease, and the locks of `hosts`, in one vCenter (pure: from what `lock.look` read)."""
    runs = _live(seen)
    rows = [_lease_row(vcenter, name, record, seen.now) for name, (_, record) in sorted(leases(seen).items())]
    for name, key in sorted(seen.fields.items()):
        host = name[len(lock.PREFIX):]
        if name.startswith(lock.PREFIX) and host in hosts:
            rows.append(_lock_row(vcenter, host, seen.values.get(key), runs, seen.now))
    return rows


def _foreign_row(vcenter: str, object_: str, foreign: Foreign) -> Row:
    return Row(vcenter, "foreign", object_, act=foreign.field if not foreign.act else f"{foreign.field} {foreign.act}",
               why=foreign.message())


def _lease_row(vcenter: str, name: str, record: Lease | Foreign | None, now: datetime) -> Row:
    run = name[len(lock.LEASE_PREFIX):]
    if isinstance(record, Foreign):
        return _foreign_row(vcenter, run, record)
    if record is None:
        return Row(vcenter, "lease", run, run, state="stale", why="no value: its run stopped before writing it; "
                                                                 "it holds nothing")
    return Row(vcenter, "lease", record.run, record.run, record.who, record.since, record.expires,
               lease_state(record, now), why=f"{record.hosts} host lock(s)")


def _lock_row(vcenter: str, host: str, text: str | None, runs: dict[str, Lease], now: datetime) -> Row:
    if not text:  # being taken, or its taker was killed before it named itself
        taking = any(lease.taking and lease.until > now for lease in runs.values())
        return Row(vcenter, "lock", host, state="being taken" if taking else "stale", why="no holder named yet")
    try:
        value = lock.lock_value(text)
    except Unreadable as error:
        return _foreign_row(vcenter, host, Foreign(object=ROOT, field=lock.PREFIX + host, why=str(error),
                                                   shown=shown(text)))
    if isinstance(value, Holder):
        lease = runs.get(value.run)
        state = lease_state(lease, now) if lease is not None else "stale"
        return Row(vcenter, "lock", host, value.run, value.who, value.since, lease.expires if lease else "", state,
                   why="" if lease else "its run's lease is gone")
    assert isinstance(value, Held)
    why = f"marks a value gpuvm did not write: {value.found}" if value.found else "a lock from before leases"
    return Row(vcenter, "lock", host, value.run or "", value.who or "", value.since, value.expires,
               "live" if value.until > now else "expired", why=why)


def object_rows(vcenter: str, inventory: Inventory, objects: Objects, seen: lock.Seen) -> list[Row]:
    """The intents (and foreign values) on the runbook's objects in one vCenter (pure)."""
    alive = {run for run, lease in _live(seen).items() if lease.until > seen.now}
    vms = objects.vms | {vm.name for host in objects.hosts for vm in inventory.vms_on(host)}
    found: list[tuple[str, Any]] = [*((name, inventory.hosts.get(name)) for name in sorted(objects.hosts)),
                                    *((name, inventory.vms.get(name)) for name in sorted(vms)),
                                    *((name, inventory.templates.get(name) or inventory.vms.get(name))
                                      for name in sorted(objects.templates - vms))]
    rows = []
    for name, facts in found:
        if facts is None:
            continue
        for act, intent in sorted(facts.intents.items()):
            rows.append(Row(vcenter, "intent", name, intent.run, since=intent.since, act=act, why=intent.why,
                            state=_intent_state(act, intent.run in alive)))
        rows += [_foreign_row(vcenter, name, foreign) for foreign in facts.foreign]
    return rows


def _intent_state(act: str, alive: bool) -> str:
    """An act's record is under way while its run lives, else waits for the next apply to finish or
    undo it; the `rebooted` memo records a reboot done (what it was for), nothing left to do."""
    if act == REBOOTED:
        return "memo"
    return "under way" if alive else "waiting for the next apply"


def _holders(seen: lock.Seen) -> dict[str, tuple[int, Holder]]:
    """The locks naming their run, by host: key and value."""
    found = {}
    for name, key in seen.fields.items():
        if name.startswith(lock.PREFIX):
            try:
                value = lock.lock_value(seen.values.get(key))
            except Unreadable:
                continue
            if isinstance(value, Holder):
                found[name[len(lock.PREFIX):]] = (key, value)
    return found


def runs_holding(seen: lock.Seen) -> set[str]:
    """The runs with a lease definition (named for its run, whatever its value) or a lock naming them."""
    named = {name[len(lock.LEASE_PREFIX):] for name in leases(seen)}
    return {run for run in named if RUN_ID.fullmatch(run)} | {value.run for _, value in _holders(seen).values()}


def check_run(run: str, seen: dict[str, lock.Seen]) -> None:
    """InputError (exit 2) unless `run` holds a lease or lock in one of the vCenters, naming those that do."""
    holding = set().union(*(runs_holding(each) for each in seen.values()))
    if run not in holding:
        there = f"runs that do: {listed(sorted(holding))}" if holding else "no gpuvm run holds any"
        raise InputError(f"--break {run}: no lease or lock of that run in vCenter ({there})")


def held_by(run: str, seen: lock.Seen) -> dict[str, int]:
    """What `run` holds in one vCenter: its lease definition, then the locks naming it (what → key)."""
    name = lock.LEASE_PREFIX + run
    held = {f"lease {name}": seen.fields[name]} if name in seen.fields else {}
    held.update({f"the lock of host {host}": key for host, (key, value) in sorted(_holders(seen).items())
                 if value.run == run})
    return held


def break_run(session: Any, held: dict[str, int]) -> list[str]:
    """Remove what `held_by` found, by key (a lock taken again since has a new key and stays): the
    lease first, the fence that stops a holder still alive."""
    for key in held.values():
        lock.remove(session, key)
    return list(held)


@dataclass(frozen=True)
class Report:
    """The rows of every vCenter reached, what each one's root folder holds, and the vCenters not reached."""

    rows: list[Row]
    seen: dict[str, lock.Seen]
    down: dict[str, ConnectError]


def observe(book: Runbook, sessions: dict[str, Any], down: dict[str, ConnectError]) -> Report:
    """Read every vCenter's leases and locks, and the intents on the runbook's objects (one inventory read each)."""
    inventories, lost = read_all(sessions)
    rows: list[Row] = []
    seen: dict[str, lock.Seen] = {}
    for name in (name for name in sessions if name in inventories):
        seen[name] = lock.look(sessions[name])
        objects = Objects.of(book.part(name) if book.vcenters else book)
        rows += root_rows(name, seen[name], objects.hosts) + object_rows(name, inventories[name], objects, seen[name])
    return Report(rows, seen, {**down, **lost})
