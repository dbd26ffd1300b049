"""nvidia-smi: `-L`, `--query-gpu=... --format=csv,noheader`, `mig -lgi`, `mig -lci`, `mig -lgip`, `mig -cgi`."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from gpuvm.parsers._common import unparseable
from gpuvm.untrusted import checked


@dataclass(frozen=True)
class MigDevice:
    profile: str  # "3g.40gb"
    device: int
    uuid: str


@dataclass(frozen=True)
class Gpu:
    index: int
    name: str
    uuid: str
    mig_devices: tuple[MigDevice, ...] = field(default=())


@dataclass(frozen=True)
class MigMode:
    index: int
    name: str
    current: str  # "Enabled" | "Disabled" | "[N/A]"
    pending: str

    @property
    def enabled(self) -> bool:
        return self.current == "Enabled"

    @property
    def pending_change(self) -> bool:
        return self.current != self.pending


@dataclass(frozen=True)
class GpuInstance:
    gpu: int
    profile: str  # "3g.40gb"
    profile_id: int
    instance_id: int
    placement_start: int
    placement_size: int


@dataclass(frozen=True)
class ComputeInstance:
    gpu: int
    gpu_instance_id: int
    profile: str  # "3g.40gb" (a compute instance spanning its GPU instance has the GPU instance's name)
    profile_id: int
    instance_id: int


@dataclass(frozen=True)
class GpuInstanceProfile:
    gpu: int
    profile: str
    profile_id: int
    free: int
    total: int
    memory_gib: float


@dataclass(frozen=True)
class CreatedInstance:
    kind: str  # "GPU" | "compute"
    instance_id: int
    gpu: int
    profile: str
    profile_id: int
    gpu_instance_id: int | None = None


_GPU = re.compile(r"^GPU (\d+): (.+?) \(UUID: (GPU-[0-9a-fA-F-]+)\)\s*$")
_MIG = re.compile(r"^\s+MIG (\S+)\s+Device\s+(\d+): \(UUID: (MIG-[^)]+)\)\s*$")
_LGI = re.compile(r"^\|\s+(\d+)\s+MIG (\S+)\s+(\d+)\s+(\d+)\s+(\d+):(\d+)\s+\|$")
_LCI = re.compile(r"^\|\s+(\d+)\s+(\d+)\s+MIG (\S+)\s+(\d+)\s+(\d+)\s+\d+:\d+\s+\|$")
_LGIP = re.compile(r"^\|\s+(\d+)\s+MIG (\S+)\s+(\d+)\s+(\d+)/(\d+)\s+([\d.]+)\s+")
_CGI = re.compile(
    r"^Successfully created GPU instance ID\s+(\d+) on GPU\s+(\d+) using profile MIG (\S+) \(ID\s+(\d+)\)$"
)
_CCI = re.compile(
    r"^Successfully created compute instance ID\s+(\d+) on GPU\s+(\d+) GPU instance ID\s+(\d+)"
    r" using profile MIG (\S+) \(ID\s+(\d+)\)$"
)


def parse_gpu_list(text: str) -> list[Gpu]:
    """`nvidia-smi -L`: GPUs, each with the MIG devices listed under it."""
    gpus: list[Gpu] = []
    migs: list[list[MigDevice]] = []
    for line in text.splitlines():
        if not line.strip():
            continue
        if m := _GPU.match(line):
            gpus.append(Gpu(int(m[1]), checked(m[2], "a product name", "nvidia-smi -L"), m[3]))
            migs.append([])
        elif (m := _MIG.match(line)) and gpus:
            migs[-1].append(MigDevice(checked(m[1], "a MIG profile", "nvidia-smi -L"), int(m[2]),
                                      checked(m[3], "a GPU UUID", "nvidia-smi -L")))
        else:
            raise unparseable("nvidia-smi -L", "lines 'GPU N: NAME (UUID: GPU-...)' and '  MIG ... Device N: (UUID: MIG-...)'", line)
    return [Gpu(g.index, g.name, g.uuid, tuple(m)) for g, m in zip(gpus, migs)]


def parse_mig_query_csv(text: str) -> list[MigMode]:
    """`nvidia-smi --query-gpu=index,name,mig.mode.current,mig.mode.pending --format=csv,noheader`."""
    command = "nvidia-smi --query-gpu=index,name,mig.mode.current,mig.mode.pending --format=csv,noheader"
    modes = []
    for line in text.splitlines():
        if not line.strip():
            continue
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 4 or not parts[0].isdigit():
            raise unparseable(command, "4 comma-separated fields: index, name, current and pending MIG mode", line)
        modes.append(MigMode(int(parts[0]), checked(parts[1], "a product name", command),
                             checked(parts[2], "a MIG mode", command), checked(parts[3], "a MIG mode", command)))
    return modes


def _box_rows(text: str, title: str, command: str) -> list[str]:
    nothing = ("No MIG-enabled devices found", "No GPU instances found", "No compute instances found")
    if any(none in text for none in nothing):
        return []
    lines = [line.rstrip() for line in text.splitlines() if line.strip()]
    if not lines or not lines[0].startswith("+-") or not any(title in line for line in lines[:3]):
        raise unparseable(command, f"a boxed table titled '{title}'", text)
    try:
        body = next(i for i, line in enumerate(lines) if line.startswith("|="))
    except StopIteration:
        raise unparseable(command, "a '|====|' line under the table header", text) from None
    return [line for line in lines[body + 1 :] if line.startswith("|")]


def parse_gpu_instances(text: str) -> list[GpuInstance]:
    """`nvidia-smi mig -lgi` (empty when MIG is off or no instance exists)."""
    rows = []
    for line in _box_rows(text, "GPU instances:", "nvidia-smi mig -lgi"):
        m = _LGI.match(line)
        if not m:
            raise unparseable("nvidia-smi mig -lgi", "rows '| GPU  MIG <profile>  <profile id>  <instance id>  <start>:<size> |'", line)
        rows.append(GpuInstance(int(m[1]), checked(m[2], "a MIG profile", "nvidia-smi mig -lgi"), int(m[3]), int(m[4]),
                                int(m[5]), int(m[6])))
    return rows


def parse_compute_instances(text: str) -> list[ComputeInstance]:
    """`nvidia-smi mig -lci` (empty when MIG is off or no instance exists)."""
    rows = []
    for line in _box_rows(text, "Compute instances:", "nvidia-smi mig -lci"):
        m = _LCI.match(line)
        if not m:
            raise unparseable("nvidia-smi mig -lci",
                              "rows '| GPU  GI  MIG <profile>  <profile id>  <instance id>  <start>:<size> |'", line)
        rows.append(ComputeInstance(int(m[1]), int(m[2]), checked(m[3], "a MIG profile", "nvidia-smi mig -lci"),
                                    int(m[4]), int(m[5])))
    return rows


def parse_gpu_instance_profiles(text: str) -> list[GpuInstanceProfile]:
    """`nvidia-smi mig -lgip`: each profile's id and free/total instances (second row lines skipped)."""
    rows = []
    for line in _box_rows(text, "GPU instance profiles:", "nvidia-smi mig -lgip"):
        if "MIG" not in line:
            continue  # the CE/JPEG/OFA continuation row
        m = _LGIP.match(line)
        if not m:
            raise unparseable("nvidia-smi mig -lgip", "rows '| GPU  MIG <profile>  <id>  <free>/<total>  <GiB> ...'", line)
        rows.append(GpuInstanceProfile(int(m[1]), checked(m[2], "a MIG profile", "nvidia-smi mig -lgip"), int(m[3]),
                                       int(m[4]), int(m[5]), float(m[6])))
    return rows


def parse_created_instances(text: str) -> list[CreatedInstance]:
    """`nvidia-smi mig -cgi ... [-C]`: the GPU and compute instances it reports as created."""
    created = []
    for line in text.splitlines():
        if m := _CGI.match(line.strip()):
            created.append(CreatedInstance("GPU", int(m[1]), int(m[2]), checked(m[3], "a MIG profile", "nvidia-smi mig -cgi"),
                                           int(m[4])))
        elif m := _CCI.match(line.strip()):
            created.append(CreatedInstance("compute", int(m[1]), int(m[2]),
                                           checked(m[4], "a MIG profile", "nvidia-smi mig -cgi"), int(m[5]), int(m[3])))
    if not created:
        raise unparseable("nvidia-smi mig -cgi", "'Successfully created GPU instance ID ...' lines", text)
    return created
