"""Whole runs over a runbook: plan it, apply it, verify it, read its inventory
(reaching the vCenters and reading their inventories: gpuvm.connecting).

What the CLI's commands do, as library calls that return data and raise `GpuvmError`s: the
commands parse options, call one of these and render the result. Printing is the caller's: the
TLS warning goes to `Access.warn`, the plan and the apply progress to callbacks. This is the one
place that drives the engine (`make_plan`, `apply_plan`, ...).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpuvm import collector, fleet_plan
from gpuvm.apply_options import ApplyOptions
from gpuvm.connecting import Access, connect_all, observe_fleet
from gpuvm.engine import Outcome, apply_plan, check_allowed, make_plan, observe_reachable, raise_failures
from gpuvm.errors import NOT_OBSERVED, ConnectError, DriftError, TargetFailures
from gpuvm.journal import Journal, state_dir as make_state_dir
from gpuvm.steps.guest_ssh_mesh.verify import check_mesh
from gpuvm.outstanding import FOREIGN, STEP as OUTSTANDING
from gpuvm.plan import Note, Plan
from gpuvm.read_ahead import NOTHING_AHEAD, ReadAhead
from gpuvm.desired import Desired
from gpuvm.remote import Cluster, RemoteOptions, build_cluster
from gpuvm.resolve_slurm import slurm_nodes
from gpuvm.resolve_ssh import resolve_ssh
from gpuvm.runbook.loader import load_runbook
from gpuvm.names import vsphere_name
from gpuvm.runbook.model import Runbook
from gpuvm.runbook.setups import select_setup
from gpuvm.steps import reboot_memo
from gpuvm.steps.base import Context, Options
from gpuvm.targeting import Scope, select
from gpuvm.vsphere.facts import Inventory
from gpuvm.vsphere.fleet import Fleet, each, read_all
from gpuvm.vsphere.in_flight import await_on_vms, on_vms
from gpuvm.vsphere.intent import IntentStore
from gpuvm.vsphere.lock import HostLocks
from gpuvm.vsphere.session import Session

Progress = Callable[[str, str, str], None]  # (step, target, status), as the engine reports them
RemoteFacts = dict[tuple[str, str], Any]  # (step, target) → observed fact


@contextmanager
def remote(runbook: Runbook, access: Access, parallel: int | None = None,
           whole: Runbook | None = None) -> Iterator[tuple[Cluster | None, RemoteFacts, dict[str, ConnectError]]]:
    """The SSH targets of the runbook and what they look like now: (cluster, facts, the targets not
    observed → why), or (None, {}, {}) when it names none. The connections close on exit. `whole`: the
    runbook that `runbook` is the reached part of (`reached`): its other guests stay mesh peers."""
    if not runbook.guests and not any(h.ssh for h in runbook.hosts):
        yield None, {}, {}
        return
    cluster = build_cluster(runbook, make_state_dir(access.state_dir),
                            RemoteOptions(accept_new_host_keys=access.accept_new_host_keys))
    if whole is not None and whole is not runbook:
        cluster.all_guests = {name: t for name, t in resolve_ssh(whole).items() if t.role == "guest"}
    try:
        yield (cluster, *observe_reachable(cluster, parallel))
    finally:
        cluster.close()


def narrowed(plan: Plan, book: Runbook, targets: Sequence[str], inventory: Inventory) -> tuple[Plan, Scope | None]:
    """The plan on `targets` only (`--target`; see gpuvm.targeting), and the scope that narrowed it."""
    selection = select(book, targets)
    if selection is None:
        return plan, None
    scope = Scope(selection, inventory)
    return scope.narrow(plan), scope


def plan_runbook(runbook: Path, access: Access, snapshot: Path | None = None, setup: str | None = None,
                 targets: Sequence[str] = (), ahead: ReadAhead = NOTHING_AHEAD) -> Plan:
    """Every change the runbook (with `setup`'s layout) needs, on `targets` only when given. From a
    snapshot, vSphere only; else live, SSH steps too. `ahead`: the reads sent before the runbook was
    validated (gpuvm/read_ahead.py), taken where they fit."""
    book = select_setup(load_runbook(runbook, ahead.text), setup)
    select(book, targets)  # unknown names refused before vCenter is read
    with collector.paused():  # inventories and plans: objects made in bulk
        if snapshot is None and not targets and fleet_plan.apart(book):
            return _plan_apart(book, access, ahead)
        if snapshot is None:
            return plan_observed(book, access, targets, ahead)[0]
        fleet = observe_fleet(book, access, snapshot)
        plan, _ = make_plan(book, fleet)
        return narrowed(plan, book, targets, fleet.merged(book))[0]


def _plan_apart(book: Runbook, access: Access, ahead: ReadAhead) -> Plan:
    """Several vCenters, no SSH target: each vCenter's part planned where its inventory is read."""
    with connect_all(book, access, ahead) as (sessions, down):
        in_flight = _in_flight_notes(book, sessions)
        parts, lost = read_all(sessions, lambda name, inventory: fleet_plan.plan_part(book.part(name), inventory),
                               ahead.sent_on(sessions))
    plan = fleet_plan.merged(list(parts.values()), Fleet.of(book, {}, {**down, **lost}).unobserved)
    plan.notes += in_flight
    return plan


def plan_observed(book: Runbook, access: Access, targets: Sequence[str] = (),
                  ahead: ReadAhead = NOTHING_AHEAD) -> tuple[Plan, Inventory, RemoteFacts]:
    """The live plan of a loaded runbook (on `targets` only when given), with what it was made from:
    the inventory and the SSH targets' facts (a saved plan digests them: gpuvm.saved_plan)."""
    with connect_all(book, access, ahead) as (sessions, lost):
        in_flight = _in_flight_notes(book, sessions)
        fleet = Fleet.read(book, sessions, lost, ahead.sent_on(sessions))
    with remote(reached(book, fleet), access, whole=book) as (cluster, facts, down):
        plan, _ = make_plan(reached(book, fleet), fleet, cluster, facts, down)
    plan.notes += in_flight
    inventory = fleet.merged(book)
    return narrowed(plan, book, targets, inventory)[0], inventory, facts


def reached(book: Runbook, fleet: Fleet) -> Runbook:
    """The runbook without the hosts, VMs and guests of the vCenters not reached (not observed)."""
    return book.part(*fleet.inventories) if fleet.unobserved else book


@dataclass
class Applied:
    """What `apply_runbook` did. `outcome` is None when there was nothing to apply."""

    plan: Plan  # guest changes are re-planned during the run, so this is the plan as carried out
    outcome: Outcome | None = None
    journal: Path | None = None

    @property
    def ran(self) -> bool:
        return self.outcome is not None

    @property
    def changes_done(self) -> int:
        return sum(len(changes) for changes in self.outcome.done.values()) if self.outcome else 0

    @property
    def seconds(self) -> float:
        return self.outcome.seconds if self.outcome else 0.0

    @property
    def failed(self) -> dict[str, Exception]:
        """'target (step)' → its error."""
        return dict(self.outcome.failed) if self.outcome else {}

    @property
    def skipped(self) -> dict[str, str]:
        """'target (step)' → why it was skipped."""
        return dict(self.outcome.skipped) if self.outcome else {}

    def raise_for_failures(self) -> None:
        """One TargetFailures naming every failed target, if any failed."""
        if self.outcome is not None:
            raise_failures(self.outcome)

    @property
    def unobserved(self) -> dict[str, str]:
        """Targets in scope not observed to the end (→ why), other than those that failed: ESXi shells
        that did not answer, guests whose observation failed at plan time and never ran again."""
        observed = self.outcome.observed if self.outcome else set()
        failed = self.failed
        return {name: why for name, why in self.plan.unobserved.items()
                if name not in observed and name + NOT_OBSERVED not in failed}

    def raise_for_outcome(self) -> None:
        """`apply`'s verdict, the worst outcome first: targets failed or not observed (TargetFailures:
        the failures' exit code, 3 when all are connections), then changes left out by `--target`
        (LeftOutDrift, 5: the targets do not match the runbook yet). Nothing raised: they match."""
        if self.failed or self.unobserved:
            raise TargetFailures(dict(self.failed), not_observed=dict(self.unobserved))
        if self.plan.left_out:
            raise LeftOutDrift(self.plan)


def apply_runbook(runbook: Path, access: Access, options: ApplyOptions = ApplyOptions(), *,
                  show_plan: Callable[[Plan], None] | None = None, confirm: Callable[[Plan], None] | None = None,
                  progress: Progress | None = None, setup: str | None = None, targets: Sequence[str] = ()) -> Applied:
    """Plan the runbook live and carry the plan out, every change journaled.

    `show_plan` sees the plan first. With nothing to do (no change, every guest answering) the run
    stops there. Disruptive changes `options` does not allow raise InputError before anything is touched; then
    `confirm` (if given) is asked and raises to stop. Failed targets do not raise: see `Applied`.
    `targets`: only those hosts, VMs and guests (see gpuvm.targeting). A host reboot for a change still
    pending after gpuvm's last reboot of that host raises RepeatedReboot (exit 4) up front unless
    `options.allow_repeat_reboot` (steps/reboot_memo.py).
    """
    return apply_loaded(select_setup(load_runbook(runbook), setup), access, options, show_plan=show_plan,
                        confirm=confirm, progress=progress, targets=targets)


def apply_loaded(book: Runbook, access: Access, options: ApplyOptions = ApplyOptions(), *,
                 show_plan: Callable[[Plan], None] | None = None, confirm: Callable[[Plan], None] | None = None,
                 progress: Progress | None = None, targets: Sequence[str] = (),
                 check: Callable[[Plan, Inventory, RemoteFacts], None] | None = None) -> Applied:
    """`apply_runbook` for a runbook already loaded (a campaign's setup is built, not read). `check`
    sees the plan made under the locks, and what it was made from, first: raising stops the run
    with nothing touched (a saved plan that is stale: gpuvm.saved_plan)."""
    select(book, targets)  # unknown names refused before anything is touched
    journal = Journal(make_state_dir(access.state_dir))
    with ExitStack() as stack:
        sessions, lost = stack.enter_context(connect_all(book, access))
        locks = [stack.enter_context(HostLocks(session, _hosts(book.part(name) if book.vcenters else book),
                                               journal.run_id, journal=journal))
                 for name, session in sessions.items()]
        steps = Options(allow_power_off=options.allow_power_off, allow_host_reboot=options.allow_host_reboot,
                        shutdown_timeout=options.shutdown_timeout, guest_boot_timeout=book.ssh.boot_timeout,
                        max_unavailable=options.max_unavailable, drain_timeout=options.drain_timeout)
        _await_tasks_in_flight(book, sessions, steps.task_timeout, progress)
        fleet = Fleet.read(book, sessions, lost)  # read under the locks: what no other run is changing now
        sessions = {name: sessions[name] for name in fleet.inventories}  # a vCenter silent meanwhile: not observed
        live = reached(book, fleet)
        cluster, seen, down = stack.enter_context(remote(live, access, options.parallel, whole=book))
        plan, desired = make_plan(live, fleet, cluster, seen, down)
        facts = fleet.merged(book)
        plan, scope = narrowed(plan, book, targets, facts)
        if scope is not None:
            down = {name: why for name, why in down.items() if scope.covers(name)}
        if check is not None:
            check(plan, facts, seen)
        if show_plan is not None:
            show_plan(plan)
        intents = {name: IntentStore(session, journal.run_id) for name, session in sessions.items()}

        def settle_memos() -> None:
            """Every guest observed: a host with nothing waiting has nothing left to reboot for."""
            for name, session in sessions.items() if not down else ():
                part = live.part(name) if book.vcenters else live
                reboot_memo.settle(intents[name], session, plan.changes, fleet.inventories[name],
                                   [h.name for h in part.hosts if scope is None or scope.covers(h.name)])

        if plan.empty and not down:
            settle_memos()
            return Applied(plan)
        # Nothing is written before every check and the confirmation: a refused apply changes nothing
        reboot_memo.refuse(reboot_memo.repeats(plan.changes, facts), options.allow_repeat_reboot)
        check_allowed(plan, desired, options)
        if confirm is not None:
            confirm(plan)
        settle_memos()
        slurm = slurm_nodes(live)
        contexts = {name: Context(session, fleet.inventories[name], steps, cluster, down, planned=plan.changes,
                                  journal=journal, intents=intents[name], slurm=slurm)
                    for name, session in sessions.items()}
        if len(contexts) == 1 and not fleet.down:
            context, regions = next(iter(contexts.values())), {}
        else:  # each host and VM through its own vCenter; the guests through none
            context = Context(None, facts, steps, cluster, down, planned=plan.changes, journal=journal, slurm=slurm)
            regions = {target: contexts[name] for name in contexts
                       for target in [*(h.name for h in live.part(name).hosts), *(v.name for v in live.part(name).vms)]}
        outcome = apply_plan(plan, desired, context, journal, options.parallel, progress, keep=scope, regions=regions)
        for each_lock in locks:
            each_lock.check("the end of the run")  # a lease lost during the last step: exit 8, not a list of refusals
    return Applied(plan, outcome, journal.path)


def _vms_in(book: Runbook, vcenter: str) -> dict[str, str]:
    """The runbook's VMs in `vcenter`: their names there → their names in gpuvm."""
    return {vsphere_name(vm.name): vm.name for vm in (book.part(vcenter) if book.vcenters else book).vms}


def _await_tasks_in_flight(book: Runbook, sessions: dict[str, Session], timeout: float,
                           progress: Progress | None) -> None:
    """Before observing: the vCenter tasks in flight on the runbook's VMs (one a stopped run left)
    end first, every vCenter's at once (vsphere/in_flight.py): the plan is made on what they leave."""
    def await_one(name: str) -> None:
        session = sessions[name]
        say = None if progress is None else (lambda line: progress("vcenter", session.target.url, line))
        await_on_vms(session, _vms_in(book, name), timeout, say)

    each({name: name for name in sessions}, await_one)  # a vCenter not answering: Fleet.read tells


def _in_flight_notes(book: Runbook, sessions: dict[str, Session]) -> list[Note]:
    """`plan`'s word on the vCenter tasks in flight on the runbook's VMs: read-only, it does not wait
    (apply does, before it plans), so it plans on each such VM as it is before its task ends."""
    def notes(name: str) -> list[Note]:
        vms = _vms_in(book, name)
        return [Note(vms[vm], "observe", f"vCenter task {busy} in flight: planned on the VM as it is before the "
                                         "task ends; apply awaits it, then plans", level="info")
                for vm, busy in on_vms(sessions[name], vms)]

    found, _ = each({name: name for name in sessions}, notes)
    return [note for name in sessions if name in found for note in found[name]]


def _hosts(book: Runbook) -> set[str]:
    """The hosts a run locks: the runbook's, and those its VMs are on; by their names in vCenter (the
    lock is the host's in its own vCenter, whichever runbook names it)."""
    return {vsphere_name(h.name) for h in book.hosts} | {vsphere_name(vm.host) for vm in book.vms}


def plan_loaded(book: Runbook, access: Access) -> tuple[Plan, Desired]:
    """The live plan of a loaded runbook and the desired state it was made for (to check flags)."""
    fleet = observe_fleet(book, access)
    with remote(reached(book, fleet), access, whole=book) as (cluster, seen, down):
        return make_plan(reached(book, fleet), fleet, cluster, seen, down)


class PlanDrift(DriftError):
    """`verify` found changes to make; they are in `plan`."""

    def __init__(self, message: str, plan: Plan):
        super().__init__(message)
        self.plan = plan


class LeftOutDrift(DriftError):
    """`apply --target` left changes out (they wait on targets not given): the targets given do not
    match the runbook yet."""

    def __init__(self, plan: Plan):
        by_target = plan.left_out_by_target()
        super().__init__(f"drift remains: {len(plan.left_out)} change(s) left out on {len(by_target)} target(s):\n  "
                         + "\n  ".join(f"{name}: {why}" for name, why in by_target.items())
                         + "\ntarget those too (or run without --target) to apply them")
        self.plan = plan


class NotObserved(ConnectError):
    """`verify` could not observe some targets in scope (an SSH target did not answer): its verdict is
    incomplete, exit 3. `plan` holds the drift found on the others, `down` the targets, with why."""

    def __init__(self, plan: Plan):
        self.plan, self.down = plan, dict(plan.unobserved)
        drift = f"; drift on the targets observed: {len(plan.changes)} change(s)" if plan.changes else ""
        super().__init__(f"{len(self.down)} target(s) not observed{drift}:\n  "
                         + "\n  ".join(f"{name}: {reason}" for name, reason in self.down.items()))


@dataclass(frozen=True)
class Verified:
    """The world matches the runbook."""

    mesh_guests: int | None = None  # guests whose SSH mesh was checked pair by pair; None: no mesh
    foreign: list[Note] = field(default_factory=list)  # values gpuvm did not write in its attributes: warned of, not drift
    targeted: bool = False  # only --target's hosts, VMs and guests were checked

    @property
    def message(self) -> str:
        return ("No drift on the targets: they match the runbook." if self.targeted
                else "No drift: infrastructure matches the runbook.")


def _drift_message(plan: Plan, held: list[Note], runbook: Path) -> str:
    lines = [f"drift: {len(plan.changes)} change(s) needed to match {runbook}"] if plan.changes else ["drift"]
    if held:
        lines[0] += f"; {len(held)} act(s) an interrupted gpuvm run left unfinished:"
        lines += [f"  {note.target}: {note.message}" for note in held]
    return "\n".join(lines)


def verify_runbook(runbook: Path, access: Access, setup: str | None = None, targets: Sequence[str] = (),
                   ahead: ReadAhead = NOTHING_AHEAD) -> Verified:
    """Raise when the world differs from the runbook, or cannot be told: NotObserved (exit 3) when an
    SSH target in scope did not answer (with the drift found on the others), else PlanDrift (exit 5,
    with the plan) when there are changes to make. With an SSH mesh, every ordered pair of guests
    must log in with the mesh key (else RemoteCommandError naming the pairs). `targets`: only those
    hosts, VMs and guests (the mesh's pairs are checked when every guest is targeted). `ahead`: as
    `plan_runbook`'s."""
    book = select_setup(load_runbook(runbook, ahead.text), setup)
    selection = select(book, targets)  # unknown names refused before anything is read
    fleet = observe_fleet(book, access, ahead=ahead)
    inventory = fleet.merged(book)
    chosen = selection.targets(inventory) if selection else None
    with remote(reached(book, fleet), access, whole=book) as (cluster, facts, down):
        plan, _ = make_plan(reached(book, fleet), fleet, cluster, facts, down)
        if selection is not None:
            plan = selection.drift(plan, inventory)
        held = [note for note in plan.notes if note.step == OUTSTANDING]  # an interrupted run's unfinished acts
        if plan.unobserved:
            raise NotObserved(plan)
        if not plan.empty or held:
            raise PlanDrift(_drift_message(plan, held, runbook), plan)
        mesh = book.guests and book.guests.ssh_mesh and book.guests.ssh_mesh.enabled
        foreign = [note for note in plan.notes if note.step == FOREIGN]  # never acted on: no apply removes it
        if cluster is None or not mesh or (chosen is not None and not set(cluster.of_role("guest")) <= chosen):
            return Verified(foreign=foreign, targeted=selection is not None)
        check_mesh(cluster)  # every ordered pair of guests logs in with the mesh key
        return Verified(mesh_guests=len(cluster.of_role("guest")), foreign=foreign, targeted=selection is not None)
