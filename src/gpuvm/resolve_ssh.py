"""From the runbook to the desired state of its SSH targets: ESXi shells and guest OSes.

The SSH counterpart of `resolve.py`: every setting an SSH step reads is decided here, once, so the
steps never look at the runbook: the guest-wide settings of `guests` are given to each guest, the
training image's recipe is rendered and its builder chosen (`image.builder`, else the first guest),
the mesh user defaults to the guest's SSH user. Errors keep naming the runbook's file and line.
"""

from __future__ import annotations

from gpuvm.desired.ssh import (DesiredEsxi, DesiredGuest, DriverInstall, GuestImage, GuestMesh, Login, RdmaStack,
                               ToolkitSource, VgpuGuestDriver, VgpuManager)
from gpuvm.image import recipe
from gpuvm.licensing import wanted_licence
from gpuvm.resolve_slurm import slurm_node
from gpuvm.runbook.guest_drivers import chosen, needed_kind
from gpuvm.runbook.guests import Guests, NvidiaDriver, Rdma
from gpuvm.runbook.hosts import Host, HostDriver, SshAccess
from gpuvm.runbook.model import Runbook

SshTargets = dict[str, DesiredEsxi | DesiredGuest]


def login(access: SshAccess) -> Login:
    return Login(access.address, access.user, access.port, access.sudo)


def resolve_ssh(runbook: Runbook) -> SshTargets:
    """The runbook's ESXi shells (hosts with `ssh`), then its guests, by name."""
    targets: SshTargets = {}
    for i, host in enumerate(runbook.hosts):
        if host.ssh is not None:
            targets[host.name] = _esxi(runbook, i, host)
    guests = runbook.guests
    if guests is not None:
        image, rdma = _image(guests), _rdma(guests.rdma)
        for i, guest in enumerate(guests.hosts):
            pick = chosen(runbook, i, guest)
            driver = _driver(pick.driver if pick else None)
            mesh = guests.ssh_mesh if guests.ssh_mesh is not None and guests.ssh_mesh.enabled else None
            targets[guest.vm] = DesiredGuest(
                guest.vm, login(guest.ssh), ("guests", "hosts", i), runbook.where,
                driver=driver, rdma=rdma, rdma_ports=tuple(guest.rdma_ports), nic_ats=guest.nic_ats,
                mig=tuple(guest.mig) if isinstance(guest.mig, list) else guest.mig, image=image,
                licence=wanted_licence(runbook, guest),
                mesh=GuestMesh(mesh.user or guest.ssh.user, mesh.container_port) if mesh else None,
                slurm=slurm_node(runbook, guest.vm))
    return targets


def _esxi(runbook: Runbook, i: int, host: Host) -> DesiredEsxi:
    assert host.ssh is not None
    return DesiredEsxi(host.name, login(host.ssh), ("hosts", i), runbook.where,
                       mig=tuple(host.mig) if isinstance(host.mig, list) else host.mig, ats=host.ats,
                       ats_option=host.ats_option, nvlink=tuple(host.nvlink) if host.nvlink is not None else None,
                       host_driver=_host_driver(host.nvidia_host_driver),
                       vgpu_guests=_vgpu_guests(runbook, host) if host.nvidia_host_driver is None else ())


def _vgpu_guests(runbook: Runbook, host: Host) -> tuple[VgpuGuestDriver, ...]:
    """The vGPU guest drivers of the host's VMs, checked against the manager it runs (esxi.vgpu_manager)
    where the runbook does not give one (it checks the one it gives itself: guest_drivers.py)."""
    out = []
    for i, guest in enumerate(runbook.guests.hosts if runbook.guests else []):
        vm, pick = runbook.vm(guest.vm), chosen(runbook, i, guest)
        if vm is not None and vm.host == host.name and pick and pick.driver.kind == "vgpu" and needed_kind(vm) == "vgpu":
            out.append(VgpuGuestDriver(vm.name, pick.driver.version, pick.where + ("version",)))
    return tuple(out)


def _host_driver(driver: HostDriver | None) -> VgpuManager | None:
    if driver is None:
        return None
    return VgpuManager(driver.bundle, driver.version, driver.sha256 or "", driver.component, driver.state)


def _driver(driver: NvidiaDriver | None) -> DriverInstall | None:
    if driver is None:
        return None
    return DriverInstall(driver.version, driver.installer.format(version=driver.version), driver.sha256 or "")


def _rdma(rdma: Rdma | None) -> RdmaStack | None:
    if rdma is None:
        return None
    return RdmaStack(rdma.stack, rdma.version, (rdma.installer or "").format(version=rdma.version),
                     rdma.sha256 or "")


def _image(guests: Guests) -> GuestImage | None:
    image = guests.image
    if image is None or not guests.hosts:
        return None
    rendered = recipe(image)
    return GuestImage(rendered.ref, rendered.dockerfile, image.builder or guests.hosts[0].vm, image.registry,
                      image.gpus, image.build_network, image.build_timeout, image.stall_timeout,
                      ToolkitSource(image.toolkit_repository.url, image.toolkit_repository.key))
