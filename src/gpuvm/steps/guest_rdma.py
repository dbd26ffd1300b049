"""guest.rdma: the RDMA user space the runbook chooses (`guests.rdma`), the same on every guest.

- `stack: inbox`: the distribution's `rdma-core` (with `ibverbs-utils`), observed with
  `dpkg-query -W -f '${Version}' rdma-core`, installed with apt-get (at `version` when pinned).
- `stack: mofed`: Mellanox OFED's user space, observed with `ofed_info -s`
  ("MLNX_OFED_LINUX-5.8-3.0.7.0:"), installed from the runbook's tarball (checked against its
  `sha256` before it is unpacked) with
  `mlnxofedinstall --user-space-only --without-fw-update --all -q` (as DeepSpeed's images do).
User-space libraries only: no kernel module or firmware changes, so no change is disruptive
(processes already running keep the libraries they loaded until they restart).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from gpuvm.errors import RemoteCommandError
from gpuvm.plan import Change, Disruption
from gpuvm.desired.ssh import DesiredGuest, RdmaStack
from gpuvm.remote import run
from gpuvm.steps.base import Context, Step
from gpuvm.steps.installer import INSTALL_TIMEOUT, fetch_and_run, missing
from gpuvm.untrusted import checked

NAME = "guest.rdma"
MOFED = re.compile(r"MLNX_OFED_LINUX-(\S+?):?\s*$")
INBOX_PACKAGES = ["rdma-core", "ibverbs-utils"]


@dataclass(frozen=True)
class InstallInbox:
    version: str | None  # rdma-core's, when pinned


@dataclass(frozen=True)
class InstallMofed:
    version: str
    url: str
    sha256: str  # the tarball's, from the runbook: checked on the guest before it is unpacked


def _rdma(target: DesiredGuest) -> RdmaStack:
    assert target.rdma is not None
    return target.rdma


def wanted(target: DesiredGuest) -> bool:
    return target.rdma is not None


def parse_ofed_info(text: str) -> str | None:
    """`ofed_info -s`: "MLNX_OFED_LINUX-5.8-3.0.7.0:" → "5.8-3.0.7.0"."""
    m = MOFED.search(text.strip())
    return checked(m[1], "a version", "ofed_info -s") if m else None


def parse_dpkg_status(text: str) -> str | None:
    """`dpkg-query -W -f '${Status} ${Version}'`: "install ok installed 39.0-1" → "39.0-1"; a package
    removed ("deinstall ok config-files 39.0-1") or never installed reads None."""
    status, _, version = text.strip().rpartition(" ")
    return checked(version, "a version", "dpkg-query rdma-core") if status.split()[-1:] == ["installed"] else None


def observe(ctx: Context, target: DesiredGuest) -> str | None:
    """The installed version of the chosen stack; None: not installed."""
    if _rdma(target).stack == "mofed":
        result = run(target, ctx.cluster, ["ofed_info", "-s"], sudo=False, check=False)
        return None if missing(result) or not result.ok else parse_ofed_info(result.stdout)
    result = run(target, ctx.cluster, ["dpkg-query", "-W", "-f", "${Status} ${Version}", "rdma-core"], sudo=False,
                 check=False)
    return parse_dpkg_status(result.stdout) if result.ok else None


def plan(target: DesiredGuest, installed: str | None) -> list[Change]:
    rdma = _rdma(target)
    if rdma.stack == "mofed":
        if installed == rdma.version:
            return []
        return [Change(NAME, target.name, "RDMA user space", "MLNX_OFED", installed, rdma.version, Disruption.NONE,
                       InstallMofed(rdma.version or "", rdma.url, rdma.sha256))]
    if installed is not None and rdma.version in (None, installed):
        return []
    return [Change(NAME, target.name, "RDMA user space", "rdma-core", installed, rdma.version or "installed",
                   Disruption.NONE, InstallInbox(rdma.version))]


def apply(ctx: Context, target: DesiredGuest, changes: list[Change]) -> None:
    cluster = ctx.cluster
    for change in changes:
        action = change.action
        if isinstance(action, InstallInbox):
            packages = [f"rdma-core={action.version}" if action.version else "rdma-core", "ibverbs-utils"]
            env = ["env", "DEBIAN_FRONTEND=noninteractive"]
            run(target, cluster, env + ["apt-get", "update"], sudo=target.root)
            result = run(target, cluster, env + ["apt-get", "install", "-y", *packages], sudo=target.root, check=False,
                         timeout=max(cluster.command_timeout, INSTALL_TIMEOUT))
            if not result.ok:
                raise RemoteCommandError(f"apt-get install {' '.join(packages)} failed: {result.last_line}")
        elif isinstance(action, InstallMofed):
            fetch_and_run(target, cluster, action.url, action.sha256, f"MLNX_OFED_LINUX-{action.version}.tgz", lambda path: [
                ["mkdir", "-p", path + ".d"],
                ["tar", "-xzf", path, "-C", path + ".d", "--strip-components=1"],
                [path + ".d/mlnxofedinstall", "--user-space-only", "--without-fw-update", "--all", "-q"],
            ], f"MLNX_OFED {action.version} installer")


STEP = Step(NAME, "guest", observe, plan, apply, wanted=wanted)
