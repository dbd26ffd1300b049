"""The desired state of vSphere objects: hosts (`DesiredHost`, role "host") and VMs (`DesiredVm`,
role "vm"), with what they hold: passthrough devices, a clone's spec and network, NVLink pairs."""

from __future__ import annotations

from dataclasses import dataclass, field

from gpuvm.pci import pci_id
from gpuvm.plan import Note

Pair = tuple[str, str]


@dataclass(frozen=True)
class Nvlink:
    """A host's NVLink-bridged GPU pairs and where they come from. `seen`: the GPUs the source
    could see (None: all of them, as in a declaration); pairs of the others are unknown."""

    pairs: tuple[Pair, ...] | None = None  # None: nothing known
    source: str = ""  # where the pairs come from; when unknown, how to make them known
    seen: frozenset[str] | None = None
    switched: bool = False  # the source shows the GPUs joined by an NVSwitch (gpuvm.nvswitch)

    def knows(self, address: str) -> bool:
        return self.pairs is not None and (self.seen is None or address in self.seen)

    def partner(self, address: str) -> str | None:
        return next((b if a == address else a for a, b in self.pairs or () if address in (a, b)), None)

    def describe(self) -> str:
        shown = ", ".join(f"{a[5:]}+{b[5:]}" for a, b in self.pairs or ()) or "none"
        return f"{shown} (from {self.source})"


@dataclass(frozen=True)
class DesiredDevice:
    kind: str  # classic | dynamic | vgpu
    address: str | None = None
    vendor_id: int | None = None
    device_id: int | None = None
    profile: str | None = None
    label: str = ""
    candidates: tuple[str, ...] = ()  # dynamic: the GPUs vSphere can pick from at power-on

    def describe(self) -> str:
        if self.kind == "vgpu":
            return f"vGPU {self.profile}"
        if self.kind == "dynamic":
            picks = f" (vSphere picks from {', '.join(self.candidates)})" if self.candidates else ""
            return f"dynamic {pci_id(self.vendor_id or 0, self.device_id or 0)}{picks}"
        return f"{self.address} {self.label}".strip()


@dataclass
class DesiredHost:
    name: str
    passthrough: list[str]  # PCI addresses to enable
    graphics: str | None  # API value: shared | sharedDirect
    allow_reboot: bool
    nvlink: Nvlink = Nvlink()  # its NVLink-bridged GPU pairs, where known
    vms: list[str] = field(default_factory=list)  # the runbook's VMs on this host
    release: list[str] = field(default_factory=list)  # PCI addresses whose passthrough gpuvm turns off again
    forget: list[str] = field(default_factory=list)  # PCI addresses gpuvm enabled, since seen off: no longer its own


@dataclass
class DesiredVm:
    name: str
    host: str
    cpus: int | None
    memory_mb: int | None
    firmware: str
    reservation_locked: bool
    devices: list[DesiredDevice]
    extra_config: dict[str, str]
    power: str
    system_uuid: str = ""
    state: str = "present"  # absent: destroyed
    clone: Clone | None = None  # how to create it, where the runbook names a template
    hardware_version: str | None = None  # vmx-NN the runbook asks for at least (None: leave it)


@dataclass(frozen=True)
class CloneNetwork:
    """The edit of the clone's first NIC (device `nic_key`, pyVmomi class `nic_type`): a standard
    port group's backing (network moid + name) or, with `portgroup_key`, a distributed port's."""

    name: str
    moid: str
    nic_key: int
    nic_type: str
    portgroup_key: str = ""
    switch_uuid: str = ""


@dataclass(frozen=True)
class Clone:
    """A VM to create: a clone of `template` on the VM's host and `datastore`, powered off, with
    cloud-init's guestinfo (`cloud_init.py`) in its extraConfig."""

    template: str
    datastore: str
    guestinfo: tuple[tuple[str, str], ...] = ()
    folder: str | None = None  # the VM folder (name; folder_moid its moid); None: the template's
    folder_moid: str = ""
    pool: str | None = None  # the resource pool (name; pool_moid its moid); None: the cluster's root pool
    pool_moid: str = ""
    network: CloneNetwork | None = None  # the network the clone's first NIC joins; None: the template's


@dataclass
class Desired:
    """Everything resolve decided: hosts and VMs by name, and the warnings that become plan notes."""

    hosts: dict[str, DesiredHost] = field(default_factory=dict)
    vms: dict[str, DesiredVm] = field(default_factory=dict)
    notes: list[Note] = field(default_factory=list)
