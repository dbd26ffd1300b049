"""guest.slurm's apply: the controller first (key, files, slurmctld), the compute guests in parallel
(key, slurmd), then the controller resumes the nodes and waits, bounded, until they answer."""

from __future__ import annotations

import time

from gpuvm.desired.ssh import DesiredGuest
from gpuvm.errors import GpuvmError, RemoteCommandError
from gpuvm.executors.base import UNDER_WAY
from gpuvm.executors.group import run_group
from gpuvm.parsers.scontrol import parse_nodes, slurms_reason
from gpuvm.plan import Change
from gpuvm.remote import Cluster, run
from gpuvm.steps.base import Context
from gpuvm.steps.guest_slurm.actions import (DEFAULTS, GRES_CONF, NAME, InstallPackages, Reconfigure, ResumeNode,
                                             StartService, WriteFile, WriteMungeKey, slurm_node)
from gpuvm.steps.guest_slurm.munge_key import munge_key
from gpuvm.steps.guest_slurm.observe import MUNGE_KEY
from gpuvm.steps.guest_slurm.wanted import read, wanted_files

SETTLE_TIMEOUT = 90.0  # seconds apply waits for every node to register with slurmctld


def _apt_install(target: DesiredGuest, cluster: Cluster, packages: tuple[str, ...]) -> None:
    env = ["env", "DEBIAN_FRONTEND=noninteractive"]
    run(target, cluster, env + ["apt-get", "update"], sudo=target.root, check=False)
    result = run(target, cluster, env + ["apt-get", "install", "-y", *packages], sudo=target.root, check=False,
                 timeout=max(cluster.command_timeout, 900))
    if not result.ok:
        raise RemoteCommandError(f"{target.name}: {NAME}: apt-get install {' '.join(packages)} failed: "
                                 f"{result.last_line or f'exit {result.exit_code}'}")


def _systemctl(target: DesiredGuest, cluster: Cluster, verb: str, service: str) -> None:
    result = run(target, cluster, ["systemctl", verb, service], sudo=target.root, check=False)
    if not result.ok:
        raise RemoteCommandError(f"{target.name}: {NAME}: systemctl {verb} {service} failed: "
                                 f"{result.last_line or f'exit {result.exit_code}'}")


def _write(target: DesiredGuest, cluster: Cluster, path: str, content: bytes, mode: str, owner: str) -> None:
    """`content` into `path` whole (written beside, then renamed), with its mode and owner."""
    new = f"{path}.gpuvm-new"
    run(target, cluster, ["sh", "-c", 'umask 077; mkdir -p "$(dirname "$1")" && cat > "$2" && chown "$3" "$2" && '
                          'chmod "$4" "$2" && mv -f "$2" "$1"', "gpuvm-write", path, new, owner, mode],
        sudo=target.root, stdin=content)


def _dirs(target: DesiredGuest, cluster: Cluster) -> None:
    """The directories slurm.conf names, and /run/slurm made again at every boot (tmpfiles.d)."""
    run(target, cluster, ["sh", "-c", "install -d -o slurm -g slurm -m 0755 /var/lib/slurm /var/lib/slurm/slurmctld "
                          "/var/log/slurm /run/slurm && install -d -m 0755 /var/lib/slurm/slurmd && "
                          "mkdir -p /etc/tmpfiles.d && echo 'd /run/slurm 0755 slurm slurm -' > /etc/tmpfiles.d/slurm-gpuvm.conf"],
        sudo=target.root)


def apply(ctx: Context, target: DesiredGuest, changes: list[Change]) -> None:
    """One guest's changes (the controller's node states aside: `apply_all` resumes them last)."""
    cluster, node = ctx.cluster, slurm_node(target)
    actions = [c.action for c in changes]
    if install := next((a for a in actions if isinstance(a, InstallPackages)), None):
        _apt_install(target, cluster, install.packages)
    _dirs(target, cluster)
    keyed = any(isinstance(a, WriteMungeKey) for a in actions)
    if keyed:
        _write(target, cluster, MUNGE_KEY, munge_key(cluster.state_dir).data(), "0400", "munge:munge")
    if keyed or any(isinstance(a, StartService) and a.service == "munge" for a in actions):
        _systemctl(target, cluster, "restart", "munge")
        _systemctl(target, cluster, "enable", "munge")
    writes = [a for a in actions if isinstance(a, WriteFile)]
    again = _rendered_after_mig(target, cluster) if any(w.after_mig for w in writes) else {}
    for write in writes:
        _write(target, cluster, write.path, again.get(write.path, write.content).encode(), "0644", "root:root")
    if node.controller_of(target.name):
        _apply_controller(target, cluster, actions, {w.path for w in writes}, keyed)
    if node.compute_of(target.name):
        if keyed or any(w.path == DEFAULTS for w in writes) or any(isinstance(a, StartService) and a.service == "slurmd"
                                                                   for a in actions):
            _systemctl(target, cluster, "restart", "slurmd")
            _systemctl(target, cluster, "enable", "slurmd")


def _rendered_after_mig(target: DesiredGuest, cluster: Cluster) -> dict[str, str]:
    """The controller's files rendered from the guests as they are now, after guest.mig made their MIG
    devices (the plan's gres.conf could only count them)."""
    wanted = wanted_files(cluster, target, read(target, cluster, False).hardware)
    if wanted.unread or wanted.problem:
        why = wanted.problem or f"{', '.join(wanted.unread)} could not be read"
        raise RemoteCommandError(f"{target.name}: {NAME}: gres.conf not rendered after guest.mig: {why}")
    return {GRES_CONF: wanted.files[GRES_CONF]}


def _apply_controller(target: DesiredGuest, cluster: Cluster, actions: list, written: set[str], keyed: bool) -> None:
    start = any(isinstance(a, StartService) and a.service == "slurmctld" for a in actions)
    if start or keyed or written & {"/etc/slurm/slurm.conf", "/etc/slurm/gres.conf"}:
        _systemctl(target, cluster, "restart", "slurmctld")
        _systemctl(target, cluster, "enable", "slurmctld")
        _wait_controller(target, cluster)
        if not start:
            _scontrol(target, cluster, ["reconfigure"])  # pushes the new files to the configless slurmds
    elif written or any(isinstance(a, Reconfigure) for a in actions):
        _scontrol(target, cluster, ["reconfigure"])


def _scontrol(target: DesiredGuest, cluster: Cluster, args: list[str], check: bool = True):
    result = run(target, cluster, ["scontrol", *args], sudo=target.root, check=False)
    if check and not result.ok:
        raise RemoteCommandError(f"{target.name}: {NAME}: scontrol {' '.join(args)} failed: "
                                 f"{result.last_line or f'exit {result.exit_code}'}")
    return result


def _pause(target: DesiredGuest, seconds: float) -> None:
    """A poll's pause, cut short by an interrupt (SIGTERM, Ctrl-C): the wait ends with it."""
    if UNDER_WAY.interrupted.wait(seconds):
        raise RemoteCommandError(f"{target.name}: {NAME}: interrupted while waiting for Slurm")


def _wait_controller(target: DesiredGuest, cluster: Cluster, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not _scontrol(target, cluster, ["ping"], check=False).ok:
        if time.monotonic() > deadline:
            raise RemoteCommandError(f"{target.name}: {NAME}: slurmctld does not answer `scontrol ping` after {timeout:.0f} s")
        _pause(target, 0.5)


def apply_all(ctx: Context, changes_by_target: dict[str, list[Change]], parallel: int | None = None) -> dict[str, Exception]:
    """The controller first, then the compute guests in parallel, then the controller resumes the
    nodes and waits until they answer. Failures by target."""
    cluster = ctx.cluster
    if not any(changes_by_target.values()):
        return {}
    munge_key(cluster.state_dir)  # made once, before the guests race for it
    guests = {n: cluster.targets[n] for n in changes_by_target}
    node = next(slurm_node(t) for t in guests.values())
    controller = node.cluster.controller
    failures: dict[str, Exception] = {}
    if changes_by_target.get(controller):
        try:
            apply(ctx, cluster.targets[controller], changes_by_target[controller])
        except GpuvmError as e:
            held = GpuvmError(f"{NAME}: not configured: the controller {controller} failed")
            return {controller: e, **{n: held for n, c in changes_by_target.items() if c and n != controller}}
    rest = {n: (cluster.targets[n], c) for n, c in changes_by_target.items() if c and n != controller}
    failures.update(run_group(rest, lambda item: apply(ctx, item[0], item[1]), parallel or max(1, min(32, len(rest))),
                              name="slurm").failed)
    if controller in cluster.targets:
        try:
            _settle(cluster.targets[controller], cluster, changes_by_target, failures)
        except GpuvmError as e:
            failures[controller] = e
    return failures


def _settle(target: DesiredGuest, cluster: Cluster, changes_by_target: dict[str, list[Change]],
            failures: dict[str, Exception]) -> None:
    """Resume the nodes planned so, then wait (bounded) until every compute node gpuvm did not fail
    on answers slurmctld."""
    for change in changes_by_target.get(target.name, []):
        if isinstance(change.action, ResumeNode):
            _scontrol(target, cluster, ["update", f"nodename={change.action.node}", "state=resume"], check=False)
    slurm = slurm_node(target).cluster
    wanted = {cluster.targets[n].login.address for n in slurm.compute if n in cluster.targets and n not in failures}
    deadline = time.monotonic() + SETTLE_TIMEOUT
    while True:
        nodes = parse_nodes(_scontrol(target, cluster, ["show", "node", "-o"], check=False).stdout)
        waiting = [n for n in nodes if n.address in wanted and not n.healthy and slurms_reason(n.reason)]
        if not waiting and nodes:
            return
        if time.monotonic() > deadline:
            raise RemoteCommandError(f"{target.name}: {NAME}: Slurm nodes not up after {SETTLE_TIMEOUT:.0f} s: "
                                     + "; ".join(f"{n.name} {n.state}" + (f" ({n.reason})" if n.reason else "")
                                                 for n in waiting))
        _pause(target, 1.0)
