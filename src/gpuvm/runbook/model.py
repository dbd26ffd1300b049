"""The runbook's typed model (pydantic v2). Field names are the YAML keys users write."""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, field_validator, model_validator

from gpuvm.errors import InputError

if TYPE_CHECKING:
    from gpuvm.runbook.loader import Locator

PCI_ADDRESS = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")
PCI_ID = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{4}$")
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,79}$")


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


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


def _name(value: str) -> str:
    if not NAME.match(value):
        raise ValueError(f"'{value}' is not a valid name (letters, digits, '.', '_', '-'; max 80)")
    return value


Name = Annotated[str, Field(min_length=1)]


class VCenter(Strict):
    url: str | None = None
    user: str | None = None
    password_env: str | None = Field(default=None, description="environment variable holding the password")
    insecure: bool | None = None
    ca_file: Path | None = None

    @field_validator("url")
    @classmethod
    def _url(cls, value: str | None) -> str | None:
        if value is not None and not re.match(r"^https?://[^/\s]+", value):
            raise ValueError(f"'{value}' is not a URL like https://vcenter.example.com/sdk")
        return value


class PciSelector(Strict):
    """Exactly one of: a model name (substring of the device name), a vendor:device id, an address."""

    model: str | None = None
    id: str | None = None
    address: str | None = None

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


class Host(Strict):
    name: Name
    passthrough: list[PciSelector] = []
    graphics: GraphicsMode | None = None
    allow_maintenance: bool = False
    allow_reboot: bool = False
    ssh: dict[str, Any] | None = None  # ESXi shell access: see the guest-configuration steps

    _n = field_validator("name")(lambda cls, v: _name(v))


class PassthroughGpus(Strict):
    mode: Literal["passthrough"]
    count: int = Field(ge=1, le=16)
    addresses: list[str] | None = None

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
    mode: Literal["dynamic"]
    count: int = Field(ge=1, le=16)
    id: str | None = None  # vendor:device; defaults to the GPU model found on the host

    @field_validator("id")
    @classmethod
    def _id(cls, value: str | None) -> str | None:
        return None if value is None else _pci_id(value)


class VgpuGpus(Strict):
    mode: Literal["vgpu"]
    count: int = Field(default=1, ge=1, le=16)
    profile: str = Field(min_length=1)
    nvlink: bool | None = None  # disables unified memory so NVLink P2P works; default: count ≥ 2

    @property
    def uses_nvlink(self) -> bool:
        return self.count >= 2 if self.nvlink is None else self.nvlink


Gpus = Annotated[PassthroughGpus | DynamicGpus | VgpuGpus, Field(discriminator="mode")]


class Nic(Strict):
    address: str

    _a = field_validator("address")(lambda cls, v: _pci_address(v))


class Vm(Strict):
    name: Name
    host: Name
    cpus: int | None = Field(default=None, ge=1, le=768)
    memory_gb: int | None = Field(default=None, ge=1, le=24576)
    firmware: Literal["efi", "bios"] = "efi"
    gpus: Gpus | None = None
    nics: list[Nic] = []
    p2p: bool = True
    mmio: Literal["auto"] | int = "auto"
    numa_node: int | None = Field(default=None, ge=0, le=7)
    power: Literal["on", "off"] = "on"

    _n = field_validator("name")(lambda cls, v: _name(v))

    @field_validator("mmio")
    @classmethod
    def _mmio(cls, value: Any) -> Any:
        if isinstance(value, int) and (value < 1 or value & (value - 1)):
            raise ValueError(f"64-bit MMIO size {value} GB is not a power of two (e.g. 256, 512, 1024) or 'auto'")
        return value

    @property
    def has_passthrough(self) -> bool:
        return self.gpus is not None or bool(self.nics)


class Runbook(Strict):
    model_config = ConfigDict(extra="forbid", frozen=False)

    vcenter: VCenter = VCenter()
    hosts: list[Host] = []
    vms: list[Vm] = []
    guests: dict[str, Any] | list[Any] | None = None
    benchmarks: dict[str, Any] | list[Any] | None = None

    _file: Path | None = PrivateAttr(default=None)
    _locator: "Locator | None" = PrivateAttr(default=None)
    _digest: str = PrivateAttr(default="")

    @field_validator("guests", "benchmarks")
    @classmethod
    def _reserved(cls, value: Any) -> Any:
        return value  # validated by their own steps

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
            from gpuvm.runbook.loader import field_path

            return InputError(f"{self.file}: {field_path(loc)}: {message}")
        return self._locator.error(loc, message)

    def where(self, loc: tuple[str | int, ...]) -> str:
        return self._locator.where(loc) if self._locator else str(loc)

    def host(self, name: str) -> Host | None:
        return next((h for h in self.hosts if h.name == name), None)

    def check_references(self) -> None:
        """Checks that need only the runbook: unique names, VMs on declared hosts."""
        seen: dict[str, int] = {}
        for i, host in enumerate(self.hosts):
            if host.name in seen:
                raise self.error(("hosts", i, "name"), f"host '{host.name}' is declared twice (also hosts[{seen[host.name]}])")
            seen[host.name] = i
        vms: dict[str, int] = {}
        claimed: dict[tuple[str, str], str] = {}
        for i, vm in enumerate(self.vms):
            if vm.name in vms:
                raise self.error(("vms", i, "name"), f"VM '{vm.name}' is declared twice (also vms[{vms[vm.name]}])")
            vms[vm.name] = i
            if vm.host not in seen:
                known = ", ".join(sorted(seen)) or "none declared"
                raise self.error(("vms", i, "host"), f"host '{vm.host}' is not in hosts (declared: {known})")
            addresses = [(("nics", j, "address"), n.address) for j, n in enumerate(vm.nics)]
            if isinstance(vm.gpus, PassthroughGpus) and vm.gpus.addresses:
                addresses += [(("gpus", "addresses", j), a) for j, a in enumerate(vm.gpus.addresses)]
            for loc, address in addresses:
                owner = claimed.setdefault((vm.host, address), vm.name)
                if owner != vm.name:
                    raise self.error(("vms", i) + loc, f"device {address} on {vm.host} is already given to VM '{owner}'")
                if owner == vm.name and loc[0] == "nics" and sum(1 for _, a in addresses if a == address) > 1:
                    raise self.error(("vms", i) + loc, f"device {address} is listed twice")

    def vm_location(self, vm: Vm) -> tuple[str | int, ...]:
        return ("vms", self.vms.index(vm))


def env_flag(name: str) -> bool | None:
    value = os.environ.get(name)
    if value is None or value == "":
        return None
    return value.strip().lower() in ("1", "true", "yes", "on")
