"""The guests in the mesh: which targets, the mesh user on each, their verified host keys.

The mesh user is `guests.ssh_mesh.user`, default the guest's SSH user; when it is another user,
the mesh's scripts run as that user (`sudo -u`), never as root: `~/.ssh` is the user's
to shape, and root working there would follow a link the user planted (`known_hosts ->
/etc/shadow`) to read or change what the user cannot. Host keys come from the connection gpuvm
itself verified (`host_key_line()`), never from ssh-keyscan.
"""

from __future__ import annotations

import shlex
from typing import TYPE_CHECKING

from gpuvm.errors import GpuvmError, RemoteCommandError
from gpuvm.ssh_keys import known_hosts_name
from gpuvm.steps.guest_ssh_mesh.name import NAME
from gpuvm.steps.guest_ssh_mesh.files import Peer
from gpuvm.desired.ssh import DesiredGuest
from gpuvm.remote import Cluster
from gpuvm.secrets import redact

if TYPE_CHECKING:  # paramiko is imported where a guest's key is read: plan and inventory run without it
    import paramiko


def mesh_guests(cluster: Cluster) -> dict[str, DesiredGuest]:
    return cluster.of_role("guest")  # type: ignore[return-value]


def mesh_members(cluster: Cluster) -> dict[str, DesiredGuest]:
    """Every guest in the others' mesh files, in the runbook's order: the guests gpuvm works on, and
    those whose VM was not observed (their vCenter not reached: `Cluster.all_guests`)."""
    return cluster.all_guests or mesh_guests(cluster)  # type: ignore[return-value]


def mesh_user(target: DesiredGuest) -> str:
    return target.mesh.user if target.mesh else target.login.user


def as_other_user(target: DesiredGuest, user: str) -> bool:
    """Whether `user` is not the login user (its files are then read and written through sudo)."""
    return user != target.login.user


def as_mesh_user(target: DesiredGuest, user: str, script: str) -> str:
    """`script` made to run as `user`: the login user's own files directly; another user's through
    `sudo -u` (as the mesh check logs in), so no root process opens a path in that user's home."""
    if not as_other_user(target, user):
        return script
    return f"sudo -n -u {shlex.quote(user)} -H sh -c {shlex.quote(script)}"


def peer_host_keys(cluster: Cluster) -> tuple[tuple[Peer, ...], dict[str, Exception]]:
    """Every mesh member's verified host key (`mesh_members`), and the guests that did not answer.

    The key comes from gpuvm's own connection; for a guest that does not answer, or whose VM was not
    observed (not asked), from gpuvm's known_hosts (the key it verified last), its address from the
    runbook. A peer briefly away thus keeps its last verified place in the others' peer sets and their
    mesh files are not rewritten: a peer set changes when the runbook adds or removes a guest, or for
    a guest gpuvm has never verified (no key to give the others yet).
    """
    peers, unreachable = [], {}
    known: paramiko.HostKeys | None = None
    for name, target in mesh_members(cluster).items():
        line = getattr(cluster.executors.get(name), "host_key_line", None)
        try:
            if line is None:  # not a connection (a local or scripted executor, or none): no "does not answer"
                raise GpuvmError(f"{name}: {NAME}: the executor cannot tell the host key")
            _, key_type, key = line().split()[:3]
        except GpuvmError as e:
            if name in cluster.targets:
                unreachable[name] = e
            if known is None:
                known = _known_keys(cluster)
            if (last := _last_key(known, target)) is None:
                continue
            key_type, key = last
        peers.append(Peer(name, target.login.address, target.login.port, key_type, key))
    return tuple(peers), unreachable


def _known_keys(cluster: Cluster) -> paramiko.HostKeys:
    import paramiko

    from gpuvm.executors.known_hosts import read_known_hosts

    keys = paramiko.HostKeys()
    read_known_hosts(cluster.known_hosts_files()).add_to(keys)
    return keys


def _last_key(known: paramiko.HostKeys, target: DesiredGuest) -> tuple[str, str] | None:
    """(type, base64) of the host key gpuvm trusts for the target's address: the first one known, the
    type paramiko asks a known host for first, so the one its connections verified."""
    found = known.lookup(known_hosts_name(target.login.address, target.login.port))
    if not found:
        return None
    key_type = next(iter(found.keys()))
    return key_type, found[key_type].get_base64()


def script_error(target: DesiredGuest, what: str, result) -> RemoteCommandError:
    """The error for a mesh script that failed on a guest: its last error line, not the script's text."""
    detail = result.last_line or "no output"
    return RemoteCommandError(redact(f"{target.name}: {NAME}: {what} failed (exit {result.exit_code}): {detail}"))
