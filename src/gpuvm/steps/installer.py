"""What the installing steps share: a vendor installer fetched onto a guest with curl, or the vGPU
manager's bundle copied on its ESXi host, into a private directory, and run from there once its
sha256 is the runbook's."""

from __future__ import annotations

import posixpath
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from gpuvm.errors import RemoteCommandError
from gpuvm.executors.base import CommandResult
from gpuvm.desired.ssh import DesiredGuest
from gpuvm.remote import Cluster, SshTarget, run

INSTALL_TIMEOUT = 1800.0  # an installer builds kernel modules or unpacks hundreds of packages


def missing(result: CommandResult) -> bool:
    """The command is not installed: exit 127 plain; under sudo "command not found" and exit 1."""
    return result.exit_code == 127 or "command not found" in result.stderr


def fetch_and_run(target: DesiredGuest, cluster: Cluster, url: str, sha256: str, filename: str,
                  commands: Callable[[str], list[list[str]]], what: str, hint: str = "") -> None:
    """curl `url` into a private directory on the guest (`checked_copy`), run `commands(path)` as
    root in order once its sha256 is the runbook's (`sha256`). A file with another digest is never run."""
    refused = (lambda actual: f"{what}: {url} has sha256 {actual}, the runbook's sha256 is {sha256}: "
               "not run (a changed or tampered download, or a stale sha256 in the runbook)")
    with checked_copy(target, cluster, lambda path: ["curl", "-fsSL", "--retry", "3", "-o", path, url],
                      filename, sha256, refused) as path:
        for argv in commands(path):
            result = run(target, cluster, argv, sudo=target.root, check=False,
                         timeout=max(cluster.command_timeout, INSTALL_TIMEOUT))
            if not result.ok:
                raise RemoteCommandError(f"{what} failed (exit {result.exit_code}): {result.last_line}{hint}")


@contextmanager
def checked_copy(target: SshTarget, cluster: Cluster, copy: Callable[[str], list[str]], filename: str,
                 sha256: str, refused: Callable[[str], str], under: str = "/tmp") -> Iterator[str]:
    """The path of `filename` in a new private directory on the target (`mktemp -d` under `under`: no
    path another user could have prepared or can change), put there by `copy(path)` and checked
    there: its sha256 is `sha256`, else RemoteCommandError(`refused(actual)`). What runs on that path
    runs what was checked. The directory is removed after."""
    workdir = run(target, cluster, ["mktemp", "-d", posixpath.join(under, "gpuvm-install.XXXXXX")],
                  sudo=False).stdout.strip()
    path = f"{workdir}/{filename}"
    try:
        run(target, cluster, copy(path), sudo=False)
        if (actual := file_sha256(target, cluster, path)) != sha256:
            raise RemoteCommandError(refused(actual))
        yield path
    finally:
        run(target, cluster, ["rm", "-rf", workdir], sudo=target.root, check=False)


def file_sha256(target: SshTarget, cluster: Cluster, path: str) -> str:
    """The sha256 of a file on the target, as `sha256sum` prints it."""
    fields = run(target, cluster, ["sha256sum", path], sudo=False).stdout.split()
    return fields[0].lower() if fields else "(none printed)"
