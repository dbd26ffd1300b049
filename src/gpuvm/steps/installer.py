"""What the guest stack steps share: their runbook setting, and fetching a vendor installer onto a
guest with curl to run it, once its sha256 is the runbook's."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gpuvm.errors import RemoteCommandError
from gpuvm.executors.base import CommandResult
from gpuvm.remote import Cluster, RemoteTarget, run

INSTALL_TIMEOUT = 1800.0  # an installer builds kernel modules or unpacks hundreds of packages


def guest_setting(target: RemoteTarget, name: str) -> Any:
    """The runbook's `guests.<name>` (driver, rdma) for a guest target; None elsewhere or when unset."""
    guests = target.runbook.guests
    return getattr(guests, name) if target.guest is not None and guests is not None else None


def missing(result: CommandResult) -> bool:
    """The command is not installed: exit 127 plain; under sudo "command not found" and exit 1."""
    return result.exit_code == 127 or "command not found" in result.stderr


def fetch_and_run(target: RemoteTarget, cluster: Cluster, url: str, sha256: str, filename: str,
                  commands: Callable[[str], list[list[str]]], what: str, hint: str = "") -> None:
    """curl `url` to `filename` in a new private directory on the guest (`mktemp -d`: no path another
    user could have prepared), check its sha256 against the runbook's (`sha256`), run `commands(path)`
    as root in order, then remove the directory. A file with another digest is never run."""
    workdir = run(target, cluster, ["mktemp", "-d", "/tmp/gpuvm-install.XXXXXX"], sudo=False).stdout.strip()
    path = f"{workdir}/{filename}"
    try:
        run(target, cluster, ["curl", "-fsSL", "--retry", "3", "-o", path, url], sudo=False)
        actual = file_sha256(target, cluster, path)
        if actual != sha256:
            raise RemoteCommandError(f"{what}: {url} has sha256 {actual}, the runbook's sha256 is {sha256}: "
                                     "not run (a changed or tampered download, or a stale sha256 in the runbook)")
        for argv in commands(path):
            result = run(target, cluster, argv, sudo=target.root, check=False,
                         timeout=max(cluster.command_timeout, INSTALL_TIMEOUT))
            if not result.ok:
                raise RemoteCommandError(f"{what} failed (exit {result.exit_code}): {result.last_line}{hint}")
    finally:
        run(target, cluster, ["rm", "-rf", workdir], sudo=target.root, check=False)


def file_sha256(target: RemoteTarget, cluster: Cluster, path: str) -> str:
    """The sha256 of a file on the guest, as `sha256sum` prints it."""
    fields = run(target, cluster, ["sha256sum", path], sudo=False).stdout.split()
    return fields[0].lower() if fields else "(none printed)"
