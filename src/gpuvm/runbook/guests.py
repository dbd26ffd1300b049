"""The guest OSes: RDMA ports, MIG layouts, image, driver, licensing, the SSH mesh."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field, ValidationInfo, field_validator, model_validator

from gpuvm.runbook.fields import (IMAGE_NAME, IMAGE_REFERENCE, REGISTRY, VERSION, Reference, address_with_prefix,
                                  download_url, driver_version, sha256_field)
from gpuvm.runbook.hosts import SshAccess
from gpuvm.runbook.strict import Seconds, Strict, required_in_schema, shown


class RdmaPort(Strict):
    """A ConnectX port in the guest: by RDMA device and port (mapped with ibdev2netdev) or interface."""

    device: str | None = None  # mlx5_0
    port: int = Field(default=1, ge=1, le=2)  # the device's port
    interface: str | None = None  # ens64np1
    ip: str | None = None  # 192.168.100.11/24
    mtu: int | None = Field(default=None, ge=576, le=9216)  # 9000: jumbo frames

    _ip = field_validator("ip")(lambda cls, v: None if v is None else address_with_prefix(v))

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

    _urls = field_validator("url", "key")(lambda cls, v: download_url(v))


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


class NvidiaDriver(Strict):
    """The NVIDIA driver, one version on every guest, from NVIDIA's .run installer: the data-center
    driver (passthrough VMs), or the vGPU guest driver (`kind: vgpu`, for vGPU VMs)."""

    model_config = required_in_schema("sha256")
    version: str  # 535.183.01
    kind: Literal["datacenter", "vgpu"] = "datacenter"  # vgpu: the vGPU guest driver, matching the hosts' vGPU manager
    # the .run installer's URL, {version} filled in; the guest fetches it
    installer: str = "https://us.download.nvidia.com/tesla/{version}/NVIDIA-Linux-x86_64-{version}.run"
    sha256: str | None = Field(default=None, validate_default=True, description="the installer's sha256 (it runs as root on every guest)")

    _digest = field_validator("sha256")(lambda cls, v: sha256_field(v, "the driver installer"))

    _version = field_validator("version")(lambda cls, v: driver_version(v, "535.183.01"))

    _url = field_validator("installer")(lambda cls, v: download_url(v))


class Rdma(Strict):
    """The RDMA user space on every guest: the distribution's rdma-core, or Mellanox OFED."""

    stack: Literal["inbox", "mofed"] = "inbox"  # inbox: rdma-core and ibverbs-utils with apt-get; mofed: MLNX_OFED
    version: str | None = None  # inbox: an rdma-core package version (default: any); mofed: 5.8-3.0.7.0
    installer: str | None = None  # mofed: the MLNX_OFED_LINUX-….tgz URL for the guests' distribution
    sha256: str | None = Field(default=None, validate_default=True, description="mofed: the tarball's sha256, required with it")

    _url = field_validator("installer")(lambda cls, v: None if v is None else download_url(v))

    @field_validator("sha256")
    @classmethod
    def _digest(cls, value: str | None, info: ValidationInfo) -> str | None:
        if info.data.get("stack") == "mofed":
            return sha256_field(value, "the MLNX_OFED installer")
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
