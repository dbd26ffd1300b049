"""guest.docker: Docker (with the NVIDIA runtime unless `image.gpus: false`) on every guest, and the
same training image on all.

The image is rendered from `templates/Dockerfile.j2`; its tag is the first 12 hex digits of the
recipe's sha256, so "does this guest have the right image?" is one `docker image inspect` and
never a build. One guest (the runbook's `image.builder`, else the first guest: chosen by
`resolve_ssh`) builds it; the others get it over the SSH mesh once the runbook's mesh has its key
(`guest.ssh_mesh` made it in an earlier apply: it runs after this step): the builder sends to a first guest,
then every guest that has it sends on, guest to guest, the id checked at each hop
(`image_fanout.py`), so no image byte passes through the machine running gpuvm. Without a mesh (or
its key) they load the builder's `docker save` through gpuvm's machine; with a registry every guest
pulls it.
Because the builder must go first, the engine applies this step through `apply_all`.

A guest whose daemon is stopped cannot say which runtimes and images it has: the plan starts the
daemon, and configures the runtime and places the image only if, once it runs, they are missing
(`only_if_missing`), so a stopped daemon never costs a rebuild. Packages, the daemon and the runtime
are root's (`target.root`: through sudo for any login but root's); docker itself runs as the login.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from gpuvm.errors import GpuvmError, InputError, RemoteCommandError
from gpuvm.executors.base import CommandResult
from gpuvm.executors.group import run_group
from gpuvm.plan import Change
from gpuvm.desired.ssh import DesiredGuest, GuestImage
from gpuvm.image_fanout import OPERATOR_BYTES, SAVE_FAILED, SSH_FAILED, FanOut, Hop, HopError, fan_out, hop_script
from gpuvm.remote import Cluster, run
from gpuvm.secrets import redact
from gpuvm.steps.guest_ssh_mesh.key import key_path
from gpuvm.steps.base import Context, Say, Step, quiet
from gpuvm.ticker import Counted, Ticker, amount, rate
from gpuvm.untrusted import UntrustedValueError, checked, image_id, shown

NAME = "guest.docker"
STDIN_LIMIT = 256 << 20  # larger saved images go to the guest in chunks, then `docker load -i`
CHUNK = 64 << 20


@dataclass(frozen=True)
class DockerFact:
    server_version: str | None  # None: docker is not installed
    daemon_error: str | None  # installed, but the daemon did not answer
    nvidia_runtime: bool  # `docker info` lists the nvidia runtime
    toolkit_installed: bool  # nvidia-container-toolkit's package (only looked at without the runtime)
    image_id: str | None  # this guest's id of the recipe's name:tag
    builder_id: str | None  # the builder's id of it (this guest's own on the builder)


@dataclass(frozen=True)
class InstallDocker:
    """apt-get install docker.io, then start and enable the daemon."""


@dataclass(frozen=True)
class StartDocker:
    """systemctl enable --now docker."""


@dataclass(frozen=True)
class AddNvidiaRuntime:
    install_toolkit: bool  # apt-get install nvidia-container-toolkit first
    # then `nvidia-ctk runtime configure --runtime=docker` and a daemon restart
    only_if_missing: bool = False  # the daemon was stopped: done only if, once started, it lacks the runtime


@dataclass(frozen=True)
class PlaceImage:
    ref: str  # name:tag of the recipe the plan was made for
    how: str  # build (on the builder) | copy (from the builder) | pull (from the registry)
    builder: str
    only_if_missing: bool = False  # the daemon was stopped: done only if, once started, the image is not there


def _image(target: DesiredGuest) -> GuestImage:
    assert target.image is not None  # wanted
    return target.image


# -- observe ------------------------------------------------------------------------------------

def wanted(target: DesiredGuest) -> bool:
    return target.image is not None


def _missing(result) -> bool:
    # plain: exit 127; under sudo: "sudo: docker: command not found" and exit 1
    return result.exit_code == 127 or "command not found" in result.stderr


def _said(result: CommandResult) -> str:
    return result.last_line or f"exit {result.exit_code}"


def inspect_id(target: DesiredGuest, cluster: Cluster, ref: str) -> str | None:
    """The image id of `ref` on the target; None when it has no such image (or no docker)."""
    result = run(target, cluster, ["docker", "image", "inspect", "--format", "{{.Id}}", ref], check=False)
    if result.ok:
        return image_id(result.stdout.strip(), "docker image inspect") if result.stdout.strip() else None
    if "No such image" in result.stderr or _missing(result):
        return None
    raise RemoteCommandError(f"{target.name}: {NAME}: cannot inspect image {ref}: {_said(result)}")


def observe(ctx: Context, target: DesiredGuest) -> DockerFact:
    cluster, image = ctx.cluster, _image(target)
    ref, builder = image.ref, image.builder
    version = run(target, cluster, ["docker", "version", "--format", "{{.Server.Version}}"], check=False)
    if not version.ok or not version.stdout.strip():  # no docker, or its daemon does not answer
        server, error = (None, None) if _missing(version) else ("", _said(version))
        toolkit = image.gpus and _toolkit(target, cluster)
        return DockerFact(server, error, False, toolkit, None, _builder_id(target, cluster, builder, ref))
    runtimes = run(target, cluster, ["docker", "info", "--format", "{{json .Runtimes}}"]).stdout
    nvidia = "nvidia" in parse_runtimes(runtimes)
    own = inspect_id(target, cluster, ref)
    builder_id = own if target.name == builder else _builder_id(target, cluster, builder, ref)
    toolkit = nvidia or (image.gpus and _toolkit(target, cluster))
    server = checked(version.stdout.strip(), "a version", "docker version")
    return DockerFact(server, None, nvidia, toolkit, own, builder_id)


def parse_runtimes(text: str) -> list[str]:
    """`docker info --format '{{json .Runtimes}}'` → runtime names."""
    try:
        data = json.loads(text.strip() or "{}")
    except ValueError:
        return []
    return sorted(data) if isinstance(data, dict) else []


def _toolkit(target: DesiredGuest, cluster: Cluster) -> bool:
    result = run(target, cluster, ["dpkg-query", "-W", "-f", "${Status}", "nvidia-container-toolkit"], check=False)
    return result.ok and "install ok installed" in result.stdout


def _builder_id(target: DesiredGuest, cluster: Cluster, builder: str, ref: str) -> str | None:
    if target.name == builder:
        return None
    try:
        return inspect_id(cluster.targets[builder], cluster, ref)
    except GpuvmError as e:
        raise RemoteCommandError(f"{target.name}: {NAME}: cannot read the image on the builder {builder}: {e}") from None


# -- plan (pure) --------------------------------------------------------------------------------

def plan(target: DesiredGuest, fact: DockerFact) -> list[Change]:
    image = _image(target)
    builder = image.builder
    changes: list[Change] = []
    stopped = bool(fact.daemon_error)  # runtimes and images unknown until the daemon runs
    unknown = "unknown: the docker daemon is stopped"
    if fact.server_version is None:
        changes.append(Change(NAME, target.name, "package docker.io", "installed", None, "installed",
                              action=InstallDocker()))
    elif stopped:
        changes.append(Change(NAME, target.name, "service docker", "running", fact.daemon_error, "running",
                              action=StartDocker()))
    if image.gpus and not fact.nvidia_runtime:  # gpus: false (CPU guests): containers get no GPUs
        before = unknown if stopped else "toolkit installed, runtime not configured" if fact.toolkit_installed else None
        changes.append(Change(NAME, target.name, "docker runtime nvidia", "present", before,
                              "nvidia-container-toolkit" + (", if missing once the daemon runs" if stopped else ""),
                              action=AddNvidiaRuntime(not fact.toolkit_installed, only_if_missing=stopped)))
    ref = image.ref
    if image.registry:
        how, source = "pull", f"pulled from {image.registry}"
    elif target.name == builder:
        how, source = "build", f"built on {builder}"
    else:
        how, source = "copy", f"copied from {builder}"
    place = PlaceImage(ref, how, builder, only_if_missing=stopped)
    if stopped:
        changes.append(Change(NAME, target.name, f"image {ref}", "present", unknown,
                              f"{source}, if missing once the daemon runs", action=place))
    elif fact.image_id is None:
        changes.append(Change(NAME, target.name, f"image {ref}", "present", None, source, action=place))
    elif target.name != builder and fact.image_id != fact.builder_id:
        # the builder has another build of the recipe, or has none yet and will build one
        changes.append(Change(NAME, target.name, f"image {ref}", "id", fact.image_id, fact.builder_id or source,
                              action=place))
    return changes


# -- apply --------------------------------------------------------------------------------------

def _placement(changes: list[Change]) -> PlaceImage | None:
    return next((c.action for c in changes if isinstance(c.action, PlaceImage)), None)


def _set_up(target: DesiredGuest, changes: list[Change], cluster: Cluster) -> None:
    """Packages, daemon and runtime (root's: through sudo for any login but root's): all but the image.
    A runtime planned while the daemon was stopped is looked at once it runs, before anything is installed."""
    actions = [c.action for c in changes]
    install = any(isinstance(a, InstallDocker) for a in actions)
    runtime = next((a for a in actions if isinstance(a, AddNvidiaRuntime)), None)
    later = runtime is not None and runtime.only_if_missing
    _apt_install(target, cluster, (["docker.io"] if install else []) +
                 (["nvidia-container-toolkit"] if runtime and runtime.install_toolkit and not later else []))
    if install or any(isinstance(a, StartDocker) for a in actions):
        run(target, cluster, ["systemctl", "enable", "--now", "docker"], sudo=target.root)
    if later and _has_nvidia_runtime(target, cluster):
        runtime = None
    if runtime:
        if later and runtime.install_toolkit:
            _apt_install(target, cluster, ["nvidia-container-toolkit"])
        run(target, cluster, ["nvidia-ctk", "runtime", "configure", "--runtime=docker"], sudo=target.root)
        run(target, cluster, ["systemctl", "restart", "docker"], sudo=target.root)


def _apt_install(target: DesiredGuest, cluster: Cluster, packages: list[str]) -> None:
    if not packages:
        return
    env = ["env", "DEBIAN_FRONTEND=noninteractive"]
    run(target, cluster, env + ["apt-get", "update"], sudo=target.root)
    result = run(target, cluster, env + ["apt-get", "install", "-y", *packages], sudo=target.root, check=False)
    if not result.ok:
        hint = (" (nvidia-container-toolkit comes from NVIDIA's apt repository: add "
                "https://nvidia.github.io/libnvidia-container to the guest's sources)"
                if "nvidia-container-toolkit" in packages and "Unable to locate" in result.stderr else "")
        raise RemoteCommandError(f"apt-get install {' '.join(packages)} failed: {_said(result)}{hint}")


def _has_nvidia_runtime(target: DesiredGuest, cluster: Cluster) -> bool:
    return "nvidia" in parse_runtimes(run(target, cluster, ["docker", "info", "--format", "{{json .Runtimes}}"]).stdout)


def _still_missing(cluster: Cluster, name: str, place: PlaceImage) -> bool:
    """Whether a placement planned while the daemon was stopped is needed now that it runs: the
    image is not there, or (copied) differs from the builder's."""
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


def _save(builder: DesiredGuest, cluster: Cluster, ref: str, sink: BinaryIO, say: Say = quiet) -> None:
    counted = Counted(sink)
    with Ticker(lambda line: say(builder.name, line),
                lambda s: f"saving {ref} from the builder: {rate(counted.bytes, s)}") as tick:
        try:
            run(builder, cluster, ["docker", "save", ref], stdout_to=counted,  # type: ignore[arg-type]
                timeout=max(cluster.command_timeout, _image(builder).build_timeout))
        finally:
            OPERATOR_BYTES.add(counted.bytes)
    say(builder.name, f"saved {ref} from the builder: {rate(counted.bytes, tick.elapsed)}")


def _load(target: DesiredGuest, cluster: Cluster, saved: Path, stdin_limit: int = STDIN_LIMIT,
          say: Say = quiet) -> None:
    """`docker load` the saved image: on stdin when small, else sent in chunks to a temp file first.
    Progress: bytes sent and rate, every few seconds and at the end."""
    timeout = max(cluster.command_timeout, _image(target).build_timeout)
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


def _ship(builder: DesiredGuest, cluster: Cluster, ref: str, receivers: dict[str, DesiredGuest],
          parallel: int = 4, say: Say = quiet) -> dict[str, Exception]:
    """Save once on the builder into a local temp file, then load it on every receiver (bounded)."""
    if not receivers:
        return {}
    where = cluster.state_dir if cluster.state_dir.is_dir() else None
    with tempfile.TemporaryDirectory(prefix="gpuvm-image-", dir=where) as tmp:
        saved = Path(tmp) / "image.tar"
        with open(saved, "wb") as sink:
            try:
                _save(builder, cluster, ref, sink, say)
            except Exception as e:
                return {name: RemoteCommandError(f"cannot fetch {ref} from the builder: {e}")
                        for name in receivers}
        os.chmod(saved, 0o600)
        return run_group(receivers, lambda t: _load(t, cluster, saved, say=say), parallel, name="load").failed


def _verify(cluster: Cluster, ref: str, names: list[str], reference: str) -> dict[str, Exception]:
    """Every named guest must have `ref` with the reference guest's id (else the first named's)."""
    targets = {n: cluster.targets[n] for n in dict.fromkeys([reference, *names])}
    inspected = run_group(targets, lambda t: inspect_id(t, cluster, ref), name="inspect")
    ids, failures = inspected.ok, dict(inspected.failed)
    want = ids.get(reference) or next((ids[n] for n in names if ids.get(n)), None)
    for name in names:
        if name not in failures and (ids.get(name) is None or ids[name] != want):
            seen = ", ".join(f"{n} {ids.get(n) or 'none'}" for n in targets if n not in failures)
            failures[name] = RemoteCommandError(f"image {ref} differs between guests ({seen})")
    return {n: e for n, e in failures.items() if n in names}


def _copy_to(cluster: Cluster, ref: str, builder: str, receivers: dict[str, DesiredGuest], parallel: int,
             say: Say = quiet) -> dict[str, Exception]:
    """Ship the builder's image to the receivers whose copy differs from it."""
    try:
        want = inspect_id(cluster.targets[builder], cluster, ref)
    except GpuvmError as e:
        want, error = None, str(e)
    else:
        error = "it has no such image (its build failed?)"
    if want is None:
        return {n: RemoteCommandError(f"{n}: {NAME}: cannot copy {ref} from the builder {builder}: {error}")
                for n in receivers}
    # a guest whose copy already has the builder's id (e.g. the build was repeatable) needs no transfer
    inspected = run_group(receivers, lambda t: inspect_id(t, cluster, ref), parallel, name="inspect")
    have, failures = inspected.ok, inspected.failed
    send = {n: t for n, t in receivers.items() if n not in failures and have.get(n) != want}
    if not _mesh_keyed(cluster, {builder: cluster.targets[builder], **receivers}):
        return failures | _ship(cluster.targets[builder], cluster, ref, send, parallel, say)
    holders = [builder] + [n for n in receivers if have.get(n) == want]
    return failures | _tree(cluster, ref, want, builder, holders, send, say)


def _mesh_keyed(cluster: Cluster, receivers: dict[str, DesiredGuest]) -> bool:
    """Whether the guests are in a mesh and its key was made (by an earlier apply's guest.ssh_mesh):
    else they cannot log in to each other."""
    in_mesh = all(t.mesh is not None for t in receivers.values())
    return in_mesh and key_path(cluster.state_dir).exists()


def _unreached(result: FanOut) -> list[str]:
    """Receivers the mesh could not reach (ssh failed, or no sender was left), not their own failures."""
    return [n for n, e in result.failures.items() if not (isinstance(e, HopError) and e.side == "receiver")]


def _tree(cluster: Cluster, ref: str, want: str, builder: str, holders: list[str],
          receivers: dict[str, DesiredGuest], say: Say = quiet) -> dict[str, Exception]:
    """Guest to guest over the mesh (`image_fanout.fan_out`). Through gpuvm's machine only what the
    mesh cannot reach: one copy when the builder could send none (that guest then serves the rest),
    and guests that no sender could log in to (a guest the mesh has not reached yet)."""
    if not receivers:
        return {}
    started = time.monotonic()

    def hop(h: Hop) -> None:
        _hop(cluster, ref, want, builder, h, say)

    result = fan_out(holders, list(receivers), hop)
    stuck = _unreached(result)
    if stuck and not result.served and holders == [builder]:
        first = stuck[0]
        if not _ship(cluster.targets[builder], cluster, ref, {first: receivers[first]}, 1, say):
            say(first, f"image {ref}: one copy through gpuvm's machine: the builder could send none over the mesh")
            rest = fan_out([first], stuck[1:], hop)
            result = FanOut(result.rounds + rest.rounds, {n: e for n, e in result.failures.items() if n not in stuck}
                            | rest.failures, [first, *rest.served])
            stuck = _unreached(rest)
    failures = {n: e if isinstance(e, HopError) else RemoteCommandError(f"{n}: {NAME}: image {ref}: {e}")
                for n, e in result.failures.items() if n not in stuck}
    say(builder, f"image {ref} copied to {len(result.served)} of {len(receivers)} guest(s) over the mesh in "
                 f"{len(result.rounds)} round(s), {time.monotonic() - started:.0f} s")
    if stuck:  # the mesh does not reach them: the old way, through gpuvm's machine
        say(builder, f"image {ref}: through gpuvm's machine to {', '.join(stuck)}, which the mesh does not reach")
        failures |= _ship(cluster.targets[builder], cluster, ref, {n: receivers[n] for n in stuck}, 4, say)
    return failures


def _hop(cluster: Cluster, ref: str, want: str, builder: str, hop: Hop, say: Say = quiet) -> None:
    """`docker save | ssh receiver docker load` on the sender, then the receiver's id checked from here."""
    sender, receiver = cluster.targets[hop.sender], cluster.targets[hop.receiver]
    user = sender.mesh.user  # type: ignore[union-attr]  # _mesh_keyed: every guest here is in the mesh
    script = hop_script(ref, receiver.login.address, receiver.login.port, save_sudo=sender.sudo,
                        load_sudo=receiver.sudo, mesh_user=None if user == sender.login.user else user)
    timeout = max(cluster.command_timeout, _image(sender).build_timeout)
    with Ticker(lambda line: say(receiver.name, line),
                lambda s: f"copying {ref} from {sender.name} over the mesh: {s:.0f} s") as tick:
        result = cluster.executors[sender.name].run_script(script, timeout=timeout, check=False)
    if result.exit_code != 0:
        side = {SAVE_FAILED: "sender", SSH_FAILED: "mesh"}.get(result.exit_code, "receiver")
        raise HopError(redact(f"{receiver.name}: {NAME}: image {ref} from {sender.name}: {_said(result)}"), side)
    got = inspect_id(receiver, cluster, ref)
    if got != want:
        raise HopError(f"{receiver.name}: {NAME}: image {ref} copied from {sender.name} has id {got or 'none'} "
                       f"on {receiver.name}, not {want} as on the builder {builder}")
    say(receiver.name, f"image {ref} copied from {sender.name} over the mesh in {tick.elapsed:.0f} s")


def apply_all(ctx: Context, changes_by_target: dict[str, list[Change]], parallel: int = 8) -> dict[str, Exception]:
    """Set up docker everywhere, build on the builder (or pull), ship to the rest, check the ids.

    Returns the failures by target; an empty dict when every target ended with the same image.
    """
    cluster = ctx.cluster
    targets = {n: cluster.targets[n] for n in changes_by_target}
    setup = {n: t for n, t in targets.items() if any(not isinstance(c.action, PlaceImage) for c in changes_by_target[n])}
    failures = dict(run_group(setup, lambda t: _set_up(t, changes_by_target[t.name], cluster), parallel,
                              name="docker").failed)

    placements = {n: p for n, cs in changes_by_target.items() if (p := _placement(cs)) and n not in failures}
    try:
        placements = {n: p for n, p in placements.items() if _still_missing(cluster, n, p)}
    except GpuvmError as e:
        return failures | {n: e for n in placements}
    if not placements:
        return failures
    first = next(iter(placements))
    try:
        current = _check_recipe(targets[first], placements[first])
    except GpuvmError as e:
        return failures | {n: e for n in placements}
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
    failures.update(_copy_to(cluster, current.ref, current.builder, by_how["copy"], min(parallel, 4), ctx.say))
    checked = [n for n in placements if n not in failures]
    failures.update(_verify(cluster, current.ref, checked, current.builder))
    return failures


def apply(ctx: Context, target: DesiredGuest, changes: list[Change]) -> None:
    """This guest alone: set up, then build, pull or fetch the image from the builder."""
    failure = apply_all(ctx, {target.name: changes}, 1).get(target.name)
    if failure is not None:
        raise failure


STEP = Step(NAME, "guest", observe, plan, apply, wanted=wanted, apply_all=apply_all)
