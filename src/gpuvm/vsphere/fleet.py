"""Several vCenters in one run: a session to each, logged in in parallel; their inventories, read in
parallel; and `Fleet`, what the engine plans across them.

A vCenter that cannot be reached (no answer, TLS or login refused), or stops answering while its
inventory is read (vsphere/bounded.py), does not stop the others: its hosts, VMs and guests are "not
observed" (exit 3), as an SSH target that does not answer is. With one vCenter (`vcenter:`, the short
form) nothing changes: its failure is the run's error.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.connection
import pickle
import signal
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, TypeVar

from gpuvm import collector
from gpuvm.errors import ConnectError, GpuvmError
from gpuvm.executors.group import run_group
from gpuvm.runbook.model import Runbook
from gpuvm.secrets import redact
from gpuvm.vsphere.facts import Inventory
from gpuvm.vsphere.inventory import read_inventory
from gpuvm.vsphere.named import named_for
from gpuvm.vsphere.retrieve import Sent
from gpuvm.vsphere.session import Session, Target

T = TypeVar("T")
R = TypeVar("R")


def each(items: Mapping[str, T], work: Callable[[T], R]) -> tuple[dict[str, R], dict[str, ConnectError]]:
    """`work` on every item at once (one thread each: vCenters are few), results and connection
    failures by name; any other error is raised (the first, in the items' order)."""
    if len(items) == 1:  # one vCenter: no thread, its error as it was
        ((name, item),) = items.items()
        return {name: work(item)}, {}
    outcome = run_group(items, work, len(items), name="vcenter")
    failed = {name: error for name, error in outcome.failed.items() if isinstance(error, ConnectError)}
    for name, error in outcome.failed.items():
        if name not in failed:
            raise error
    return dict(outcome.ok), failed


def read_all(reached: Mapping[str, Session], then: Callable[[str, Inventory], Any] | None = None,
             sent: Mapping[str, Sent] | None = None) -> tuple[dict[str, Any], dict[str, ConnectError]]:
    """Every vCenter's inventory, read at once (one request each, plus paging), and the vCenters whose
    read failed to connect or went unanswered (→ why). With several, the first is read here and the
    others in child processes, one each: decoding an answer is Python work, which threads would take
    in turns. `then(name, inventory)`, when given, runs where the inventory was read (a child: its
    vCenter's plan, `fleet_plan.py`) and its result comes back instead of the inventory. `sent`: the
    reads already sent on some of these sessions (gpuvm/read_ahead.py), by vCenter; a child takes
    such a session over (its connections, its logout) instead of logging in again."""
    if not reached:  # every vCenter down: nothing to read, every target not observed
        return {}, {}
    work, sent = then or _inventory, sent or {}
    first, *others = reached
    results: dict[str, Any] = {}
    lost: dict[str, ConnectError] = {}

    def read_first() -> None:
        try:
            inventory = read_inventory(reached[first], alone=not others, sent=sent.get(first))
        except ConnectError as e:
            lost[first] = e
        else:
            results[first] = work(first, inventory)

    if not others:
        read_first()
        return results, lost
    fork = multiprocessing.get_context("fork")  # the child has the code (and `then`) loaded: nothing to send
    children, answered = {}, set()
    try:
        for name in others:
            answer, child_end = fork.Pipe(duplex=False)
            taken = (reached[name], sent[name]) if name in sent else None
            child = fork.Process(target=_read_alone, args=(name, reached[name].target, work, child_end, taken),
                                 daemon=True)
            child.start()
            child_end.close()
            if taken is not None:
                reached[name].let_go()  # the child's now
            children[name] = (child, answer)
        read_first()  # while the children read theirs
        answers = _in_order(children, answered, lambda name, pipe: _answer_of(reached[name].target, pipe))
        for name, (kind, value) in answers:
            if kind == "raise":
                raise value
            if kind == "connect":
                lost[name] = ConnectError(value)
            elif kind != "ok":
                raise GpuvmError(value)
            else:
                results[name] = value
        return results, lost
    finally:
        for name, (child, answer) in children.items():
            if name not in answered:
                child.terminate()  # the run failed before reading its answer
            answer.close()
            child.join()


def _in_order(children: dict[str, tuple[Any, Any]], answered: set[str],
              read: Callable[[str, Any], tuple[str, Any]]) -> Iterator[tuple[str, tuple[str, Any]]]:
    """The children's answers in their order, each read (unpickled: a plan part takes a tenth of a
    second) as soon as it comes, while the children still at work use the other cores; `answered`
    gets each name read."""
    order = list(children)
    waiting = {answer: name for name, (_, answer) in children.items()}
    came: dict[str, tuple[str, Any]] = {}
    while order:
        for answer in multiprocessing.connection.wait(list(waiting)):
            name = waiting.pop(answer)
            came[name] = read(name, answer)
            answered.add(name)
        while order and order[0] in came:
            name = order.pop(0)
            yield name, came.pop(name)


def _inventory(name: str, inventory: Inventory) -> Inventory:
    return inventory


def _answer_of(target: Target, answer: Any) -> tuple[str, Any]:
    """A child's (kind, value), unpickled with the collector paused (a plan or an inventory: many
    objects); a child that ended without answering (killed) is an error."""
    try:
        data = answer.recv_bytes()
    except EOFError:
        return "error", f"{target.url}: reading the inventory failed: its process ended without an answer"
    with collector.paused():
        return pickle.loads(data)


def _read_alone(name: str, target: Target, work: Callable[[str, Inventory], Any], answer: Any,
                taken: tuple[Session, Sent] | None = None) -> None:
    """In a child process: log in (its own session: the parent's connections are not shared), read,
    log out, `work` on the inventory; `taken`: the session the parent let go (Session.let_go) with
    the read it sent there, whose answer is read here. Sends back its result, or the error: a read's
    as its kind and message (an exception's own pickling may not carry it over), `work`'s as raised
    where it pickles whole (so that the parent raises what the first vCenter's `work` would raise),
    else its message.
    SIGTERM and SIGINT end it at once (the parent, interrupted, terminates it)."""
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, signal.SIG_DFL)
    try:
        with _session(target, taken) as session:
            inventory = read_inventory(session, alone=False, sent=taken[1] if taken else None)
    except ConnectError as e:
        sent = pickle.dumps(("connect", str(e)))
    except Exception as e:  # one line for the user, never a traceback from a child
        sent = pickle.dumps(("error", f"{target.url}: reading the inventory failed: {redact(str(e) or type(e).__name__)}"))
    else:
        try:
            with collector.paused():
                sent = pickle.dumps(("ok", work(name, inventory)), protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as e:
            sent = _raised(e) or pickle.dumps(("error", f"{target.url}: {redact(str(e) or type(e).__name__)}"))
    answer.send_bytes(sent)
    answer.close()


@contextmanager
def _session(target: Target, taken: tuple[Session, Sent] | None) -> Iterator[Session]:
    """A session of its own to `target`, or the one `taken`, logged out on exit either way."""
    if taken is None:
        with Session(target) as session:
            yield session
        return
    try:
        yield taken[0]
    finally:
        taken[0].__exit__(None, None, None)


def _raised(error: Exception) -> bytes | None:
    """("raise", error) pickled, if the error comes back from its pickle as the same type and text."""
    try:
        sent = pickle.dumps(("raise", error))
        back = pickle.loads(sent)[1]
    except Exception:
        return None
    return sent if type(back) is type(error) and str(back) == str(error) else None


@dataclass
class Fleet:
    """The inventories of a runbook's vCenters, by vCenter name, and the targets of those not reached."""

    inventories: dict[str, Inventory]
    unobserved: dict[str, str] = field(default_factory=dict)  # hosts, VMs, guests of vCenters not reached → why
    down: dict[str, Exception] = field(default_factory=dict)  # the vCenters not reached → why

    @classmethod
    def read(cls, book: Runbook, reached: Mapping[str, Session], down: Mapping[str, Exception],
             sent: Mapping[str, Sent] | None = None) -> "Fleet":
        """The inventories of the vCenters `reached` (`sent`: the reads already sent, read_all); those
        `down` and those that stop answering while read are not observed (one vCenter, `vcenter:`: its
        error is the run's)."""
        inventories, lost = read_all(reached, sent=sent)
        if lost and not book.vcenters:
            raise next(iter(lost.values()))
        return cls.of(book, inventories, {**down, **lost})

    @classmethod
    def of(cls, book: Runbook, inventories: dict[str, Inventory], down: Mapping[str, Exception]) -> "Fleet":
        unobserved: dict[str, str] = {}
        if book.vcenters:  # a host or VM name used in several vCenters: <vcenter>/<name>, in plans and here
            inventories = {name: named_for(book.part(name), inventory) for name, inventory in inventories.items()}
        for name, error in down.items():
            part = book.part(name)
            why = f"vCenter {name} not reached: {error}"
            unobserved |= {h.name: why for h in part.hosts} | {v.name: why for v in part.vms}
        return cls(inventories, unobserved, dict(down))

    def parts(self, book: Runbook) -> list[tuple[Runbook, Inventory]]:
        """Each vCenter's part of the runbook with its inventory (one vCenter: the runbook itself)."""
        if len(self.inventories) == 1 and not self.unobserved:
            return [(book, next(iter(self.inventories.values())))]
        return [(book.part(name), inventory) for name, inventory in self.inventories.items()]

    def merged(self, book: Runbook) -> Inventory:
        """One inventory of every vCenter: the runbook's hosts and VMs from their own vCenter (what the
        steps that span vCenters read: outstanding acts, reboot memos, unobserved guests' VMs)."""
        if len(self.inventories) == 1:
            return next(iter(self.inventories.values()))
        merged = Inventory(source=", ".join(i.source for i in self.inventories.values()))
        for name, inventory in self.inventories.items():
            part = book.part(name)
            mine = {h.name for h in part.hosts} | {v.host for v in part.vms} | {v.name for v in part.vms}
            for kind in ("hosts", "vms", "templates", "datastores", "folders", "pools", "networks"):
                into, source = getattr(merged, kind), getattr(inventory, kind)
                into.update({k: v for k, v in source.items() if k in mine or k not in into})
        return merged
