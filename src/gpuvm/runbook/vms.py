"""The VMs: their GPUs (passthrough, dynamic DirectPath, vGPU), NICs, cloud-init, placement."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, field_validator, model_validator

from gpuvm.runbook.fields import HOSTNAME, MAX_MMIO_GB, Name, Reference, address_with_prefix, pci_address, pci_id
from gpuvm.runbook.hosts import TopologyPolicy
from gpuvm.runbook.strict import Strict, shown
from gpuvm.vgpu_profiles import vgpu_profile


class PassthroughGpus(Strict):
    mode: Literal["passthrough"]  # classic DirectPath: gpuvm chooses the GPUs
    count: int = Field(ge=1, le=16)  # GPUs for this VM
    addresses: list[str] | None = None  # these GPUs (PCI addresses), instead of gpuvm's choice

    @field_validator("addresses")
    @classmethod
    def _addresses(cls, value: list[str] | None) -> list[str] | None:
        return None if value is None else [pci_address(a) for a in value]

    @model_validator(mode="after")
    def _count(self) -> "PassthroughGpus":
        if self.addresses is not None and len(self.addresses) != self.count:
            raise ValueError(f"count is {self.count} but {len(self.addresses)} address(es) are given")
        if self.addresses and len(set(self.addresses)) != len(self.addresses):
            raise ValueError("an address is listed twice")
        return self


class DynamicGpus(Strict):
    mode: Literal["dynamic"]  # dynamic DirectPath: vSphere picks the GPUs at power-on
    count: int = Field(ge=1, le=16)  # GPUs for this VM
    id: str | None = None  # vendor:device; defaults to the GPU model found on the host

    @field_validator("id")
    @classmethod
    def _id(cls, value: str | None) -> str | None:
        return None if value is None else pci_id(value)


class VgpuGpus(Strict):
    mode: Literal["vgpu"]  # NVIDIA vGPU (time-sliced or MIG-backed profiles)
    count: int = Field(default=1, ge=1, le=16)  # vGPUs of this profile
    profile: str = Field(min_length=1)  # a profile the host offers, like grid_a100d-3-40c
    nvlink: bool | None = None  # disables unified memory so NVLink P2P works; default: count ≥ 2, not MIG-backed

    @property
    def uses_nvlink(self) -> bool:
        """MIG-backed vGPUs never use NVLink: MIG has no GPU-to-GPU P2P, over PCIe or NVLink (NVIDIA
        MIG User Guide, "Supported Configurations")."""
        if self.nvlink is not None:
            return self.nvlink
        profile = vgpu_profile(self.profile)
        return self.count >= 2 and not (profile and profile.slices)


Gpus = Annotated[PassthroughGpus | DynamicGpus | VgpuGpus, Field(discriminator="mode")]


class Nic(Strict):
    address: str  # the NIC's PCI address on the VM's host, like 0000:4b:00.0

    _a = field_validator("address")(lambda cls, v: pci_address(v))


class CloudInit(Strict):
    """A clone's identity on first boot, through cloud-init's VMware datasource (guestinfo)."""

    hostname: str | None = None  # default: the VM's name
    address: str = "dhcp"  # or a static address with prefix, like 10.0.0.21/24
    gateway: str | None = None  # with a static address
    nameservers: list[str] = []  # DNS servers' addresses
    interfaces: str = "ens*"  # the guest NICs the network config matches (by name)
    ssh_public_key_file: Path  # authorised for the template's default user; never a private key

    @field_validator("address")
    @classmethod
    def _address(cls, value: str) -> str:
        return value if value == "dhcp" else address_with_prefix(value)

    @field_validator("hostname")
    @classmethod
    def _hostname(cls, value: str | None) -> str | None:
        if value is not None and not HOSTNAME.fullmatch(value):
            raise ValueError(f"{shown(value)} is not a host name")
        return value


class Vm(Strict):
    name: Name  # as named in vCenter
    host: Reference  # the host it runs on (a clone is made there); in the VM's vCenter, or <vcenter>/<name>
    vcenter: Name | None = None  # the vCenter it is in; default: its host's
    cpus: int | None = Field(default=None, ge=1, le=768)  # at most the host's logical CPUs
    memory_gb: int | None = Field(default=None, ge=1, le=24576)  # fully reserved when the VM has passthrough devices
    firmware: Literal["efi", "bios"] = "efi"  # GPU passthrough needs efi
    gpus: Gpus | None = None  # by classic DirectPath, dynamic DirectPath or vGPU profile (the key mode says which)
    nics: list[Nic] = []  # NIC passthrough
    p2p: bool = True  # pciPassthru.allowP2P and RelaxACSforP2P
    mmio: Literal["auto"] | int = "auto"  # 64-bit MMIO GB: auto = power of two ≥ 2x total GPU memory
    numa_node: int | None = Field(default=None, ge=0, le=7)  # numa.nodeAffinity; classic GPUs are chosen on it
    topology: TopologyPolicy | None = None  # default: the runbook's
    power: Literal["on", "off"] = "on"  # the power state apply leaves the VM in
    state: Literal["present", "absent"] = "present"  # absent: destroyed by apply --allow-destroy
    template: Name | None = None  # a missing VM is created as a clone of this template (or VM)
    datastore: Name | None = None  # where a clone goes; default: the template's datastore
    folder: Name | None = None  # the VM folder a clone goes into; default: the template's
    resource_pool: Name | None = None  # a pool of the host's cluster for a clone; default: the cluster's root pool
    # the network (one of the host's: a port group or distributed port group, "VM Network" say) a clone's first NIC
    # joins; default: the template's
    network: str | None = None
    cloud_init: CloudInit | None = None  # a clone's identity on first boot
    hardware_version: str | None = None  # vmx-NN: upgraded to at least this (VM powered off)


    @field_validator("network")
    @classmethod
    def _network(cls, value: str | None) -> str | None:
        # vSphere network names may hold spaces ("VM Network"); at most 80 characters, as a port group's
        if value is not None and (not value.strip() or value != value.strip() or len(value) > 80
                                  or any(ord(c) < 32 or ord(c) == 127 for c in value)):
            raise ValueError(f"{shown(value)} is not a network name (1 to 80 characters, no control characters or "
                             "leading/trailing spaces)")
        return value

    @field_validator("hardware_version")
    @classmethod
    def _hardware_version(cls, value: str | None) -> str | None:
        if value is not None and not re.fullmatch(r"vmx-([7-9]|[1-9][0-9])", value):
            raise ValueError(f"{shown(value)} is not a VM hardware version (vmx-7 to vmx-99, e.g. vmx-19)")
        return value

    @model_validator(mode="after")
    def _clone(self) -> "Vm":
        if (self.cloud_init or self.datastore or self.folder or self.resource_pool or self.network) and not self.template:
            raise ValueError("cloud_init, datastore, folder, resource_pool and network apply to a VM gpuvm creates: "
                             "give template")
        return self

    @field_validator("mmio")
    @classmethod
    def _mmio(cls, value: Any) -> Any:
        if isinstance(value, int) and (value < 1 or value & (value - 1)):
            raise ValueError(f"64-bit MMIO size {shown(value)} GB is not a power of two (e.g. 256, 512, 1024) or 'auto'")
        if isinstance(value, int) and value > MAX_MMIO_GB:
            raise ValueError(f"64-bit MMIO size {shown(value)} GB is more than {MAX_MMIO_GB} GB; give the size in GB")
        return value

    @property
    def has_passthrough(self) -> bool:
        return self.gpus is not None or bool(self.nics)
