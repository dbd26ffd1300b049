"""guest.docker: Docker on every guest that runs the training image, with the NVIDIA runtime unless
`image.gpus: false`.

The package (docker.io), the daemon (enabled and running) and the runtime (nvidia-container-toolkit,
`nvidia-ctk runtime configure`); the image itself is `guest.image`'s, which runs after the SSH mesh.
A guest without the toolkit gets NVIDIA's apt repository first, unless its source list already
names the runbook's (toolkit_repository.py); once configured, `nvidia-ctk --version` must answer and
`docker info` list the nvidia runtime, or the guest fails naming the command.
A guest whose daemon is stopped cannot say which runtimes it has: the plan starts the daemon, and
configures the runtime only if, once it runs, it is missing (`only_if_missing`). Packages, the
daemon and the runtime are root's (`target.root`: through sudo for any login but root's); docker
itself runs as the login.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from gpuvm.errors import RemoteCommandError
from gpuvm.executors.base import CommandResult
from gpuvm.plan import Change
from gpuvm.desired.ssh import DesiredGuest, GuestImage
from gpuvm.remote import Cluster, run
from gpuvm.steps.base import Context, Step
from gpuvm.steps.toolkit_repository import AddToolkitRepository, configure, current_line, source_line
from gpuvm.untrusted import checked

NAME = "guest.docker"


@dataclass(frozen=True)
class DockerFact:
    server_version: str | None  # None: docker is not installed
    daemon_error: str | None  # installed, but the daemon did not answer
    nvidia_runtime: bool  # `docker info` lists the nvidia runtime
    toolkit_installed: bool  # nvidia-container-toolkit's package (only looked at without the runtime)
    toolkit_source: str | None = None  # without the toolkit: NVIDIA's source list's entry (None: no list)


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


def observe(ctx: Context, target: DesiredGuest) -> DockerFact:
    cluster, image = ctx.cluster, _image(target)
    version = run(target, cluster, ["docker", "version", "--format", "{{.Server.Version}}"], check=False)
    if not version.ok or not version.stdout.strip():  # no docker, or its daemon does not answer
        server, error = (None, None) if _missing(version) else ("", _said(version))
        toolkit = image.gpus and _toolkit(target, cluster)
        return DockerFact(server, error, False, toolkit, _source(target, cluster, image.gpus and not toolkit))
    runtimes = run(target, cluster, ["docker", "info", "--format", "{{json .Runtimes}}"]).stdout
    nvidia = "nvidia" in parse_runtimes(runtimes)
    toolkit = nvidia or (image.gpus and _toolkit(target, cluster))
    return DockerFact(checked(version.stdout.strip(), "a version", "docker version"), None, nvidia, toolkit,
                      _source(target, cluster, image.gpus and not toolkit))


def _source(target: DesiredGuest, cluster: Cluster, needed: bool) -> str | None:
    return current_line(target, cluster) if needed else None


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


# -- plan (pure) --------------------------------------------------------------------------------

def plan(target: DesiredGuest, fact: DockerFact) -> list[Change]:
    image = _image(target)
    changes: list[Change] = []
    stopped = bool(fact.daemon_error)  # runtimes unknown until the daemon runs
    unknown = "unknown: the docker daemon is stopped"
    if fact.server_version is None:
        changes.append(Change(NAME, target.name, "package docker.io", "installed", None, "installed",
                              action=InstallDocker()))
    elif stopped:
        changes.append(Change(NAME, target.name, "service docker", "running", fact.daemon_error, "running",
                              action=StartDocker()))
    if image.gpus and not fact.nvidia_runtime and not fact.toolkit_installed and \
            fact.toolkit_source != source_line(image.toolkit):
        after = source_line(image.toolkit) + (", if the runtime is missing once the daemon runs" if stopped else "")
        changes.append(Change(NAME, target.name, "apt source nvidia-container-toolkit", "entry", fact.toolkit_source,
                              after, action=AddToolkitRepository(image.toolkit.url, image.toolkit.key)))
    if image.gpus and not fact.nvidia_runtime:  # gpus: false (CPU guests): containers get no GPUs
        before = unknown if stopped else "toolkit installed, runtime not configured" if fact.toolkit_installed else None
        changes.append(Change(NAME, target.name, "docker runtime nvidia", "present", before,
                              "nvidia-container-toolkit" + (", if missing once the daemon runs" if stopped else ""),
                              action=AddNvidiaRuntime(not fact.toolkit_installed, only_if_missing=stopped)))
    return changes


# -- apply --------------------------------------------------------------------------------------

def apply(ctx: Context, target: DesiredGuest, changes: list[Change]) -> None:
    """Packages, daemon and runtime (root's: through sudo for any login but root's). A runtime planned
    while the daemon was stopped is looked at once it runs, before anything (NVIDIA's repository
    included) is installed."""
    cluster = ctx.cluster
    actions = [c.action for c in changes]
    install = any(isinstance(a, InstallDocker) for a in actions)
    runtime = next((a for a in actions if isinstance(a, AddNvidiaRuntime)), None)
    repository = next((a for a in actions if isinstance(a, AddToolkitRepository)), None)
    later = runtime is not None and runtime.only_if_missing
    if repository and not later:
        configure(target, cluster, repository)
    _apt_install(target, cluster, (["docker.io"] if install else []) +
                 (["nvidia-container-toolkit"] if runtime and runtime.install_toolkit and not later else []))
    if install or any(isinstance(a, StartDocker) for a in actions):
        run(target, cluster, ["systemctl", "enable", "--now", "docker"], sudo=target.root)
    if later and _has_nvidia_runtime(target, cluster):
        runtime = None
    if runtime:
        if later and runtime.install_toolkit:
            if repository:
                configure(target, cluster, repository)
            _apt_install(target, cluster, ["nvidia-container-toolkit"])
        run(target, cluster, ["nvidia-ctk", "runtime", "configure", "--runtime=docker"], sudo=target.root)
        run(target, cluster, ["systemctl", "restart", "docker"], sudo=target.root)
        _verify(target, cluster)


def _verify(target: DesiredGuest, cluster: Cluster) -> None:
    """nvidia-ctk answers, and the restarted daemon lists the nvidia runtime."""
    ctk = run(target, cluster, ["nvidia-ctk", "--version"], sudo=False, check=False)
    if not ctk.ok:
        raise RemoteCommandError(f"guest {target.name}: `nvidia-ctk --version` exited {ctk.exit_code} after "
                                 f"installing nvidia-container-toolkit: {_said(ctk)}")
    if not _has_nvidia_runtime(target, cluster):
        raise RemoteCommandError(f"guest {target.name}: `docker info` lists no nvidia runtime after `nvidia-ctk "
                                 "runtime configure --runtime=docker` and a daemon restart")


def _apt_install(target: DesiredGuest, cluster: Cluster, packages: list[str]) -> None:
    if not packages:
        return
    env = ["env", "DEBIAN_FRONTEND=noninteractive"]
    run(target, cluster, env + ["apt-get", "update"], sudo=target.root)
    result = run(target, cluster, env + ["apt-get", "install", "-y", *packages], sudo=target.root, check=False)
    if not result.ok:
        raise RemoteCommandError(f"guest {target.name}: `apt-get install -y {' '.join(packages)}` exited "
                                 f"{result.exit_code}: {_said(result)}")


def _has_nvidia_runtime(target: DesiredGuest, cluster: Cluster) -> bool:
    return "nvidia" in parse_runtimes(run(target, cluster, ["docker", "info", "--format", "{{json .Runtimes}}"]).stdout)


STEP = Step(NAME, "guest", observe, plan, apply, wanted=wanted)
