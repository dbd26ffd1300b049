"""The SSH side of a run: one executor per ESXi shell and guest OS named in the runbook.

Connections open lazily and are reused. Host keys come from ~/.ssh/known_hosts, the runbook's
`ssh.known_hosts` and the state directory's known_hosts; an unknown key is refused unless the
user passes --accept-new-host-keys, which records it (in the runbook's file, else the state's).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Literal

from gpuvm.desired.ssh import DesiredEsxi, DesiredGuest
from gpuvm.errors import InputError, listed
from gpuvm.executors.base import Executor
from gpuvm.files import KEY_BYTES, check_capped
from gpuvm.resolve_ssh import resolve_ssh
from gpuvm.runbook.hosts import SshAccess
from gpuvm.runbook.model import Runbook
from gpuvm.secrets import secret_from_env

Role = Literal["esxi", "guest"]
SshTarget = DesiredEsxi | DesiredGuest


@dataclass
class RemoteOptions:
    accept_new_host_keys: bool = False
    executor_factory: Callable[[str, SshAccess], Executor] | None = None  # tests inject fakes here


@dataclass
class Cluster:
    """Everything remote steps share: every target's desired state and its connection, the state
    directory, the known_hosts files, timeouts."""

    state_dir: Path
    targets: dict[str, SshTarget] = field(default_factory=dict)  # by name: the steps' targets
    executors: dict[str, Executor] = field(default_factory=dict)  # by name: how to run commands there
    command_timeout: float = 600
    own_known_hosts: Path | None = None  # the runbook's `ssh.known_hosts`
    # Every guest of the runbook in its order, those whose VM was not observed (their vCenter not reached)
    # too: not targets, never reached, but kept in the mesh's peers (guest_ssh_mesh.guests.mesh_members).
    # Empty: the guests among `targets`.
    all_guests: dict[str, SshTarget] = field(default_factory=dict)

    def of_role(self, role: Role) -> dict[str, SshTarget]:
        return {n: t for n, t in self.targets.items() if t.role == role}

    def known_hosts_files(self) -> list[Path]:
        """The known_hosts files gpuvm trusts, those that exist: the user's, the state's, the runbook's."""
        return known_hosts_files(self.own_known_hosts, self.state_dir)

    def close(self) -> None:
        for executor in self.executors.values():
            executor.close()


def _relative(runbook: Runbook, path: Path | None) -> Path | None:
    if path is None:
        return None
    path = path.expanduser()
    return path if path.is_absolute() else runbook.file.parent / path


def known_hosts_files(own: Path | None, state_dir: Path) -> list[Path]:
    """The known_hosts files gpuvm trusts, those that exist: the user's, the state's, the runbook's (`own`)."""
    paths = [Path("~/.ssh/known_hosts").expanduser(), state_dir / "known_hosts"] + ([own] if own else [])
    return [p for p in paths if p.exists()]


def ssh_executor(runbook: Runbook, state_dir: Path, options: RemoteOptions, name: str, access: SshAccess,
                 where: tuple[str | int, ...]) -> Executor:
    if options.executor_factory is not None:
        return options.executor_factory(name, access)
    from gpuvm.executors.ssh import SshExecutor

    password = secret_from_env(access.password_env, runbook.where(where + ("password_env",))) \
        if access.password_env else None
    passphrase = secret_from_env(access.passphrase_env, runbook.where(where + ("passphrase_env",))) \
        if access.passphrase_env else None
    own = _relative(runbook, runbook.ssh.known_hosts)
    known = known_hosts_files(own, state_dir)
    key_file = _relative(runbook, access.key_file)  # checked once for every login: check_key_files
    return SshExecutor(name, access.address, access.user, port=access.port,
                       key_file=key_file, password=password, passphrase=passphrase,
                       known_hosts=known, accept_new_host_keys=options.accept_new_host_keys,
                       record_to=own or state_dir / "known_hosts", connect_timeout=runbook.ssh.connect_timeout)


def build_cluster(runbook: Runbook, state_dir: Path, options: RemoteOptions | None = None) -> Cluster:
    """The runbook's SSH targets (`resolve_ssh`), each with its executor (connections open lazily)."""
    options = options or RemoteOptions()
    cluster = Cluster(state_dir, resolve_ssh(runbook), command_timeout=runbook.ssh.command_timeout,
                      own_known_hosts=_relative(runbook, runbook.ssh.known_hosts))
    logins: list[tuple[str, SshAccess, tuple[str | int, ...]]] = \
        [(h.name, h.ssh, ("hosts", i, "ssh")) for i, h in enumerate(runbook.hosts) if h.ssh is not None]
    logins += [(g.vm, g.ssh, ("guests", "hosts", i, "ssh"))
               for i, g in enumerate(runbook.guests.hosts if runbook.guests else [])]
    if options.executor_factory is None:
        check_key_files(runbook, logins)
    for name, access, where in logins:
        cluster.executors[name] = ssh_executor(runbook, state_dir, options, name, access, where)
    return cluster


def check_key_files(runbook: Runbook, logins: list[tuple[str, SshAccess, tuple[str | int, ...]]]) -> None:
    """Every `ssh.key_file` the runbook names is a file, before anything connects: a missing key is the
    runbook's error (file:line: field, and every host or guest that logs in with it), not an SSH
    target that "does not answer"."""
    users: dict[Path, list[tuple[str, tuple[str | int, ...]]]] = {}
    for name, access, where in logins:
        if access.key_file is not None:
            users.setdefault(_relative(runbook, access.key_file), []).append((name, where + ("key_file",)))
    problems = []
    for path, used_by in users.items():
        if not path.exists() and not path.is_symlink():
            problem = f"{path} does not exist"
        else:  # a FIFO or /dev/zero would hang or fill the key loader
            try:
                check_capped(path, KEY_BYTES, "SSH key")
                continue
            except InputError as e:
                problem = str(e)
        names = listed(name for name, _ in used_by)
        problems.append(f"{runbook.where(used_by[0][1])}: {problem}: the SSH key gpuvm logs in to {names} with")
    if problems:
        raise InputError("\n".join(problems))


def run(target: SshTarget, cluster: Cluster, argv: list[str], *, sudo: bool | None = None,
        check: bool = True, **kwargs: Any):
    """Run argv on a target with its sudo setting and the runbook's command timeout."""
    kwargs.setdefault("timeout", cluster.command_timeout)
    return cluster.executors[target.name].run(argv, sudo=target.sudo if sudo is None else sudo, check=check, **kwargs)
