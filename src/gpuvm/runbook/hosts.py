"""The ESXi hosts: PCI selections, the vGPU manager, SSH access to their shells."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, field_validator, model_validator

from gpuvm.runbook.fields import Name, driver_version, pci_address, pci_id, sha256_field
from gpuvm.runbook.strict import Seconds, Strict, required_in_schema, shown


class PciSelector(Strict):
    """Exactly one of: a model name (substring of the device name), a vendor:device id, an address."""

    model: str | None = None  # a substring of the device name, like A100
    id: str | None = None  # vendor:device, like 15b3:101b
    address: str | None = None  # a PCI address, like 0000:4b:00.0

    @field_validator("id")
    @classmethod
    def _id(cls, value: str | None) -> str | None:
        return None if value is None else pci_id(value)

    @field_validator("address")
    @classmethod
    def _address(cls, value: str | None) -> str | None:
        return None if value is None else pci_address(value)

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
        addresses = [pci_address(a) for a in pair]
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

    _digest = field_validator("sha256")(lambda cls, v: sha256_field(v, "the host driver bundle"))

    _version = field_validator("version")(lambda cls, v: driver_version(v, "535.154.02"))

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
