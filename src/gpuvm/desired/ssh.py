"""The desired state of the SSH roles: an ESXi shell (`DesiredEsxi`) and a guest OS (`DesiredGuest`).

What an SSH step needs of its target, decided once from the runbook (`resolve_ssh.py`): how gpuvm
logs in, the per-target settings, and the guest-wide ones already applied to each guest (driver,
RDMA stack, the training image with its recipe rendered and its builder chosen, the mesh user).
Steps read these and never the runbook. The connection itself is the cluster's
(`Cluster.executors`), not desired state.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar, Literal

from gpuvm.errors import InputError
from gpuvm.desired.slurm import SlurmNode
from gpuvm.runbook.document import field_path
from gpuvm.runbook.guests import NVIDIA_TOOLKIT_KEY, NVIDIA_TOOLKIT_REPOSITORY, MigDevices, RdmaPort  # noqa: F401 (RdmaPort: a port as the runbook gives it, for guest.nic)

Loc = tuple[str | int, ...]
Locate = Callable[[Loc], str]  # a runbook field → `file:line: field` (the runbook's `where`)


@dataclass(frozen=True)
class Login:
    """How gpuvm logs in (what steps use of it: the mesh's peers and users, sudo)."""

    address: str
    user: str = "root"
    port: int = 22
    sudo: bool = False


@dataclass(frozen=True)
class _SshTarget:
    name: str  # the host's name, or the guest's VM name
    login: Login
    where: Loc = ()  # its entry in the runbook: ("hosts", 0) or ("guests", "hosts", 2)
    locate: Locate = field(default=field_path, compare=False, repr=False)  # without a file: the field
    role: ClassVar[Literal["esxi", "guest"]]

    @property
    def sudo(self) -> bool:
        return self.login.sudo

    @property
    def root(self) -> bool:
        """Whether commands that need root go through sudo: unless the login user is root."""
        return self.login.sudo or self.login.user != "root"

    def error(self, step: str, loc: Loc, message: str) -> InputError:
        """An input error at a field of this target's runbook entry: `file:line: field: step: guest X: …`."""
        kind = "host" if self.role == "esxi" else "guest"
        return InputError(f"{self.locate(self.where + loc)}: {step}: {kind} {self.name}: {message}")


@dataclass(frozen=True)
class VgpuManager:
    """The NVIDIA vGPU manager (ESXi host driver) a host should run (esxi.vgpu_manager): its
    `hosts[].nvidia_host_driver`."""

    bundle: str  # the offline bundle: a path on the host, or an http(s) URL
    version: str  # the driver version it installs, as nvidia-smi reports it
    sha256: str = ""  # the bundle's: checked on the host before it is installed
    component: str | None = None  # its name in `esxcli software component list`; None: NVIDIA's one
    state: Literal["present", "absent"] = "present"  # absent: the component is removed


@dataclass(frozen=True)
class VgpuGuestDriver:
    """A vGPU VM's guest driver, which the vGPU manager its host runs must accept (esxi.vgpu_manager)."""

    vm: str
    version: str
    where: Loc  # the runbook field that gives it: ("guests", "driver", "version")


@dataclass(frozen=True)
class DesiredEsxi(_SshTarget):
    """An ESXi host's shell: `hosts[i]` with `ssh`."""

    role: ClassVar[Literal["esxi", "guest"]] = "esxi"
    mig: Literal["all"] | tuple[int, ...] | None = None  # GPUs to put in MIG mode (esxi.mig)
    ats: bool | None = None  # PCIe ATS (esxi.ats); None: left alone
    ats_option: str = "atsSupport"  # the kernel setting's name
    nvlink: tuple[tuple[str, str], ...] | None = None  # declared NVLink pairs (esxi.topology checks them)
    host_driver: VgpuManager | None = None  # esxi.vgpu_manager; None: left alone
    vgpu_guests: tuple[VgpuGuestDriver, ...] = ()  # without host_driver: checked against the running manager

    @property
    def runs_manager(self) -> bool:
        """Whether the runbook has a vGPU manager installed here (esxi.mig needs one to reach the GPUs)."""
        return self.host_driver is not None and self.host_driver.state == "present"


@dataclass(frozen=True)
class DriverInstall:
    """The NVIDIA driver a guest runs (guest.driver), and the installer that puts it there."""

    version: str  # 535.183.01
    url: str  # the .run installer, `{version}` filled in
    sha256: str  # the installer's: checked on the guest before it runs


@dataclass(frozen=True)
class RdmaStack:
    """The RDMA user space every guest has (guest.rdma): the distribution's rdma-core, or MLNX_OFED."""

    stack: Literal["inbox", "mofed"] = "inbox"
    version: str | None = None  # inbox: rdma-core's version (None: any); mofed: 5.8-3.0.7.0
    url: str = ""  # mofed: the tarball, `{version}` filled in
    sha256: str = ""  # mofed: the tarball's: checked on the guest before it is unpacked


@dataclass(frozen=True)
class ToolkitSource:
    """The apt repository of nvidia-container-toolkit (guest.docker): its URL and signing key's."""

    url: str = NVIDIA_TOOLKIT_REPOSITORY
    key: str = NVIDIA_TOOLKIT_KEY


@dataclass(frozen=True)
class GuestImage:
    """The training image a guest must have (guest.image; guest.docker sets up docker for it): its recipe
    rendered, its builder chosen."""

    ref: str  # name:tag; the tag is the recipe's digest
    dockerfile: str  # the rendered recipe
    builder: str  # the guest that builds it (the others copy it), unless pulled
    registry: str | None = None  # pull <registry>/<ref> instead of building
    gpus: bool = True  # containers get GPUs: docker needs the NVIDIA runtime
    build_network: Literal["default", "host"] = "default"
    build_timeout: float = 10800  # seconds for a build, pull, or all the copies together
    stall_timeout: float = 60  # seconds a guest's load may take no bytes before it is cut off (image_feed)
    toolkit: ToolkitSource = ToolkitSource()  # where guest.docker gets nvidia-container-toolkit from


@dataclass(frozen=True)
class GuestLicence:
    """The NVIDIA licence a guest must hold (guest.licensing; `bench run` checks it): `guests.licensing`,
    for a vGPU guest or a passthrough one the runbook licenses."""

    token_file: Path  # the client configuration token, on this machine
    feature_type: int  # gridd.conf's FeatureType
    min_validity: float  # seconds a licence must still be valid for
    acquire_timeout: float  # seconds apply waits for nvidia-gridd to report Licensed
    where: str  # `file:line: field` of the token_file setting, for errors


@dataclass(frozen=True)
class GuestMesh:
    """This guest's part of the SSH mesh (guest.ssh_mesh)."""

    user: str  # the mesh user: `ssh_mesh.user`, else the guest's SSH user
    container_port: int | None = None  # sshd port inside containers, in the mesh's known_hosts


@dataclass(frozen=True)
class DesiredGuest(_SshTarget):
    """A guest OS: `guests.hosts[i]`, with the guest-wide settings of `guests` that apply to it."""

    role: ClassVar[Literal["esxi", "guest"]] = "guest"
    driver: DriverInstall | None = None  # guest.driver
    rdma: RdmaStack | None = None  # guest.rdma
    rdma_ports: tuple[RdmaPort, ...] = ()  # guest.nic
    nic_ats: bool | None = None  # guest.nic_ats
    mig: str | tuple[MigDevices, ...] | None = None  # guest.mig: a named layout or mig-parted entries
    image: GuestImage | None = None  # guest.docker and guest.image
    licence: GuestLicence | None = None  # guest.licensing (None: the guest needs no licence)
    mesh: GuestMesh | None = None  # guest.ssh_mesh (None: no mesh)
    slurm: SlurmNode | None = None  # guest.slurm (None: not a Slurm node)
