"""Reaching the runbook's vCenters and reading their inventories: what `gpuvm inventory` (and every
run, through gpuvm.runs) needs, without the engine's modules, which `inventory` never uses (a
third of its start-up)."""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from gpuvm.errors import ConnectError, InputError, listed
from gpuvm.read_ahead import NOTHING_AHEAD, ReadAhead
from gpuvm.runbook.loader import load_runbook
from gpuvm.runbook.model import Runbook
from gpuvm.runbook.vcenters import DEFAULT_VCENTER
from gpuvm.vsphere.facts import Inventory
from gpuvm.vsphere.fleet import Fleet, each
from gpuvm.vsphere.inventory import read_inventory
from gpuvm.vsphere.session import Session, Target, resolve_target
from gpuvm.vsphere.shown import Shown, shown

_log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Access:
    """How a run reaches its peers: vCenter's TLS, SSH host keys and the state directory."""

    insecure: bool = False  # TLS certificate verification off
    accept_new_host_keys: bool = False  # trust (and record) SSH host keys seen for the first time
    state_dir: Path | None = None  # journal and keys; None: $GPUVM_STATE_DIR or .gpuvm
    warn: Callable[[str], None] | None = None  # told about insecure TLS; None: logged as a warning


@contextmanager
def connect(runbook: Runbook, access: Access, ahead: ReadAhead = NOTHING_AHEAD) -> Iterator[Session]:
    """The runbook's vCenter session, logged in (out on exit). A bad setting, or a login or TLS
    failure, names the runbook's file:line of the vcenter field responsible. `ahead`: connect_all's."""
    with ExitStack() as stack:
        yield _reach(runbook, DEFAULT_VCENTER, _target(runbook, DEFAULT_VCENTER, access), stack, ahead)


def _target(runbook: Runbook, name: str, access: Access) -> Target:
    """Where and as whom to log in to vCenter `name` (its settings checked: file:line of a bad one)."""
    loc = runbook.vcenter_loc(name)
    target = resolve_target(runbook.all_vcenters[name], access.insecure,
                            lambda field: runbook.where(loc + tuple(field.split(".")[1:])))
    if target.insecure:
        (access.warn or _log.warning)(f"TLS certificate verification is OFF for {target.url}: "
                                      "anyone on the network path can impersonate vCenter and read the password")
    return target


def _login(runbook: Runbook, name: str, target: Target, stack: ExitStack) -> Session:
    """A session to vCenter `name`, logged out when `stack` closes; a failure names the field responsible."""
    try:
        return stack.enter_context(Session(target))
    except ConnectError as e:
        raise _named(runbook, name, e) from None


def _reach(runbook: Runbook, name: str, target: Target, stack: ExitStack, ahead: ReadAhead) -> Session:
    """`_login`, or the session opened for the same target before the runbook was validated (its
    login refused then: that error, named here; logged out by read_ahead's exit)."""
    early = ahead.reached().get(name)
    if early is None or early.target != target:
        return _login(runbook, name, target, stack)
    if early.refused is not None:
        raise _named(runbook, name, early.refused)
    return early.session or _login(runbook, name, target, stack)


def _named(runbook: Runbook, name: str, error: ConnectError) -> ConnectError:
    """A login's failure with the file:line of the field responsible (none: from govc's variables)."""
    if error.field is None or getattr(runbook.all_vcenters[name], error.field) is None:
        return error
    return ConnectError(f"{runbook.where(runbook.vcenter_loc(name) + (error.field,))}: {error}", error.field)


@contextmanager
def connect_all(runbook: Runbook, access: Access,
                ahead: ReadAhead = NOTHING_AHEAD) -> Iterator[tuple[dict[str, Session], dict[str, ConnectError]]]:
    """A session to every vCenter of the runbook, logged in at once: (sessions by vCenter name, those
    not reached → why). Every vCenter's settings are checked first. One vCenter: `connect`. `ahead`:
    the sessions opened before the runbook was validated (gpuvm/read_ahead.py), taken where they fit."""
    if not runbook.vcenters:
        with connect(runbook, access, ahead) as session:
            yield {DEFAULT_VCENTER: session}, {}
        return
    targets = {name: _target(runbook, name, access) for name in runbook.all_vcenters}
    with ExitStack() as stack:
        guard = threading.Lock()  # logins run in threads; the stack is shared

        def login(name: str) -> Session:
            with ExitStack() as own:
                session = _reach(runbook, name, targets[name], own, ahead)
                with guard:
                    stack.push(own.pop_all())
                return session

        sessions, down = each({name: name for name in targets}, login)
        _refuse_one_vcenter_twice(runbook, sessions, targets)
        yield sessions, down


def _refuse_one_vcenter_twice(runbook: Runbook, sessions: dict[str, Session], targets: dict[str, Target]) -> None:
    """Two entries that reached one vCenter (by two names or addresses: its instance UUID seen twice)
    are refused before anything is locked or written: each would take the same locks and leases."""
    seen: dict[str, str] = {}
    for name in (n for n in runbook.all_vcenters if n in sessions):
        uuid = sessions[name].content.about.instanceUuid
        if uuid and (first := seen.setdefault(uuid, name)) != name:
            raise InputError(f"{runbook.where(runbook.vcenter_loc(name))}: vCenter '{name}' ({targets[name].url}) is "
                             f"vCenter '{first}' ({runbook.where(runbook.vcenter_loc(first))}, {targets[first].url}) "
                             f"again: the same instance ({uuid}); declare each vCenter once")


def observe_fleet(runbook: Runbook, access: Access, snapshot: Path | None = None,
                  ahead: ReadAhead = NOTHING_AHEAD) -> Fleet:
    """Every vCenter's inventory, read live at once (or one vCenter's from a snapshot); `ahead`: the
    reads sent before the runbook was validated, taken where they fit (gpuvm/read_ahead.py)."""
    if snapshot is not None:
        if len(runbook.vcenters) > 1:
            raise InputError(f"--snapshot: a snapshot holds one vCenter's inventory; {runbook.file} names "
                             f"{len(runbook.vcenters)} ({listed(runbook.all_vcenters)})")
        return Fleet({DEFAULT_VCENTER: Inventory.load(snapshot)})
    with connect_all(runbook, access, ahead) as (sessions, down):
        return Fleet.read(runbook, sessions, down, ahead.sent_on(sessions))


def _govc_missing() -> list[str]:
    """govc's variables `init` lacks (a user and password in GOVC_URL stand for their own)."""
    url = os.environ.get("GOVC_URL", "")
    parts = urlsplit(url if "://" in url else f"https://{url}")
    given = {"GOVC_URL": url, "GOVC_USERNAME": parts.username or os.environ.get("GOVC_USERNAME"),
             "GOVC_PASSWORD": parts.password or os.environ.get("GOVC_PASSWORD")}
    return [name for name, value in given.items() if not value]


def discover(access: Access) -> tuple[Inventory, Target]:
    """What `gpuvm init` starts from: the inventory of the vCenter govc's variables name, and it."""
    if missing := _govc_missing():
        raise InputError(f"gpuvm init reads the vCenter govc's variables name: set {', '.join(missing)}")
    book = Runbook()
    with connect(book, access) as session:
        return read_inventory(session), resolve_target(book.vcenter, access.insecure)


def inventory_of(runbook: Path, access: Access, ahead: ReadAhead = NOTHING_AHEAD) -> tuple[Shown, Runbook]:
    """What `inventory` shows of the runbook's vCenters, read live (vsphere/shown.py), and the runbook;
    `ahead`: the reads sent before the runbook was validated (gpuvm/read_ahead.py), used where they fit."""
    book = load_runbook(runbook, ahead.text)
    return shown(book, observe_fleet(book, access, ahead=ahead)), book
