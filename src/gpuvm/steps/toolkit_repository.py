"""NVIDIA's apt repository for nvidia-container-toolkit on a guest (guest.docker's), set up as NVIDIA's
install guide does (https://docs.nvidia.com/datacenter/cloud-native/container-toolkit/latest/
install-guide.html: the signing key from https://nvidia.github.io/libnvidia-container/gpgkey, then
`deb [signed-by=<key>] https://nvidia.github.io/libnvidia-container/stable/deb/$(ARCH) /` in
/etc/apt/sources.list.d/nvidia-container-toolkit.list), from the runbook's URL and key
(`guests.image.toolkit_repository`: NVIDIA's, or a local mirror).

The key is kept ASCII-armoured (`.asc`, which apt reads since 1.4), so the guest needs no gpg. Only
this source is refreshed (`apt-get update` with it as the only source list), so what fails is this
repository's doing: a signature apt refuses with the key, or a repository it cannot reach (apt
only warns about that one, exit 0: its "Failed to fetch" is read as the failure it is). A failed
set-up leaves neither list nor key behind, so the guest's other apt commands keep working.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpuvm.desired.ssh import DesiredGuest, ToolkitSource
from gpuvm.errors import RemoteCommandError
from gpuvm.executors.base import CommandResult
from gpuvm.remote import Cluster, run
from gpuvm.secrets import without_password

LIST = "/etc/apt/sources.list.d/nvidia-container-toolkit.list"
KEYRING = "/etc/apt/keyrings/nvidia-container-toolkit.asc"
REFRESH = ["env", "DEBIAN_FRONTEND=noninteractive", "apt-get", "update",
           "-o", "Dir::Etc::sourcelist=sources.list.d/nvidia-container-toolkit.list",
           "-o", "Dir::Etc::sourceparts=-", "-o", "APT::Get::List-Cleanup=0"]
UNREACHABLE = ("Failed to fetch", "Some index files failed to download")
REFUSED = ("NO_PUBKEY", "is not signed", "BADSIG", "EXPKEYSIG", "KEYEXPIRED", "unsupported filetype")


@dataclass(frozen=True)
class AddToolkitRepository:
    """Fetch the key, write the source list, refresh that source (removed again if it fails)."""

    url: str
    key: str


def source_line(source: ToolkitSource) -> str:
    return f"deb [signed-by={KEYRING}] {source.url} /"


def current_line(target: DesiredGuest, cluster: Cluster) -> str | None:
    """The source list's first entry (None: no such file), printable and bounded: shown in the plan."""
    result = run(target, cluster, ["cat", LIST], sudo=False, check=False)
    if not result.ok:
        return None
    lines = [line.strip() for line in result.stdout.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    line = lines[0] if lines else ""
    return line[:300] if line.isascii() and line.isprintable() else "(not printable)"


def configure(target: DesiredGuest, cluster: Cluster, action: AddToolkitRepository) -> None:
    """The key, the list, one refresh of that source; nothing left behind when any of them fails."""
    root = target.root
    run(target, cluster, ["install", "-d", "-m", "0755", "/etc/apt/keyrings"], sudo=root)
    fetch = ["curl", "-fsSL", "--retry", "3", "-o", KEYRING, action.key]
    fetched = run(target, cluster, fetch, sudo=root, check=False)
    if not fetched.ok:
        _remove(target, cluster)
        key = without_password(action.key)
        raise RemoteCommandError(f"guest {target.name}: NVIDIA's repository key {key} not fetched: "
                                 f"`{' '.join(fetch[:-1] + [key])}` exited {fetched.exit_code}: {fetched.last_line}")
    try:
        cluster.executors[target.name].put(f"{source_line(ToolkitSource(action.url, action.key))}\n".encode(), LIST,
                                           sudo=root)
        refreshed = run(target, cluster, REFRESH, sudo=root, check=False)
    except Exception:
        _remove(target, cluster)
        raise
    if why := _refresh_failure(refreshed):
        _remove(target, cluster)
        raise RemoteCommandError(f"guest {target.name}: NVIDIA's repository {without_password(action.url)} {why} "
                                 f"(`{' '.join(REFRESH)}` exited {refreshed.exit_code}: {_apt_said(refreshed)}); "
                                 "the source and key were removed again")


def _refresh_failure(result: CommandResult) -> str | None:
    said = result.stdout + result.stderr
    if any(word in said for word in REFUSED):
        return "is refused: apt does not accept its signature with the runbook's key (guests.image.toolkit_repository.key)"
    if any(word in said for word in UNREACHABLE):
        return "is unreachable"
    return None if result.ok else "could not be read"


def _apt_said(result: CommandResult) -> str:
    """apt's errors and warnings (E:, W:), the first two, on one line."""
    lines = [" ".join(line.split()) for line in result.stderr.splitlines() if line.startswith(("E:", "W:"))]
    return " ".join(lines[:2])[:500] or result.last_line


def _remove(target: DesiredGuest, cluster: Cluster) -> None:
    run(target, cluster, ["rm", "-f", LIST, KEYRING], sudo=target.root, check=False)
