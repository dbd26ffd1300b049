"""Reading a Slurm guest in one command (`script`, as root: the munge key's digest needs it) and
parsing what it printed (`parse`, pure). Sections start with `== name ==`."""

from __future__ import annotations

import re
from dataclasses import dataclass

from gpuvm.errors import RemoteCommandError
from gpuvm.parsers.cpus import LSCPU, CpuTopology, cpulist, parse_lscpu, parse_pci_cpus
from gpuvm.parsers.nvidia_caps import SOURCE as MIG_MINORS
from gpuvm.parsers.nvidia_caps import cap_device, compute_instance_cap, gpu_instance_cap, parse_mig_minors
from gpuvm.parsers.nvidia_smi import ComputeInstance, parse_compute_instances
from gpuvm.parsers.nvidia_topo import BUS_IDS, parse_bus_ids
from gpuvm.parsers.scontrol import SlurmNodeState, parse_nodes
from gpuvm.steps.guest_slurm.render import MigInstance, NodeHardware
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
    ("mig", "lci=$(nvidia-smi mig -lci 2>/dev/null); echo \"$lci\""),  # MIG devices: GPU, GPU and compute instance
    # the minors of those instances' capabilities (9 lines of mig-minors' ~4,300 a GPU instance) …
    ("mig_minors", "minors=$(echo \"$lci\" | awk 'NR == FNR { if ($1 == \"|\" && $2 ~ /^[0-9]+$/ && $3 ~ /^[0-9]+$/) "
                   "keep[\"gpu\" $2 \"/gi\" $3]; next } { split($1, p, \"/\") } (p[1] \"/\" p[2]) in keep' "
                   f"- {MIG_MINORS} 2>/dev/null); echo \"$minors\""),
    # … and which of their device files exist
    ("caps", "for m in $(echo \"$minors\" | awk '{ print $2 }'); do [ -c /dev/nvidia-caps/nvidia-cap$m ] && "
             "echo nvidia-cap$m; done; true"),
    # where each GPU is: its PCI address, that device's NUMA node and CPUs, and which core each CPU is
    ("bus_ids", f"{BUS_IDS} 2>/dev/null"),
    ("pci_cpus", "for d in /sys/bus/pci/devices/*; do [ \"$(cat $d/vendor 2>/dev/null)\" = 0x10de ] && "
                 "echo \"${d##*/} $(cat $d/numa_node) $(cat $d/local_cpulist)\"; done 2>/dev/null; true"),
    ("lscpu", f"{LSCPU} 2>/dev/null"),
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


def mig_instances(instances: list[ComputeInstance], minors: dict[str, int],
                  present: set[str]) -> tuple[MigInstance, ...]:
    """Each MIG device with the files Slurm needs to bind it (its GPU's, its GPU and compute instances'
    capability devices), those only when all are in `present` (device paths)."""
    found = []
    for ci in sorted(instances, key=lambda c: (c.gpu, c.gpu_instance_id, c.instance_id)):
        caps = (gpu_instance_cap(ci.gpu, ci.gpu_instance_id),
                compute_instance_cap(ci.gpu, ci.gpu_instance_id, ci.instance_id))
        files = (f"/dev/nvidia{ci.gpu}", *(cap_device(minors[c]) for c in caps if c in minors))
        found.append(MigInstance(ci.gpu, ci.profile, files if len(files) == 3 and set(files) <= present else ()))
    return tuple(found)


def gpu_cores(bus_ids: dict[int, str], pci: dict[str, tuple[int, frozenset[int]]], topology: CpuTopology,
              gpus: int) -> tuple[str, ...]:
    """Each GPU's cores (`cpulist` of Slurm's core indices), by index: those of its NUMA node's CPUs
    when the guest knows the node (a VM with virtual NUMA does; else numa_node is -1) and they are not
    all its CPUs; else ""."""
    cores = []
    for index in range(gpus):
        numa, cpus = pci.get(bus_ids.get(index, ""), (-1, frozenset()))
        known = numa >= 0 and cpus and cpus <= topology.core_of.keys() and cpus != topology.core_of.keys()
        cores.append(cpulist({topology.core_of[c] for c in cpus}) if known else "")
    return tuple(cores) if any(cores) else ()


def parse(text: str, address: str, controller: bool) -> GuestSlurm:
    s = _sections(text)
    packages = frozenset(line.split()[0] for line in s.get("packages", []) if line.endswith("install ok installed"))
    hostname = checked((s.get("hostname") or [""])[0].strip(), "a host name", "hostname -s")
    gpus = []
    for line in s.get("gpus", []):
        index, _, name = line.partition(",")
        if index.strip().isdigit():
            gpus.append(checked(name.strip(), "a product name", "nvidia-smi --query-gpu=index,name"))
    devices = tuple(f"/dev/{d.strip()}" for d in s.get("devices", []) if re.fullmatch(r"nvidia\d+", d.strip()))
    caps = {f"/dev/nvidia-caps/{c.strip()}" for c in s.get("caps", []) if re.fullmatch(r"nvidia-cap\d+", c.strip())}
    mig = mig_instances(parse_compute_instances("\n".join(s["mig"])) if s.get("mig") else [],
                        parse_mig_minors("\n".join(s.get("mig_minors", []))), {*devices, *caps})
    topology = parse_lscpu("\n".join(s.get("lscpu", [])))
    cores = gpu_cores(parse_bus_ids("\n".join(s.get("bus_ids", []))), parse_pci_cpus("\n".join(s.get("pci_cpus", []))),
                      topology, len(gpus))
    hardware = NodeHardware(hostname, address, _number(s.get("cpus", []), "CPU count", "getconf _NPROCESSORS_ONLN"),
                            _number(s.get("memory", []), "MemTotal", "/proc/meminfo") // 1024, tuple(gpus), devices, mig,
                            cores, topology.threads_per_core)
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
