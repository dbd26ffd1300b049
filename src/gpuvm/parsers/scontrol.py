"""`scontrol show node -o`: one line per node, `Key=Value` pairs; Reason's value has spaces."""

from __future__ import annotations

import re
from dataclasses import dataclass

# Reasons Slurm sets itself (a person's drain has their own words): gpuvm resumes and waits for these only
SLURMS_REASONS = ("Not responding", "gres/", "Node unexpectedly rebooted", "Kill task failed")
_KEY = re.compile(r"(?:^|\s)([A-Za-z][A-Za-z0-9_.:/]*)=")


@dataclass(frozen=True)
class SlurmNodeState:
    name: str
    state: str  # IDLE, ALLOC, MIXED, DOWN+NOT_RESPONDING, IDLE+DRAIN, ... as scontrol prints it
    gres: str  # Gres= as slurmctld counts it ("(null)" → "")
    reason: str = ""  # without the "[user@time]" tail
    address: str = ""  # NodeAddr

    @property
    def healthy(self) -> bool:
        """Up and taking jobs: IDLE, ALLOC or MIXED, neither down, drained, failing nor not responding."""
        flags = set(self.state.split("+"))
        return bool(flags & {"IDLE", "ALLOCATED", "ALLOC", "MIXED", "COMPLETING"}) and not flags & {
            "DOWN", "DRAIN", "DRAINED", "DRAINING", "FAIL", "FAILING", "NOT_RESPONDING", "UNKNOWN", "INVALID_REG",
            "POWERED_DOWN", "REBOOT_REQUESTED"} and not self.state.endswith("*")


def parse_fields(line: str) -> dict[str, str]:
    """One line's Key=Value pairs; a value runs up to the next ` Key=`."""
    matches = list(_KEY.finditer(line))
    fields = {}
    for m, nxt in zip(matches, matches[1:] + [None]):
        fields[m[1]] = line[m.end():nxt.start() if nxt else len(line)].strip()
    return fields


def parse_nodes(text: str) -> list[SlurmNodeState]:
    nodes = []
    for line in text.splitlines():
        fields = parse_fields(line)
        if "NodeName" not in fields:
            continue
        gres = fields.get("Gres", "")
        reason = re.sub(r"\s*\[[^\]]*@[^\]]*\]$", "", fields.get("Reason", "")).strip()
        nodes.append(SlurmNodeState(fields["NodeName"], fields.get("State", "UNKNOWN"),
                                    "" if gres == "(null)" else gres, "" if reason == "(null)" else reason,
                                    fields.get("NodeAddr", "")))
    return nodes


def slurms_reason(reason: str) -> bool:
    """Whether a node's reason is Slurm's own (none, or one of SLURMS_REASONS), not a person's: a drain
    someone set is theirs to lift."""
    return not reason or reason.startswith(SLURMS_REASONS)
