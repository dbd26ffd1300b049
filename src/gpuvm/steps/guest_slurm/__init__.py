"""guest.slurm: Slurm on the guests, from the runbook's `slurm:` section.

munge on every Slurm guest with the cluster's one key (`munge_key`: made once, shown as a digest);
slurmctld on the controller with slurm.conf, gres.conf and cgroup.conf rendered from the desired
state and every compute guest's observed hardware (`render`); slurmd on each compute guest, taking
those files from the controller (Slurm's configless mode: `--conf-server` in /etc/default/slurmd),
so they are written in one place. The packages come from the guest's apt.

observe reads a guest in one command (`observe.script`); the controller's also reads each compute
guest's hardware and Slurm's own view of its nodes (`scontrol show node -o`): a node down, drained
or not responding, or whose GRES as slurmctld counts them differ from the runbook's, is drift.
`apply_all` orders the guests: the controller first (key, files, slurmctld: restarted when
slurm.conf or gres.conf changed, `scontrol reconfigure` when only cgroup.conf did), then the compute
guests in parallel (key, slurmd: restarted when its key or options changed), then the controller
resumes the nodes it drained or lost and waits, bounded, until every node answers.
"""

from __future__ import annotations

import hashlib
import re
import time
from dataclasses import dataclass, field, replace

from gpuvm.desired.ssh import DesiredGuest
from gpuvm.desired.slurm import SlurmNode
from gpuvm.errors import GpuvmError, RemoteCommandError
from gpuvm.executors.group import run_group
from gpuvm.mig import MigLayoutError
from gpuvm.parsers.scontrol import parse_nodes
from gpuvm.plan import Change
from gpuvm.remote import Cluster, run
from gpuvm.steps.base import Context, Step
from gpuvm.steps.guest_slurm.munge_key import digest_shown, load_munge_key, munge_key
from gpuvm.steps.guest_slurm.observe import MUNGE_KEY, GuestSlurm, parse, script
from gpuvm.steps.guest_slurm.render import NodeHardware, NodeLine, node_gres, render

NAME = "guest.slurm"
DEFAULTS = "/etc/default/slurmd"
SETTLE_TIMEOUT = 90.0  # seconds apply waits for every node to register with slurmctld
RESUMABLE = ("Not responding", "gres/", "Node unexpectedly rebooted", "Kill task failed")  # Slurm's reasons, not a person's


@dataclass(frozen=True)
class SlurmFact:
    own: GuestSlurm
    key_sha256: str | None  # the cluster's munge key; None: not made yet (apply makes it)
    controller_address: str
    files: dict[str, str] = field(default_factory=dict)  # controller: path → wanted content
    gres: dict[str, str] = field(default_factory=dict)  # controller: node (host name) → wanted Gres=
    unread: tuple[str, ...] = ()  # controller: compute guests whose hardware could not be read (files left as they are)
    problem: str | None = None  # controller: why the files cannot be rendered (a MIG layout that does not fit)


@dataclass(frozen=True)
class InstallPackages:
    packages: tuple[str, ...]


@dataclass(frozen=True)
class WriteMungeKey:
    """The cluster's key into /etc/munge/munge.key (0400 munge), then munge restarted."""


@dataclass(frozen=True)
class StartService:
    service: str


@dataclass(frozen=True)
class WriteFile:
    path: str
    content: str  # not a secret: Slurm's configuration


@dataclass(frozen=True)
class Reconfigure:
    """`scontrol reconfigure`: slurmctld reads its files again and pushes them to the slurmds."""


@dataclass(frozen=True)
class ResumeNode:
    node: str  # the Slurm node name


def wanted(target: DesiredGuest) -> bool:
    return target.slurm is not None


def _node(target: DesiredGuest) -> SlurmNode:
    assert target.slurm is not None  # wanted
    return target.slurm


def _packages(target: DesiredGuest) -> tuple[str, ...]:
    node = _node(target)
    return ("munge", *(("slurmctld",) if node.controller_of(target.name) else ()),
            *(("slurmd",) if node.compute_of(target.name) else ()), "slurm-client")


def _read(target: DesiredGuest, cluster: Cluster, controller: bool) -> GuestSlurm:
    result = run(target, cluster, ["sh", "-c", script(controller)], sudo=target.root)
    return parse(result.stdout, target.login.address, controller)


# -- observe ------------------------------------------------------------------------------------

def observe(ctx: Context, target: DesiredGuest) -> SlurmFact:
    cluster, node = ctx.cluster, _node(target)
    controller = node.controller_of(target.name)
    own = _read(target, cluster, controller)
    key = load_munge_key(cluster.state_dir)
    known = {**(cluster.all_guests or {}), **cluster.targets}  # the controller, even where it is not a target now
    address = known[node.cluster.controller].login.address if node.cluster.controller in known else ""
    fact = SlurmFact(own, key.sha256 if key else None, address)
    if not controller:
        return fact
    return _with_wanted_files(cluster, target, fact)


def _with_wanted_files(cluster: Cluster, target: DesiredGuest, fact: SlurmFact) -> SlurmFact:
    """The controller's fact with its files as the cluster needs them: every compute guest's hardware
    read (in parallel), its GRES from the runbook's MIG layout or vGPU profile."""
    own = fact.own
    slurm = _node(target).cluster
    others = {n: cluster.targets[n] for n in slurm.compute if n != target.name and n in cluster.targets}
    missing = [n for n in slurm.compute if n != target.name and n not in cluster.targets]
    read = run_group(others, lambda t: _read(t, cluster, False).hardware, max(1, min(32, len(others))), name="slurm")
    hardware = {**read.ok, **({target.name: own.hardware} if target.name in slurm.compute else {})}
    if missing or read.failed:
        return replace(fact, unread=tuple(sorted([*missing, *read.failed])))
    nodes: dict[str, tuple[NodeHardware, tuple]] = {}
    for name in slurm.compute:
        guest = cluster.targets[name]
        try:
            nodes[name] = (hardware[name], node_gres(hardware[name], guest.mig, guest.slurm.gres_type if guest.slurm else None))
        except MigLayoutError as e:
            return replace(fact, problem=f"guest {name}'s MIG layout: {e}")
    files = render(slurm, own.hardware, nodes)
    gres = {h.hostname: NodeLine(h.hostname, h.address, h.cpus, h.memory_mb, g).gres_field for h, g in nodes.values()}
    return replace(fact, files=files.by_path(), gres=gres)


# -- plan (pure) --------------------------------------------------------------------------------

def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _defaults(address: str) -> str:
    return f'# Written by gpuvm (guest.slurm): slurmd takes its configuration from slurmctld.\nSLURMD_OPTIONS="--conf-server {address}"\n'


def plan(target: DesiredGuest, fact: SlurmFact) -> list[Change]:
    node, own = _node(target), fact.own
    controller, compute = node.controller_of(target.name), node.compute_of(target.name)
    changes: list[Change] = []

    def change(resource: str, field_: str, before: object, after: object, action: object) -> None:
        changes.append(Change(NAME, target.name, resource, field_, before, after, action=action))

    if missing := [p for p in _packages(target) if p not in own.packages]:
        change("packages", "installed", "missing " + ", ".join(missing), ", ".join(missing), InstallPackages(tuple(missing)))
    key = digest_shown(fact.key_sha256) if fact.key_sha256 else "new cluster key (made on apply)"
    if own.key_sha256 is None or own.key_sha256 != fact.key_sha256:
        change(MUNGE_KEY, "key", digest_shown(own.key_sha256) if own.key_sha256 else None, key, WriteMungeKey())
    elif own.key_mode != "400 munge":
        change(MUNGE_KEY, "mode", own.key_mode or "unknown", "400 munge", WriteMungeKey())
    if "munge" not in own.active:
        change("service munge", "running", "stopped", "running", StartService("munge"))
    if controller:
        changes += _plan_controller(target, fact)
    if compute:
        wanted_defaults = _defaults(fact.controller_address)
        if fact.controller_address and own.configs.get(DEFAULTS) != _sha(wanted_defaults):
            change(DEFAULTS, "content", "differs" if DEFAULTS in own.configs else None,
                   f"--conf-server {fact.controller_address}", WriteFile(DEFAULTS, wanted_defaults))
        if "slurmd" not in own.active:
            change("service slurmd", "running", "stopped", "running", StartService("slurmd"))
    return changes


def _plan_controller(target: DesiredGuest, fact: SlurmFact) -> list[Change]:
    own, changes = fact.own, []

    def change(resource: str, field_: str, before: object, after: object, action: object) -> None:
        changes.append(Change(NAME, target.name, resource, field_, before, after, action=action))

    if fact.problem:
        raise target.error(NAME, ("mig",), f"slurm.conf's GRES: {fact.problem}")
    written = False
    for path, content in fact.files.items():
        if own.configs.get(path) != _sha(content):
            before = f"sha256:{own.configs[path][:12]}" if path in own.configs else None
            change(path, "content", before, f"sha256:{_sha(content)[:12]}", WriteFile(path, content))
            written = True
    if "slurmctld" not in own.active:
        change("service slurmctld", "running", "stopped", "running", StartService("slurmctld"))
        return changes
    seen = {n.name: n for n in own.nodes or ()}
    for name, gres in fact.gres.items():
        state = seen.get(name)
        if state is None:
            continue  # not in slurmctld's files yet: the files' change adds it
        if not state.healthy:
            reason = f" ({state.reason})" if state.reason else ""
            if _slurms(state.reason):
                change(f"slurm node {name}", "state", f"{state.state}{reason}", "IDLE", ResumeNode(name))
        if _gres(state.gres) != gres:  # with new files too: the plan shows what the GRES become
            change(f"slurm node {name}", "gres", _gres(state.gres) or None, gres or None, Reconfigure())
    return changes


def _slurms(reason: str) -> bool:
    """Whether a node's reason is Slurm's own (none, or one of RESUMABLE), not a person's: gpuvm
    resumes and waits for the first kind only; a drain someone set is theirs to lift."""
    return not reason or reason.startswith(RESUMABLE)


def _gres(slurm_gres: str) -> str:
    """Gres= as scontrol prints it without the sockets (`gpu:a100:4(S:0)` → `gpu:a100:4`)."""
    return ",".join(re.sub(r"\(S:[^)]*\)$", "", g) for g in slurm_gres.split(",") if g)


# -- apply --------------------------------------------------------------------------------------

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
    cluster, node = ctx.cluster, _node(target)
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
    for write in writes:
        _write(target, cluster, write.path, write.content.encode(), "0644", "root:root")
    if node.controller_of(target.name):
        _apply_controller(target, cluster, actions, {w.path for w in writes}, keyed)
    if node.compute_of(target.name):
        if keyed or any(w.path == DEFAULTS for w in writes) or any(isinstance(a, StartService) and a.service == "slurmd"
                                                                   for a in actions):
            _systemctl(target, cluster, "restart", "slurmd")
            _systemctl(target, cluster, "enable", "slurmd")


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


def _wait_controller(target: DesiredGuest, cluster: Cluster, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not _scontrol(target, cluster, ["ping"], check=False).ok:
        if time.monotonic() > deadline:
            raise RemoteCommandError(f"{target.name}: {NAME}: slurmctld does not answer `scontrol ping` after {timeout:.0f} s")
        time.sleep(0.5)


def apply_all(ctx: Context, changes_by_target: dict[str, list[Change]], parallel: int | None = None) -> dict[str, Exception]:
    """The controller first, then the compute guests in parallel, then the controller resumes the
    nodes and waits until they answer. Failures by target."""
    cluster = ctx.cluster
    if not any(changes_by_target.values()):
        return {}
    munge_key(cluster.state_dir)  # made once, before the guests race for it
    guests = {n: cluster.targets[n] for n in changes_by_target}
    node = next(_node(t) for t in guests.values())
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
    slurm = _node(target).cluster
    wanted = {cluster.targets[n].login.address for n in slurm.compute if n in cluster.targets and n not in failures}
    deadline = time.monotonic() + SETTLE_TIMEOUT
    while True:
        nodes = parse_nodes(_scontrol(target, cluster, ["show", "node", "-o"], check=False).stdout)
        waiting = [n for n in nodes if n.address in wanted and not n.healthy and _slurms(n.reason)]
        if not waiting and nodes:
            return
        if time.monotonic() > deadline:
            raise RemoteCommandError(f"{target.name}: {NAME}: Slurm nodes not up after {SETTLE_TIMEOUT:.0f} s: "
                                     + "; ".join(f"{n.name} {n.state}" + (f" ({n.reason})" if n.reason else "")
                                                 for n in waiting))
        time.sleep(1.0)


STEP = Step(NAME, "guest", observe, plan, apply, wanted=wanted, apply_all=apply_all)
