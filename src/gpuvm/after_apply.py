"""Guests of VMs the plan creates: planned from the runbook alone, their changes known after apply.

A VM this run clones has no guest yet: its SSH address answers nothing until apply has created and
booted it. That is no target failing to answer (exit 3): each guest step the runbook asks of it is
planned as one change marked `known_after_apply` (Terraform's "(known after apply)"), which counts
as a change (`plan --detailed-exitcode` exits 2). `apply` never carries such a change out: once
its VMs changed it observes the guests and plans them for real (engine._replan_guests). A guest of
an existing VM that does not answer stays not observed, and so does a guest of a new VM that
answered wrong (a host key refused, an answer gpuvm cannot use): something else has its address.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from gpuvm.errors import HostKeyError, ObserveError
from gpuvm.plan import Change, Note
from gpuvm.steps.base import Step
from gpuvm.steps.vm_lifecycle import CloneVm

WHAT = "as the runbook asks"  # a placeholder's `after`: the values are the guest's, once it exists


def awaited(changes: Iterable[Change], unreachable: Mapping[str, Exception | str]) -> set[str]:
    """The guests not observed only because the plan creates their VM (guests are named after it)."""
    created = {c.target for c in changes if isinstance(c.action, CloneVm)}
    return {name for name, why in unreachable.items()
            if name in created and not isinstance(why, (HostKeyError, ObserveError))}


def planned(guests: Iterable[str], targets: Mapping[str, Any], steps: Iterable[Step]) -> list[Change]:
    """One change per guest step the runbook wants on each guest (`targets`: the SSH targets by name),
    in step order."""
    return [Change(step.name, name, "guest", "setup", None, WHAT, known_after_apply=True)
            for step in steps if step.over_ssh for name in sorted(guests)
            if targets[name].role == step.role and step.wanted(targets[name])]


def note(name: str, why: Exception | str) -> Note:
    return Note(name, "observe", f"not reachable over SSH yet ({why}): its VM is created by this run, so its "
                                 "guest steps are known after apply, which observes it once its VM runs", level="info")
