"""The SSH side of a run: one executor per ESXi shell and guest OS named in the runbook.

Connections open lazily and are reused. Host keys come from ~/.ssh/known_hosts, the runbook's
`ssh.known_hosts` and the state directory's known_hosts; an unknown key is refused unless the
user passes --accept-new-host-keys, which records it (in the runbook's file, else the state's).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Literal

from gpuvm.errors import InputError, listed
from gpuvm.executors.base import Executor
from gpuvm.files import KEY_BYTES, check_capped
from gpuvm.runbook.model import Guest, Host, Runbook, SshAccess
from gpuvm.secrets import secret_from_env

Role = Literal["esxi", "guest"]


@dataclass
class RemoteTarget:
    name: str  # the host's name, or the guest's VM name
    role: Role
    access: SshAccess
    executor: Executor
    runbook: Runbook
    where: tuple[str | int, ...]  # its entry in the runbook: ("hosts", 0) or ("guests", "hosts", 2)
    host: Host | None = None
    guest: Guest | None = None

    @property
    def sudo(self) -> bool:
        return self.access.sudo

    @property
    def root(self) -> bool:
        """Whether commands that need root go through sudo: unless the login user is root."""
        return self.sudo or self.access.user != "root"

    def error(self, step: str, loc: tuple[str | int, ...], message: str) -> InputError:
        """An input error at a field of this target's runbook entry: `file:line: field: step: guest X: …`."""
        kind = "host" if self.role == "esxi" else "guest"
        return self.runbook.error(self.where + loc, f"{step}: {kind} {self.name}: {message}")


@dataclass
class RemoteOptions:
    accept_new_host_keys: bool = False
    executor_factory: Callable[[str, SshAccess], Executor] | None = None  # tests inject fakes here


@dataclass
class Cluster:
    """Everything remote steps share: the runbook, every target, the state directory, timeouts."""

    runbook: Runbook
    state_dir: Path
    targets: dict[str, RemoteTarget] = field(default_factory=dict)
    command_timeout: float = 600

    def of_role(self, role: Role) -> dict[str, RemoteTarget]:
        return {n: t for n, t in self.targets.items() if t.role == role}

    def close(self) -> None:
        for target in self.targets.values():
            target.executor.close()


def _relative(runbook: Runbook, path: Path | None) -> Path | None:
    if path is None:
        return None
    path = path.expanduser()
    return path if path.is_absolute() else runbook.file.parent / path


def known_hosts_files(runbook: Runbook, state_dir: Path) -> list[Path]:
    """The known_hosts files gpuvm trusts, those that exist: the user's, the state's, the runbook's."""
    own = _relative(runbook, runbook.ssh.known_hosts)
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
    known = known_hosts_files(runbook, state_dir)
    key_file = _relative(runbook, access.key_file)  # checked once for every login: check_key_files
    return SshExecutor(name, access.address, access.user, port=access.port,
                       key_file=key_file, password=password, passphrase=passphrase,
                       known_hosts=known, accept_new_host_keys=options.accept_new_host_keys,
                       record_to=own or state_dir / "known_hosts", connect_timeout=runbook.ssh.connect_timeout)


def build_cluster(runbook: Runbook, state_dir: Path, options: RemoteOptions | None = None) -> Cluster:
    options = options or RemoteOptions()
    cluster = Cluster(runbook, state_dir, command_timeout=runbook.ssh.command_timeout)
    logins: list[tuple[str, SshAccess, tuple[str | int, ...]]] = \
        [(h.name, h.ssh, ("hosts", i, "ssh")) for i, h in enumerate(runbook.hosts) if h.ssh is not None]
    logins += [(g.vm, g.ssh, ("guests", "hosts", i, "ssh"))
               for i, g in enumerate(runbook.guests.hosts if runbook.guests else [])]
    if options.executor_factory is None:
        check_key_files(runbook, logins)
    for i, host in enumerate(runbook.hosts):
        if host.ssh is not None:
            executor = ssh_executor(runbook, state_dir, options, host.name, host.ssh, ("hosts", i, "ssh"))
            cluster.targets[host.name] = RemoteTarget(host.name, "esxi", host.ssh, executor, runbook, ("hosts", i),
                                                      host=host)
    for i, guest in enumerate(runbook.guests.hosts if runbook.guests else []):
        where = ("guests", "hosts", i)
        executor = ssh_executor(runbook, state_dir, options, guest.vm, guest.ssh, where + ("ssh",))
        cluster.targets[guest.vm] = RemoteTarget(guest.vm, "guest", guest.ssh, executor, runbook, where, guest=guest)
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


def run(target: RemoteTarget, cluster: Cluster, argv: list[str], *, sudo: bool | None = None,
        check: bool = True, **kwargs: Any):
    """Run argv on a target with its sudo setting and the runbook's command timeout."""
    kwargs.setdefault("timeout", cluster.command_timeout)
    return target.executor.run(argv, sudo=target.sudo if sudo is None else sudo, check=check, **kwargs)
