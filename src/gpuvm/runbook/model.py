"""The runbook's typed model (pydantic v2). Field names are the YAML keys users write."""

from __future__ import annotations

import hashlib
import os
import re
from urllib.parse import urlsplit
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import AfterValidator, ConfigDict, Field, PrivateAttr, ValidationInfo, field_validator, model_validator
from pydantic_core import PydanticCustomError

from gpuvm.errors import InputError, listed
from gpuvm.names import Names, vsphere_name
from gpuvm.runbook import guest_drivers
from gpuvm.runbook.benchmarks import BenchmarkSpec, check_benchmarks
from gpuvm.runbook.document import field_path
from gpuvm.runbook.slurm import Slurm
from gpuvm.runbook.strict import Seconds, Strict, checked_name, checked_reference, required_in_schema, shown
from gpuvm.secrets import without_password
from gpuvm.sizing.spec import SizingSpec
from gpuvm.vgpu_profiles import vgpu_profile

if TYPE_CHECKING:
    from gpuvm.runbook.document import Locator

PCI_ADDRESS = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")
PCI_ID = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{4}$")
# Image references as Docker reads them (distribution/reference's grammar, without IPv6 hosts), so
# nothing the Dockerfile or a docker command line would read as more than a name gets through.
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_DOMAIN = r"[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?(?:\.[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?)*(?::[0-9]+)?"
IMAGE_NAME = re.compile(rf"(?:{_DOMAIN}/)?{_COMPONENT}(?:/{_COMPONENT})*")
IMAGE_REFERENCE = re.compile(rf"{IMAGE_NAME.pattern}(?::[A-Za-z0-9_][A-Za-z0-9_.-]{{0,127}})?"
                             r"(?:@[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,})?")
REGISTRY = re.compile(rf"{_DOMAIN}(?:/{_COMPONENT})*")
VERSION = re.compile(r"[0-9][0-9A-Za-z.+-]{0,39}")
HOSTNAME = re.compile(r"[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?")
MAX_MMIO_GB = 1 << 16  # 64 TB: far beyond any GPU set; a larger figure is a typo


def _pci_address(value: str) -> str:
    value = value.strip().lower()
    if len(value) == 7:  # '17:00.0' → domain 0000
        value = "0000:" + value
    if not PCI_ADDRESS.match(value):
        raise ValueError(f"'{value}' is not a PCI address like 0000:17:00.0")
    return value


def _pci_id(value: str) -> str:
    value = value.strip().lower().replace("0x", "")
    if not PCI_ID.match(value):
        raise ValueError(f"'{value}' is not a vendor:device id like 10de:20b5")
    return value


Name = Annotated[str, AfterValidator(checked_name)]  # hosts, VMs, vCenters as named in vCenter
Reference = Annotated[str, AfterValidator(checked_reference)]  # a host or VM: name, or <vcenter>/<name>


class VCenter(Strict):
    url: str | None = None  # https://vcenter.example.com/sdk; default: GOVC_URL
    user: str | None = None  # default: GOVC_USERNAME
    password_env: str | None = Field(default=None, description="environment variable holding the password")
    insecure: bool | None = None  # true: TLS verification off (said so on every connect); default: GOVC_INSECURE
    ca_file: Path | None = None  # a CA bundle to verify vCenter's certificate; default: GOVC_TLS_CA_CERTS
    connect_timeout: Seconds = 15  # seconds to open a connection (TCP and TLS); past it, the vCenter is not reached
    call_timeout: Seconds = 120  # seconds a call may wait for its answer; past it, the vCenter is not answering

    @field_validator("url")
    @classmethod
    def _url(cls, value: str | None) -> str | None:
        if value is not None and (problem := url_problem(value)):
            raise ValueError(f"{shown(without_password(value))} {problem}")
        return value


class NamedVCenter(VCenter):
    """One of several vCenters (`vcenters:`): hosts and VMs name theirs with `vcenter: <name>`."""

    name: Name  # how hosts and VMs name it (vcenter: <name>), and a --target for all its hosts and VMs


DEFAULT_VCENTER = "default"  # the name of the one vCenter of a runbook that gives `vcenter:` (or neither)


def url_problem(url: str) -> str | None:
    """Why `url` cannot be a vCenter address (None when it can): scheme, host and port checked."""
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in url):
        return "contains control characters"
    try:
        parts = urlsplit(url if "://" in url else "https://" + url)
        port = parts.port  # raises on a port that is not a number from 0 to 65535
    except ValueError as e:
        return f"is not a valid URL ({without_password(str(e))})"  # Python may quote the netloc
    if port == 0:
        return "names port 0 (leave the port out for 443)"
    if parts.scheme != "https":
        return f"is not an https URL like https://vcenter.example.com/sdk ('{parts.scheme}://': vCenter speaks https)"
    if not parts.hostname:
        return "names no host (a URL like https://vcenter.example.com/sdk)"
    if not HOSTNAME.fullmatch(parts.hostname) and ":" not in parts.hostname:  # IPv6 literals were checked
        return "is not a URL like https://vcenter.example.com/sdk (the host name has characters no host has)"
    return None


def vcenter_address(url: str) -> str:
    """What tells one vCenter's URL from another's: https://host:port/path, case folded, the defaults
    filled in (port 443, path /sdk), no user or password: "VC1" and "https://vc1:443/SDK/" are one."""
    parts = urlsplit(url if "://" in url else "https://" + url)
    host = (parts.hostname or "").lower()
    host = f"[{host}]" if ":" in host else host  # an IPv6 literal
    return f"https://{host}:{parts.port or 443}{parts.path.rstrip('/').lower() or '/sdk'}"


def _address_with_prefix(value: str) -> str:
    import ipaddress

    try:
        ipaddress.ip_interface(value)
    except ValueError:
        raise ValueError(f"'{value}' is not an address with prefix like 192.168.100.11/24") from None
    if "/" not in value:
        raise ValueError(f"'{value}' needs a prefix length, like {value}/24")
    return value


class PciSelector(Strict):
    """Exactly one of: a model name (substring of the device name), a vendor:device id, an address."""

    model: str | None = None  # a substring of the device name, like A100
    id: str | None = None  # vendor:device, like 15b3:101b
    address: str | None = None  # a PCI address, like 0000:4b:00.0

    @field_validator("id")
    @classmethod
    def _id(cls, value: str | None) -> str | None:
        return None if value is None else _pci_id(value)

    @field_validator("address")
    @classmethod
    def _address(cls, value: str | None) -> str | None:
        return None if value is None else _pci_address(value)

    @model_validator(mode="after")
    def _one(self) -> "PciSelector":
        given = [k for k in ("model", "id", "address") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError("give exactly one of model, id or address")
        return self

    def describe(self) -> str:
        return self.model or self.id or self.address or ""


GraphicsMode = Literal["shared", "shared_direct"]
TopologyPolicy = Literal["warn", "strict"]  # strict: what would be a topology warning refuses the plan


def _nvlink_pairs(value: Any) -> list[tuple[str, str]] | None:
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(p, list) and all(isinstance(a, str) for a in p)
                                              for p in value):
        raise ValueError("nvlink is a list of GPU address pairs, like [[0000:17:00.0, 0000:31:00.0]]")
    pairs: list[tuple[str, str]] = []
    for pair in value:
        addresses = [_pci_address(a) for a in pair]
        if len(addresses) != 2 or addresses[0] == addresses[1]:
            raise ValueError(f"{pair} is not a pair: give two GPU addresses, like [0000:17:00.0, 0000:31:00.0]")
        if twice := {a for p in pairs for a in p} & set(addresses):
            raise ValueError(f"GPU {', '.join(sorted(twice))} is in two NVLink pairs")
        pairs.append((addresses[0], addresses[1]))
    return pairs


class HostDriver(Strict):
    """The NVIDIA vGPU manager (ESXi host driver): an offline bundle installed with `esxcli software
    component apply -d` in maintenance mode, running after the host reboot."""

    model_config = required_in_schema("sha256")
    bundle: str = Field(min_length=1)  # on the host (/vmfs/volumes/<datastore>/….zip) or an http(s) URL
    version: str  # the driver version the bundle installs, as nvidia-smi reports it: 535.154.02
    sha256: str | None = Field(default=None, validate_default=True, description="the bundle's sha256 (it runs as root on the host)")
    component: str | None = None  # its name in `esxcli software component list`; default: NVIDIA's one
    state: Literal["present", "absent"] = "present"  # absent: the component is removed

    _digest = field_validator("sha256")(lambda cls, v: _sha256(v, "the host driver bundle"))

    @field_validator("version")
    @classmethod
    def _version(cls, value: str) -> str:
        if not re.fullmatch(r"\d{3}\.\d{2,3}(\.\d{2})?", value):
            raise ValueError(f"{shown(value)} is not an NVIDIA driver version like 535.154.02")
        return value

    @field_validator("bundle")
    @classmethod
    def _bundle(cls, value: str) -> str:
        if not (re.fullmatch(r"https?://[^\s'\"]+", value) or re.fullmatch(r"/[^\s'\"]+\.zip", value)):
            raise ValueError(f"{shown(value)} is neither a path on the host to an offline bundle "
                             "(/vmfs/volumes/datastore1/NVD-….zip) nor an http(s):// URL")
        return value

    @field_validator("component")
    @classmethod
    def _component(cls, value: str | None) -> str | None:
        if value is not None and not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", value):
            raise ValueError(f"{shown(value)} is not an esxcli component name like NVD-AIE-800")
        return value


class SshAccess(Strict):
    """How gpuvm logs in: key file or a password from an environment variable."""

    address: str = Field(min_length=1)  # host name or IP address
    user: str = "root"  # the login user
    port: int = Field(default=22, ge=1, le=65535)  # the SSH port
    key_file: Path | None = None  # a private key file (at most 64 KB, a regular file)
    passphrase_env: str | None = None  # environment variable holding the key file's passphrase
    password_env: str | None = None  # environment variable holding the login password
    sudo: bool = False  # commands that need root go through `sudo -n`

    @field_validator("address")
    @classmethod
    def _address(cls, value: str) -> str:
        if not re.match(r"^[A-Za-z0-9.:_][A-Za-z0-9.:_-]*$", value):  # no leading '-': ssh would read an option
            raise ValueError(f"'{value}' is not a host name or IP address")
        return value


class SshSettings(Strict):
    known_hosts: Path | None = None  # trusted host keys besides ~/.ssh/known_hosts; new keys are recorded here
    connect_timeout: Seconds = 10  # seconds
    command_timeout: Seconds = 600  # seconds every remote command may take
    boot_timeout: Seconds = 600  # how long apply waits for a guest's SSH after its VM starts


class Host(Strict):
    name: Name  # as named in vCenter
    vcenter: Name | None = None  # the vCenter it is in (a name in vcenters); needed with several
    passthrough: list[PciSelector] = []  # devices to enable for PCI passthrough
    graphics: GraphicsMode | None = None  # shared_direct: needed for NVIDIA vGPU
    allow_maintenance: bool = False  # may gpuvm enter maintenance mode ...
    allow_reboot: bool = False  # ... and reboot (still needs --allow-host-reboot)
    ssh: SshAccess | None = None  # ESXi shell access, for ATS and MIG
    ats: bool | None = None  # PCIe Address Translation Services (for P2P), via esxcli
    ats_option: str = "atsSupport"  # the kernel setting's name is unconfirmed: configurable
    mig: Literal["all"] | list[Annotated[int, Field(ge=0, le=15)]] | None = None  # GPUs in MIG mode (MIG-backed vGPU)
    nvlink: list[tuple[str, str]] | None = None  # NVLink-bridged GPU pairs; undeclared: read from the ESXi shell
    nvidia_host_driver: HostDriver | None = None  # the NVIDIA vGPU manager, via esxcli (esxi.vgpu_manager)

    _l = field_validator("nvlink", mode="before")(lambda cls, v: _nvlink_pairs(v))

    @model_validator(mode="after")
    def _needs_ssh(self) -> "Host":
        given = [f for f in ("ats", "mig", "nvidia_host_driver") if getattr(self, f) is not None]
        if given and self.ssh is None:
            raise ValueError(f"{' and '.join(given)} {'is' if len(given) == 1 else 'are'} set through the ESXi shell: "
                             "give ssh (address, user, key_file)")
        return self



class PassthroughGpus(Strict):
    mode: Literal["passthrough"]  # classic DirectPath: gpuvm chooses the GPUs
    count: int = Field(ge=1, le=16)  # GPUs for this VM
    addresses: list[str] | None = None  # these GPUs (PCI addresses), instead of gpuvm's choice

    @field_validator("addresses")
    @classmethod
    def _addresses(cls, value: list[str] | None) -> list[str] | None:
        return None if value is None else [_pci_address(a) for a in value]

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
        return None if value is None else _pci_id(value)


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

    _a = field_validator("address")(lambda cls, v: _pci_address(v))


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
        return value if value == "dhcp" else _address_with_prefix(value)

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


class RdmaPort(Strict):
    """A ConnectX port in the guest: by RDMA device and port (mapped with ibdev2netdev) or interface."""

    device: str | None = None  # mlx5_0
    port: int = Field(default=1, ge=1, le=2)  # the device's port
    interface: str | None = None  # ens64np1
    ip: str | None = None  # 192.168.100.11/24
    mtu: int | None = Field(default=None, ge=576, le=9216)  # 9000: jumbo frames

    _ip = field_validator("ip")(lambda cls, v: None if v is None else _address_with_prefix(v))

    @model_validator(mode="after")
    def _one(self) -> "RdmaPort":
        if (self.device is None) == (self.interface is None):
            raise ValueError("give exactly one of device (with port) or interface")
        for name in (self.device, self.interface):
            if name is not None and not re.match(r"^[A-Za-z0-9_.-]{1,15}$", name):
                raise ValueError(f"'{name}' is not a device or interface name")
        return self

    def describe(self) -> str:
        return self.interface or f"{self.device} port {self.port}"


class MigDevices(Strict):
    """One entry of NVIDIA mig-parted's format: which GPUs, MIG on/off, the instances to create;
    `device-filter` (PCI ids as mig-parted writes them, `0x20B510DE`: device, then vendor) limits
    the entry to GPUs of those models."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)
    device_filter: list[str] | None = Field(default=None, alias="device-filter")
    devices: Literal["all"] | list[Annotated[int, Field(ge=0, le=15)]] = "all"
    mig_enabled: bool = Field(alias="mig-enabled")
    mig_devices: dict[str, Annotated[int, Field(ge=1, le=7)]] = Field(default={}, alias="mig-devices")

    @field_validator("device_filter", mode="before")
    @classmethod
    def _filter(cls, value: Any) -> Any:
        items = [value] if isinstance(value, str) else value
        if isinstance(items, list):
            for item in items:
                if not isinstance(item, str) or not re.fullmatch(r"0x[0-9A-Fa-f]{8}", item):
                    raise ValueError(f"{shown(item)} is not a PCI id like 0x20B510DE (device, then vendor)")
        return items


class MigConfigFile(Strict):
    """A layout from an NVIDIA mig-parted config file (`version: v1`, `mig-configs:`), the format
    DeepOps and the GPU Operator use: `config` names one of its `mig-configs`. The path is relative
    to the runbook; the loader reads it and puts the config's entries in its place."""

    config_file: str
    config: str


class Guest(Strict):
    vm: Reference  # the VM this guest OS runs in; <vcenter>/<name> for a name used in several vCenters
    ssh: SshAccess  # how gpuvm logs in to the guest OS
    rdma_ports: list[RdmaPort] = []  # ConnectX ports: up, with their IP and MTU (guest.nic)
    nic_ats: bool | None = None  # ConnectX ATS_ENABLED via mlxconfig (needs a host reboot)
    # a named layout (all-3g.40gb, all-disabled) or mig-parted entries; the loader puts the entries of
    # `{config_file, config}` (MigConfigFile) here
    mig: str | list[MigDevices] | None = None
    slots: int | None = Field(default=None, ge=1, le=16)  # MPI slots (GPUs used by a job); default: its VM's gpus.count, else 1
    # this guest's NVIDIA driver (guest.driver), over guests.driver; none: no driver
    driver: NvidiaDriver | Literal["none"] | None = None

    @field_validator("mig")
    @classmethod
    def _layout(cls, value: Any) -> Any:
        if isinstance(value, str) and not re.match(r"^all-(disabled|enabled|\d+g\.\d+gb([+-][a-z.]+)?)$", value):
            raise ValueError(f"'{value}' is not a named MIG layout (all-disabled, all-enabled, all-<profile> "
                             "such as all-3g.40gb, all-1g.24gb+gfx) — or give mig-parted entries")
        return value


GIT_REF = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/-]*$")


class ImageScripts(Strict):
    """Benchmark scripts fetched into the image at build time, each at a pinned git ref (a tag,
    branch or commit): tf_cnn_benchmarks at /opt/gpuvm/benchmarks, Horovod's examples at
    /opt/gpuvm/horovod/examples."""

    tf_cnn_benchmarks: str | None = None  # a ref of github.com/tensorflow/benchmarks
    horovod_examples: str | None = None  # a ref of github.com/horovod/horovod

    @field_validator("tf_cnn_benchmarks", "horovod_examples")
    @classmethod
    def _ref(cls, value: str | None) -> str | None:
        if value is not None and not GIT_REF.match(value):
            raise ValueError(f"'{value}' is not a git ref (a tag, branch or commit: letters, digits, . _ / -)")
        return value


NVIDIA_TOOLKIT_REPOSITORY = "https://nvidia.github.io/libnvidia-container/stable/deb/$(ARCH)"
NVIDIA_TOOLKIT_KEY = "https://nvidia.github.io/libnvidia-container/gpgkey"


class ToolkitRepository(Strict):
    """The apt repository guest.docker takes nvidia-container-toolkit from, on a guest that lacks it:
    NVIDIA's (its install guide: https://docs.nvidia.com/datacenter/cloud-native/container-toolkit/
    latest/install-guide.html), or a local mirror of it."""

    # the repository (apt fills in $(ARCH)): NVIDIA's, or a local mirror's http(s):// or file:// URL
    url: str = NVIDIA_TOOLKIT_REPOSITORY
    key: str = NVIDIA_TOOLKIT_KEY  # its ASCII-armoured signing key, fetched by the guest

    _urls = field_validator("url", "key")(lambda cls, v: _download_url(v))


class Image(Strict):
    """The training container: RDMA user space, Open MPI, the framework, Horovod, sshd for MPI.

    Production builds on an NGC (or CUDA) base with Mellanox OFED and Open MPI from source; a plain
    Debian/Ubuntu base can take everything from its distribution instead (`mpi: distro`,
    `framework_from: distro`, `ofed: inbox`, `horovod: null`), which is what CI builds.
    """

    name: str = "gpuvm/dl"  # the image name; its tag is the recipe's digest
    base: str = "nvcr.io/nvidia/tensorflow:22.01-tf2-py3"  # the FROM image: NGC, CUDA, or a plain distribution
    ofed: str = "5.4-3.1.0.0"  # a Mellanox OFED version, or inbox: the distribution's rdma-core
    openmpi: str = "4.1.2"  # built from source with mpi: source
    mpi: Literal["source", "distro"] = "source"  # distro: the distribution's openmpi-bin
    framework: Literal["tensorflow", "pytorch"] = "tensorflow"  # the deep-learning framework the image holds
    framework_from: Literal["base", "pip", "distro"] = "base"  # base: kept if the base has it, else pip
    horovod: str | None = "0.23.0"  # null: no Horovod (mpirun and torch.distributed only)
    scripts: ImageScripts = ImageScripts()  # benchmark scripts fetched at build time
    gpus: bool = True  # containers get the GPUs (--gpus all): guest.docker needs the NVIDIA runtime
    toolkit_repository: ToolkitRepository = ToolkitRepository()  # where nvidia-container-toolkit comes from
    sshd_port: int = Field(default=12345, ge=1, le=65535)  # the containers' sshd, for mpirun between them
    registry: str | None = None  # pull <registry>/<name>:<tag> instead of building
    builder: str | None = None  # the guest (VM name) that builds; default the first guest
    ofed_os: str = Field(default="ubuntu20.04", pattern=r"^[a-z]+[0-9][0-9.]*$")  # OFED tarball's OS (the base's)
    build_network: Literal["default", "host"] = "default"  # docker build --network (host: the guest's own)
    build_timeout: Seconds = 10800  # seconds for a build, pull, or all the copies together (OFED + MPI + Horovod)
    stall_timeout: Seconds = 60  # seconds a guest's load may take no bytes of the image before it is cut off

    @field_validator("name", "base", "registry")
    @classmethod
    def _reference(cls, value: str | None, info: ValidationInfo) -> str | None:
        grammar, example = {"name": (IMAGE_NAME, "an image name (lowercase path like gpuvm/dl)"),
                            "base": (IMAGE_REFERENCE, "an image reference like nvcr.io/nvidia/pytorch:24.01-py3"),
                            "registry": (REGISTRY, "a registry like registry.example.com:5000/team")}[info.field_name]
        if value is not None and not grammar.fullmatch(value):
            raise ValueError(f"{shown(value)} is not {example}")
        return value

    @field_validator("ofed", "openmpi", "horovod")
    @classmethod
    def _version(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value is None or (info.field_name == "ofed" and value == "inbox"):
            return value
        if not VERSION.fullmatch(value):
            raise ValueError(f"{shown(value)} is not a version like 4.1.2" + (" or inbox" if info.field_name == "ofed" else ""))
        return value

    @model_validator(mode="after")
    def _consistent(self) -> "Image":
        if self.framework_from == "distro" and self.framework != "pytorch":
            raise ValueError("framework_from: distro needs framework: pytorch (Debian and Ubuntu package "
                             "python3-torch; TensorFlow comes from the base image or pip)")
        return self


class SshMesh(Strict):
    enabled: bool = True  # false: no mesh
    user: str | None = None  # default: each guest's SSH user
    container_port: int | None = Field(default=None, ge=1, le=65535)  # sshd port inside containers


def _download_url(value: str) -> str:
    """An http(s) or file URL the guests fetch with curl; `{version}` is filled in."""
    if not re.fullmatch(r"(https?|file)://[^\s'\"]+", value):
        raise ValueError(f"{shown(value)} is not an http(s):// or file:// URL")
    return value


def _sha256(value: str | None, what: str) -> str | None:
    """An installer's sha256, lowercase: required, since `what` runs as root on every guest (a
    "missing" error, so that the message names the field itself)."""
    if value is None:
        raise PydanticCustomError("missing", f"{what}'s sha256 is required")
    if not re.fullmatch(r"[0-9a-fA-F]{64}", value):
        raise ValueError(f"{shown(value)} is not a sha256 digest (64 hexadecimal digits, as sha256sum prints them)")
    return value.lower()


class NvidiaDriver(Strict):
    """The NVIDIA driver, one version on every guest, from NVIDIA's .run installer: the data-center
    driver (passthrough VMs), or the vGPU guest driver (`kind: vgpu`, for vGPU VMs)."""

    model_config = required_in_schema("sha256")
    version: str  # 535.183.01
    kind: Literal["datacenter", "vgpu"] = "datacenter"  # vgpu: the vGPU guest driver, matching the hosts' vGPU manager
    # the .run installer's URL, {version} filled in; the guest fetches it
    installer: str = "https://us.download.nvidia.com/tesla/{version}/NVIDIA-Linux-x86_64-{version}.run"
    sha256: str | None = Field(default=None, validate_default=True, description="the installer's sha256 (it runs as root on every guest)")

    _digest = field_validator("sha256")(lambda cls, v: _sha256(v, "the driver installer"))

    @field_validator("version")
    @classmethod
    def _version(cls, value: str) -> str:
        if not re.fullmatch(r"\d{3}\.\d{2,3}(\.\d{2})?", value):
            raise ValueError(f"{shown(value)} is not an NVIDIA driver version like 535.183.01")
        return value

    _url = field_validator("installer")(lambda cls, v: _download_url(v))


class Rdma(Strict):
    """The RDMA user space on every guest: the distribution's rdma-core, or Mellanox OFED."""

    stack: Literal["inbox", "mofed"] = "inbox"  # inbox: rdma-core and ibverbs-utils with apt-get; mofed: MLNX_OFED
    version: str | None = None  # inbox: an rdma-core package version (default: any); mofed: 5.8-3.0.7.0
    installer: str | None = None  # mofed: the MLNX_OFED_LINUX-….tgz URL for the guests' distribution
    sha256: str | None = Field(default=None, validate_default=True, description="mofed: the tarball's sha256, required with it")

    _url = field_validator("installer")(lambda cls, v: None if v is None else _download_url(v))

    @field_validator("sha256")
    @classmethod
    def _digest(cls, value: str | None, info: ValidationInfo) -> str | None:
        if info.data.get("stack") == "mofed":
            return _sha256(value, "the MLNX_OFED installer")
        if value is not None:
            raise ValueError("only stack: mofed fetches an installer to check (inbox packages are checked by the package manager)")
        return None

    @model_validator(mode="after")
    def _mofed(self) -> "Rdma":
        if self.stack == "mofed" and not (self.version and self.installer):
            raise ValueError("stack: mofed needs version (like 5.8-3.0.7.0) and installer (the MLNX_OFED_LINUX "
                             "tarball's URL for the guests' distribution)")
        if self.version and not re.fullmatch(r"[0-9][0-9A-Za-z.+~:-]*", self.version):
            raise ValueError(f"{shown(self.version)} is not a package version")
        return self


LicensedProduct = Literal["vcs", "vws", "none"]


class Licensing(Strict):
    """NVIDIA License System client settings, the same on every GPU guest (guest.licensing).

    vGPU guests are licensed with gridd.conf's `FeatureType=1` (the driver picks the licence for the
    vGPU type); passthrough guests only when `passthrough` names a product (a data-centre driver on a
    passthrough GPU needs none). Values: NVIDIA's "Virtual GPU Client Licensing User Guide"."""

    token_file: Path  # the client configuration token (.tok) from the NLS; a secret, relative to the runbook
    passthrough: LicensedProduct = "none"  # vcs: FeatureType=4 (Virtual Compute Server), vws: 2 (RTX vWS)
    min_validity: Seconds = 86400  # a licence expiring sooner is drift, and bench run refuses
    acquire_timeout: Seconds = 120  # how long apply waits for nvidia-gridd to report Licensed


class Guests(Strict):
    hosts: list[Guest] = []  # the guest OSes, one per VM, over SSH
    image: Image | None = None  # the training container, built once and shipped to every guest (guest.image)
    ssh_mesh: SshMesh | None = None  # keyless SSH between all guests (guest.ssh_mesh)
    # the NVIDIA driver on every guest (guest.driver), or a list of one per kind: each guest gets the kind
    # its VM's GPUs need, a VM without GPUs none
    driver: NvidiaDriver | list[NvidiaDriver] | None = None
    rdma: Rdma | None = None  # the RDMA user space on every guest (guest.rdma)
    licensing: Licensing | None = None  # the NVIDIA licence of every GPU guest (guest.licensing)


class Runbook(Strict):
    model_config = ConfigDict(extra="forbid", frozen=False)

    vcenter: VCenter = VCenter()  # where and how gpuvm logs in to vCenter
    vcenters: list[NamedVCenter] = []  # several vCenters, each named (instead of vcenter)
    topology: TopologyPolicy = "warn"  # GPUs of a VM on one NUMA node, in NVLink pairs, its NICs on their node
    hosts: list[Host] = []  # the ESXi hosts gpuvm configures
    vms: list[Vm] = []  # the VMs gpuvm configures; a missing one with a template is created
    ssh: SshSettings = SshSettings()  # SSH settings for every ESXi shell and guest
    guests: Guests | None = None  # the guest OSes, over SSH
    benchmarks: BenchmarkSpec | None = None  # the benchmark campaign `gpuvm bench run` runs
    sizing: SizingSpec | None = None  # what `gpuvm size` reads (gpuvm/sizing/spec.py)
    slurm: Slurm | None = None  # Slurm on the guests (gpuvm/runbook/slurm.py, guest.slurm)

    _file: Path | None = PrivateAttr(default=None)
    _locator: "Locator | None" = PrivateAttr(default=None)
    _digest: str = PrivateAttr(default="")

    @field_validator("benchmarks")
    @classmethod
    def _reserved(cls, value: Any) -> Any:
        return value  # validated by the benchmark runner

    def attach(self, file: Path, locator: "Locator", text: str) -> None:
        self._file, self._locator = file, locator
        self._digest = hashlib.sha256(text.encode()).hexdigest()

    @property
    def file(self) -> Path:
        return self._file or Path("<runbook>")

    @property
    def digest(self) -> str:
        return self._digest

    def error(self, loc: tuple[str | int, ...], message: str) -> InputError:
        """An InputError at a field of this runbook: `file:line: field: message`."""
        if self._locator is None:
            return InputError(f"{self.file}: {field_path(loc)}: {message}")
        return self._locator.error(loc, message)

    def where(self, loc: tuple[str | int, ...]) -> str:
        """`file:line: field` of a field of this runbook."""
        if self._locator is None:
            return f"{self.file}: {field_path(loc)}"
        return self._locator.where(loc)

    def host(self, name: str) -> Host | None:
        return next((h for h in self.hosts if h.name == name), None)

    def vm(self, name: str) -> Vm | None:
        return next((v for v in self.vms if v.name == name), None)

    @property
    def all_vcenters(self) -> dict[str, VCenter]:
        """Every vCenter of the runbook by name: `vcenters`, or `vcenter` named "default"."""
        if self.vcenters:
            return {vc.name: vc for vc in self.vcenters}
        return {DEFAULT_VCENTER: self.vcenter}

    def vcenter_loc(self, name: str) -> tuple[str | int, ...]:
        """Where a vCenter's settings are in the runbook ('vcenter', or 'vcenters', i)."""
        index = next((i for i, vc in enumerate(self.vcenters) if vc.name == name), None)
        return ("vcenter",) if index is None else ("vcenters", index)

    def vcenter_of(self, target: str) -> str:
        """The vCenter of a host, VM or guest of the runbook (checked: `check_references`)."""
        by_host = self.vcenters_by_host()
        vm = next((v for v in self.vms if v.name == target), None) if target not in by_host else None
        return by_host.get(vm.host if vm is not None else target, self._first_vcenter())

    def vcenters_by_host(self) -> dict[str, str]:
        """Each declared host's vCenter."""
        first = self._first_vcenter()
        return {h.name: h.vcenter or first for h in self.hosts}

    def _first_vcenter(self) -> str:
        return self.vcenters[0].name if self.vcenters else DEFAULT_VCENTER

    def part(self, *vcenters: str) -> "Runbook":
        """This runbook with only these vCenters' hosts, VMs and their guests (its other settings kept)."""
        by_host = self.vcenters_by_host()
        first = self._first_vcenter()
        hosts = [h for h in self.hosts if by_host[h.name] in vcenters]
        vms = [v for v in self.vms if by_host.get(v.host, first) in vcenters]
        names = {v.name for v in vms}
        guests = self.guests
        if guests is not None:
            guests = guests.model_copy(update={"hosts": [g for g in guests.hosts if g.vm in names]})
        part = self.model_copy(update={"hosts": hosts, "vms": vms, "guests": guests})
        part._file, part._locator, part._digest = self._file, self._locator, self._digest
        return part

    def slots_of(self, guest: Guest) -> int:
        """A guest's MPI slots (the GPUs a job uses there): its `slots`, else its VM's GPU count (in
        this runbook: a setup's own), else 1."""
        if guest.slots is not None:
            return guest.slots
        vm = next((v for v in self.vms if v.name == guest.vm), None)
        return vm.gpus.count if vm is not None and vm.gpus is not None else 1

    def strict_topology(self, vm: Vm) -> bool:
        return (vm.topology or self.topology) == "strict"

    def check_references(self) -> None:
        """Checks that need only the runbook: names unique per vCenter, references that name one host
        or VM, VMs on declared hosts, devices given once."""
        self._check_vcenters()
        book = self.qualified()
        vms = {vm.name: i for i, vm in enumerate(book.vms)}
        claimed: dict[tuple[str, str], str] = {}
        for i, vm in enumerate(book.vms):
            addresses = [(("nics", j, "address"), n.address) for j, n in enumerate(vm.nics)]
            if isinstance(vm.gpus, PassthroughGpus) and vm.gpus.addresses:
                addresses += [(("gpus", "addresses", j), a) for j, a in enumerate(vm.gpus.addresses)]
            for loc, address in addresses:
                owner = claimed.setdefault((vm.host, address), vm.name)
                if owner != vm.name:
                    raise self.error(("vms", i) + loc, f"device {address} on {vm.host} is already given to VM '{owner}'")
                if owner == vm.name and loc[0] == "nics" and sum(1 for _, a in addresses if a == address) > 1:
                    raise self.error(("vms", i) + loc, f"device {address} is listed twice")

        book._check_guests(vms)
        if book.benchmarks is not None:
            check_benchmarks(book, local=not (book.guests and book.guests.hosts))

    def qualified(self) -> "Runbook":
        """This runbook with each host and VM named as gpuvm shows and targets it: a name used in more
        than one vCenter as `<vcenter>/<name>` (gpuvm/names.py), and every reference to one resolved
        to that name (a VM's host within the VM's vCenter). Itself when nothing changes. InputError at
        file:line: field for a name declared twice in one vCenter, or a reference naming none or
        several. Run again on its result, it changes nothing."""
        first = self._first_vcenter()
        declared = list(self.all_vcenters)
        keys = [(h.vcenter or first, vsphere_name(h.name)) for h in self.hosts]
        hosts = Names("host", "hosts", keys, declared)
        self._once("hosts", "host", keys)
        host_vcenter = {hosts.ids[key]: key[0] for key in keys}
        vm_hosts = [self._host_of(i, vm, hosts, host_vcenter) for i, vm in enumerate(self.vms)]
        vm_keys = [(vm.vcenter or host_vcenter[vm_hosts[i]], vsphere_name(vm.name)) for i, vm in enumerate(self.vms)]
        vms = Names("VM", "vms", vm_keys, declared)
        self._once("vms", "VM", vm_keys)
        host_names = [hosts.ids[key] for key in keys]
        vm_names = [(vms.ids[key], host) for key, host in zip(vm_keys, vm_hosts)]
        guests, benchmarks = self._qualified_guests(vms), self._qualified_benchmarks(vms)
        if host_names == [h.name for h in self.hosts] and vm_names == [(v.name, v.host) for v in self.vms] \
                and guests is self.guests and benchmarks is self.benchmarks:
            return self
        book = self.model_copy(update={
            "hosts": [h.model_copy(update={"name": name}) for h, name in zip(self.hosts, host_names)],
            "vms": [v.model_copy(update={"name": name, "host": host}) for v, (name, host) in zip(self.vms, vm_names)],
            "guests": guests, "benchmarks": benchmarks})
        book._file, book._locator, book._digest = self._file, self._locator, self._digest
        return book

    def _once(self, field: str, kind: str, keys: list[tuple[str, str]]) -> None:
        """Each (vCenter, name) of `field` (hosts or vms) declared once."""
        seen: dict[tuple[str, str], int] = {}
        for i, key in enumerate(keys):
            if key in seen:
                where = f" in vCenter '{key[0]}'" if self.vcenters else ""
                raise self.error((field, i, "name"), f"{kind} '{key[1]}' is declared twice{where} "
                                                     f"(also {field}[{seen[key]}])")
            seen[key] = i

    def _host_of(self, i: int, vm: Vm, hosts: Names, host_vcenter: dict[str, str]) -> str:
        """The name gpuvm gives VM i's host: its `host`, looked for in the VM's `vcenter` when it gives one."""
        try:
            host = hosts.resolve(vm.host, vm.vcenter, hint="give vcenter, or ")
        except ValueError as e:
            try:  # in one other vCenter only: the VM's vcenter is what is wrong
                host = hosts.resolve(vm.host)
            except ValueError:
                raise self.error(("vms", i, "host"), str(e)) from None
        if vm.vcenter is not None and host_vcenter[host] != vm.vcenter:
            raise self.error(("vms", i, "vcenter"), f"VM '{vm.name}' is in vCenter '{vm.vcenter}' but its host "
                                                    f"'{vm.host}' is in '{host_vcenter[host]}'")
        return host

    def _qualified_guests(self, vms: Names) -> "Guests | None":
        """`guests` with each guest's `vm` and the image's `builder` resolved (`qualified`)."""
        guests = self.guests
        if guests is None:
            return None
        named = [self._vm_named(vms, ("guests", "hosts", i, "vm"), g.vm, strict=True) for i, g in enumerate(guests.hosts)]
        hosts = [g if vm == g.vm else g.model_copy(update={"vm": vm}) for g, vm in zip(guests.hosts, named)]
        image = guests.image
        if image is not None and image.builder is not None:
            builder = self._vm_named(vms, ("guests", "image", "builder"), image.builder)
            image = image if builder == image.builder else image.model_copy(update={"builder": builder})
        if [g.vm for g in hosts] == [g.vm for g in guests.hosts] and image is guests.image:
            return guests
        return guests.model_copy(update={"hosts": hosts, "image": image})

    def _qualified_benchmarks(self, vms: Names) -> "BenchmarkSpec | None":
        """`benchmarks` with the VMs it names (launcher, a run's groups, a setup's VMs and guests)
        resolved (`qualified`); itself when none needs it."""
        spec = self.benchmarks
        if spec is None:
            return None
        loc: tuple[str | int, ...] = ("benchmarks",)
        launcher = spec.launcher and self._vm_named(vms, loc + ("launcher",), spec.launcher)
        runs = [run if run.groups is None else run.model_copy(update={"groups": [
            [self._vm_named(vms, loc + ("runs", i, "groups", j, k), vm) for k, vm in enumerate(group)]
            for j, group in enumerate(run.groups)]}) for i, run in enumerate(spec.runs)]
        setups = [setup.model_copy(update={
            "vms": [self._named_in(vms, loc + ("setups", i, "vms", j), item, "name") for j, item in enumerate(setup.vms)],
            "guests": [self._named_in(vms, loc + ("setups", i, "guests", j), item, "vm")
                       for j, item in enumerate(setup.guests)]}) for i, setup in enumerate(spec.setups)]
        if launcher == spec.launcher and [r.groups for r in runs] == [r.groups for r in spec.runs] and \
                [(s.vms, s.guests) for s in setups] == [(s.vms, s.guests) for s in spec.setups]:
            return spec
        return spec.model_copy(update={"launcher": launcher, "runs": runs, "setups": setups})

    def _named_in(self, vms: Names, loc: tuple[str | int, ...], item: Any, key: str) -> Any:
        """A setup's VM or guest entry with its `key` (the VM) resolved."""
        if not isinstance(item, dict) or not isinstance(item.get(key), str):
            return item
        return {**item, key: self._vm_named(vms, loc + (key,), item[key])}

    def _vm_named(self, vms: Names, loc: tuple[str | int, ...], reference: str, strict: bool = False) -> str:
        """The name gpuvm gives the VM `reference` names. Not `strict`: a bare name no VM has is left as
        it is (the check of that field says what it must name)."""
        if not strict and "/" not in reference and not vms.choices(reference):
            return reference
        try:
            return vms.resolve(reference)
        except ValueError as e:
            raise self.error(loc, str(e)) from None

    def _check_vcenters(self) -> None:
        """`vcenter` or `vcenters`; names unique; every host and VM names a declared vCenter (with
        several). Host and VM names are unique per vCenter (`qualified`)."""
        if not self.vcenters:
            for loc, item in [*((("hosts", i), h) for i, h in enumerate(self.hosts)),
                              *((("vms", i), v) for i, v in enumerate(self.vms))]:
                if item.vcenter not in (None, DEFAULT_VCENTER):
                    raise self.error(loc + ("vcenter",), f"vCenter '{item.vcenter}' is not declared (the runbook "
                                     "gives one vcenter; name several under vcenters)")
            return
        if "vcenter" in self.model_fields_set:
            raise self.error(("vcenter",), "give vcenter (one) or vcenters (several), not both")
        names: dict[str, int] = {}
        addresses: dict[str, int] = {}  # no url: GOVC_URL's
        for i, vc in enumerate(self.vcenters):
            if vc.name in names:
                raise self.error(("vcenters", i, "name"), f"vCenter '{vc.name}' is declared twice "
                                 f"(also vcenters[{names[vc.name]}])")
            names[vc.name] = i
            address = vcenter_address(vc.url) if vc.url else "GOVC_URL"
            if (first := addresses.setdefault(address, i)) != i:
                raise self.error(("vcenters", i, "url"), f"vCenter '{vc.name}' is vCenter "
                                 f"'{self.vcenters[first].name}' again (vcenters[{first}]: {address}): "
                                 "declare each vCenter once")
        declared = listed(names)
        for i, host in enumerate(self.hosts):
            if host.vcenter is None and len(names) > 1:
                raise self.error(("hosts", i, "vcenter"), f"host '{host.name}' names no vCenter (one of: {declared})")
            if host.vcenter is not None and host.vcenter not in names:
                raise self.error(("hosts", i, "vcenter"), f"vCenter '{host.vcenter}' is not in vcenters "
                                 f"(declared: {declared})")
        for i, vm in enumerate(self.vms):
            if vm.vcenter is not None and vm.vcenter not in names:
                raise self.error(("vms", i, "vcenter"), f"vCenter '{vm.vcenter}' is not in vcenters (declared: {declared})")

    def _check_guests(self, vms: dict[str, int]) -> None:
        if self.guests is None:
            return
        seen: dict[str, int] = {}
        for i, guest in enumerate(self.guests.hosts):
            loc = ("guests", "hosts", i, "vm")
            if guest.vm not in vms:
                raise self.error(loc, f"VM '{guest.vm}' is not in vms (declared: {listed(vms) or 'none'})")
            if self.vms[vms[guest.vm]].state == "absent":
                raise self.error(loc, f"VM '{guest.vm}' is marked state: absent; a guest in it cannot be configured")
            if guest.vm in seen:
                raise self.error(loc, f"guest for VM '{guest.vm}' is declared twice (also guests.hosts[{seen[guest.vm]}])")
            seen[guest.vm] = i
        guest_drivers.check(self)
        image = self.guests.image
        if image and image.builder and image.builder not in seen:
            raise self.error(("guests", "image", "builder"), f"'{image.builder}' is not a guest (guests: {listed(seen)})")


def env_flag(name: str) -> bool | None:
    value = os.environ.get(name)
    if value is None or value == "":
        return None
    return value.strip().lower() in ("1", "true", "yes", "on")
