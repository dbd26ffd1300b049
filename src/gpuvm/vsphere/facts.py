"""What gpuvm knows about vSphere after one inventory read: plain, serialisable facts.

`Inventory` is what steps observe; it is also what `inventory --save` writes and
`plan --snapshot` reads, so planning needs no vCenter.
"""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field, PrivateAttr, ValidationError

from gpuvm.errors import InputError
from gpuvm.pci import MELLANOX, NVIDIA, gpu_memory_gb, pci_id
from gpuvm.vsphere.intent import Intent
from gpuvm.vsphere.owned import Owned
from gpuvm.vsphere.records import Foreign


class PciDevice(BaseModel):
    id: str
    vendor_id: int
    device_id: int
    vendor_name: str = ""
    device_name: str = ""
    class_id: int = 0
    numa_node: int | None = None
    passthru_capable: bool = False
    passthru_enabled: bool = False
    passthru_active: bool = False

    @property
    def pci_id(self) -> str:
        return pci_id(self.vendor_id, self.device_id)

    @property
    def is_gpu(self) -> bool:
        return self.vendor_id == NVIDIA and (self.class_id >> 8) == 0x03

    @property
    def is_mellanox(self) -> bool:
        return self.vendor_id == MELLANOX

    @property
    def memory_gb(self) -> int | None:
        return gpu_memory_gb(self.vendor_id, self.device_id)

    @property
    def passthru_state(self) -> str:
        if not self.passthru_capable:
            return "not capable"
        if self.passthru_enabled and self.passthru_active:
            return "active"
        if self.passthru_enabled:
            return "enabled (reboot pending)"
        if self.passthru_active:
            return "disabled (reboot pending)"
        return "off"


class Graphics(BaseModel):
    default_type: str = "shared"  # configured: config.graphicsConfig.hostDefaultGraphicsType
    assignment_policy: str = "performance"
    devices: dict[str, str] = {}  # configured per GPU (graphicsConfig.deviceType): PCI id → type
    running: dict[str, str] = {}  # what each GPU runs now (config.graphicsInfo): PCI id → type

    def configured(self, address: str) -> str:
        return self.devices.get(address, self.default_type)


class HostFacts(BaseModel):
    name: str
    moid: str
    compute_resource: str = ""  # moid of its cluster (or standalone compute resource): its resource pools' owner
    networks: list[str] = []  # moids of the networks (standard and distributed port groups) it has (HostSystem.network)
    system_uuid: str = ""
    memory_mb: int = 0
    cpu_threads: int = 0  # logical CPUs; 0: not read
    connection_state: str = "connected"
    in_maintenance: bool = False
    power_state: str = "poweredOn"
    booted: str = ""  # runtime.bootTime (ISO 8601; "" not known): a reboot changes it
    rebind_without_reboot: bool = False
    graphics: Graphics = Graphics()
    vgpu_profiles: list[str] = []
    gpu_memory_mb: dict[str, int] = {}  # graphics device address → its memory (config.graphicsInfo)
    pci: list[PciDevice] = []
    passthru_system: str | None = None  # moid of configManager.pciPassthruSystem
    graphics_manager: str | None = None
    intents: dict[str, Intent] = {}  # what a gpuvm run began on it and has not finished (vsphere/intent.py)
    owned: Owned = Owned()  # the passthrough gpuvm enabled on it (vsphere/owned.py)
    foreign: list[Foreign] = []  # values in gpuvm's attributes gpuvm did not write (vsphere/records.py): never acted on
    vm_moids: list[str] | None = None  # every VM and template registered on it (HostSystem.vm); None: not read

    _pci_index: tuple[int, int, dict[str, PciDevice]] = PrivateAttr(default=(0, -1, {}))

    def device(self, address: str) -> PciDevice | None:
        """The device at `address` (indexed once, not searched per call: planning looks up every
        selected device, and a snapshot may list thousands; indexed again if `pci` changed)."""
        key = (id(self.pci), len(self.pci))
        found = self._pci_index[2].get(address) if self._pci_index[:2] == key else None
        if found is None or found.id != address:  # not indexed yet, or a device changed: index again
            index: dict[str, PciDevice] = {}
            for d in self.pci:
                index.setdefault(d.id, d)  # the first, as a search would find
            self._pci_index = (*key, index)
            found = index.get(address)
        return found

    @property
    def gpus(self) -> list[PciDevice]:
        return [d for d in self.pci if d.is_gpu]

    def gpu_memory_gb(self, device: PciDevice) -> int | None:
        """The GPU's memory: as the host reports it, else from the PCI id."""
        mb = self.gpu_memory_mb.get(device.id)
        return mb // 1024 if mb else device.memory_gb


VmDeviceKind = Literal["classic", "dynamic", "vgpu"]


class VmPciDevice(BaseModel):
    key: int
    kind: VmDeviceKind
    label: str = ""
    address: str | None = None  # classic DirectPath
    vendor_id: int | None = None  # classic and dynamic
    device_id: int | None = None
    profile: str | None = None  # vGPU
    assigned: str | None = None  # dynamic: the device vSphere gave it at power-on (while it runs)
    also_allowed: list[str] = []  # dynamic: the PCI ids of its allowedDevice entries after the first

    def describe(self) -> str:
        if self.kind == "vgpu":
            return f"vGPU {self.profile}"
        if self.kind == "dynamic":
            return f"dynamic {pci_id(self.vendor_id or 0, self.device_id or 0)}"
        return f"{self.address}"


class VmNic(BaseModel):
    """A VM's first virtual NIC: what a clone's edit of it needs (its device key and class)."""

    key: int
    type: str  # the pyVmomi class name: VirtualE1000, VirtualVmxnet3, ...


class VmFacts(BaseModel):
    name: str
    moid: str
    host: str | None = None  # host name
    power_state: str = "poweredOff"
    cpus: int = 1
    memory_mb: int = 1024
    firmware: str = "bios"
    reservation_locked: bool = False
    hw_version: str = ""
    extra_config: dict[str, str] = {}
    pci: list[VmPciDevice] = []
    datastores: list[str] = []  # names
    disk_gb: int = 0  # what its files take on its datastores (summary.storage.committed): what a clone needs
    nic: VmNic | None = None  # its first virtual NIC (None: it has none)
    clone_of: str | None = None  # not created yet: the plan clones it from this template (moid "")
    intents: dict[str, Intent] = {}  # what a gpuvm run began on it and has not finished (vsphere/intent.py)
    foreign: list[Foreign] = []  # values in gpuvm's attributes gpuvm did not write (vsphere/records.py): never acted on

    @property
    def powered_on(self) -> bool:
        return self.power_state == "poweredOn"


class NetworkFacts(BaseModel):
    """A network a VM's NIC can connect to: a standard port group (`Network`) or a distributed
    port group (its key and its switch's uuid, which a NIC's backing names)."""

    name: str
    moid: str
    portgroup_key: str = ""  # distributed port groups only
    switch_uuid: str = ""

    @property
    def distributed(self) -> bool:
        return bool(self.portgroup_key)


class DatastoreFacts(BaseModel):
    name: str
    moid: str
    free_gb: int = 0


class Inventory(BaseModel):
    format: Literal["gpuvm-inventory/1"] = "gpuvm-inventory/1"
    source: str = ""  # vCenter URL (no credentials)
    taken: datetime = Field(default_factory=lambda: datetime.now(timezone.utc))
    hosts: dict[str, HostFacts] = {}
    vms: dict[str, VmFacts] = {}
    templates: dict[str, VmFacts] = {}  # VM templates, to clone from
    datastores: dict[str, DatastoreFacts] = {}
    folders: dict[str, list[str]] = {}  # VM folder name → moids (names need not be unique)
    pools: dict[str, list[tuple[str, str]]] = {}  # resource pool name → (moid, owner compute resource moid)
    networks: dict[str, list[NetworkFacts]] = {}  # network name → the networks of that name (names need not be unique)
    foreign: list[Foreign] = []  # the root folder's gpuvm.lease.* and gpuvm.lock.* values gpuvm did not write
    _vms_by_host: tuple[int, dict[str | None, list[VmFacts]]] = PrivateAttr(default=(-1, {}))

    def vms_on(self, host: str) -> list[VmFacts]:
        """The VMs on a host (indexed once, not searched per call: planning asks for every host and
        for many VMs; indexed again if VMs were added)."""
        size, index = self._vms_by_host
        if size != len(self.vms):
            index = {}
            for vm in self.vms.values():
                index.setdefault(vm.host, []).append(vm)
            self._vms_by_host = (len(self.vms), index)
        return list(index.get(host, []))

    def save(self, path: Path) -> None:
        from gpuvm.files import write_text

        write_text(path, self.model_dump_json(indent=2) + "\n", "snapshot")

    @classmethod
    def load(cls, path: Path) -> "Inventory":
        from gpuvm.files import SNAPSHOT_BYTES, read_capped

        try:
            return cls.model_validate_json(read_capped(path, SNAPSHOT_BYTES, "snapshot"))
        except ValidationError as e:
            first = e.errors()[0]
            where = ".".join(str(p) for p in first["loc"])
            raise InputError(f"{path}: not a gpuvm inventory snapshot ({where}: {first['msg']})") from None
