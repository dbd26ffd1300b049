"""guest.image: the same training image on every guest, shipped guest to guest over the SSH mesh.

The image is rendered from `templates/Dockerfile.j2`; its tag is the first 12 hex digits of the
recipe's sha256, so "does this guest have the right image?" is one `docker image inspect` and
never a build. One guest (the runbook's `image.builder`, else the first guest: chosen by
`resolve_ssh`) builds it; the others get it over the SSH mesh, guest to guest: down a pipelined
tree, where every guest loads the stream while passing it on (`image_pipeline.py`), then round by
round for whatever the tree missed (`image_fanout.py`), every receiver's id checked against the
builder's, so no image byte passes through the machine running gpuvm. This step runs
after `guest.ssh_mesh`, so even a first apply has the mesh's key. Only what the mesh does not reach
(no mesh in the runbook, a guest no sender can log in to) goes through gpuvm's machine: the
builder's `docker save`, loaded there, counted in `image_fanout.OPERATOR_BYTES`. With a registry
every guest pulls it. Because the builder must go first, the engine applies this step through
`apply_all`.

Bounds: a build or a pull takes at most `image.build_timeout`; then the copies to every guest (the
tree, the rounds, what goes through gpuvm's machine) share one more `build_timeout` between them
(`_copy_to`'s deadline: each command gets what is left, and no round starts after it), so a step
with the image already built takes about one build timeout at most, one that builds about two. A
guest whose load takes no bytes for `image.stall_timeout` seconds (60) is cut off, in the tree and
in a hop alike (`image_feed`): its subtree is served by other holders in the next rounds.

A guest reads the builder's image id only to compare it with its own (`_compares`): a builder that
does not answer leaves the others observed, their other steps planned as usual.

Docker itself (packages, daemon, NVIDIA runtime) is `guest.docker`'s, which runs before. A guest
whose daemon did not answer when observed cannot say which images it has: the image is placed only
if, once the daemon runs, it is missing (`only_if_missing`), so a stopped daemon never costs a
rebuild. docker runs as the login (through sudo where the guest's `ssh.sudo` is true).
"""

from __future__ import annotations

import math
import os
import re
import tempfile
from time import monotonic
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from gpuvm.errors import GpuvmError, InputError, RemoteCommandError
from gpuvm.executors.base import CommandResult
from gpuvm.executors.group import at_once, run_group
from gpuvm.plan import Change
from gpuvm.desired.ssh import DesiredGuest, GuestImage
from gpuvm.image_pipeline import Relay, levels, pipeline_script
from gpuvm.image_fanout import (OPERATOR_BYTES, SAVE_FAILED, SSH_FAILED, FanOut, Hop, HopError, OutOfTime, fan_out,
                                hop_script)
from gpuvm.remote import Cluster, run
from gpuvm.secrets import redact
from gpuvm.steps.guest_ssh_mesh.key import key_path
from gpuvm.steps.base import Context, Say, Step, quiet
from gpuvm.ticker import Counted, Ticker, amount, rate
from gpuvm.untrusted import UntrustedValueError, image_id, shown

NAME = "guest.image"
STDIN_LIMIT = 256 << 20  # larger saved images go to the guest in chunks, then `docker load -i`
CHUNK = 64 << 20
STOPPED = "unknown: the docker daemon is stopped"


@dataclass(frozen=True)
class ImageFact:
    image_id: str | None  # this guest's id of the recipe's name:tag (None: no such image, or no docker)
    builder_id: str | None  # the builder's id of it, read only to compare with this guest's (`_compares`)
    daemon_error: str | None = None  # docker is installed but its daemon did not answer: images unknown
    builder_error: str | None = None  # why the builder's id could not be read (it did not answer)


@dataclass(frozen=True)
class PlaceImage:
    ref: str  # name:tag of the recipe the plan was made for
    how: str  # build (on the builder) | copy (from the builder) | pull (from the registry)
    builder: str
    # looked at again first: done only if the image is missing then, or (a copy) differs from the builder's
    # (the daemon was stopped, or the builder did not answer, when planned)
    only_if_missing: bool = False


def _image(target: DesiredGuest) -> GuestImage:
    assert target.image is not None  # wanted
    return target.image


# -- observe ------------------------------------------------------------------------------------

def wanted(target: DesiredGuest) -> bool:
    return target.image is not None


def _missing(result: CommandResult) -> bool:
    """docker is not installed. Plain: exit 127; under sudo: "sudo: docker: command not found", exit 1."""
    return result.exit_code == 127 or "command not found" in result.stderr


def _said(result: CommandResult) -> str:
    return result.last_line or f"exit {result.exit_code}"


def _no_daemon(result: CommandResult) -> bool:
    return "Cannot connect to the Docker daemon" in result.stderr or "Is the docker daemon running" in result.stderr


def _inspect(target: DesiredGuest, cluster: Cluster, ref: str) -> CommandResult:
    return run(target, cluster, ["docker", "image", "inspect", "--format", "{{.Id}}", ref], check=False)


def inspect_id(target: DesiredGuest, cluster: Cluster, ref: str) -> str | None:
    """The image id of `ref` on the target; None when it has no such image (or no docker)."""
    return _inspected_id(target, ref, _inspect(target, cluster, ref))


def _inspected_id(target: DesiredGuest, ref: str, result: CommandResult) -> str | None:
    if result.ok:
        return image_id(result.stdout.strip(), "docker image inspect") if result.stdout.strip() else None
    if "No such image" in result.stderr or _missing(result):
        return None
    raise RemoteCommandError(f"{target.name}: {NAME}: cannot inspect image {ref}: {_said(result)}")


def observe(ctx: Context, target: DesiredGuest) -> ImageFact:
    """This guest's image id; the builder's only where the plan compares them (`_compares`). A
    builder that does not answer then is this fact's `builder_error`, not this guest's failure: its
    other steps are observed, and so are the guests that never read the builder."""
    cluster, image = ctx.cluster, _image(target)
    result = _inspect(target, cluster, image.ref)
    if not result.ok and _no_daemon(result):  # guest.docker starts it; the image is looked at then
        return ImageFact(None, None, _said(result))
    own = _inspected_id(target, image.ref, result)
    if not _compares(target, own):
        return ImageFact(own, None)
    try:
        return ImageFact(own, inspect_id(cluster.targets[image.builder], cluster, image.ref))
    except GpuvmError as e:
        return ImageFact(own, None, builder_error=str(e))


def _compares(target: DesiredGuest, own: str | None) -> bool:
    """Whether this guest's image is compared with the builder's: it has one, and gets it from the
    builder (not the builder itself, not from a registry). One without it is copied whatever the
    builder has; a stopped daemon's is looked at again at apply."""
    image = _image(target)
    return own is not None and target.name != image.builder and not image.registry


# -- plan (pure) --------------------------------------------------------------------------------

def plan(target: DesiredGuest, fact: ImageFact) -> list[Change]:
    image = _image(target)
    builder, ref = image.builder, image.ref
    stopped = bool(fact.daemon_error)  # its images unknown until the daemon runs
    if image.registry:
        how, source = "pull", f"pulled from {image.registry}"
    elif target.name == builder:
        how, source = "build", f"built on {builder}"
    else:
        how, source = "copy", f"copied from {builder}"
    place = PlaceImage(ref, how, builder, only_if_missing=stopped)
    if stopped:
        return [Change(NAME, target.name, f"image {ref}", "present", STOPPED,
                       f"{source}, if missing once the daemon runs", action=place)]
    if fact.image_id is None:
        return [Change(NAME, target.name, f"image {ref}", "present", None, source, action=place)]
    if fact.builder_error:  # the builder did not answer: its id is read again at apply
        return [Change(NAME, target.name, f"image {ref}", "id", fact.image_id,
                       f"the builder {builder}'s, compared at apply: it did not answer ({fact.builder_error})",
                       action=PlaceImage(ref, how, builder, only_if_missing=True))]
    if _compares(target, fact.image_id) and fact.image_id != fact.builder_id:
        # the builder has another build of the recipe, or has none yet and will build one
        return [Change(NAME, target.name, f"image {ref}", "id", fact.image_id, fact.builder_id or source,
                       action=place)]
    return []


# -- apply --------------------------------------------------------------------------------------

def _placement(changes: list[Change]) -> PlaceImage | None:
    return next((c.action for c in changes if isinstance(c.action, PlaceImage)), None)


def _still_missing(cluster: Cluster, name: str, place: PlaceImage) -> bool:
    """Whether a placement planned to be looked at again (the daemon was stopped, or the builder did
    not answer) is needed now: the image is not there, or (copied) differs from the builder's."""
    if not place.only_if_missing:
        return True
    own = inspect_id(cluster.targets[name], cluster, place.ref)
    if own is None or place.how != "copy":
        return own is None
    return own != inspect_id(cluster.targets[place.builder], cluster, place.ref)


def _check_recipe(target: DesiredGuest, place: PlaceImage) -> GuestImage:
    current = _image(target)
    if place.ref != current.ref:
        raise InputError(f"the plan is for image {place.ref} but the runbook "
                         f"now renders {current.ref}; plan again")
    return current


def _build(target: DesiredGuest, cluster: Cluster, image: GuestImage, say: Say = quiet) -> None:
    network = ["--network=host"] if image.build_network == "host" else []
    with Ticker(lambda line: say(target.name, line), lambda s: f"building image {image.ref}: {s:.0f} s") as tick:
        run(target, cluster, ["docker", "build", *network, "-t", image.ref, "-"],
            stdin=image.dockerfile.encode(), timeout=max(cluster.command_timeout, image.build_timeout))
    say(target.name, f"image {image.ref} built in {tick.elapsed:.0f} s")


def _pull(target: DesiredGuest, cluster: Cluster, image: GuestImage, say: Say = quiet) -> None:
    remote = f"{image.registry.rstrip('/')}/{image.ref}"  # type: ignore[union-attr]
    with Ticker(lambda line: say(target.name, line), lambda s: f"pulling {remote}: {s:.0f} s"):
        run(target, cluster, ["docker", "pull", remote], timeout=max(cluster.command_timeout, image.build_timeout))
    run(target, cluster, ["docker", "tag", remote, image.ref])


def _save(builder: DesiredGuest, cluster: Cluster, ref: str, sink: BinaryIO, deadline: float, say: Say = quiet) -> None:
    counted = Counted(sink)
    with Ticker(lambda line: say(builder.name, line),
                lambda s: f"saving {ref} from the builder: {rate(counted.bytes, s)}") as tick:
        try:
            run(builder, cluster, ["docker", "save", ref], stdout_to=counted,  # type: ignore[arg-type]
                timeout=_left(deadline))
        finally:
            OPERATOR_BYTES.add(counted.bytes)
    say(builder.name, f"saved {ref} from the builder: {rate(counted.bytes, tick.elapsed)}")


def _load(target: DesiredGuest, cluster: Cluster, saved: Path, deadline: float, stdin_limit: int = STDIN_LIMIT,
          say: Say = quiet) -> None:
    """`docker load` the saved image: on stdin when small, else sent in chunks to a temp file first.
    Progress: bytes sent and rate, every few seconds and at the end."""
    timeout = _left(deadline)
    size, sent = saved.stat().st_size, Counted()
    with Ticker(lambda line: say(target.name, line),
                lambda s: f"shipping image: {rate(sent.bytes, s)} of {amount(size)} sent") as tick:
        try:
            if size <= stdin_limit:
                run(target, cluster, ["docker", "load"], stdin=saved.read_bytes(), timeout=timeout)
                sent.add(size)
            else:
                _load_in_chunks(target, cluster, saved, timeout, sent)
        finally:
            OPERATOR_BYTES.add(size if size <= stdin_limit else sent.bytes)
    say(target.name, f"image shipped and loaded: {rate(size, tick.elapsed)}")


def _load_in_chunks(target: DesiredGuest, cluster: Cluster, saved: Path, timeout: float, sent: Counted) -> None:
    remote = run(target, cluster, ["mktemp", "/tmp/gpuvm-image.XXXXXX"], sudo=False).stdout.strip()
    if not re.fullmatch(r"/tmp/gpuvm-image\.[A-Za-z0-9]{6,}", remote):  # a file name from the guest
        raise UntrustedValueError(f"`mktemp` answered {shown(remote)}, not a /tmp/gpuvm-image.XXXXXX file")
    try:
        with open(saved, "rb") as f:
            for chunk in iter(lambda: f.read(CHUNK), b""):
                run(target, cluster, ["sh", "-c", 'cat >> "$1"', "gpuvm-load", remote], sudo=False, stdin=chunk)
                sent.add(len(chunk))
        run(target, cluster, ["docker", "load", "-i", remote], timeout=timeout)
    finally:
        run(target, cluster, ["rm", "-f", remote], sudo=False, check=False)


def _ship(builder: DesiredGuest, cluster: Cluster, ref: str, want: str, receivers: dict[str, DesiredGuest],
          deadline: float, parallel: int = 4, say: Say = quiet) -> dict[str, Exception]:
    """Save once on the builder into a local temp file, then load it on every receiver (bounded),
    each receiver's id checked against the builder's (`want`)."""
    if not receivers:
        return {}
    where = cluster.state_dir if cluster.state_dir.is_dir() else None
    with tempfile.TemporaryDirectory(prefix="gpuvm-image-", dir=where) as tmp:
        saved = Path(tmp) / "image.tar"
        with open(saved, "wb") as sink:
            try:
                _save(builder, cluster, ref, sink, deadline, say)
            except Exception as e:
                return {name: RemoteCommandError(f"cannot fetch {ref} from the builder: {e}")
                        for name in receivers}
        os.chmod(saved, 0o600)

        def load(target: DesiredGuest) -> None:
            _load(target, cluster, saved, deadline, say=say)
            got = inspect_id(target, cluster, ref)
            if got != want:
                raise RemoteCommandError(f"{target.name}: {NAME}: image {ref} loaded through gpuvm's machine has id "
                                         f"{got or 'none'} on {target.name}, not {want} as on the builder {builder.name}")

        return run_group(receivers, load, parallel, name="load").failed


def _verify(cluster: Cluster, ref: str, names: list[str], reference: str) -> dict[str, Exception]:
    """Every named guest must have `ref` with the reference guest's id (else the first named's)."""
    targets = {n: cluster.targets[n] for n in dict.fromkeys([reference, *names])}
    inspected = run_group(targets, lambda t: inspect_id(t, cluster, ref), at_once(targets), name="inspect")
    ids, failures = inspected.ok, dict(inspected.failed)
    want = ids.get(reference) or next((ids[n] for n in names if ids.get(n)), None)
    for name in names:
        if name not in failures and (ids.get(name) is None or ids[name] != want):
            seen = ", ".join(f"{n} {ids.get(n) or 'none'}" for n in targets if n not in failures)
            failures[name] = RemoteCommandError(f"image {ref} differs between guests ({seen})")
    return {n: e for n, e in failures.items() if n in names}


def _copy_to(cluster: Cluster, ref: str, builder: str, receivers: dict[str, DesiredGuest], parallel: int,
             say: Say = quiet, built: bool = False) -> dict[str, Exception]:
    """Ship the builder's image to the receivers whose copy differs from it (as planned; once the
    builder has `built` it anew, each receiver's copy is compared with the new one first). All of
    it (the tree, the rounds, the copies through gpuvm's machine) within one `build_timeout`."""
    deadline = monotonic() + max(cluster.command_timeout, _image(cluster.targets[builder]).build_timeout)
    try:
        want = inspect_id(cluster.targets[builder], cluster, ref)
    except GpuvmError as e:
        want, error = None, str(e)
    else:
        error = "it has no such image (its build failed?)"
    if want is None:
        return {n: RemoteCommandError(f"{n}: {NAME}: cannot copy {ref} from the builder {builder}: {error}")
                for n in receivers}
    have: dict[str, str | None] = {}
    failures: dict[str, Exception] = {}
    if built:  # a guest whose copy already has the new build's id (a repeatable build) needs no transfer
        inspected = run_group(receivers, lambda t: inspect_id(t, cluster, ref), at_once(receivers), name="inspect")
        have, failures = inspected.ok, dict(inspected.failed)
    send = {n: t for n, t in receivers.items() if n not in failures and have.get(n) != want}
    if not _mesh_keyed(cluster, {builder: cluster.targets[builder], **receivers}):
        return failures | _ship(cluster.targets[builder], cluster, ref, want, send, deadline, parallel, say)
    holders = [builder] + [n for n in receivers if have.get(n) == want]
    return failures | _tree(cluster, ref, want, builder, holders, send, deadline, say)


def _mesh_keyed(cluster: Cluster, receivers: dict[str, DesiredGuest]) -> bool:
    """Whether the guests are in a mesh and its key was made (guest.ssh_mesh runs before this step):
    else they cannot log in to each other."""
    in_mesh = all(t.mesh is not None for t in receivers.values())
    return in_mesh and key_path(cluster.state_dir).exists()


def _unreached(result: FanOut) -> list[str]:
    """Receivers the mesh could not reach (ssh failed, or no sender was left), not their own failures
    nor those left when the time ran out."""
    return [n for n, e in result.failures.items()
            if not (isinstance(e, HopError) and e.side == "receiver" or isinstance(e, OutOfTime))]


def _tree(cluster: Cluster, ref: str, want: str, builder: str, holders: list[str],
          receivers: dict[str, DesiredGuest], deadline: float, say: Say = quiet) -> dict[str, Exception]:
    """Guest to guest over the mesh (`image_fanout.fan_out`). Through gpuvm's machine only what the
    mesh cannot reach: one copy when the builder could send none (that guest then serves the rest),
    and guests that no sender could log in to (a guest the mesh has not reached yet)."""
    if not receivers:
        return {}
    started = monotonic()

    def hop(h: Hop) -> None:
        _hop(cluster, ref, want, builder, h, deadline, say)

    piped = _pipelined(cluster, ref, want, builder, receivers, deadline, say) if holders == [builder] else []
    result = fan_out(holders + piped, [n for n in receivers if n not in piped], hop, deadline=deadline)
    result = FanOut(result.rounds, result.failures, piped + result.served)
    stuck = _unreached(result)
    if stuck and not result.served and holders == [builder]:
        first = stuck[0]
        if not _ship(cluster.targets[builder], cluster, ref, want, {first: receivers[first]}, deadline, 1, say):
            say(first, f"image {ref}: one copy through gpuvm's machine: the builder could send none over the mesh")
            rest = fan_out([first], stuck[1:], hop, deadline=deadline)
            result = FanOut(result.rounds + rest.rounds, {n: e for n, e in result.failures.items() if n not in stuck}
                            | rest.failures, [first, *rest.served])
            stuck = _unreached(rest)
    failures = {n: e if isinstance(e, HopError) or isinstance(e.__cause__, HopError)  # named already
                else RemoteCommandError(f"{n}: {NAME}: image {ref}: {e}")
                for n, e in result.failures.items() if n not in stuck}
    how = f"a pipelined tree and {len(result.rounds)} round(s)" if piped else f"{len(result.rounds)} round(s)"
    say(builder, f"image {ref} copied to {len(result.served)} of {len(receivers)} guest(s) over the mesh in "
                 f"{how}, {monotonic() - started:.0f} s")
    if stuck:  # the mesh does not reach them: the old way, through gpuvm's machine
        say(builder, f"image {ref}: through gpuvm's machine to {', '.join(stuck)}, which the mesh does not reach")
        failures |= _ship(cluster.targets[builder], cluster, ref, want, {n: receivers[n] for n in stuck}, deadline, 4,
                          say)
    return failures


def _pipelined(cluster: Cluster, ref: str, want: str, builder: str, receivers: dict[str, DesiredGuest],
               deadline: float, say: Say = quiet) -> list[str]:
    """The image down the pipelined tree (`image_pipeline`) from the builder; the receivers that
    then have the builder's id. The rest (a load or a login that failed on the way, a guest whose
    address or user is not plain) are left to the rounds, which say why."""
    relays = [_relay(t) for t in receivers.values()]
    if len(relays) < 2:  # one receiver: one hop, which the rounds make
        return []
    sender = cluster.targets[builder]
    try:  # a word that is not plain (pipeline_script refuses it): the rounds serve them all
        script = pipeline_script(ref, relays, save_sudo=sender.sudo, mesh_user=_relay(sender).mesh_user,
                                 stall=_stall(sender))
    except ValueError:
        return []
    shape = levels(builder, list(receivers))
    parent = {h.receiver: h.sender for level in shape for h in level}
    with Ticker(lambda line: say(builder, line),
                lambda s: f"sending {ref} down a pipelined tree of {len(relays)} guest(s): {s:.0f} s") as tick:
        try:
            cluster.executors[builder].run_script(script, timeout=_left(deadline), check=False)
        except GpuvmError as e:  # timed out, or the builder's connection lost: what arrived is kept
            say(builder, f"image {ref}: the pipelined tree stopped: {redact(str(e))}")
        ids = run_group(receivers, lambda t: inspect_id(t, cluster, ref), at_once(receivers), name="inspect").ok
    got = [n for n in receivers if ids.get(n) == want]
    for name in got:
        say(name, f"image {ref} copied from {parent[name]} over the mesh in {tick.elapsed:.0f} s (pipelined)")
    say(builder, f"image {ref} down a pipelined tree of {len(shape)} level(s) to {len(got)} of {len(relays)} "
                 f"guest(s) in {tick.elapsed:.0f} s")
    return got


def _left(deadline: float) -> float:
    """A command's timeout: what is left of the copies' time (at least a second: it then fails fast)."""
    return max(1.0, deadline - monotonic())


def _stall(target: DesiredGuest) -> int:
    return max(1, math.ceil(_image(target).stall_timeout))


def _relay(target: DesiredGuest) -> Relay:
    user = target.mesh.user  # type: ignore[union-attr]  # _mesh_keyed: every guest here is in the mesh
    return Relay(target.login.address, target.login.port, target.sudo,
                 None if user == target.login.user else user)


def _hop(cluster: Cluster, ref: str, want: str, builder: str, hop: Hop, deadline: float, say: Say = quiet) -> None:
    """`docker save | ssh receiver docker load` on the sender, then the receiver's id checked from here."""
    sender, receiver = cluster.targets[hop.sender], cluster.targets[hop.receiver]
    user = sender.mesh.user  # type: ignore[union-attr]  # _mesh_keyed: every guest here is in the mesh
    script = hop_script(ref, receiver.login.address, receiver.login.port, save_sudo=sender.sudo,
                        load_sudo=receiver.sudo, mesh_user=None if user == sender.login.user else user,
                        stall=_stall(sender))
    with Ticker(lambda line: say(receiver.name, line),
                lambda s: f"copying {ref} from {sender.name} over the mesh: {s:.0f} s") as tick:
        result = cluster.executors[sender.name].run_script(script, timeout=_left(deadline), check=False)
    if result.exit_code != 0:
        side = {SAVE_FAILED: "sender", SSH_FAILED: "mesh"}.get(result.exit_code, "receiver")
        raise HopError(redact(f"{receiver.name}: {NAME}: image {ref} from {sender.name}: {_said(result)}"), side)
    got = inspect_id(receiver, cluster, ref)
    if got != want:
        raise HopError(f"{receiver.name}: {NAME}: image {ref} copied from {sender.name} has id {got or 'none'} "
                       f"on {receiver.name}, not {want} as on the builder {builder}")
    say(receiver.name, f"image {ref} copied from {sender.name} over the mesh in {tick.elapsed:.0f} s")


def apply_all(ctx: Context, changes_by_target: dict[str, list[Change]], parallel: int = 8) -> dict[str, Exception]:
    """Build on the builder (or pull), ship to the rest over the mesh, check the ids.

    Returns the failures by target; an empty dict when every target ended with the same image.
    """
    cluster = ctx.cluster
    targets = {n: cluster.targets[n] for n in changes_by_target}
    failures: dict[str, Exception] = {}
    placements = {n: p for n, cs in changes_by_target.items() if (p := _placement(cs))}
    needed = run_group({n: (n, p) for n, p in placements.items()}, lambda np: _still_missing(cluster, *np),
                       at_once(placements), name="inspect")
    failures.update(needed.failed)
    placements = {n: p for n, p in placements.items() if needed.ok.get(n)}
    if not placements:
        return failures
    first = next(iter(placements))
    try:
        current = _check_recipe(targets[first], placements[first])
    except GpuvmError as e:
        return {n: e for n in placements}
    by_how: dict[str, dict[str, DesiredGuest]] = {"build": {}, "pull": {}, "copy": {}}
    for name, place in placements.items():
        by_how[place.how][name] = targets[name]
    for name, target in by_how["build"].items():  # the builder: at most one, before any copy
        try:
            _build(target, cluster, current, ctx.say)
        except Exception as e:
            failures[name] = e
    pulled = run_group(by_how["pull"], lambda t: _pull(t, cluster, current, ctx.say), parallel, name="pull")
    failures.update(pulled.failed)
    failures.update(_copy_to(cluster, current.ref, current.builder, by_how["copy"], min(parallel, 4), ctx.say,
                             built=bool(by_how["build"])))
    # every copy's id was checked against the builder's where it landed (`_ship`, `_hop`, `_pipelined`)
    checked = [n for n in placements if n not in failures and placements[n].how != "copy"]
    failures.update(_verify(cluster, current.ref, checked, current.builder))
    return failures


def apply(ctx: Context, target: DesiredGuest, changes: list[Change]) -> None:
    """This guest alone: build, pull or fetch the image from the builder."""
    failure = apply_all(ctx, {target.name: changes}, 1).get(target.name)
    if failure is not None:
        raise failure


STEP = Step(NAME, "guest", observe, plan, apply, wanted=wanted, apply_all=apply_all)
