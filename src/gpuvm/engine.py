"""The engine: observe, plan every step, apply step by step with targets in parallel.

Steps run in a fixed order: ESXi shells, hosts, the guest steps that a host reboot activates, the
reboot, VMs, then guest OSes. vSphere steps observe through one bulk inventory read; SSH steps
observe every target in parallel. Within a step targets run in parallel, bounded by `parallel`. A
failing target does not stop the others; later steps skip the targets that depend on it (the same
VM or host, or VMs on a failed host). A host reboot has the VM steps' changes on the VMs it stopped
made while they are off (`Context.while_off`), so they come back with their host. An SSH target
that cannot be observed at plan time (it does not answer, offers a wrong host key, or answers what
gpuvm cannot use) is set aside (not observed, with why) rather than failing the plan; apply leaves
a host whose ESXi shell was not observed alone, with its VMs and guests. Once VMs have changed, guests are observed and planned
again, after waiting only for the guests whose VM this run (re)started; a change planned then that
needs a flag not given is refused on its guest, as `check_allowed` would.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from gpuvm import after_apply
from gpuvm.apply_options import ApplyOptions
from gpuvm.errors import ConnectError, GpuvmError, HostKeyError, InputError, NOT_OBSERVED, ObserveError, RemoteCommandError, listed
from gpuvm.executors.group import GroupResult, at_once, run_group
from gpuvm.journal import Journal, JournalError
from gpuvm.outstanding import outstanding
from gpuvm.plan import Change, Disruption, Note, Plan
from gpuvm.remote import Cluster
from gpuvm.desired import Desired
from gpuvm.resolve import resolve
from gpuvm.resolve_slurm import slurm_nodes
from gpuvm.runbook.model import Runbook
from gpuvm.secrets import redact
from gpuvm.steps import (esxi_ats, esxi_mig, esxi_topology, esxi_vgpu_manager, guest_docker, guest_driver,
                         guest_image, guest_licensing, guest_mig, guest_nic, guest_nic_ats, guest_rdma, guest_slurm, guest_ssh_mesh,
                         host_graphics, host_passthrough, host_reboot, reboot_memo, slurm_drain, vm_advanced, vm_hardware,
                         vm_lifecycle, vm_power, vm_version)
from gpuvm.steps.base import Context, Options, Step, WhileOff
from gpuvm.vsphere.facts import Inventory
from gpuvm.vsphere.fleet import Fleet

STEPS: list[Step] = [
    esxi_vgpu_manager.STEP,  # the NVIDIA host driver, before the steps that read its nvidia-smi
    esxi_topology.STEP,
    esxi_ats.STEP,
    esxi_mig.STEP,
    host_passthrough.STEP,
    host_graphics.STEP,
    guest_nic_ats.STEP,  # before the reboot that activates it, on the guests that answer now
    host_reboot.STEP,
    vm_lifecycle.STEP,  # creates missing VMs (the steps after it configure them), destroys absent ones
    vm_version.STEP,  # hardware version upgrades, before the devices that need them
    vm_hardware.STEP,
    vm_advanced.STEP,
    vm_power.STEP,
    guest_driver.STEP,  # before MIG and the container toolkit, which need the driver
    guest_licensing.STEP,  # right after the driver: an unlicensed vGPU loses CUDA after its grace period
    guest_rdma.STEP,
    guest_nic.STEP,
    guest_mig.STEP,
    guest_docker.STEP,  # packages, daemon, runtime
    guest_ssh_mesh.STEP,
    guest_image.STEP,  # after the mesh: even a first apply ships the image guest to guest over it
    guest_slurm.STEP,  # after MIG: its GRES follow the guests' MIG layouts
]

Facts = dict[tuple[str, str], Any]  # (step, target) → observed fact
Progress = Callable[[str, str, str], None]


class Keep(Protocol):
    """Narrows what apply plans again to the targets chosen (`--target`: `targeting.Scope`)."""

    def keep(self, changes: list[Change]) -> list[Change]: ...

    def covers(self, target: str) -> bool: ...


def targets_of(step: Step, desired: Desired, cluster: Cluster | None) -> dict[str, Any]:
    """The step's targets by name: the desired hosts or VMs, or the SSH targets of its role."""
    if step.role == "host":
        return dict(desired.hosts)
    if step.role == "vm":
        return dict(desired.vms)
    return cluster.of_role(step.role) if cluster is not None else {}


def observe_remote(cluster: Cluster, role: str | None = None,
                   parallel: int | None = None) -> GroupResult[str, dict[str, Any]]:
    """Every wanted SSH step's fact for every target (of `role`), targets in parallel (`parallel`, by
    default every target at once up to `at_once`'s limit: it only reads): by target, its facts by step
    (`_facts_of` makes them `Facts`), or why it could not be observed. A target whose answer gpuvm
    cannot use (a command failed or timed out, an untrusted value) fails with ObserveError."""
    steps = [s for s in STEPS if s.over_ssh and (role is None or s.role == role)]
    targets = {n: t for n, t in cluster.targets.items() if any(s.role == t.role for s in steps)}
    ctx = Context(cluster=cluster)

    def observe(target: Any) -> dict[str, Any]:
        try:
            return {s.name: s.observe(ctx, target) for s in steps if s.role == target.role and s.wanted(target)}
        except RemoteCommandError as e:
            raise ObserveError(str(e)) from e

    return run_group(targets, observe, parallel or at_once(targets), name="observe")


def observe_reachable(cluster: Cluster, parallel: int | None = None) -> tuple[Facts, dict[str, ConnectError]]:
    """`observe_remote`, but an SSH target that cannot be observed is set aside (→ its error) instead
    of failing the run, and the others are planned: one that does not answer (a guest whose VM is off
    or booting, an ESXi shell that is down), one whose host key is wrong (never trusted: an error
    for that target, not "not up yet"), one whose answer gpuvm cannot use (ObserveError). Any other
    error (the runbook's, a bug) is no one target's doing: it fails the run."""
    observed = observe_remote(cluster, parallel=parallel)
    down = {n: error for n, error in observed.failed.items() if isinstance(error, ConnectError)}
    GroupResult(observed.ok, {n: e for n, e in observed.failed.items() if n not in down}).raise_failures()
    return _facts_of(observed.ok), down


def plan_step(step: Step, ctx: Context, desired: Desired, facts: Facts) -> list[Change]:
    """The step's changes on every target: SSH facts were observed beforehand, vSphere ones are
    observed now (from the inventory, and from what earlier steps planned: `ctx.planned`)."""
    changes: list[Change] = []
    for name, target in targets_of(step, desired, ctx.cluster).items():
        if step.over_ssh:
            if (step.name, name) not in facts:
                continue  # not wanted there, or the guest did not answer
            fact = facts[(step.name, name)]
        elif step.wanted(target):
            fact = step.observe(ctx, target)
        else:
            continue
        changes.extend(step.plan(target, fact))
    return changes


def plan_by_step(runbook: Runbook, inventory: Inventory) -> tuple[Desired, list[list[Change]]]:
    """One vCenter's hosts and VMs planned against its inventory, without SSH targets: the desired
    state and the changes of each step, in STEPS' order (fleet_plan.py: a vCenter's part of the plan
    made in the process that read its inventory)."""
    desired = resolve(runbook, inventory, esxi_topology.discovered({}))
    ctx = Context(inventory=inventory)
    by_step = []
    for step in STEPS:  # the SSH steps have no target here: nothing planned for them
        planned = plan_step(step, ctx, desired, {})
        ctx.planned.extend(planned)
        by_step.append(planned)
    return desired, by_step


def make_plan(runbook: Runbook, inventory: Inventory | Fleet, cluster: Cluster | None = None,
              facts: Facts | None = None, unreachable: Mapping[str, Exception | str] | None = None) -> tuple[Plan, Desired]:
    """The plan reads no history: what gpuvm owns is on the objects (`HostFacts.owned`, intents).
    SSH targets in `unreachable` (→ why: `observe_reachable`'s errors) are not observed: the plan lists them and is incomplete,
    but for the guests of VMs it creates, whose guest steps are known after apply (gpuvm.after_apply).
    With several vCenters (a `Fleet`), each vCenter's hosts and VMs are resolved and planned against
    its own inventory, the guests across all; the targets of a vCenter not reached are not observed."""
    fleet = inventory if isinstance(inventory, Fleet) else Fleet({"": inventory})
    nvlink = esxi_topology.discovered(facts or {})
    regions = [(part, known, resolve(part, known, nvlink)) for part, known in fleet.parts(runbook)]
    desired = regions[0][2] if len(regions) == 1 else \
        Desired(hosts={n: h for _, _, d in regions for n, h in d.hosts.items()},
                vms={n: v for _, _, d in regions for n, v in d.vms.items()},
                notes=[note for _, _, d in regions for note in d.notes])
    inventory = fleet.merged(runbook)  # after resolve: it adds the clones to be made to their vCenter's VMs
    plan = Plan(notes=desired.notes + [note for _, known, d in regions for note in outstanding(known, d.hosts, d.vms)],
                unobserved={name: str(why) for name, why in (unreachable or {}).items()} | fleet.unobserved)
    if cluster is None and (runbook.guests or any(h.ssh for h in runbook.hosts)):
        plan.notes.append(Note("-", "plan", "SSH steps (ESXi shell, guests) are not planned from a snapshot",
                               level="info"))
    slurm = slurm_nodes(runbook) if cluster is not None else None  # asked over SSH: not from a snapshot
    ctx = Context(inventory=inventory, cluster=cluster, planned=plan.changes, slurm=slurm)
    in_vcenter = [(Context(inventory=known, cluster=cluster, planned=plan.changes, slurm=slurm), d)
                  for _, known, d in regions]
    for step in STEPS:
        if step.role in ("host", "vm") and len(in_vcenter) > 1:  # each vCenter's targets against its own inventory
            for region_ctx, region_desired in in_vcenter:
                plan.changes.extend(plan_step(step, region_ctx, region_desired, facts or {}))
        else:
            plan.changes.extend(plan_step(step, ctx, desired, facts or {}))
    plan.notes.extend(reboot_memo.notes(reboot_memo.repeats(plan.changes, inventory)))  # a reboot that did not help
    awaited = after_apply.awaited(plan.changes, unreachable or {}) if cluster is not None else set()
    plan.changes.extend(after_apply.planned(awaited, cluster.targets, STEPS) if cluster is not None else [])
    plan.unobserved = {name: why for name, why in plan.unobserved.items() if name not in awaited}
    roles = {n: t.role for n, t in cluster.targets.items()} if cluster is not None else {}
    plan.notes += [after_apply.note(name, why) if name in awaited else
                   unobserved_note(name, roles.get(name, "guest"), why, plan, inventory)
                   for name, why in (unreachable or {}).items()]
    unread = unread_notes(facts or {}, cluster.targets) if cluster is not None else []
    plan.notes += [replace(note, level="info") if other in awaited else note for other, note in unread]
    plan.unobserved |= {other: note.message for other, note in unread if other not in awaited | set(plan.unobserved)}
    plan.notes += [Note(name, "observe", why) for name, why in fleet.unobserved.items()]
    return plan, desired


def unread_notes(facts: Facts, targets: Mapping[str, Any]) -> list[tuple[str, Note]]:
    """The other targets SSH steps observing one target could not read (`Step.unread`), each with its
    note on the target observed."""
    steps = {s.name: s for s in STEPS}
    return [item for (step, name), fact in facts.items() for item in steps[step].unread(targets[name], fact).items()]


def unobserved_note(name: str, role: str, why: Exception | str, plan: Plan, inventory: Inventory) -> Note:
    """Why an SSH target is not in the plan, and what apply does about it. One that answered wrong (a
    host key gpuvm does not trust, an answer it cannot use) is an error; of those that do not answer,
    only a guest whose VM is off, or that this plan starts, is expected to be away (info); anything
    else is a warning."""
    if isinstance(why, (HostKeyError, ObserveError)):
        steps = f"its ESXi steps are not planned, and apply leaves host {name} and its VMs alone" \
            if role == "esxi" else "its guest steps are not planned, and apply changes nothing in it"
        said = str(why).removeprefix(f"{name}: ")
        return Note(name, "observe", f"not observed: {said}; {steps} until this is fixed", level="error")
    if role == "esxi":
        return Note(name, "observe", f"ESXi shell not observed ({why}): its ESXi steps are not planned, and "
                                     f"apply leaves host {name} and its VMs alone until it answers")
    vm = inventory.vms.get(name)
    if vm is None or not vm.powered_on:
        return Note(name, "observe", f"not reachable over SSH yet ({why}); its guest steps are planned when "
                                     "`apply` has its VM running", level="info")
    restarts = {s.name for s in STEPS if s.restarts_guest}
    changing = [c for c in plan.changes if c.target == name and c.step in restarts]
    if changing:
        return Note(name, "observe", f"guest not observed although its VM runs ({why}), and its VM is planned "
                                     f"to change ({len(changing)} change(s)): apply changes the VM, waits for "
                                     "its SSH, then plans its guest steps")
    return Note(name, "observe", f"guest not observed although its VM runs ({why}): its guest steps are not "
                                 "planned, and apply does not wait for it")


def check_allowed(plan: Plan, desired: Desired, allowed: ApplyOptions) -> None:
    """Refuse, before touching anything, disruptive changes the user has not allowed."""
    problems = []
    destroys = plan.disruptive(Disruption.VM_DESTROY)
    if destroys and not allowed.allow_destroy:
        problems.append(f"VM(s) {', '.join(c.target for c in destroys)} would be DESTROYED (state: absent): "
                        "pass --allow-destroy")
    power = plan.disruptive(Disruption.VM_POWER_OFF)
    if power and not allowed.allow_power_off:
        vms = listed(dict.fromkeys(c.target for c in power))
        problems.append(f"VM(s) {vms} must be powered off for {len(power)} change(s): pass --allow-power-off")
    reboot_steps = {s.name for s in STEPS if s.reboots_host}
    reboots = [c for c in plan.changes if c.step in reboot_steps and c.target in desired.hosts
               and c.disruption == Disruption.HOST_REBOOT]
    if reboots and not allowed.allow_host_reboot:
        problems.append(f"host(s) {listed(c.target for c in reboots)} must reboot: pass --allow-host-reboot")
    for change in reboots:
        if not desired.hosts[change.target].allow_reboot:
            problems.append(f"host {change.target} must reboot but the runbook does not allow it "
                            "(set allow_maintenance: true and allow_reboot: true on the host)")
    problems += slurm_drain.refusals(plan.changes, allowed.drain_timeout)
    if problems:
        raise InputError("refusing to apply; nothing was changed:\n  " + "\n  ".join(problems))


@dataclass
class Outcome:
    done: dict[str, list[Change]] = field(default_factory=dict)  # target → changes done
    failed: dict[str, GpuvmError | Exception] = field(default_factory=dict)  # "target (step)" → error
    skipped: dict[str, str] = field(default_factory=dict)
    observed: set[str] = field(default_factory=set)  # guests observed again during the run
    seconds: float = 0.0


def _blocked(target: str, failed_targets: set[str], desired: Desired, unseen_hosts: set[str]) -> str | None:
    if target in failed_targets:
        return f"an earlier step failed on {target}"
    host = desired.vms[target].host if target in desired.vms else None
    if host in failed_targets:
        return f"its host {host} failed"
    if target in unseen_hosts:
        return f"the ESXi shell of {target} was not observed (its ESXi steps could not be planned)"
    if host in unseen_hosts:
        return f"the ESXi shell of its host {host} was not observed"
    return None


def _unseen_hosts(ctx: Context) -> set[str]:
    """Hosts whose ESXi shell did not answer at plan time: what they need there is unknown, so none
    of their changes (nor their VMs' and guests') are made; the other hosts go on."""
    if ctx.cluster is None:
        return set()
    return {name for name in ctx.unreachable if name in ctx.cluster.of_role("esxi")}


class _Runner:
    """Applies one step's changes: journal, progress, per-target errors."""

    def __init__(self, step: Step, ctx: Context, journal: Journal, progress: Progress | None, targets: dict[str, Any],
                 regions: Mapping[str, Context] | None = None):
        self.step, self.ctx, self.journal, self.progress, self.targets = step, ctx, journal, progress, targets
        # host or VM → the context of its vCenter (several vCenters); a guest (named after its VM) is the
        # fleet's: guest steps run once over every vCenter's guests (one mesh, one image tree)
        self.regions = (regions or {}) if step.role in ("host", "vm") else {}
        ctx.say = self._say  # a long step's own progress lines (guest.image's build and ship)

    def __call__(self, item: tuple[str, list[Change]]) -> None:
        target, changes = item
        ctx = self.regions.get(target, self.ctx)
        check_lease(ctx, f"{self.step.name} on {target}")
        self._start(target, changes)
        try:
            self.step.apply(ctx, self.targets[target], changes)
        except Exception as error:
            self._finish(target, changes, error)
            raise
        self._finish(target, changes, None)

    def all(self, by_target: dict[str, list[Change]], parallel: int) -> dict[str, Exception]:
        """Apply through the step's `apply_all` (it orders its targets), once per vCenter for hosts and VMs,
        once for every guest; failures by target."""
        groups: dict[int, tuple[Context, dict[str, list[Change]]]] = {}
        for target, changes in by_target.items():
            ctx = self.regions.get(target, self.ctx)
            groups.setdefault(id(ctx), (ctx, {}))[1][target] = changes
        failures: dict[str, Exception] = {}
        for ctx, group in groups.values():
            failures |= self._all(ctx, group, parallel)
        return failures

    def _all(self, ctx: Context, by_target: dict[str, list[Change]], parallel: int) -> dict[str, Exception]:
        """Every target started up front and finished at the end, or by a `begins_targets` step as it
        starts and ends each (a rolling reboot's hosts, batch by batch; one it never began that failed
        is only failed)."""
        begun: set[str] = set()
        ended: set[str] = set()
        lock = threading.Lock()

        def begin(target: str) -> None:
            with lock:
                if target in by_target and target not in begun:
                    begun.add(target)
                    self._start(target, by_target[target])

        def end(target: str, error: Exception | None = None) -> None:
            with lock:
                if target in by_target and target not in ended:
                    ended.add(target)
                    self._finish(target, by_target[target], error)

        for target in () if self.step.begins_targets else by_target:
            begin(target)
        previous, (ctx.begin, ctx.end) = (ctx.begin, ctx.end), (begin, end)
        try:
            failures = self.step.apply_all(ctx, by_target, parallel)  # type: ignore[misc]
        except Exception as error:  # the step itself broke: every target failed with it
            failures = {target: error for target in by_target}
        finally:
            ctx.begin, ctx.end = previous
        for target in by_target:
            if target not in failures:
                begin(target)
            end(target, failures.get(target))
        return failures

    def _start(self, target: str, changes: list[Change]) -> None:
        self.journal.record_all("started", list(changes))
        self._say(target, "started")

    def _finish(self, target: str, changes: list[Change], error: Exception | None) -> None:
        if error is None:
            self.journal.record_all("done", list(changes))
            self._say(target, f"done ({len(changes)} change(s))")
            return
        message = redact(str(error) if isinstance(error, GpuvmError) else f"{type(error).__name__}: {error}")
        self.journal.record_all("failed", list(changes), error=message)
        self._say(target, f"failed: {message}")

    def _say(self, target: str, status: str) -> None:
        if self.progress:
            self.progress(self.step.name, target, status)


def check_lease(ctx: Context, before: str) -> None:
    """Raise LeaseLostError when the run's lease on its host locks is lost (vsphere/lock.py): the run
    stops at the next step or target, SSH steps included, not only at its next vSphere call."""
    fence = getattr(ctx.session, "fence", None)
    if fence is not None:
        fence(before)


def _last_vm_step() -> int:
    return max(i for i, s in enumerate(STEPS) if s.role == "vm")


def _early_guest_steps() -> list[Step]:
    """Guest steps that run before the VM steps (what a host reboot activates)."""
    return [s for s in STEPS[:_last_vm_step()] if s.role == "guest"]


def _run_order() -> list[Step | None]:
    """STEPS, with None where guests are observed again (after the last VM step), and the early guest
    steps repeated there for the guests that came up only then."""
    last_vm = _last_vm_step()
    return [*STEPS[:last_vm + 1], None, *_early_guest_steps(), *STEPS[last_vm + 1:]]


def apply_plan(plan: Plan, desired: Desired, ctx: Context, journal: Journal, parallel: int = 8,
               progress: Progress | None = None, keep: Keep | None = None,
               regions: Mapping[str, Context] | None = None) -> Outcome:
    """Every change, step by step; the journal records the run's start and end (interrupted too).
    `keep` narrows what guests are planned again to (`--target`). `regions`: with several vCenters,
    each host's and VM's context (its vCenter's session, inventory, intents); `ctx` serves the rest."""
    outcome = Outcome()
    start = time.monotonic()
    journal.record("run-start", changes=len(plan.changes))
    try:
        _apply_steps(plan, desired, ctx, journal, parallel, progress, outcome, keep, regions or {})
    except BaseException as e:  # Ctrl-C or SIGTERM (cli.common makes it a KeyboardInterrupt), a journal not written
        try:
            journal.record("run-end", interrupted=type(e).__name__, failed=len(outcome.failed),
                           seconds=round(time.monotonic() - start, 3))
        except JournalError:
            pass  # the error that stops the run is `e`
        raise
    outcome.seconds = time.monotonic() - start
    journal.record("run-end", failed=len(outcome.failed), seconds=round(outcome.seconds, 3))
    return outcome


def _apply_steps(plan: Plan, desired: Desired, ctx: Context, journal: Journal, parallel: int,
                 progress: Progress | None, outcome: Outcome, keep: Keep | None, regions: Mapping[str, Context]) -> None:
    run = _StepRun(plan, desired, ctx, journal, parallel, progress, outcome, regions)
    leased = [ctx, *{id(c): c for c in regions.values()}.values()]
    for each_ctx in leased:  # a reboot in any vCenter changes its VMs while they are off
        each_ctx.while_off = WhileOff(frozenset(s.name for s in _while_off_steps()), run.while_off)
    for step in _run_order():
        for each_ctx in leased:
            check_lease(each_ctx, f"step {step.name}" if step else "observing the guests again")
        if step is None:
            run.failed_targets |= _replan_guests(plan, desired, ctx, journal, outcome, parallel, progress, keep)
        else:
            run.step(step)


def _while_off_steps() -> list[Step]:
    """The VM steps whose changes a host reboot's stopped VMs get while they are off (hardware version,
    devices, advanced settings), so that they come back with their host: those between the reboot and
    `vm.power`, but `vm.lifecycle` (it creates and destroys VMs, none of those the reboot stops)."""
    names = [s.name for s in STEPS]
    between = STEPS[names.index(host_reboot.NAME) + 1:names.index(vm_power.NAME)]
    return [s for s in between if s.role == "vm" and s.name != vm_lifecycle.NAME]


class _StepRun:
    """Carries out the plan's changes step by step, each change at most once; what failed blocks what
    depends on it. Thread-safe: `while_off` is called from the hosts a reboot batch handles at once."""

    def __init__(self, plan: Plan, desired: Desired, ctx: Context, journal: Journal, parallel: int,
                 progress: Progress | None, outcome: Outcome, regions: Mapping[str, Context]):
        self.plan, self.desired, self.ctx, self.journal, self.regions = plan, desired, ctx, journal, regions
        self.parallel, self.progress, self.outcome = parallel, progress, outcome
        self.failed_targets: set[str] = set()
        self.unseen_hosts = _unseen_hosts(ctx)
        self.attempted: set[int] = set()  # ids of the changes carried out (or tried): each at most once
        self.lock = threading.Lock()

    def step(self, step: Step, only: set[str] | None = None) -> set[str]:
        """The step's changes not carried out yet (on the targets `only`, if given); returns the targets
        whose changes were not all made (failed or skipped)."""
        by_target: dict[str, list[Change]] = {}
        runnable = {}
        with self.lock:
            for change in self.plan.for_step(step.name):
                if id(change) not in self.attempted and (only is None or change.target in only) \
                        and not change.known_after_apply:  # planned for real once its guest is observed
                    self.attempted.add(id(change))
                    by_target.setdefault(change.target, []).append(change)
            for target, changes in by_target.items():
                reason = _blocked(target, self.failed_targets, self.desired, self.unseen_hosts)
                if reason:
                    self.outcome.skipped[f"{target} ({step.name})"] = reason
                    self.journal.record_all("skipped", list(changes), reason=reason)
                else:
                    runnable[target] = (target, changes)
        if not runnable:
            return set(by_target)
        runner = _Runner(step, self.ctx, self.journal, self.progress, targets_of(step, self.desired, self.ctx.cluster),
                         self.regions)
        if step.apply_all is not None:  # the step orders its targets itself (build once, then ship)
            failures = runner.all({t: changes for t, (_, changes) in runnable.items()}, self.parallel)
        else:
            failures = run_group(runnable, runner, self.parallel, name="apply").failed
        if lost := next((e for e in failures.values() if isinstance(e, JournalError)), None):
            raise lost  # nothing more is done unrecorded: the run stops (its locks released, intents kept)
        with self.lock:
            for target, (_, changes) in runnable.items():
                if target in failures:
                    self.failed_targets.add(target)
                    self.outcome.failed[f"{target} ({step.name})"] = failures[target]
                else:
                    self.outcome.done.setdefault(target, []).extend(changes)
            for target in failures.keys() - runnable.keys():  # found on a target it was not given (the mesh check)
                self.failed_targets.add(target)
                self.outcome.failed.setdefault(f"{target} ({step.name})", failures[target])
        return (set(by_target) - set(runnable)) | set(failures)

    def while_off(self, vms: list[str]) -> set[str]:
        """`WhileOff.run`: the VM steps' changes on `vms` now; the VMs not fully changed."""
        say = self.ctx.say
        held: set[str] = set()
        try:
            for step in _while_off_steps():
                held |= self.step(step, only=set(vms))
        finally:
            self.ctx.say = say  # the step under way (host.reboot) keeps its own progress listener
        return held


def _replan_guests(plan: Plan, desired: Desired, ctx: Context, journal: Journal, outcome: Outcome, parallel: int,
                   progress: Progress | None, keep: Keep | None) -> set[str]:
    """Guests are observed again once a step that restarts them changed their VM (a host reboot stops
    its VMs), or if some did not answer at plan time. gpuvm first waits for the SSH of the guests whose
    VM it (re)started; a guest that still does not answer fails alone (`name (observe)`). Guest steps
    that ran before the VM steps are planned again only for the guests that did not answer then. A
    change planned now that needs a flag the user did not give is not applied: its guest fails
    (returned), its other changes are skipped."""
    cluster = ctx.cluster
    restarting = {s.name for s in STEPS if s.restarts_guest}
    if cluster is None or not cluster.of_role("guest"):
        return set()
    rebooted = {t for t, changes in outcome.done.items() if any(c.step in restarting for c in changes)}
    if not rebooted and not set(ctx.unreachable) & set(cluster.of_role("guest")):
        return set()
    # Waiting is per target: only a guest whose VM this run (re)started is given boot_timeout to answer.
    # One that did not answer although its VM ran untouched is tried once more, below, not waited for.
    _wait_for_ssh(cluster, rebooted & set(cluster.of_role("guest")), ctx.options.guest_boot_timeout, progress)
    early = {s.name for s in _early_guest_steps()}
    guest_steps = [s for s in STEPS if s.role == "guest"]
    late = {s.name for s in guest_steps} - early
    plan.changes = [c for c in plan.changes if c.step not in late and not c.known_after_apply]
    observed = observe_remote(cluster, "guest", parallel)
    for name, error in observed.failed.items():
        if keep is None or keep.covers(name):
            outcome.failed[name + NOT_OBSERVED] = error
    facts = _facts_of(observed.ok)
    outcome.observed |= {target for _, target in facts}
    again = [c for step in guest_steps for c in plan_step(step, ctx, desired, facts)
             if step.name in late or c.target in ctx.unreachable]
    again = keep.keep(again) if keep else again
    refused = _refuse_unallowed(again, ctx.options, journal, outcome, progress)
    plan.changes.extend(c for c in again if c not in refused)
    if progress:
        why = "after VM changes" if rebooted else "as some did not answer when planned"
        progress("guest.*", "all guests", f"observed again {why}: "
                                          f"{sum(1 for c in plan.changes if c.step in late)} change(s)")
    return {c.target for c in refused}


def _refuse_unallowed(changes: list[Change], options: Options, journal: Journal, outcome: Outcome,
                      progress: Progress | None) -> list[Change]:
    """`check_allowed` for the guest changes planned during apply: those that need VM power-off
    without --allow-power-off (a guest step's only disruption that needs a flag) fail their guest
    and step, one line each, in the outcome, the journal and the progress. Returns them."""
    if options.allow_power_off:
        return []
    refused = [c for c in changes if c.disruption == Disruption.VM_POWER_OFF]
    by_key: dict[tuple[str, str], list[Change]] = {}
    for change in refused:
        by_key.setdefault((change.target, change.step), []).append(change)
    for (target, step), held in by_key.items():
        what = "; ".join(f"{c.field} {c.before} → {c.after}" for c in held)
        error = InputError(f"{what} needs VM power-off (found when the guest was observed again during apply): "
                           "not applied without --allow-power-off")
        outcome.failed[f"{target} ({step})"] = error
        journal.record_all("failed", list(held), error=str(error))
        if progress:
            progress(step, target, f"failed: {error}")
    return refused


# Guests just (re)started are asked again after 0.5 s, 1 s, then every 2 s (one `ssh true` each): one
# back within a second is not left waiting 5 s (the test bed's guests are back at once).
SSH_POLL_FIRST, SSH_POLL_MAX = 0.5, 2.0


def _wait_for_ssh(cluster: Cluster, guests: set[str], timeout: float, progress: Progress | None) -> None:
    """Wait (up to `timeout` s) until the guests that did not answer accept SSH; the ones that still
    do not are reported by the observation that follows."""
    deadline = time.monotonic() + timeout
    waiting = set(guests)
    tries = 0
    while waiting and time.monotonic() < deadline:
        for name in sorted(waiting):
            try:
                cluster.executors[name].run(["true"], timeout=30)
            except HostKeyError:
                pass  # it answers, with a key gpuvm refuses: the observation that follows says so
            except GpuvmError:
                continue
            waiting.discard(name)
            if progress and tries:
                progress("guest.*", name, "answers over SSH now")
        if waiting:
            if progress and not tries:
                progress("guest.*", listed(sorted(waiting)), f"waiting up to {timeout:.0f} s for SSH")
            time.sleep(min(SSH_POLL_MAX, SSH_POLL_FIRST * 2 ** tries))
            tries += 1


def _facts_of(results: dict[str, dict[str, Any]]) -> Facts:
    """Facts by (step, target), from each target's facts by step."""
    return {(step, target): fact for target, by_step in results.items() for step, fact in by_step.items()}


def raise_failures(outcome: Outcome) -> None:
    """One TargetFailures naming every 'target (step)' that failed, if any did."""
    GroupResult(failed=outcome.failed).raise_failures()
