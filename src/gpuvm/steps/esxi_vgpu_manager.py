"""esxi.vgpu_manager: the NVIDIA vGPU manager (ESXi host driver) the runbook pins
(`hosts[].nvidia_host_driver`): installed, upgraded or removed, and running after the host reboot.
Where the runbook pins none, the manager the host runs (else the one installed) is read all the
same and the vGPU guest drivers of the host's VMs are checked against it (vgpu_compat.py): one it
does not load is refused at plan time, naming both versions (exit 2).

Observed in the ESXi shell: `esxcli software component list` (what is installed: NVIDIA's component,
or the one the runbook names) and `nvidia-smi --query-gpu=driver_version` (what runs: the VIB brings
nvidia-smi, and it answers only once the manager's module is loaded, after the reboot).

NVIDIA's install is done with the host in maintenance mode, then a reboot (Virtual GPU Software
User Guide, "Installing and Configuring the NVIDIA Virtual GPU Manager for VMware vSphere"), so the
change is marked "needs host reboot" and carried out by `host.reboot`: it stops the host's VMs,
enters maintenance mode, runs `esxcli software component apply -d <bundle>` (an upgrade in place;
a differently named NVIDIA component is removed first; `component remove -n` for state: absent),
then reboots. This step's own apply, before any VM is stopped, fetches a URL bundle onto the host
and checks its sha256 there (`sha256sum`, in ESXi's busybox): a bundle with another digest stops
the host's run before anything is touched. The install checks it again, on the private copy it
installs from: a bundle changed in between is refused, and `host.reboot` undoes what it did
(maintenance mode left, VMs on again). Installed but not running yet is pending until the reboot.
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass

from gpuvm.desired.ssh import DesiredEsxi, VgpuManager
from gpuvm.errors import InputError, RemoteCommandError
from gpuvm.parsers.esxcli import Component, parse_components
from gpuvm.plan import Change, Disruption
from gpuvm.remote import run
from gpuvm.steps.base import Context, Step
from gpuvm.steps.installer import INSTALL_TIMEOUT, checked_copy, file_sha256, missing
from gpuvm.vgpu_compat import incompatibility

NAME = "esxi.vgpu_manager"
RESOURCE = "NVIDIA vGPU manager"
LIST = ["esxcli", "software", "component", "list"]
RUNNING = ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"]
DOWNLOADS = "/tmp"  # where a URL bundle is fetched to on the host, then checked and installed from
NOT_HOST_DRIVER = ("mgmt", "daemon")  # NVIDIA's other components (the GPU management daemon)


@dataclass(frozen=True)
class ManagerFact:
    installed: Component | None  # the NVIDIA component, if any
    running: str | None  # the driver version nvidia-smi reports; None: no manager loaded


@dataclass(frozen=True)
class InstallManager:
    """Install (or upgrade to) the bundle at `path` on the host, in maintenance mode, before the reboot."""

    version: str
    bundle: str  # the runbook's path or URL
    path: str  # where the bundle is on the host
    sha256: str
    replaces: str | None = None  # an NVIDIA component of another name, removed first

    def in_maintenance(self, ctx: Context, host: str) -> None:
        """Installed from a private copy checked just before (`checked_copy`): a bundle changed since
        this step's own check is refused, the installed component left as it is. The copy sits next
        to the bundle, not in ESXi's /tmp (a small ramdisk)."""
        target = ctx.cluster.targets[host]
        with checked_copy(target, ctx.cluster, lambda copy: ["cp", self.path, copy], posixpath.basename(self.path),
                          self.sha256, lambda actual: _refused(target, self.path, actual, self.sha256),
                          under=posixpath.dirname(self.path)) as copy:
            if self.replaces:
                _esxcli(target, ctx, ["software", "component", "remove", "-n", self.replaces])
            _esxcli(target, ctx, ["software", "component", "apply", "-d", copy])


@dataclass(frozen=True)
class RemoveManager:
    """Remove the component, in maintenance mode, before the reboot."""

    component: str

    def in_maintenance(self, ctx: Context, host: str) -> None:
        _esxcli(ctx.cluster.targets[host], ctx, ["software", "component", "remove", "-n", self.component])


def _esxcli(target: DesiredEsxi, ctx: Context, args: list[str]) -> None:
    result = run(target, ctx.cluster, ["esxcli", *args], check=False,
                 timeout=max(ctx.cluster.command_timeout, INSTALL_TIMEOUT))
    if not result.ok:  # esxcli's error: "[MetadataDownloadError]", then what went wrong
        lines = [line.strip() for line in (result.stderr + result.stdout).splitlines() if line.strip()]
        raise RemoteCommandError(f"host {target.name}: `esxcli {' '.join(args)}` failed (exit {result.exit_code}): "
                                 + " ".join(lines[:2])[:500])


def _driver(target: DesiredEsxi) -> VgpuManager:
    assert target.host_driver is not None  # wanted
    return target.host_driver


def wanted(target: DesiredEsxi) -> bool:
    return target.host_driver is not None or bool(target.vgpu_guests)


def observe(ctx: Context, target: DesiredEsxi) -> ManagerFact:
    name = target.host_driver.component if target.host_driver else None
    components = parse_components(run(target, ctx.cluster, LIST).stdout)
    nvidia = [c for c in components if (c.name == name if name else _is_host_driver(c))]
    result = run(target, ctx.cluster, RUNNING, check=False)
    versions = {line.strip() for line in result.stdout.splitlines() if line.strip()}
    if missing(result) or not result.ok or not versions:
        running = None  # no nvidia-smi (no VIB), or no module loaded (installed, not rebooted yet)
    else:
        running = ", ".join(sorted(versions))
    return ManagerFact(nvidia[0] if nvidia else None, running)


def _is_host_driver(component: Component) -> bool:
    return component.vendor.upper().startswith("NVIDIA") and not any(
        word in component.name.lower() for word in NOT_HOST_DRIVER)


def plan(target: DesiredEsxi, fact: ManagerFact) -> list[Change]:
    if target.host_driver is None:
        check_guests(target, fact)
        return []
    want = _driver(target)
    installed = fact.installed.driver_version if fact.installed else None
    if want.state == "absent":
        if fact.installed is not None:
            return [Change(NAME, target.name, RESOURCE, "installed", f"{installed} ({fact.installed.name})", "none",
                           Disruption.HOST_REBOOT, RemoveManager(fact.installed.name))]
        return []
    if installed != want.version:
        shown = f"{installed} ({fact.installed.name})" if fact.installed else "none"
        replaces = fact.installed.name if fact.installed and want.component is None and _other_name(fact, want) else None
        return [Change(NAME, target.name, RESOURCE, "installed", shown, want.version, Disruption.HOST_REBOOT,
                       InstallManager(want.version, want.bundle, _host_path(want), want.sha256, replaces))]
    if fact.running != want.version:  # installed before, waiting for the reboot
        return [Change(NAME, target.name, RESOURCE, "running", fact.running or "not loaded", want.version,
                       Disruption.HOST_REBOOT)]
    return []


def check_guests(target: DesiredEsxi, fact: ManagerFact) -> None:
    """Each vGPU guest driver of the host's VMs loads on the manager the host runs (installed, where
    none runs yet); no manager at all is vCenter's to say (the host offers no vGPU type: resolve.py)."""
    manager = fact.running or (fact.installed.driver_version if fact.installed else None)
    if manager is None:
        return
    how = "runs" if fact.running else "has installed (not running yet)"
    for guest in target.vgpu_guests:
        for running in manager.split(", "):
            if why := incompatibility(running, guest.version):
                raise InputError(f"{target.locate(guest.where)}: {NAME}: host {target.name} {how} vGPU manager "
                                 f"{running} (read in its ESXi shell); VM '{guest.vm}': {why}")


def _other_name(fact: ManagerFact, want: VgpuManager) -> bool:
    """Whether the bundle's file name names another component than the one installed (NVD-VGPU-800
    replaced by NVD-AIE-800): esxcli upgrades a component in place, not across names."""
    assert fact.installed is not None
    return not posixpath.basename(want.bundle).startswith(fact.installed.name + "_")


def _host_path(want: VgpuManager) -> str:
    """Where the bundle is on the host: its path, or where a URL is fetched to."""
    if want.bundle.startswith("/"):
        return want.bundle
    return posixpath.join(DOWNLOADS, posixpath.basename(want.bundle.split("?", 1)[0]) or "nvidia-host-driver.zip")


def apply(ctx: Context, target: DesiredEsxi, changes: list[Change]) -> None:
    """Only the bundle's checks: the install is host.reboot's, in maintenance mode (module docstring)."""
    for change in changes:
        if isinstance(action := change.action, InstallManager):
            if action.bundle != action.path:
                run(target, ctx.cluster, ["wget", "-q", "-O", action.path, action.bundle],
                    timeout=max(ctx.cluster.command_timeout, INSTALL_TIMEOUT))
            check_bundle(ctx, target, action)


def check_bundle(ctx: Context, target: DesiredEsxi, action: InstallManager) -> None:
    """The bundle on the host has the runbook's sha256, or nothing is installed."""
    listing = run(target, ctx.cluster, ["ls", action.path], check=False)
    if not listing.ok:
        raise RemoteCommandError(f"host {target.name}: NVIDIA host driver bundle {action.path} not found on the host "
                                 f"(hosts[].nvidia_host_driver.bundle): {listing.last_line}")
    if (actual := file_sha256(target, ctx.cluster, action.path)) != action.sha256:
        raise RemoteCommandError(_refused(target, action.path, actual, action.sha256))


def _refused(target: DesiredEsxi, path: str, actual: str, sha256: str) -> str:
    return (f"host {target.name}: NVIDIA host driver bundle {path} has sha256 {actual}, the runbook's "
            f"nvidia_host_driver.sha256 is {sha256}: not installed (a changed or tampered bundle, or a stale "
            "sha256 in the runbook)")


STEP = Step(NAME, "esxi", observe, plan, apply, wanted=wanted)
