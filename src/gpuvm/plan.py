"""Plans are data: a list of `Change`s, each naming target, resource, field, before and after.

Steps return changes from a pure `plan`; the renderer prints them, `apply` carries out exactly
them, the journal records them. `action` is what `apply` does: a small frozen dataclass of the
step's own (never shown, never a secret); None where nothing is done by this step (a setting
made earlier that waits for a reboot, which the reboot step carries out).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from enum import Enum
from typing import Any


class Disruption(str, Enum):
    NONE = "none"
    VM_POWER_OFF = "vm-power-off"       # the VM must be powered off for this change
    HOST_REBOOT = "host-reboot"         # takes effect after a host reboot (maintenance mode)
    VM_DESTROY = "vm-destroy"           # the VM and its disks are deleted

    @property
    def label(self) -> str:
        return {"none": "", "vm-power-off": "needs VM power-off", "host-reboot": "needs host reboot",
                "vm-destroy": "DESTROYS THE VM (--allow-destroy)"}[self.value]


@dataclass(frozen=True)
class Change:
    step: str
    target: str
    resource: str
    field: str
    before: Any
    after: Any
    disruption: Disruption = Disruption.NONE
    action: Any = field(default=None, compare=False)
    # planned from the runbook alone (a guest of a VM this plan creates): apply observes the target, then plans it
    known_after_apply: bool = False

    @property
    def pending(self) -> bool:
        """Configured already, not active until the host reboots: the reboot is what remains to do."""
        return self.action is None and self.disruption == Disruption.HOST_REBOOT

    @property
    def disruption_label(self) -> str:
        return "pending: needs host reboot" if self.pending else self.disruption.label

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["disruption"] = self.disruption.value
        data["pending"] = self.pending
        data.pop("action")
        return data


WHOLE_RUN = "-"  # the target of a Note about the whole run (a snapshot plan, targets not given)
NOT_TARGETED = "target"  # the step of the Note on changes of targets --target left out of scope


@dataclass(frozen=True)
class Note:
    """Something the user should know that is not a change (a warning, a skipped target)."""

    target: str  # WHOLE_RUN: about the run, no one target
    step: str
    message: str
    level: str = "warning"


@dataclass(frozen=True)
class LeftOut:
    """A change on a target given with `--target` that is not carried out now, and why (it waits on
    a target not given). It is still drift: it counts, and is listed."""

    change: Change
    why: str


@dataclass
class Plan:
    changes: list[Change] = field(default_factory=list)
    notes: list[Note] = field(default_factory=list)
    unobserved: dict[str, str] = field(default_factory=dict)  # targets that could not be read → why
    left_out: list[LeftOut] = field(default_factory=list)  # `--target`: changes in scope not carried out now

    @property
    def empty(self) -> bool:
        """Nothing to carry out (there may still be changes left out, or targets not observed)."""
        return not self.changes

    @property
    def complete(self) -> bool:
        """Every target in scope observed, and nothing in scope left out: only then can "no changes"
        mean the infrastructure matches the runbook."""
        return not self.unobserved and not self.left_out

    def left_out_by_target(self) -> dict[str, str]:
        """Targets with changes left out → why (their reasons joined)."""
        why: dict[str, list[str]] = {}
        for left in self.left_out:
            reasons = why.setdefault(left.change.target, [])
            if left.why not in reasons:
                reasons.append(left.why)
        return {target: "; ".join(reasons) for target, reasons in why.items()}

    def for_step(self, step: str) -> list[Change]:
        return [c for c in self.changes if c.step == step]

    def disruptive(self, kind: Disruption) -> list[Change]:
        return [c for c in self.changes if c.disruption == kind]

    def targets(self) -> list[str]:
        return list(dict.fromkeys(c.target for c in self.changes))

    def to_dict(self) -> dict[str, Any]:
        return {
            "changes": [c.to_dict() for c in self.changes],
            "notes": [asdict(n) for n in self.notes],
            "summary": {
                "changes": len(self.changes),
                "targets": len(self.targets()),
                "vm_power_off": len(self.disruptive(Disruption.VM_POWER_OFF)),
                "host_reboot": len(self.disruptive(Disruption.HOST_REBOOT)),
                "vm_destroy": len(self.disruptive(Disruption.VM_DESTROY)),
                "pending": sum(1 for c in self.changes if c.pending),
                "not_observed": len(self.unobserved),
                "left_out": len(self.left_out),
                "known_after_apply": sum(1 for c in self.changes if c.known_after_apply),
            },
        }
