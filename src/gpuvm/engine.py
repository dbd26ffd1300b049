"""The engine: observe once, plan every step, apply step by step with targets in parallel.

Steps run in a fixed order (hosts first, then VMs). Within a step its targets run in parallel,
bounded by `parallel`. A target that fails does not stop the others; later steps skip the targets
that depend on it (the same VM, or VMs on a failed host). One summary at the end.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from gpuvm.errors import GpuvmError, InputError, TargetFailures
from gpuvm.journal import Journal
from gpuvm.plan import Change, Disruption, Plan
from gpuvm.resolve import Desired, resolve
from gpuvm.runbook.model import Runbook
from gpuvm.secrets import redact
from gpuvm.steps import host_graphics, host_passthrough, host_reboot, vm_advanced, vm_hardware, vm_power
from gpuvm.steps.base import ApplyContext
from gpuvm.vsphere.facts import Inventory

STEPS = [
    host_passthrough.HostPassthroughStep,
    host_graphics.HostGraphicsStep,
    host_reboot.HostRebootStep,
    vm_hardware.VmHardwareStep,
    vm_advanced.VmAdvancedStep,
    vm_power.VmPowerStep,
]


def make_plan(runbook: Runbook, inventory: Inventory) -> tuple[Plan, Desired]:
    desired = resolve(runbook, inventory)
    plan = Plan(notes=list(desired.notes))
    for step in STEPS:
        plan.changes.extend(step.plan(desired, inventory, list(plan.changes)))
    return plan, desired


def check_allowed(plan: Plan, desired: Desired, allow_power_off: bool, allow_host_reboot: bool) -> None:
    """Refuse, before touching anything, disruptive changes the user has not allowed."""
    problems = []
    power = plan.disruptive(Disruption.VM_POWER_OFF)
    if power and not allow_power_off:
        vms = ", ".join(dict.fromkeys(c.target for c in power))
        problems.append(f"VM(s) {vms} must be powered off for {len(power)} change(s): pass --allow-power-off")
    reboots = [c for c in plan.changes if c.step == host_reboot.NAME]
    if reboots and not allow_host_reboot:
        problems.append(f"host(s) {', '.join(c.target for c in reboots)} must reboot: pass --allow-host-reboot")
    for change in reboots:
        if not desired.hosts[change.target].allow_reboot:
            problems.append(f"host {change.target} must reboot but the runbook does not allow it "
                            "(set allow_maintenance: true and allow_reboot: true on the host)")
    if problems:
        raise InputError("refusing to apply; nothing was changed:\n  " + "\n  ".join(problems))


@dataclass
class Outcome:
    done: dict[str, list[Change]] = field(default_factory=dict)  # target → changes done
    failed: dict[str, GpuvmError | Exception] = field(default_factory=dict)  # "target (step)" → error
    skipped: dict[str, str] = field(default_factory=dict)
    seconds: float = 0.0


def _blocked(target: str, step_scope: str, failed_targets: set[str], desired: Desired) -> str | None:
    if target in failed_targets:
        return f"an earlier step failed on {target}"
    if step_scope == "vm":
        host = desired.vms[target].host if target in desired.vms else None
        if host in failed_targets:
            return f"its host {host} failed"
    return None


def apply_plan(plan: Plan, desired: Desired, ctx: ApplyContext, journal: Journal, parallel: int = 8,
               progress: Callable[[str, str, str], None] | None = None) -> Outcome:
    outcome = Outcome()
    start = time.monotonic()
    failed_targets: set[str] = set()
    journal.record("run-start", changes=len(plan.changes))
    for step in STEPS:
        changes = plan.for_step(step.name)
        by_target: dict[str, list[Change]] = {}
        for change in changes:
            by_target.setdefault(change.target, []).append(change)
        runnable = {}
        for target, target_changes in by_target.items():
            reason = _blocked(target, step.scope, failed_targets, desired)
            if reason:
                outcome.skipped[f"{target} ({step.name})"] = reason
                for change in target_changes:
                    journal.record("skipped", change, reason=reason)
            else:
                runnable[target] = target_changes
        if not runnable:
            continue

        def run(target: str, step=step) -> None:  # noqa: B023 - bound per step
            target_changes = runnable[target]
            for change in target_changes:
                journal.record("started", change)
            if progress:
                progress(step.name, target, "started")
            try:
                step.apply(ctx, target, target_changes)
            except Exception as error:
                message = redact(str(error)) if isinstance(error, GpuvmError) else redact(f"{type(error).__name__}: {error}")
                for change in target_changes:
                    journal.record("failed", change, error=message)
                if progress:
                    progress(step.name, target, f"failed: {message}")
                raise
            for change in target_changes:
                journal.record("done", change)
            if progress:
                progress(step.name, target, f"done ({len(target_changes)} change(s))")

        with ThreadPoolExecutor(max_workers=max(1, parallel)) as pool:
            futures = {target: pool.submit(run, target) for target in runnable}
        for target, future in futures.items():
            error = future.exception()
            if error is None:
                outcome.done.setdefault(target, []).extend(runnable[target])
            else:
                failed_targets.add(target)
                outcome.failed[f"{target} ({step.name})"] = error
    outcome.seconds = time.monotonic() - start
    journal.record("run-end", failed=len(outcome.failed), seconds=round(outcome.seconds, 3))
    return outcome


def raise_failures(outcome: Outcome) -> None:
    if outcome.failed:
        raise TargetFailures(outcome.failed)
