"""Reading a Slurm guest in one command (`script`, as root: the munge key's digest needs it) and
parsing what it printed (`parse`, pure). Sections start with `== name ==`."""

from __future__ import annotations

import re
from dataclasses import dataclass

from gpuvm.errors import RemoteCommandError
from gpuvm.parsers.scontrol import SlurmNodeState, parse_nodes
from gpuvm.steps.guest_slurm.render import NodeHardware
from gpuvm.untrusted import checked

PACKAGES = ("munge", "slurmd", "slurmctld", "slurm-client")
SERVICES = ("munge", "slurmd", "slurmctld")
CONFIGS = ("/etc/slurm/slurm.conf", "/etc/slurm/gres.conf", "/etc/slurm/cgroup.conf", "/etc/default/slurmd")
MUNGE_KEY = "/etc/munge/munge.key"


READS = (  # section → the command that reads it; each prints nothing it does not know (2>/dev/null)
    ("packages", "dpkg-query -W -f '${Package} ${Status}\\n' " + " ".join(PACKAGES) + " 2>/dev/null"),
    ("hostname", "hostname -s"),
    ("cpus", "getconf _NPROCESSORS_ONLN"),
    ("memory", "grep '^MemTotal:' /proc/meminfo"),
    ("gpus", "nvidia-smi --query-gpu=index,name --format=csv,noheader 2>/dev/null"),
    ("devices", "ls -1 /dev/ 2>/dev/null | grep -E '^nvidia[0-9]+$'"),
    ("key", f"sha256sum {MUNGE_KEY} 2>/dev/null && stat -c '%a %U' {MUNGE_KEY}"),
    ("configs", "sha256sum " + " ".join(CONFIGS) + " 2>/dev/null"),
    ("services", "systemctl is-active " + " ".join(SERVICES) + " 2>/dev/null"),
)
NODES = ("nodes", "scontrol show node -o 2>/dev/null")  # the controller's: Slurm's own view


def script(controller: bool) -> str:
    """The observe command: packages, hardware, key and config digests, services, and on the
    controller Slurm's own view of the nodes."""
    reads = READS + ((NODES,) if controller else ())
    return "; ".join(f"echo '== {section} =='; {command}" for section, command in reads) + "; true"


@dataclass(frozen=True)
class GuestSlurm:
    """One guest's Slurm, as read."""

    packages: frozenset[str]  # installed
    hardware: NodeHardware
    key_sha256: str | None  # /etc/munge/munge.key's; None: none there
    key_mode: str  # "400 munge"
    configs: dict[str, str]  # path → sha256 of the files present
    active: frozenset[str]  # services running
    nodes: tuple[SlurmNodeState, ...] | None = None  # the controller's `scontrol show node`; None: elsewhere, or slurmctld down


def _sections(text: str) -> dict[str, list[str]]:
    sections: dict[str, list[str]] = {}
    current = None
    for line in text.splitlines():
        if m := re.fullmatch(r"== (\w+) ==", line.strip()):
            current = sections.setdefault(m[1], [])
        elif current is not None and line.strip():
            current.append(line.rstrip())
    return sections


def _number(lines: list[str], what: str, source: str) -> int:
    m = re.search(r"\d{1,12}", lines[0]) if lines else None
    if m is None:
        raise RemoteCommandError(f"`{source}` printed no {what}")
    return int(m[0])


def parse(text: str, address: str, controller: bool) -> GuestSlurm:
    s = _sections(text)
    packages = frozenset(line.split()[0] for line in s.get("packages", []) if line.endswith("install ok installed"))
    hostname = checked((s.get("hostname") or [""])[0].strip(), "a host name", "hostname -s")
    gpus = []
    for line in s.get("gpus", []):
        index, _, name = line.partition(",")
        if index.strip().isdigit():
            gpus.append(checked(name.strip(), "a product name", "nvidia-smi --query-gpu=index,name"))
    hardware = NodeHardware(hostname, address, _number(s.get("cpus", []), "CPU count", "getconf _NPROCESSORS_ONLN"),
                            _number(s.get("memory", []), "MemTotal", "/proc/meminfo") // 1024, tuple(gpus),
                            tuple(f"/dev/{d.strip()}" for d in s.get("devices", []) if re.fullmatch(r"nvidia\d+", d.strip())))
    key = s.get("key", [])
    digest = key[0].split()[0] if key and re.fullmatch(r"[0-9a-f]{64}", key[0].split()[0]) else None
    configs = {}
    for line in s.get("configs", []):
        fields = line.split()
        if len(fields) == 2 and re.fullmatch(r"[0-9a-f]{64}", fields[0]):
            configs[fields[1]] = fields[0]
    active = frozenset(service for service, state in zip(SERVICES, s.get("services", [])) if state.strip() == "active")
    nodes = tuple(parse_nodes("\n".join(s["nodes"]))) if controller and "slurmctld" in active and "nodes" in s else None
    return GuestSlurm(packages, hardware, digest, key[1] if len(key) > 1 else "", configs, active, nodes)
