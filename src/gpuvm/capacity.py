"""Capacity, exclusivity and compatibility of the devices resolve() chose, checked before anything is touched.

Host by host, against the inventory — VMs the runbook does not manage included, powered on or not:
- a GPU that is passthrough (enabled, active, or selected by the runbook) serves no vGPU;
- dynamic DirectPath: the host's passthrough GPUs of the PCI id, less those held by classic
  DirectPath, cover the dynamic counts of every VM on the host;
- vGPU: every instance finds a GPU with room (`place_vgpu`, the rules below);
- each VM's hardware version is at least what its devices need (`hw_versions.py`), and its vCPUs at most the host's
  logical CPUs.
The first failure is an InputError naming the runbook line, the VM, the host and the GPU.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from gpuvm.desired import Desired, DesiredDevice
from gpuvm.errors import InputError, listed
from gpuvm.hw_versions import hw_version, needed_hw_version
from gpuvm.mig import GpuModel, gpu_model
from gpuvm.pci import pci_id
from gpuvm.plan import Note
from gpuvm.runbook.model import Runbook
from gpuvm.vgpu_profiles import VgpuProfile, vgpu_profile
from gpuvm.vsphere.facts import HostFacts, Inventory, PciDevice, VmFacts, VmPciDevice

# vGPU placement rules (NVIDIA Virtual GPU Software User Guide, "Virtual GPU Types" and "Valid Virtual
# GPU Configurations on a Single GPU"; vSphere API HostGraphicsInfoVgpuMode: sameSize, mixedSize,
# multiInstanceGpu — one mode per GPU):
# - time-sliced: a GPU in equal-size mode (the default) runs vGPUs of one frame-buffer size, as many
#   as its memory holds (grid_a100-20c: 2 on a 40 GB A100; grid_h100-80c: 1 on an H100 80GB);
# - MIG-backed: only on a GPU in MIG mode, which then runs no time-sliced vGPU; an instance takes
#   its profile's compute and memory slices (7 and 8 per A100/H100, 3g.20gb takes 3 and 4) and a
#   profile has a most-per-GPU count (gpuvm.mig, from NVIDIA's MIG user guide).
# A vGPU goes to a GPU already running vGPUs it can join, else to the first free one; gpusim places
# them the same way, so a plan that fits here powers on there.
@dataclass
class GpuRoom:
    device: PciDevice
    memory_gb: int | None
    mig: bool | None  # MIG mode; None: not known
    blocked: str = ""  # why it serves no vGPU at all
    size: int | None = None  # frame buffer of the time-sliced vGPUs it runs
    compute: int = 0  # MIG slices taken
    memory: int = 0
    users: list[tuple[str, str]] = field(default_factory=list)  # (VM, profile)

    @property
    def model(self) -> GpuModel | None:
        return gpu_model(self.device.device_name)

    def _by(self) -> str:
        return listed(sorted({vm for vm, _ in self.users}))

    def refusal(self, p: VgpuProfile) -> str | None:
        """Why this GPU cannot take one more vGPU of profile p; None if it can."""
        if self.blocked:
            return self.blocked
        if p.slices is None:
            if self.mig:
                return "is in MIG mode (time-sliced vGPUs need it off)"
            if self.compute:
                return f"runs MIG-backed vGPUs of {self._by()}"
            if self.size is not None and self.size != p.memory_gb:
                return f"runs {self.size} GB vGPUs of {self._by()} (one size per GPU)"
            if self.memory_gb is not None and (len(self.users) + 1) * p.memory_gb > self.memory_gb:
                return f"is full: {len(self.users)} x {p.memory_gb} GB of {self.memory_gb} GB used by {self._by()}"
            return None
        if self.mig is False:
            return "is not in MIG mode"
        if self.size is not None:
            return f"runs time-sliced vGPUs of {self._by()}"
        model = self.model
        spec = model.profiles.get(p.mig_profile) if model else None
        if model is None or spec is None:
            return None  # a GPU or profile gpuvm has no slice table for: not checked
        same = sum(1 for _, name in self.users if name == p.name)
        if (same >= spec.max_count or self.compute + spec.compute > model.compute_slices
                or self.memory + spec.memory > model.memory_slices):
            return (f"has {model.compute_slices - self.compute} of {model.compute_slices} MIG compute slices free "
                    f"({p.mig_profile} needs {spec.compute}; used by {self._by()})")
        return None

    def take(self, vm: str, p: VgpuProfile) -> None:
        self.users.append((vm, p.name))
        if p.slices is None:
            self.size, self.mig = p.memory_gb, False if self.mig is None else self.mig
            return
        self.mig = True
        model = self.model
        spec = model.profiles.get(p.mig_profile) if model else None
        if spec:
            self.compute, self.memory = self.compute + spec.compute, self.memory + spec.memory


def place_vgpu(gpus: list[GpuRoom], vm: str, p: VgpuProfile) -> str | None:
    """Put one vGPU on a GPU (one already in use first); return why none can take it, or None."""
    fits = [g for g in gpus if g.refusal(p) is None]
    if fits:
        min(fits, key=lambda g: (not g.users, g.device.id)).take(vm, p)
        return None
    return "; ".join(f"GPU {g.device.id} {g.refusal(p)}" for g in gpus) or "the host has no NVIDIA GPU"


@dataclass
class _Host:
    """One host's facts and what every VM on it (managed or not) holds or asks for."""

    rb: Runbook
    facts: HostFacts
    index: int  # in rb.hosts
    passthrough: set[str]  # GPU addresses that are (or will be) passthrough
    held: dict[str, str]  # address → VM holding it by classic DirectPath
    vms: list[tuple[int, str, list[DesiredDevice]]]  # runbook VMs: (index in rb.vms, name, desired devices)
    unmanaged: list[VmFacts]  # VmFacts of other VMs on the host

    def error(self, i: int, loc: tuple, vm: str, message: str) -> InputError:
        return self.rb.error(("vms", i) + loc, f"VM {vm} on host {self.facts.name}: {message}")


def check_capacity(rb: Runbook, inventory: Inventory, desired: Desired) -> None:
    """Every check above, host by host; MIG modes gpuvm cannot know become plan notes."""
    managed = {vm.name for vm in rb.vms}
    by_host: dict[str, list[tuple[int, str, list[DesiredDevice]]]] = {}  # one pass over the VMs, not one a host
    for i, vm in enumerate(rb.vms):
        if vm.state == "present":
            by_host.setdefault(vm.host, []).append((i, vm.name, desired.vms[vm.name].devices))
    for h, host in enumerate(rb.hosts):
        scope = _host_scope(rb, inventory, desired, h, by_host.get(host.name, []), managed)
        _check_versions_and_cpus(scope, inventory, desired)
        _check_dynamic(scope)
        _check_vgpus(scope, desired)


def _host_scope(rb: Runbook, inventory: Inventory, desired: Desired, h: int,
                vms: list[tuple[int, str, list[DesiredDevice]]], managed: set[str]) -> _Host:
    name = rb.hosts[h].name
    facts = inventory.hosts[name]
    selected = set(desired.hosts[name].passthrough)
    released = set(desired.hosts[name].release)  # turned off before the VMs power on (the host reboots first)
    passthrough = {d.id for d in facts.gpus
                   if (d.passthru_enabled or d.passthru_active or d.id in selected) and d.id not in released}
    unmanaged = [vm for vm in inventory.vms_on(name) if vm.name not in managed]
    held = {d.address: vm.name for vm in unmanaged for d in vm.pci if d.kind == "classic" and d.address}
    held |= {d.address: vm for _, vm, devices in vms for d in devices if d.kind == "classic" and d.address}
    return _Host(rb, facts, h, passthrough, held, vms, unmanaged)


def _check_versions_and_cpus(s: _Host, inventory: Inventory, desired: Desired) -> None:
    """vCPUs fit the host; the hardware version the VM will have (its own, or the runbook's
    hardware_version that vm.version upgrades it to) is what its features need."""
    for i, name, devices in s.vms:
        vm = s.rb.vms[i]
        if vm.cpus and s.facts.cpu_threads and vm.cpus > s.facts.cpu_threads:
            raise s.error(i, ("cpus",), name, f"{vm.cpus} vCPUs but the host has {s.facts.cpu_threads} logical CPUs")
        have = inventory.vms[name].hw_version
        version = max(filter(None, (hw_version(have), hw_version(vm.hardware_version))), default=None)
        needs = needed_hw_version(devices, desired.vms[name].extra_config)
        if version is None or needs is None or version >= needs[0]:
            continue
        need, feature, release = needs
        why = f"{feature} needs hardware version vmx-{need} or later (compatible with {release} and later)"
        if vm.hardware_version:
            raise s.error(i, ("hardware_version",), name, f"{why}; hardware_version {vm.hardware_version} is older")
        raise s.error(i, ("gpus",) if vm.gpus else ("nics",), name,
                      f"{why} but the VM is {have}: set hardware_version: vmx-{need} to have gpuvm upgrade it "
                      "(the VM powered off)")


def _check_dynamic(s: _Host) -> None:
    """Sum of dynamic DirectPath counts ≤ the host's passthrough GPUs of that id not held by classic."""
    wanted: Counter = Counter()
    for vm in s.unmanaged:
        wanted.update(_pci(d) for d in vm.pci if d.kind == "dynamic")
    for i, name, devices in s.vms:
        mine = Counter(_pci(d) for d in devices if d.kind == "dynamic")
        for pci, count in mine.items():
            wanted[pci] += count
            gpus = [d.id for d in s.facts.gpus if d.pci_id == pci and d.id in s.passthrough]
            pool = [a for a in gpus if a not in s.held]
            if wanted[pci] > len(pool):
                left = max(0, len(pool) - (wanted[pci] - count))
                held = sorted({s.held[a] for a in gpus if a in s.held})
                why = f"; classic DirectPath holds {len(gpus) - len(pool)} ({', '.join(held)})" if held else ""
                others = wanted[pci] - count
                why += f"; {others} go to dynamic DirectPath of other VMs" if others else ""
                raise s.error(i, ("gpus", "count"), name,
                              f"needs {count} dynamic DirectPath GPU(s) {pci} but {left} of the host's "
                              f"{len(gpus)} passthrough GPU(s) {pci} are left for it{why}")


def _pci(device: DesiredDevice | VmPciDevice) -> str:
    return pci_id(device.vendor_id or 0, device.device_id or 0)


def _mig_modes(s: _Host) -> dict[str, bool | None]:
    """MIG mode per GPU address: from the runbook's hosts[].mig (GPU indices in PCI order), else unknown."""
    mig = s.rb.hosts[s.index].mig
    gpus = sorted(d.id for d in s.facts.gpus)
    if mig is None:
        return {a: None for a in gpus}
    return {a: mig == "all" or n in mig for n, a in enumerate(gpus)}


def _check_vgpus(s: _Host, desired: Desired) -> None:
    modes = _mig_modes(s)
    rooms = []
    for d in sorted(s.facts.gpus, key=lambda d: d.id):
        blocked = ""
        if d.id in s.passthrough:
            blocked = "is passthrough" + (f" (held by {s.held[d.id]})" if d.id in s.held else "")
        elif d.id in s.held:
            blocked = f"is given to {s.held[d.id]} by classic DirectPath"
        rooms.append(GpuRoom(d, s.facts.gpu_memory_gb(d), modes[d.id], blocked))
    for vm in s.unmanaged:  # already there: placed first, never refused here
        for d in vm.pci:
            p = vgpu_profile(d.profile or "") if d.kind == "vgpu" else None
            if p:
                place_vgpu(rooms, vm.name, p)
    for i, name, devices in s.vms:
        vgpus = [d.profile for d in devices if d.kind == "vgpu" and d.profile]
        for n, profile in enumerate(vgpus, 1):
            p = vgpu_profile(profile)
            if p is None:  # an opaque name (vgpu_profiles.py): no size guessed
                if n == 1:
                    desired.notes.append(Note(name, "resolve", f"vGPU {profile}: its name does not say its size, so "
                                              f"gpuvm checks no room for it on {s.facts.name}; vSphere refuses it at "
                                              "power-on where no GPU has room"))
                continue
            if p.slices and modes and None in modes.values() and n == 1:
                desired.notes.append(Note(name, "resolve", f"vGPU {profile} is MIG-backed: it powers on only on a GPU "
                                          f"of {s.facts.name} in MIG mode, which gpuvm cannot read from vCenter "
                                          f"(set hosts[{s.index}].mig to have it enabled and checked)"))
            short = place_vgpu(rooms, name, p)
            if short:
                raise s.error(i, ("gpus",), name, f"vGPU {n} of {len(vgpus)} ({profile}) fits on no GPU: {short}")
