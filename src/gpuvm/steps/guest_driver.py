"""guest.driver: the NVIDIA driver version the runbook pins for the guest (`guests.driver`, the one
of its VM's kind, or its own `guests.hosts[].driver`: runbook/guest_drivers.py).

Observed with `nvidia-smi --query-gpu=driver_version --format=csv,noheader` (one line per GPU); no
nvidia-smi, or one that cannot reach a driver (exit 9), reads as "none". Installed with NVIDIA's
.run installer (`guests.driver.installer`, default NVIDIA's download URL for the version), fetched
by the guest, checked against `guests.driver.sha256` (never run when it differs) and run with
`--silent`. A guest without a driver gets it at once. Replacing a running driver unloads its
kernel modules, which ends every GPU process in the VM, as a power cycle would: that change is
marked "needs VM power-off" (refused without --allow-power-off), and where the installer cannot
unload them (a process holds a GPU) apply stops, saying to reboot the VM.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpuvm.errors import RemoteCommandError
from gpuvm.plan import Change, Disruption
from gpuvm.desired.ssh import DesiredGuest
from gpuvm.remote import Cluster, run
from gpuvm.steps.base import Context, Step
from gpuvm.steps.installer import fetch_and_run, missing
from gpuvm.untrusted import checked

NAME = "guest.driver"
QUERY = ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"]
NO_DRIVER = 9  # nvidia-smi: "couldn't communicate with the NVIDIA driver"


@dataclass(frozen=True)
class InstallDriver:
    version: str
    url: str
    sha256: str  # the installer's, from the runbook: checked on the guest before it runs


def wanted(target: DesiredGuest) -> bool:
    return target.driver is not None


def driver_version(target: DesiredGuest, cluster: Cluster) -> str | None:
    """The running driver's version (several GPUs: one line each, one version); None: no driver."""
    result = run(target, cluster, QUERY, sudo=False, check=False)
    if missing(result) or result.exit_code == NO_DRIVER:
        return None
    if not result.ok:
        raise RemoteCommandError(f"{' '.join(QUERY)} failed (exit {result.exit_code}): {result.last_line}")
    return parse_driver_versions(result.stdout)


def parse_driver_versions(text: str) -> str | None:
    """nvidia-smi's one line per GPU → the version; GPUs that disagree (never seen) → all, joined."""
    found = {checked(line.strip(), "a version", "nvidia-smi --query-gpu=driver_version") for line in text.splitlines()
             if line.strip()}
    return ", ".join(sorted(found)) or None


def observe(ctx: Context, target: DesiredGuest) -> str | None:
    return driver_version(target, ctx.cluster)


def plan(target: DesiredGuest, running: str | None) -> list[Change]:
    want = target.driver
    assert want is not None
    if running == want.version:
        return []
    disruption = Disruption.NONE if running is None else Disruption.VM_POWER_OFF
    return [Change(NAME, target.name, "NVIDIA driver", "driver_version", running, want.version, disruption,
                   InstallDriver(want.version, want.url, want.sha256))]


def apply(ctx: Context, target: DesiredGuest, changes: list[Change]) -> None:
    for change in changes:
        action: InstallDriver = change.action
        fetch_and_run(target, ctx.cluster, action.url, action.sha256, f"NVIDIA-Linux-x86_64-{action.version}.run",
                      lambda path: [["sh", path, "--silent"]],
                      f"NVIDIA driver {action.version} installer",
                      "; a GPU process may hold the running driver: stop it or reboot the VM, then apply again")
        now = driver_version(target, ctx.cluster)
        if now != action.version:
            raise RemoteCommandError(f"nvidia-smi reports driver {now or 'none'} after installing {action.version}")


STEP = Step(NAME, "guest", observe, plan, apply, wanted=wanted)
