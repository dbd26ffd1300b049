"""`squeue -h -o '%i|%u|%T|%j'`: the jobs on the nodes a host reboot drains, one a line (id, user,
state, name); the name is last and may hold `|`. Ids are held to Slurm's grammar: they appear in
gpuvm's messages. (`scontrol show node -o` is parsers/scontrol.py's.)"""

from __future__ import annotations

import re
from dataclasses import dataclass

from gpuvm.parsers._common import unparseable

JOB_FORMAT = "%i|%u|%T|%j"
_JOB = re.compile(r"^([0-9_\[\]+-]+)\|([^|]*)\|([A-Z_]+)\|(.*)$")


@dataclass(frozen=True)
class Job:
    id: str
    user: str
    state: str  # RUNNING, COMPLETING, SUSPENDED, ...
    name: str

    def shown(self) -> str:
        return f"{self.id} ({self.user}: {self.name[:40]})"


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
