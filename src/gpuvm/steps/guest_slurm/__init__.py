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
from dataclasses import dataclass, field

from gpuvm.desired.ssh import DesiredGuest
from gpuvm.parsers.scontrol import slurms_reason
from gpuvm.plan import Change, Note
from gpuvm.steps.base import Context, Step
from gpuvm.steps.guest_slurm.actions import (DEFAULTS, GRES_CONF, NAME, InstallPackages, Reconfigure, ResumeNode,
                                             StartService, WriteFile, WriteMungeKey, slurm_node)
from gpuvm.steps.guest_slurm.apply import apply, apply_all
from gpuvm.steps.guest_slurm.munge_key import digest_shown, load_munge_key
from gpuvm.steps.guest_slurm.observe import MUNGE_KEY, GuestSlurm
from gpuvm.steps.guest_slurm.wanted import WantedFiles, read, wanted_files

__all__ = ["NAME", "DEFAULTS", "InstallPackages", "Reconfigure", "ResumeNode", "StartService", "WriteFile",
           "WriteMungeKey", "STEP", "apply", "apply_all"]


@dataclass(frozen=True)
class SlurmFact:
    own: GuestSlurm
    key_sha256: str | None  # the cluster's munge key; None: not made yet (apply makes it)
    controller_address: str
    wanted: WantedFiles = field(default_factory=WantedFiles)  # controller: its files as the cluster needs (else empty)


def wanted(target: DesiredGuest) -> bool:
    return target.slurm is not None


def _packages(target: DesiredGuest) -> tuple[str, ...]:
    node = slurm_node(target)
    return ("munge", *(("slurmctld",) if node.controller_of(target.name) else ()),
            *(("slurmd",) if node.compute_of(target.name) else ()), "slurm-client")


# -- observe ------------------------------------------------------------------------------------

def observe(ctx: Context, target: DesiredGuest) -> SlurmFact:
    cluster, node = ctx.cluster, slurm_node(target)
    controller = node.controller_of(target.name)
    own = read(target, cluster, controller)
    key = load_munge_key(cluster.state_dir)
    known = {**(cluster.all_guests or {}), **cluster.targets}  # the controller, even where it is not a target now
    address = known[node.cluster.controller].login.address if node.cluster.controller in known else ""
    return SlurmFact(own, key.sha256 if key else None, address,
                     wanted_files(cluster, target, own.hardware) if controller else WantedFiles())


# -- plan (pure) --------------------------------------------------------------------------------

def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _defaults(address: str) -> str:
    return f'# Written by gpuvm (guest.slurm): slurmd takes its configuration from slurmctld.\nSLURMD_OPTIONS="--conf-server {address}"\n'


def plan(target: DesiredGuest, fact: SlurmFact) -> list[Change]:
    node, own = slurm_node(target), fact.own
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
    own, wanted_, changes = fact.own, fact.wanted, []

    def change(resource: str, field_: str, before: object, after: object, action: object) -> None:
        changes.append(Change(NAME, target.name, resource, field_, before, after, action=action))

    if wanted_.problem:
        raise target.error(NAME, ("mig",), f"slurm.conf's GRES: {wanted_.problem}")
    for path, content in wanted_.files.items():
        before = f"sha256:{own.configs[path][:12]}" if path in own.configs else None
        if path == GRES_CONF and wanted_.awaiting_mig:  # its MIG devices are known once guest.mig made them
            change(path, "content", before, f"rendered after guest.mig ({', '.join(wanted_.awaiting_mig)}'s MIG devices)",
                   WriteFile(path, content, after_mig=True))
        elif own.configs.get(path) != _sha(content):
            change(path, "content", before, f"sha256:{_sha(content)[:12]}", WriteFile(path, content))
    if "slurmctld" not in own.active:
        change("service slurmctld", "running", "stopped", "running", StartService("slurmctld"))
        return changes
    seen = {n.name: n for n in own.nodes or ()}
    for name, gres in wanted_.gres.items():
        state = seen.get(name)
        if state is None:
            continue  # not in slurmctld's files yet: the files' change adds it
        if not state.healthy:
            reason = f" ({state.reason})" if state.reason else ""
            if slurms_reason(state.reason):
                change(f"slurm node {name}", "state", f"{state.state}{reason}", "IDLE", ResumeNode(name))
        if _gres(state.gres) != gres:  # with new files too: the plan shows what the GRES become
            change(f"slurm node {name}", "gres", _gres(state.gres) or None, gres or None, Reconfigure())
    return changes


def unread(target: DesiredGuest, fact: SlurmFact) -> dict[str, Note]:
    """The compute guests the controller could not read, each → a note on the controller: its files wait."""
    return {name: Note(target.name, NAME, f"compute guest {name} not read ({why}): slurm.conf, gres.conf and cgroup.conf "
                                          f"are not planned ({name}'s node line stays as it is) until it is read")
            for name, why in fact.wanted.unread.items()}


def _gres(slurm_gres: str) -> str:
    """Gres= as scontrol prints it without the sockets (`gpu:a100:4(S:0)` → `gpu:a100:4`)."""
    return ",".join(re.sub(r"\(S:[^)]*\)$", "", g) for g in slurm_gres.split(",") if g)


STEP = Step(NAME, "guest", observe, plan, apply, wanted=wanted, apply_all=apply_all, unread=unread)
