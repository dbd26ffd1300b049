"""What the guest stack steps share: fetching a vendor installer onto a guest with curl to run it,
once its sha256 is the runbook's."""

from __future__ import annotations

from collections.abc import Callable

from gpuvm.errors import RemoteCommandError
from gpuvm.executors.base import CommandResult
from gpuvm.desired.ssh import DesiredGuest
from gpuvm.remote import Cluster, run

INSTALL_TIMEOUT = 1800.0  # an installer builds kernel modules or unpacks hundreds of packages


def missing(result: CommandResult) -> bool:
    """The command is not installed: exit 127 plain; under sudo "command not found" and exit 1."""
    return result.exit_code == 127 or "command not found" in result.stderr


def fetch_and_run(target: DesiredGuest, cluster: Cluster, url: str, sha256: str, filename: str,
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


def file_sha256(target: DesiredGuest, cluster: Cluster, path: str) -> str:
    """The sha256 of a file on the guest, as `sha256sum` prints it."""
    fields = run(target, cluster, ["sha256sum", path], sudo=False).stdout.split()
    return fields[0].lower() if fields else "(none printed)"
