"""guest.ssh_mesh: keyless SSH between every pair of guests, for mpirun and horovodrun.

One ed25519 key for the cluster goes to every guest for the mesh user (`guests.ssh_mesh.user`,
default the guest's SSH user), in `~/.ssh`: the key pair, the public key in `authorized_keys`,
every guest's verified host key in `known_hosts`, and a managed block in `config`.

observe reads a guest's ~/.ssh in one command and takes every guest's host key from gpuvm's own
connections; plan compares (pure); apply writes the changed files in one command. `apply_all`
writes every guest in parallel, then proves every ordered pair logs in, once. The parts:

- `key`: the cluster's one ed25519 key pair, kept in the state directory;
- `files`: what the mesh files hold (authorized_keys, known_hosts, the managed config block), pure;
- `guests`: the guests in the mesh, the mesh user on each, their verified host keys;
- `ssh_dir`: reading and writing a guest's ~/.ssh, one command each;
- `verify`: every ordered pair of guests logs in with the mesh key, checked pair by pair;
- `blame`: which guest a failed pair is charged to.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpuvm.errors import ConnectError
from gpuvm.executors.group import run_group
from gpuvm.steps.guest_ssh_mesh import blame, verify
from gpuvm.steps.guest_ssh_mesh.files import (IDENTITY, MeshFiles, Peer, config_block, has_key, known_host_lines,
                                              merge_known_hosts, mode_problem, split_config, wanted_files)
from gpuvm.steps.guest_ssh_mesh.guests import mesh_guests, mesh_user, peer_host_keys
from gpuvm.ssh_keys import line_fingerprint
from gpuvm.steps.guest_ssh_mesh.key import MeshKey, cluster_key, load_cluster_key
from gpuvm.steps.guest_ssh_mesh.name import NAME
from gpuvm.steps.guest_ssh_mesh.ssh_dir import read_files, write_files
from gpuvm.plan import Change
from gpuvm.desired.ssh import DesiredGuest
from gpuvm.steps.base import Context, Step


@dataclass(frozen=True)
class MeshFact:
    files: MeshFiles
    key: MeshKey | None  # None: not made yet (apply makes it)
    peers: tuple[Peer, ...]  # every reachable guest, this one included
    container_port: int | None = None


@dataclass(frozen=True)
class WriteMeshFile:
    """Write one of the mesh's files in ~user/.ssh (merged with what is there at apply time)."""

    user: str
    home: str


def wanted(target: DesiredGuest) -> bool:
    return target.mesh is not None


def _container_port(target: DesiredGuest) -> int | None:
    return target.mesh.container_port if target.mesh else None


def observe(ctx: Context, target: DesiredGuest) -> MeshFact:
    cluster = ctx.cluster
    files = read_files(target, cluster, mesh_user(target))
    peers, _ = peer_host_keys(cluster)
    return MeshFact(files, load_cluster_key(cluster.state_dir), peers, _container_port(target))


def _resource(files: MeshFiles, name: str) -> str:
    return f"~{files.user}/.ssh" + ("" if name == "." else f"/{name}")


def _fingerprint_or(public_line: str | None) -> str:
    try:
        return line_fingerprint(public_line or "")
    except (IndexError, ValueError):
        return "(unreadable)"


def plan(target: DesiredGuest, fact: MeshFact) -> list[Change]:
    files, key = fact.files, fact.key
    write = WriteMeshFile(files.user, files.home)
    fp = f"mesh key {key.fingerprint}" if key else "new mesh key (made on apply)"
    changes = []

    def change(name: str, field_: str, before: str, after: str) -> None:
        changes.append(Change(NAME, target.name, _resource(files, name), field_, before, after, action=write))

    if "." not in files.stats:
        change(".", "directory", "missing", f"0700, owner {files.user}")
    elif problem := mode_problem(files, "."):
        change(".", "directory", problem, f"0700, owner {files.user}")

    pub = files.texts.get(IDENTITY + ".pub")
    if IDENTITY not in files.stats:
        change(IDENTITY, "identity", "missing", fp)
    elif key is None or files.key_digest != key.private_digest or (pub or "").split()[:2] != key.public_line.split()[:2]:
        change(IDENTITY, "identity", f"another key {_fingerprint_or(pub)}", fp)
    elif problem := (mode_problem(files, IDENTITY, private=True)
                     or (IDENTITY + ".pub" in files.stats and mode_problem(files, IDENTITY + ".pub"))):
        change(IDENTITY, "identity", problem, fp)

    authorized = files.texts.get("authorized_keys")
    if key is None or authorized is None or not has_key(authorized, key.public_line):
        change("authorized_keys", "authorized_keys", "missing mesh key", f"{fp} authorized")
    elif problem := mode_problem(files, "authorized_keys"):
        change("authorized_keys", "authorized_keys", problem, f"{fp} authorized")

    lines = known_host_lines(fact.peers, fact.container_port)
    _, present, stale = merge_known_hosts(files.texts.get("known_hosts"), lines)
    if present < len(lines) or stale:
        before = f"{present} of {len(lines)} guest host keys" + (f", {stale} stale" if stale else "")
        change("known_hosts", "known_hosts", before, f"{len(lines)} guest host keys")
    elif problem := mode_problem(files, "known_hosts"):
        change("known_hosts", "known_hosts", problem, f"{len(lines)} guest host keys")

    _, block, _ = split_config(files.texts.get("config"))
    if block != config_block(fact.peers):
        change("config", "config", "no gpuvm block" if block is None else "gpuvm block differs",
               f"gpuvm block for {len(fact.peers)} guests")
    elif problem := mode_problem(files, "config"):
        change("config", "config", problem, f"gpuvm block for {len(fact.peers)} guests")
    return changes


def apply(ctx: Context, target: DesiredGuest, changes: list[Change]) -> None:
    cluster = ctx.cluster
    if not changes:
        return
    user = mesh_user(target)
    key = cluster_key(cluster.state_dir)
    files = read_files(target, cluster, user)  # again: merge with what is there now, not at plan time
    peers, _ = peer_host_keys(cluster)
    content = wanted_files({c.field for c in changes}, files, key, peers, _container_port(target))
    write_files(target, cluster, user, files.home, content)


def apply_all(ctx: Context, changes_by_target: dict[str, list[Change]],
              parallel: int | None = None) -> dict[str, Exception]:
    """Write every guest's files in parallel, then verify the whole mesh once. Failures by target.

    A pair that fails verification is charged to the guest that could not log in (`from`), or to the
    guest nobody could log in to (`blame.charge`): possibly one this step was not given (the engine
    skipped it), so one guest's trouble does not fail the mesh, and hold back the image, everywhere.
    Pairs with a guest that does not answer gpuvm are not checked: the others are not blamed for it.
    """
    cluster = ctx.cluster
    workers = parallel or min(32, max(1, len(mesh_guests(cluster))))
    if any(changes_by_target.values()):
        cluster_key(cluster.state_dir)  # made once, before the guests race for it
    items = {n: (cluster.targets[n], c) for n, c in changes_by_target.items() if c}
    failures = dict(run_group(items, lambda item: apply(ctx, item[0], item[1]), workers, name="mesh").failed)
    _, silent = peer_host_keys(cluster)  # a guest that does not answer is its own failure, not its peers'
    away = {n for n, error in silent.items() if isinstance(error, ConnectError)}
    healthy = [n for n in mesh_guests(cluster) if n not in failures and n not in away]
    # called through the module, so that bench/ssh_mesh.py can time it
    pairs = verify.verify_mesh(cluster, workers, among=healthy)
    for guest, charged in blame.charge(pairs, healthy).items():
        failures[guest] = verify.mesh_error(charged)
    return failures


STEP = Step(NAME, "guest", observe, plan, apply, wanted=wanted, apply_all=apply_all)
