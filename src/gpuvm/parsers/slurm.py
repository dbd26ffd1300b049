"""What Slurm's controller says about nodes and jobs, as gpuvm reads it before a host reboot.

`scontrol show node -o`: one line per node, `key=value` pairs; `State=` is the base state with its
flags (`IDLE+DRAIN`, `ALLOCATED+DRAIN`, `DOWN+NOT_RESPONDING`), `Reason=` is last on the line and
holds spaces, followed by who set it and when (`[root@2026-11-29T00:15:00]`), which is cut off.

`squeue -h -o '%i|%u|%T|%j'`: one job a line (id, user, state, name); the name is last and may hold
`|`. Names and ids are held to Slurm's grammar: they appear in gpuvm's messages and command lines.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from gpuvm.parsers._common import unparseable

NODE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")  # what gpuvm names a Slurm node (and finds there)
JOB_FORMAT = "%i|%u|%T|%j"
_NODE = re.compile(r"^NodeName=(\S+) ")
_STATE = re.compile(r" State=([A-Z_+*]+)")
_REASON = re.compile(r" Reason=(.*?)(?: \[[^\]@]*@[^\]]*\])?$")
_JOB = re.compile(r"^([0-9_\[\]+-]+)\|([^|]*)\|([A-Z_]+)\|(.*)$")


@dataclass(frozen=True)
class NodeState:
    state: str  # IDLE+DRAIN
    reason: str = ""

    @property
    def flags(self) -> set[str]:
        return set(self.state.rstrip("*").split("+"))

    @property
    def drained(self) -> bool:
        """Drained, draining, or out of service (down, failed): set by someone, no job starts on it."""
        return bool(self.flags & {"DRAIN", "DOWN", "FAIL", "FAILING"})


@dataclass(frozen=True)
class Job:
    id: str
    user: str
    state: str  # RUNNING, COMPLETING, SUSPENDED, ...
    name: str

    def shown(self) -> str:
        return f"{self.id} ({self.user}: {self.name[:40]})"


def nodes(text: str) -> dict[str, NodeState]:
    """`scontrol show node -o`, by node name."""
    found = {}
    for line in text.splitlines():
        if not line.strip():
            continue
        name, state = _NODE.match(line), _STATE.search(line)
        if name is None or state is None or not NODE_NAME.fullmatch(name.group(1)):
            raise unparseable("scontrol show node -o", "one NodeName=... State=... line per node", line)
        reason = _REASON.search(line)
        found[name.group(1)] = NodeState(state.group(1), reason.group(1).strip() if reason else "")
    return found


def jobs(text: str) -> list[Job]:
    """`squeue -h -o '%i|%u|%T|%j'`."""
    found = []
    for line in text.splitlines():
        if not line.strip():
            continue
        job = _JOB.match(line.strip())
        if job is None:
            raise unparseable(f"squeue -h -o '{JOB_FORMAT}'", "id|user|state|name lines", line)
        found.append(Job(*job.groups()))
    return found
