"""guest.docker and guest.image: the recipe, plans from facts (pure), observe and apply against scripted executors."""

from __future__ import annotations

import hashlib
import json
import re
import textwrap
import time
from pathlib import Path

import pytest

from gpuvm.steps.base import Context
from gpuvm import engine
from gpuvm.errors import ConnectError, InputError, RemoteCommandError
from gpuvm.executors.base import CommandResult
from gpuvm.executors.fake import FakeCall, FakeExecutor, ok
from gpuvm.remote import RemoteOptions, build_cluster
from gpuvm.runbook.loader import load_runbook
from gpuvm.runbook.guests import Image
from gpuvm import image as recipes
from gpuvm.steps import guest_docker as step
from gpuvm.image_pipeline import split
from gpuvm.steps import guest_image
from gpuvm.steps.guest_docker import DockerFact
from gpuvm.steps.guest_image import ImageFact
from gpuvm.steps.guest_ssh_mesh.key import cluster_key
from gpuvm.steps.toolkit_repository import LIST

GUESTS = ["gpu-vm-01", "gpu-vm-02", "gpu-vm-03", "gpu-vm-04"]
NVIDIA_SOURCE = ("deb [signed-by=/etc/apt/keyrings/nvidia-container-toolkit.asc] "
                 "https://nvidia.github.io/libnvidia-container/stable/deb/$(ARCH) /")
A, B = "sha256:" + "a" * 64, "sha256:" + "b" * 64


def runbook(tmp_path: Path, image: str = "{}", guests: list[str] = GUESTS, mesh: bool = False):
    text = "hosts: [{name: esx-01}]\nvms:\n" + "".join(f"  - {{name: {g}, host: esx-01}}\n" for g in guests)
    text += "guests:\n  image: " + image + "\n" + ("  ssh_mesh: {}\n" if mesh else "") + "  hosts:\n"
    text += "".join(f"    - {{vm: {g}, ssh: {{address: 10.0.0.{i + 1}, user: gpuadmin, sudo: true}}}}\n"
                    for i, g in enumerate(guests))
    path = tmp_path / "rb.yaml"
    path.write_text(text)
    return load_runbook(path)


class DockerWorld:
    """Scripted docker on every guest: images by tag, builds and loads recorded."""

    def __init__(self, guests=GUESTS, installed=True, runtimes=("nvidia", "runc")):
        self.images: dict[str, dict[str, str]] = {g: {} for g in guests}
        self.builds: list[str] = []
        self.loads: list[str] = []
        self.load_id: dict[str, str] = {}  # guest → id a load gives there (to fake a mismatch)
        self.fail: dict[str, str] = {}  # guest → command prefix that fails there
        self.hops: list[tuple[str, str]] = []  # (sender, receiver) of every copy over the mesh
        self.piped: list[tuple[str, str]] = []  # (sender, receiver) of every send down the pipelined tree
        self.pipeline = True  # False: the pipelined tree fails as a whole (no bash on the builder, say)
        self.unreachable: set[str] = set()  # guests no mesh login reaches
        self.executors = {g: self._executor(g, installed, runtimes) for g in guests}
        for guest in guests:
            self.executors[guest].responses[re.compile(r" -p \d+ \S+ '(sudo -n )?docker load'")] = self._hop(guest, guests)
            tree = {re.compile(r"^docker save \S+ \| bash -c "): self._tree(guest, guests)}
            self.executors[guest].responses = tree | self.executors[guest].responses  # before plain saves

    def _tree(self, builder: str, guests):
        """The pipelined tree from `builder`: each relay loads the stream (unless its load fails) and
        passes it on to its children (unless the mesh does not take it there)."""
        def respond(call: FakeCall) -> CommandResult:
            if not self.pipeline:
                return CommandResult("", 127, "", "bash: line 1: base64: command not found")
            ref = re.search(r"docker save (\S+) ", call.command).group(1)
            tokens = re.findall(r"\b10\.0\.0\.(\d+),\d+,[01],\S+", call.command)
            stream = self.images[builder][ref]

            def relay(sender: str, descendants: list[str]) -> None:
                for subtree in split(descendants):
                    if not subtree:
                        continue
                    child = subtree[0]
                    self.piped.append((sender, child))
                    if self.fail.get(sender) == "mesh" or child in self.unreachable:
                        continue
                    if self.fail.get(child) != "docker load":
                        self.images[child][ref] = self.load_id.get(child, stream)
                    relay(child, subtree[1:])

            relay(builder, [guests[int(i) - 1] for i in tokens])
            return ok("")
        return respond

    def _hop(self, sender: str, guests):
        """The hop script on `sender`: the image to the guest at the ssh line's address (10.0.0.<i+1>)."""
        def respond(call: FakeCall) -> CommandResult:
            address = re.search(r" -p \d+ (\S+) ", call.command).group(1)
            receiver = guests[int(address.rsplit(".", 1)[1]) - 1]
            self.hops.append((sender, receiver))
            if self.fail.get(receiver) == "docker load":
                return CommandResult("", 4, "", "docker load failed (exit 1): no space left on device")
            if self.fail.get(sender) == "mesh" or receiver in self.unreachable:
                return CommandResult("", 5, "", "ssh over the mesh failed: Permission denied (publickey).")
            ref = re.search(r"docker save (\S+) ", call.command).group(1)
            self.images[receiver][ref] = self.load_id.get(receiver, self.images[sender][ref])
            return ok("")
        return respond

    def _executor(self, guest: str, installed: bool, runtimes) -> FakeExecutor:
        images = self.images[guest]

        def failing(prefix, answer):
            def respond(call: FakeCall) -> CommandResult:
                if self.fail.get(guest) and call.command.startswith(self.fail[guest]):
                    return CommandResult(call.command, 1, "", f"{self.fail[guest]}: boom")
                return answer(call)
            return respond

        def inspect(call):
            ref = call.command.rsplit(" ", 1)[1]
            if ref in images:
                return ok(call.command, images[ref] + "\n")
            return CommandResult(call.command, 1, "", f"Error: No such image: {ref}")

        def build(call):
            words = call.command.split()
            ref = words[words.index("-t") + 1]
            self.builds.append(guest)
            images[ref] = "sha256:" + hashlib.sha256(call.stdin).hexdigest()
            return ok(call.command, "Successfully built\n")

        def save(call):
            ref = call.command.split()[2]
            return ok(call.command, json.dumps({"ref": ref, "id": images[ref]}))

        def load(call):
            data = json.loads(call.stdin)
            self.loads.append(guest)
            images[data["ref"]] = self.load_id.get(guest, data["id"])
            return ok(call.command, f"Loaded image: {data['ref']}\n")

        def pull(call):
            remote = call.command.split()[2]
            images[remote] = A
            return ok(call.command)

        def tag(call):
            _, _, src, dst = call.command.split()
            images[dst] = images[src]
            return ok(call.command)

        if not installed:
            return FakeExecutor(guest, {
                re.compile(r"^docker "): CommandResult("", 1, "", "sudo: docker: command not found"),
                re.compile(r"^dpkg-query "): CommandResult("", 1, "", "dpkg-query: no packages found"),
                re.compile(r"^(env|systemctl|nvidia-ctk) "): ok(""),
            })
        runtimes = list(runtimes)

        def configure(call):  # nvidia-ctk runtime configure: the daemon lists it (after its restart)
            runtimes.append("nvidia")
            return ok(call.command)

        return FakeExecutor(guest, {
            "docker version --format '{{.Server.Version}}'": ok("", "24.0.7\n"),
            "docker info --format '{{json .Runtimes}}'": lambda call: ok("", json.dumps({r: {"path": r} for r in runtimes})),
            "nvidia-ctk runtime configure --runtime=docker": configure,
            re.compile(r"^docker image inspect "): inspect,
            re.compile(r"^docker build "): failing("docker build", build),
            re.compile(r"^docker save "): failing("docker save", save),
            re.compile(r"^docker load$"): failing("docker load", load),
            re.compile(r"^docker pull "): failing("docker pull", pull),
            re.compile(r"^docker tag "): tag,
            re.compile(r"^dpkg-query "): ok("", "install ok installed"),
            re.compile(r"^(env|systemctl|nvidia-ctk) "): ok(""),
        })

    def cluster(self, rb, tmp_path):
        return build_cluster(rb, tmp_path, RemoteOptions(executor_factory=lambda name, access: self.executors[name]))


def observe_and_plan(cluster, of=guest_image):
    """Every guest observed and planned, for guest.image unless `of` names another step."""
    changes = {}
    for name, target in cluster.targets.items():
        changes[name] = of.plan(target, of.observe(Context(cluster=cluster), target))
    return changes


# -- the recipe ---------------------------------------------------------------------------------

def test_dockerfile_has_versions_port_and_label():
    image = Image(openmpi="4.1.5", horovod="0.28.1", sshd_port=2222, ofed="5.8-3.0.7.0")
    r = recipes.recipe(image)
    text = r.dockerfile
    assert text.startswith("# gpuvm training image") and "\nFROM nvcr.io/nvidia/tensorflow:22.01-tf2-py3\n" in text
    assert "MLNX_OFED-${MOFED_VERSION}/MLNX_OFED_LINUX-${MOFED_VERSION}-${MOFED_OS}-x86_64.tgz" in text
    assert "ARG MOFED_VERSION=5.8-3.0.7.0\nARG MOFED_OS=ubuntu20.04" in text
    assert "mlnxofedinstall --user-space-only --without-fw-update --all -q" in text
    assert "open-mpi/v4.1/openmpi-4.1.5.tar.gz" in text and "horovod==0.28.1" in text
    assert "HOROVOD_GPU_OPERATIONS=NCCL HOROVOD_WITH_MPI=1" in text and "HOROVOD_WITH_TENSORFLOW=1" in text
    assert '"Port 2222"' in text and "EXPOSE 2222" in text and "mkdir -p /var/run/sshd" in text
    assert "PermitRootLogin prohibit-password" in text and f"-v /etc/ssh:{recipes.HOST_KEYS_DIR}:ro" in text
    assert text.rstrip().endswith(f"LABEL org.gpuvm.recipe={r.digest}")
    body = text[: text.index("LABEL org.gpuvm.recipe")]
    assert hashlib.sha256(body.encode()).hexdigest() == r.digest
    assert r.ref == f"gpuvm/dl:{r.digest[:12]}"


DEBIAN = dict(base="gpuvm-base/debian:bookworm", mpi="distro", framework="pytorch", framework_from="distro",
              ofed="inbox", horovod=None)


@pytest.mark.parametrize("image, present, absent", [
    (Image(ofed="inbox"), ["rdma-core libibverbs1 librdmacm1 ibverbs-providers"], ["mlnxofedinstall"]),
    (Image(framework="pytorch"), ['python3 -c "import torch" 2>/dev/null || python3 -m pip install', "HOROVOD_WITH_PYTORCH=1"],
     ["HOROVOD_WITH_TENSORFLOW=1"]),
    (Image(), ["import tensorflow", "HOROVOD_WITHOUT_PYTORCH=1", "build-essential", "openmpi-4.1.2.tar.gz"],
     ["HOROVOD_WITH_PYTORCH=1", "libibverbs1", "openmpi-bin"]),
    # production on NGC: MOFED, Open MPI from source, Horovod; a Debian base: all from the distribution
    (Image(**DEBIAN), ["FROM gpuvm-base/debian:bookworm", "openmpi-bin \\", "python3-torch python3-torchvision",
                       "rdma-core", "no Horovod", "Open MPI from the distribution"],
     ["build-essential", "wget", "pip install", "horovod==", "mlnxofedinstall", "./configure", "git "]),
    (Image(**{**DEBIAN, "horovod": "0.28.1"}), ["openmpi-bin libopenmpi-dev", "horovod==0.28.1", "build-essential"], []),
    (Image(framework="pytorch", framework_from="pip"), ["RUN python3 -m pip install --no-cache-dir torch torchvision"],
     ['import torch" 2>/dev/null']),
])
def test_dockerfile_variants(image, present, absent):
    text = recipes.recipe(image).dockerfile
    assert all(p in text for p in present), [p for p in present if p not in text]
    assert not any(a in text for a in absent), [a for a in absent if a in text]
    assert "{{" not in text and "{%" not in text


def test_dockerfile_fetches_benchmark_scripts_at_pinned_refs():
    image = Image(scripts={"tf_cnn_benchmarks": "cnn_tf_v2.1_compatible", "horovod_examples": "v0.28.1"})
    text = recipes.recipe(image).dockerfile
    assert ("RUN git init -q /opt/gpuvm/benchmarks && cd /opt/gpuvm/benchmarks \\\n"
            "    && git fetch -q --depth 1 https://github.com/tensorflow/benchmarks.git cnn_tf_v2.1_compatible "
            "&& git checkout -q FETCH_HEAD \\\n    && rm -rf .git\n") in text
    assert "git fetch -q --depth 1 https://github.com/horovod/horovod.git v0.28.1" in text
    assert " git perl " in text  # git is installed for it
    assert recipes.image_programs(image) == {
        "tf_cnn_benchmarks": "/opt/gpuvm/benchmarks/scripts/tf_cnn_benchmarks/tf_cnn_benchmarks.py",
        "horovod_synthetic/tensorflow": "/opt/gpuvm/horovod/examples/tensorflow2/tensorflow2_synthetic_benchmark.py",
        "horovod_synthetic/pytorch": "/opt/gpuvm/horovod/examples/pytorch/pytorch_synthetic_benchmark.py"}
    assert recipes.image_programs(Image()) == {} and "git fetch" not in recipes.recipe(Image()).dockerfile
    assert recipes.image_ref(image) != recipes.image_ref(Image(scripts={"horovod_examples": "v0.28.0"}))


def test_image_entrypoint_installs_the_mesh_key_for_root():
    text = recipes.recipe(Image(**DEBIAN)).dockerfile
    assert 'ENTRYPOINT ["/usr/local/bin/gpuvm-entrypoint"]\nCMD ["/usr/sbin/sshd", "-D", "-e"]' in text
    assert "install -m 600 /etc/gpuvm/mesh/id_ed25519_gpuvm.pub /root/.ssh/authorized_keys" in text


@pytest.mark.parametrize("fields, message", [
    ({"framework_from": "distro"}, "framework_from: distro needs framework: pytorch"),
    ({"scripts": {"tf_cnn_benchmarks": "main; rm -rf /"}}, "is not a git ref"),
    ({"mpi": "conda"}, "Input should be 'source' or 'distro'"),
])
def test_image_fields_checked(fields, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        Image(**fields)


def test_gpus_false_needs_no_nvidia_runtime():
    assert "--gpus" not in recipes.container_run_args(Image(gpus=False))
    assert recipes.container_run_args(Image())[3:5] == ["--device=/dev/infiniband", "--gpus"]
    assert "--device=/dev/infiniband" not in recipes.container_run_args(Image(), rdma=False)
    assert recipes.image_ref(Image(gpus=False)) == recipes.image_ref(Image())  # a run option, not the recipe


def test_any_change_in_the_recipe_changes_the_tag():
    refs = {recipes.image_ref(i) for i in (Image(), Image(horovod="0.24.0"), Image(sshd_port=2222), Image(ofed="inbox"))}
    assert len(refs) == 4
    assert recipes.image_ref(Image(registry="r.example:5000", builder="x")) == recipes.image_ref(Image())  # not the recipe


def test_template_with_an_unknown_value_is_an_input_error():
    with pytest.raises(InputError, match="guest.image: Dockerfile template: 'no_such' is undefined"):
        recipes.render_dockerfile(Image(), template="FROM {{ base }}\nRUN echo {{ no_such }}\n")


# -- plan (pure) --------------------------------------------------------------------------------

def fact(image_id=None, builder_id=None, error=None):
    return ImageFact(image_id, builder_id, error)


def docker(version="24.0.7", error=None, runtime=True, toolkit=True):
    return DockerFact(version, error, runtime, toolkit)


@pytest.mark.parametrize("image, target, f, expected", [
    ("{}", "gpu-vm-01", fact(A), []),
    ("{}", "gpu-vm-02", fact(A, A), []),
    ("{}", "gpu-vm-01", fact(), [("present", None, "built on gpu-vm-01", "build")]),
    ("{}", "gpu-vm-03", fact(None, A), [("present", None, "copied from gpu-vm-01", "copy")]),
    ("{}", "gpu-vm-03", fact(B, A), [("id", B, A, "copy")]),
    ("{}", "gpu-vm-03", fact(B, None), [("id", B, "copied from gpu-vm-01", "copy")]),  # the builder will build
    ("{builder: gpu-vm-02}", "gpu-vm-02", fact(), [("present", None, "built on gpu-vm-02", "build")]),
    ("{builder: gpu-vm-02}", "gpu-vm-01", fact(), [("present", None, "copied from gpu-vm-02", "copy")]),
    ("{registry: r.example:5000}", "gpu-vm-01", fact(), [("present", None, "pulled from r.example:5000", "pull")]),
    ("{registry: r.example:5000}", "gpu-vm-04", fact(None, A), [("present", None, "pulled from r.example:5000", "pull")]),
])
def test_plan_image(tmp_path, image, target, f, expected):
    cluster = DockerWorld().cluster(rb := runbook(tmp_path, image), tmp_path)
    changes = guest_image.plan(cluster.targets[target], f)
    ref = recipes.image_ref(rb.guests.image)
    assert [(c.field, c.before, c.after, c.action.how) for c in changes] == expected
    assert all(c.resource == f"image {ref}" and c.step == "guest.image" and c.target == target for c in changes)


def test_plan_image_while_the_daemon_is_stopped(tmp_path):
    """Its images cannot be read: placed only if missing once guest.docker has started the daemon."""
    cluster = DockerWorld().cluster(runbook(tmp_path), tmp_path)
    [change] = guest_image.plan(cluster.targets["gpu-vm-02"], fact(None, A, error="Cannot connect to the Docker daemon"))
    assert (change.field, change.before, change.after) == ("present", "unknown: the docker daemon is stopped",
                                                           "copied from gpu-vm-01, if missing once the daemon runs")
    assert change.action.only_if_missing and change.action.how == "copy"


@pytest.mark.parametrize("f, expected", [
    (docker(version=None, runtime=False, toolkit=False),
     [("package docker.io", "installed", None, "installed", ["docker.io"]),
      ("apt source nvidia-container-toolkit", "entry", None, NVIDIA_SOURCE, []),
      ("docker runtime nvidia", "present", None, "nvidia-container-toolkit", ["nvidia-container-toolkit"])]),
    (docker(version="", error="Cannot connect to the Docker daemon"),  # the image: guest.image's, after
     [("service docker", "running", "Cannot connect to the Docker daemon", "running", [])]),
    (docker(runtime=False, toolkit=True),
     [("docker runtime nvidia", "present", "toolkit installed, runtime not configured", "nvidia-container-toolkit", [])]),
])
def test_plan_engine_and_toolkit(tmp_path, f, expected):
    cluster = DockerWorld().cluster(runbook(tmp_path), tmp_path)
    changes = step.plan(cluster.targets["gpu-vm-01"], f)
    assert [(c.resource, c.field, c.before, c.after, packages(c.action)) for c in changes] == expected
    assert all(c.step == "guest.docker" for c in changes)


def packages(action) -> list[str]:
    if isinstance(action, step.InstallDocker):
        return ["docker.io"]
    return ["nvidia-container-toolkit"] if isinstance(action, step.AddNvidiaRuntime) and action.install_toolkit else []


# -- observe ------------------------------------------------------------------------------------

def test_observe_fresh_guests(tmp_path):
    world = DockerWorld()
    cluster = world.cluster(rb := runbook(tmp_path), tmp_path)
    assert guest_image.observe(Context(cluster=cluster), cluster.targets["gpu-vm-02"]) == fact(None, None)
    world.images["gpu-vm-01"][recipes.image_ref(rb.guests.image)] = A
    assert guest_image.observe(Context(cluster=cluster), cluster.targets["gpu-vm-02"]) == fact(None, None)  # copied anyway
    world.images["gpu-vm-02"][recipes.image_ref(rb.guests.image)] = B
    assert guest_image.observe(Context(cluster=cluster), cluster.targets["gpu-vm-02"]) == fact(B, A)  # compared
    assert guest_image.observe(Context(cluster=cluster), cluster.targets["gpu-vm-01"]) == fact(A, None)
    assert step.observe(Context(cluster=cluster), cluster.targets["gpu-vm-02"]) == docker()
    assert all(c.sudo for c in world.executors["gpu-vm-02"].calls)  # the guests' sudo setting


def test_observe_without_docker_or_runtime(tmp_path):
    bare = DockerWorld(installed=False)
    cluster = bare.cluster(runbook(tmp_path), tmp_path)
    assert step.observe(Context(cluster=cluster), cluster.targets["gpu-vm-01"]) == docker(None, runtime=False,
                                                                                         toolkit=False)
    assert guest_image.observe(Context(cluster=cluster), cluster.targets["gpu-vm-02"]) == fact(None, None)
    plain = DockerWorld(runtimes=("runc",))
    cluster = plain.cluster(runbook(tmp_path), tmp_path)
    assert step.observe(Context(cluster=cluster), cluster.targets["gpu-vm-01"]) == docker(runtime=False, toolkit=True)
    assert step.parse_runtimes('{"nvidia":{"path":"nvidia-container-runtime"},"runc":{"path":"runc"}}') == \
        ["nvidia", "runc"]


def test_unexpected_inspect_failure_names_target_and_step(tmp_path):
    world = DockerWorld()
    world.executors["gpu-vm-01"].responses = {
        "docker version --format '{{.Server.Version}}'": ok("", "24.0.7\n"),
        "docker info --format '{{json .Runtimes}}'": ok("", '{"nvidia":{}}'),
        re.compile("^docker image inspect"): CommandResult("", 1, "", "permission denied while trying to connect"),
    }
    cluster = world.cluster(runbook(tmp_path), tmp_path)
    with pytest.raises(RemoteCommandError, match=r"^gpu-vm-01: guest.image: cannot inspect image gpuvm/dl:\w{12}: "
                                                 "permission denied"):
        guest_image.observe(Context(cluster=cluster), cluster.targets["gpu-vm-01"])


# -- apply --------------------------------------------------------------------------------------

def test_apply_all_builds_once_and_ships_to_the_rest(tmp_path):
    world = DockerWorld()
    cluster = world.cluster(rb := runbook(tmp_path), tmp_path)
    planned = observe_and_plan(cluster)
    assert [c.after for cs in planned.values() for c in cs] == ["built on gpu-vm-01"] + ["copied from gpu-vm-01"] * 3
    assert guest_image.STEP.apply_all(Context(cluster=cluster), planned) == {}
    assert world.builds == ["gpu-vm-01"]
    assert sorted(world.loads) == ["gpu-vm-02", "gpu-vm-03", "gpu-vm-04"]
    saves = [c for c in world.executors["gpu-vm-01"].calls if c.command.startswith("docker save")]
    assert len(saves) == 1
    build = next(c for c in world.executors["gpu-vm-01"].calls if c.command.startswith("docker build"))
    assert build.sudo and build.stdin == recipes.recipe(rb.guests.image).dockerfile.encode()
    assert build.timeout == 10800
    assert len({tuple(i.values()) for i in world.images.values()}) == 1
    assert observe_and_plan(cluster) == {g: [] for g in GUESTS}


def test_cpu_guests_build_on_the_host_network_without_the_nvidia_runtime(tmp_path):
    world = DockerWorld(runtimes=("runc",))  # no NVIDIA toolkit, no runtime: `gpus: false` asks for neither
    cluster = world.cluster(runbook(tmp_path, "{gpus: false, build_network: host}"), tmp_path)
    planned = observe_and_plan(cluster)
    assert [c.resource for cs in planned.values() for c in cs if "runtime" in c.resource] == []
    assert not any(c.command.startswith("dpkg-query") for e in world.executors.values() for c in e.calls)
    assert guest_image.STEP.apply_all(Context(cluster=cluster), planned) == {}
    [build] = [c for c in world.executors["gpu-vm-01"].calls if c.command.startswith("docker build")]
    assert build.command.startswith("docker build --network=host -t gpuvm/dl:")


def test_docker_installs_the_toolkit_then_configures_the_runtime(tmp_path):
    world = DockerWorld(runtimes=("runc",))
    world.executors["gpu-vm-02"].responses[re.compile(r"^dpkg-query ")] = CommandResult("", 1, "", "no packages")
    world.executors["gpu-vm-02"].responses[f"cat {LIST}"] = ok("", NVIDIA_SOURCE + "\n")  # NVIDIA's repository there
    cluster = world.cluster(runbook(tmp_path), tmp_path)
    for name, changes in observe_and_plan(cluster, step).items():
        step.STEP.apply(Context(cluster=cluster), cluster.targets[name], changes)
    commands = world.executors["gpu-vm-02"].commands
    install = commands.index("sudo -n env DEBIAN_FRONTEND=noninteractive apt-get install -y nvidia-container-toolkit")
    assert commands[install + 1:] == ["sudo -n nvidia-ctk runtime configure --runtime=docker",
                                      "sudo -n systemctl restart docker", "nvidia-ctk --version",
                                      "sudo -n docker info --format '{{json .Runtimes}}'"]  # checked
    assert not any("apt-get" in c for c in world.executors["gpu-vm-03"].commands)  # toolkit there, runtime not set
    assert not any(c.startswith(("docker build", "docker save", "docker load")) for e in world.executors.values()
                   for c in e.commands)  # the image is guest.image's


def test_docker_then_the_mesh_then_the_image():
    """The image goes out over the mesh that the same apply sets up (issue 27), on the daemon set up before."""
    from gpuvm.engine import STEPS

    names = [s.name for s in STEPS]
    assert names.index("guest.docker") < names.index("guest.ssh_mesh") < names.index("guest.image")


def test_copies_that_already_match_are_not_sent_again(tmp_path):
    world = DockerWorld()
    cluster = world.cluster(rb := runbook(tmp_path), tmp_path)
    ref = recipes.image_ref(rb.guests.image)
    world.images["gpu-vm-02"][ref] = "sha256:" + hashlib.sha256(
        recipes.recipe(rb.guests.image).dockerfile.encode()).hexdigest()  # what the build will give
    planned = observe_and_plan(cluster)
    assert [c.field for c in planned["gpu-vm-02"]] == ["id"]
    assert guest_image.STEP.apply_all(Context(cluster=cluster), planned) == {}
    assert sorted(world.loads) == ["gpu-vm-03", "gpu-vm-04"]


def test_mismatch_after_load_is_reported_with_guests_and_ids(tmp_path):
    world = DockerWorld()
    world.load_id["gpu-vm-03"] = B
    cluster = world.cluster(runbook(tmp_path), tmp_path)
    failures = guest_image.STEP.apply_all(Context(cluster=cluster), observe_and_plan(cluster))
    assert list(failures) == ["gpu-vm-03"]
    message = str(failures["gpu-vm-03"])
    assert isinstance(failures["gpu-vm-03"], RemoteCommandError)
    assert re.fullmatch(rf"gpu-vm-03: guest.image: image gpuvm/dl:\w+ loaded through gpuvm's machine has id {B} on "
                        r"gpu-vm-03, not sha256:\w+ as on the builder gpu-vm-01", message), message


def test_failed_build_fails_every_copy_without_a_transfer(tmp_path):
    world = DockerWorld()
    world.fail["gpu-vm-01"] = "docker build"
    cluster = world.cluster(runbook(tmp_path), tmp_path)
    failures = guest_image.STEP.apply_all(Context(cluster=cluster), observe_and_plan(cluster))
    assert sorted(failures) == GUESTS
    assert "docker build" in str(failures["gpu-vm-01"]) and "boom" in str(failures["gpu-vm-01"])
    assert "cannot copy gpuvm/dl:" in str(failures["gpu-vm-02"]) and "builder gpu-vm-01" in str(failures["gpu-vm-02"])
    assert world.loads == []


def test_one_failed_load_does_not_hide_the_others(tmp_path):
    world = DockerWorld()
    world.fail["gpu-vm-04"] = "docker load"
    cluster = world.cluster(runbook(tmp_path), tmp_path)
    failures = guest_image.STEP.apply_all(Context(cluster=cluster), observe_and_plan(cluster))
    assert list(failures) == ["gpu-vm-04"] and "docker load" in str(failures["gpu-vm-04"])
    assert sorted(world.loads) == ["gpu-vm-02", "gpu-vm-03"]


def test_registry_pulls_everywhere_and_tags_locally(tmp_path):
    world = DockerWorld()
    cluster = world.cluster(rb := runbook(tmp_path, "{registry: r.example:5000}"), tmp_path)
    assert guest_image.STEP.apply_all(Context(cluster=cluster), observe_and_plan(cluster)) == {}
    ref = recipes.image_ref(rb.guests.image)
    for guest in GUESTS:
        assert f"sudo -n docker pull r.example:5000/{ref}" in world.executors[guest].commands
        assert world.images[guest][ref] == A
    assert world.builds == [] and world.loads == []


def test_a_pull_that_gives_another_id_is_reported_with_every_guests_id(tmp_path):
    """The registry's tag moved while the guests pulled: the ids are compared once all have pulled."""
    world = DockerWorld()
    cluster = world.cluster(runbook(tmp_path, "{registry: r.example:5000}"), tmp_path)
    pulls = world.executors["gpu-vm-03"].responses
    pull = next(k for k in pulls if isinstance(k, re.Pattern) and "pull" in k.pattern)
    answer = pulls[pull]

    def moved(call):
        result = answer(call)
        world.images["gpu-vm-03"][call.command.split()[2]] = B
        return result

    pulls[pull] = moved
    failures = guest_image.STEP.apply_all(Context(cluster=cluster), observe_and_plan(cluster))
    assert list(failures) == ["gpu-vm-03"]
    message = str(failures["gpu-vm-03"])
    assert message.startswith("image gpuvm/dl:") and "differs between guests" in message
    assert f"gpu-vm-03 {B}" in message and f"gpu-vm-01 {A}" in message


def test_observing_a_guest_inspects_its_image_once_and_the_builders_only_to_compare(tmp_path):
    world = DockerWorld()
    cluster = world.cluster(rb := runbook(tmp_path), tmp_path)
    world.images["gpu-vm-03"][recipes.image_ref(rb.guests.image)] = A
    for guest in GUESTS[1:]:  # gpu-vm-03 has the image: compared with the builder's; the others lack it
        guest_image.observe(Context(cluster=cluster), cluster.targets[guest])
    inspects = {g: [c for c in e.commands if "docker image inspect" in c] for g, e in world.executors.items()}
    assert {g: len(c) for g, c in inspects.items()} == {"gpu-vm-01": 1, "gpu-vm-02": 1, "gpu-vm-03": 1, "gpu-vm-04": 1}


def test_apply_one_guest_fetches_from_the_builder(tmp_path):
    world = DockerWorld()
    cluster = world.cluster(runbook(tmp_path), tmp_path)
    planned = observe_and_plan(cluster)
    with pytest.raises(RemoteCommandError, match="gpu-vm-03: guest.image: cannot copy .* from the builder gpu-vm-01"):
        guest_image.STEP.apply(Context(cluster=cluster), cluster.targets["gpu-vm-03"], planned["gpu-vm-03"])
    guest_image.STEP.apply(Context(cluster=cluster), cluster.targets["gpu-vm-01"], planned["gpu-vm-01"])
    guest_image.STEP.apply(Context(cluster=cluster), cluster.targets["gpu-vm-03"], planned["gpu-vm-03"])
    assert world.builds == ["gpu-vm-01"] and world.loads == ["gpu-vm-03"]
    assert observe_and_plan(cluster)["gpu-vm-03"] == []


def test_a_stale_plan_is_refused(tmp_path):
    world = DockerWorld()
    cluster = world.cluster(runbook(tmp_path), tmp_path)
    planned = observe_and_plan(cluster)
    cluster = world.cluster(runbook(tmp_path, "{horovod: 0.28.1}"), tmp_path)  # apply reads the runbook again
    failures = guest_image.STEP.apply_all(Context(cluster=cluster), planned)
    assert sorted(failures) == GUESTS and "plan again" in str(failures["gpu-vm-01"])
    assert world.builds == []


def test_large_images_go_in_chunks_then_load_from_a_file(tmp_path, monkeypatch):
    world = DockerWorld()
    cluster = world.cluster(runbook(tmp_path), tmp_path)
    ex = world.executors["gpu-vm-02"]
    ex.responses.update({
        re.compile(r"^mktemp "): ok("", "/tmp/gpuvm-image.Ab12Cd\n"),
        re.compile(r"^sh -c "): ok(""),
        re.compile(r"^docker load -i "): ok(""),
        re.compile(r"^rm -f "): ok(""),
    })
    monkeypatch.setattr(guest_image, "CHUNK", 4)
    saved = tmp_path / "image.tar"
    saved.write_bytes(b"0123456789")
    guest_image._load(cluster.targets["gpu-vm-02"], cluster, saved, time.monotonic() + 600, stdin_limit=5)
    sent = [c for c in ex.calls if c.command.startswith("sh -c")]
    assert [c.stdin for c in sent] == [b"0123", b"4567", b"89"] and not any(c.sudo for c in sent)
    assert ex.commands[-2:] == ["sudo -n docker load -i /tmp/gpuvm-image.Ab12Cd", "rm -f /tmp/gpuvm-image.Ab12Cd"]


def test_an_apt_failure_names_the_guest_and_the_command(tmp_path):
    world = DockerWorld(installed=False)
    world.executors["gpu-vm-01"].responses = {
        re.compile(r"apt-get update"): ok(""),
        re.compile(r"apt-get install"): CommandResult("", 100, "", "E: Unable to locate package nvidia-container-toolkit"),
    }
    cluster = world.cluster(runbook(tmp_path), tmp_path)
    fact = DockerFact(None, None, False, False, NVIDIA_SOURCE)  # NVIDIA's source, yet no such package there
    changes = step.plan(cluster.targets["gpu-vm-01"], fact)
    with pytest.raises(RemoteCommandError, match=r"^guest gpu-vm-01: `apt-get install -y docker.io "
                                                 r"nvidia-container-toolkit` exited 100: E: Unable to locate"):
        step.STEP.apply(Context(cluster=cluster), cluster.targets["gpu-vm-01"], changes)


def test_step_shape():
    assert (step.STEP.name, step.STEP.role) == ("guest.docker", "guest")
    assert (guest_image.STEP.name, guest_image.STEP.role) == ("guest.image", "guest")
    assert step.STEP.apply_all is None and callable(guest_image.STEP.apply_all)  # the builder goes first
    assert recipes.container_run_args(Image())[:1] == ["--network=host"]
    assert textwrap.dedent(step.__doc__ or "").startswith("guest.docker:")
    assert textwrap.dedent(guest_image.__doc__ or "").startswith("guest.image:")


def test_image_build_and_ship_say_how_far_they_got(tmp_path, monkeypatch):
    """Issue 22, item 6: the build names its elapsed time, the save and every load bytes and rate,
    every few seconds (here every 0.05 s, each call taking 0.2 s) and when done."""
    import time

    import gpuvm.ticker

    monkeypatch.setattr(gpuvm.ticker, "EVERY", 0.05)
    world = DockerWorld()
    for executor in world.executors.values():
        for pattern, answer in list(executor.responses.items()):
            if isinstance(pattern, re.Pattern) and pattern.pattern.startswith(("^docker build", "^docker save",
                                                                               "^docker load")):
                executor.responses[pattern] = lambda call, answer=answer: (time.sleep(0.2), answer(call))[1]
    cluster = world.cluster(runbook(tmp_path), tmp_path)
    planned = observe_and_plan(cluster)
    said: list[tuple[str, str]] = []
    assert guest_image.STEP.apply_all(Context(cluster=cluster, say=lambda t, s: said.append((t, s))), planned) == {}
    lines = {target: [s for t, s in said if t == target] for target in GUESTS}
    assert any(re.fullmatch(r"building image gpuvm/dl:\w{12}: \d+ s", s) for s in lines["gpu-vm-01"]), said
    assert any(re.fullmatch(r"image gpuvm/dl:\w{12} built in \d+ s", s) for s in lines["gpu-vm-01"]), said
    assert any(re.fullmatch(r"saving gpuvm/dl:\w{12} from the builder: \d+ B in \d+ s \([\d.]+ [KMG]?B/s\)", s)
               for s in lines["gpu-vm-01"]), said
    for guest in GUESTS[1:]:
        assert any(re.fullmatch(r"shipping image: \d+ B in \d+ s \([\d.]+ [KMG]?B/s\) of \d+ B sent", s)
                   for s in lines[guest]), (guest, said)
        assert any(re.fullmatch(r"image shipped and loaded: \d+ B in \d+ s \([\d.]+ [KMG]?B/s\)", s)
                   for s in lines[guest]), (guest, said)


# -- over the mesh ------------------------------------------------------------------------------

EIGHT = [f"gpu-vm-{i:02d}" for i in range(1, 9)]


def meshed(world: DockerWorld, tmp_path: Path):
    """Eight guests with a mesh in the runbook and its key made (guest.ssh_mesh has run once)."""
    cluster_key(tmp_path)
    return world.cluster(runbook(tmp_path, guests=EIGHT, mesh=True), tmp_path)


def test_with_a_mesh_the_image_goes_down_a_pipelined_tree(tmp_path):
    world = DockerWorld(EIGHT)
    cluster = meshed(world, tmp_path)
    guest_image.OPERATOR_BYTES.reset()
    said: list[tuple[str, str]] = []
    planned = observe_and_plan(cluster)
    assert guest_image.STEP.apply_all(Context(cluster=cluster, say=lambda t, s: said.append((t, s))), planned) == {}
    assert world.piped == [("gpu-vm-01", "gpu-vm-02"), ("gpu-vm-02", "gpu-vm-03"), ("gpu-vm-03", "gpu-vm-04"),
                           ("gpu-vm-02", "gpu-vm-05"), ("gpu-vm-01", "gpu-vm-06"), ("gpu-vm-06", "gpu-vm-07"),
                           ("gpu-vm-06", "gpu-vm-08")]
    assert world.hops == [] and world.loads == [] and guest_image.OPERATOR_BYTES.bytes == 0
    assert len({tuple(i.values()) for i in world.images.values()}) == 1
    ref = cluster.targets["gpu-vm-01"].image.ref
    assert ("gpu-vm-01", f"image {ref} down a pipelined tree of 3 level(s) to 7 of 7 guest(s) in 0 s") in said
    assert ("gpu-vm-04", f"image {ref} copied from gpu-vm-03 over the mesh in 0 s (pipelined)") in said
    [tree] = [c for c in world.executors["gpu-vm-01"].calls if "| bash -c " in c.command]
    assert tree.line.startswith("sudo -n docker save gpuvm/dl:")  # the save alone through sudo
    assert tree.command.split()[-7:] == [f"10.0.0.{i},22,1,-" for i in range(2, 9)]  # each loads through sudo
    assert observe_and_plan(cluster) == {g: [] for g in EIGHT}


def test_with_the_builders_image_already_there_receivers_are_inspected_only_once_it_arrived(tmp_path):
    world = DockerWorld(EIGHT)
    cluster = meshed(world, tmp_path)
    world.images["gpu-vm-01"][cluster.targets["gpu-vm-01"].image.ref] = A  # built by an earlier run
    planned = observe_and_plan(cluster)
    for executor in world.executors.values():
        executor.calls.clear()
    assert guest_image.STEP.apply_all(Context(cluster=cluster), planned) == {}
    assert world.builds == [] and all(world.images[g] == world.images["gpu-vm-01"] for g in EIGHT)
    for guest in EIGHT[1:]:  # its id read once, after the tree: the plan has just compared it with the builder's
        assert len([c for c in world.executors[guest].commands if "docker image inspect" in c]) == 1, guest


def test_what_the_pipelined_tree_missed_goes_round_by_round(tmp_path):
    world = DockerWorld(EIGHT)
    world.unreachable.add("gpu-vm-06")  # the builder's right child: gpu-vm-07 and -08 get nothing from it
    cluster = meshed(world, tmp_path)
    failures = guest_image.STEP.apply_all(Context(cluster=cluster), observe_and_plan(cluster))
    assert list(failures) == []  # gpu-vm-06 is not reached by the mesh: one copy through gpuvm's machine
    assert world.loads == ["gpu-vm-06"]
    assert {r for _, r in world.hops} == {"gpu-vm-06", "gpu-vm-07", "gpu-vm-08"}
    assert len({tuple(i.values()) for i in world.images.values()}) == 1


def test_a_pipelined_tree_that_times_out_leaves_the_rest_to_the_rounds(tmp_path):
    world = DockerWorld(EIGHT)
    cluster = meshed(world, tmp_path)
    answer = world.executors["gpu-vm-01"].responses
    tree = next(k for k in answer if isinstance(k, re.Pattern) and "bash -c" in k.pattern)

    def halfway(call):  # the left half got it, then the builder's command ran out of time
        for guest in EIGHT[1:5]:
            world.images[guest][call.command.split()[2]] = world.images["gpu-vm-01"][call.command.split()[2]]
        raise RemoteCommandError("gpu-vm-01: `docker save …` timed out after 10800 s")

    answer[tree] = halfway
    said: list[tuple[str, str]] = []
    assert guest_image.STEP.apply_all(Context(cluster=cluster, say=lambda t, s: said.append((t, s))),
                                      observe_and_plan(cluster)) == {}
    assert sorted(r for _, r in world.hops) == EIGHT[5:]  # only what the tree had not reached, round by round
    assert any("the pipelined tree stopped: gpu-vm-01: `docker save …` timed out" in line for _, line in said)


def test_without_the_pipelined_tree_the_image_goes_guest_to_guest_round_by_round(tmp_path):
    world = DockerWorld(EIGHT)
    world.pipeline = False
    cluster = meshed(world, tmp_path)
    guest_image.OPERATOR_BYTES.reset()
    said: list[tuple[str, str]] = []
    planned = observe_and_plan(cluster)
    assert guest_image.STEP.apply_all(Context(cluster=cluster, say=lambda t, s: said.append((t, s))), planned) == {}
    rounds = [world.hops[:1], world.hops[1:3], world.hops[3:]]  # the hops of a round run side by side
    assert [sorted(r) for r in rounds] == [[("gpu-vm-01", "gpu-vm-02")],
                                           [("gpu-vm-01", "gpu-vm-03"), ("gpu-vm-02", "gpu-vm-04")],
                                           [("gpu-vm-01", "gpu-vm-05"), ("gpu-vm-02", "gpu-vm-06"),
                                            ("gpu-vm-03", "gpu-vm-07"), ("gpu-vm-04", "gpu-vm-08")]]
    assert world.loads == [] and guest_image.OPERATOR_BYTES.bytes == 0  # nothing through gpuvm's machine
    assert not any(c.command.startswith("docker save") and "| bash -c " not in c.command
               for e in world.executors.values() for c in e.calls)  # no save read by gpuvm
    assert len({tuple(i.values()) for i in world.images.values()}) == 1
    assert ("gpu-vm-01", f"image {cluster.targets['gpu-vm-01'].image.ref} copied to 7 of 7 guest(s) over "
            "the mesh in 3 round(s), 0 s") in said
    [hop] = [c for c in world.executors["gpu-vm-02"].calls if "| " in c.command and "10.0.0.4" in c.command]
    assert not hop.sudo and "sudo -n docker save gpuvm/dl:" in hop.command and "'sudo -n docker load'" in hop.command
    assert observe_and_plan(cluster) == {g: [] for g in EIGHT}


def test_a_mismatch_at_a_hop_names_both_guests_and_its_subtree_is_served(tmp_path):
    world = DockerWorld(EIGHT)
    world.load_id["gpu-vm-02"] = B  # every copy to gpu-vm-02 comes out different
    cluster = meshed(world, tmp_path)
    failures = guest_image.STEP.apply_all(Context(cluster=cluster), observe_and_plan(cluster))
    assert list(failures) == ["gpu-vm-02"]
    assert str(failures["gpu-vm-02"]).startswith(f"gpu-vm-02: guest.image: image gpuvm/dl:")
    assert f"has id {B} on gpu-vm-02, not sha256:" in str(failures["gpu-vm-02"])
    assert "as on the builder gpu-vm-01" in str(failures["gpu-vm-02"])
    assert [s for s, r in world.hops if r == "gpu-vm-02"] == ["gpu-vm-01", "gpu-vm-03"]  # tried from two guests
    assert not any(s == "gpu-vm-02" for s, _ in world.hops)  # it never sent its wrong copy on
    assert len({world.images[g][next(iter(world.images[g]))] for g in EIGHT if g != "gpu-vm-02"}) == 1


def test_a_failed_load_is_resumed_by_the_next_run(tmp_path):
    world = DockerWorld(EIGHT)
    world.fail["gpu-vm-05"] = "docker load"
    cluster = meshed(world, tmp_path)
    failures = guest_image.STEP.apply_all(Context(cluster=cluster), observe_and_plan(cluster))
    assert list(failures) == ["gpu-vm-05"] and "no space left on device" in str(failures["gpu-vm-05"])
    del world.fail["gpu-vm-05"]
    world.hops.clear()
    planned = observe_and_plan(cluster)
    assert [g for g, cs in planned.items() if cs] == ["gpu-vm-05"]
    assert guest_image.STEP.apply_all(Context(cluster=cluster), {g: cs for g, cs in planned.items() if cs}) == {}
    assert world.hops == [("gpu-vm-01", "gpu-vm-05")]


def test_a_builder_without_a_working_mesh_key_sends_one_copy_through_gpuvm(tmp_path):
    world = DockerWorld(EIGHT)
    world.fail["gpu-vm-01"] = "mesh"
    cluster = meshed(world, tmp_path)
    guest_image.OPERATOR_BYTES.reset()
    assert guest_image.STEP.apply_all(Context(cluster=cluster), observe_and_plan(cluster)) == {}
    assert world.loads == ["gpu-vm-02"]  # the one copy, through gpuvm's machine
    size = len(json.dumps({"ref": cluster.targets['gpu-vm-01'].image.ref, "id": world.images["gpu-vm-01"][
        cluster.targets['gpu-vm-01'].image.ref]}))
    assert guest_image.OPERATOR_BYTES.bytes == 2 * size  # in from the builder, out to gpu-vm-02
    assert {r for s, r in world.hops if s != "gpu-vm-01"} == set(EIGHT[2:])


def test_before_the_mesh_has_a_key_the_image_goes_through_gpuvm(tmp_path):
    """A mesh in the runbook whose key was never made (guest.ssh_mesh did not run: left out with --target,
    say): the guests cannot log in to each other."""
    world = DockerWorld(EIGHT)
    cluster = world.cluster(runbook(tmp_path, guests=EIGHT, mesh=True), tmp_path)
    guest_image.OPERATOR_BYTES.reset()
    assert guest_image.STEP.apply_all(Context(cluster=cluster), observe_and_plan(cluster)) == {}
    assert world.hops == [] and sorted(world.loads) == EIGHT[1:]
    assert guest_image.OPERATOR_BYTES.bytes > 0


def test_a_guest_the_mesh_does_not_reach_gets_it_through_gpuvm(tmp_path):
    world = DockerWorld(EIGHT)
    cluster = meshed(world, tmp_path)
    world.unreachable.add("gpu-vm-07")  # nobody can log in to it (its authorized_keys lacks the mesh key)
    guest_image.OPERATOR_BYTES.reset()
    said: list[tuple[str, str]] = []
    assert guest_image.STEP.apply_all(Context(cluster=cluster, say=lambda t, s: said.append((t, s))),
                               observe_and_plan(cluster)) == {}
    assert world.loads == ["gpu-vm-07"] and guest_image.OPERATOR_BYTES.bytes > 0
    assert len([h for h in world.hops if h[1] == "gpu-vm-07"]) == 2  # tried from two guests first
    assert ("gpu-vm-01", f"image {cluster.targets['gpu-vm-01'].image.ref}: through gpuvm's machine to "
            "gpu-vm-07, which the mesh does not reach") in said
    assert observe_and_plan(cluster) == {g: [] for g in EIGHT}


# -- a builder that does not answer -------------------------------------------------------------

def silent_builder(world: DockerWorld) -> None:
    def silent(call):
        raise ConnectError("gpu-vm-01: cannot connect to 10.0.0.1:22: timed out")
    world.executors["gpu-vm-01"].responses = {re.compile("."): silent}


def test_a_silent_builder_leaves_the_guests_that_do_not_compare_with_it_observed_and_planned(tmp_path):
    world = DockerWorld()
    cluster = world.cluster(rb := runbook(tmp_path), tmp_path)
    ref = recipes.image_ref(rb.guests.image)
    world.images["gpu-vm-02"][ref] = A  # has the recipe's tag: its id is compared with the builder's
    silent_builder(world)
    facts, down = engine.observe_reachable(cluster)
    assert list(down) == ["gpu-vm-01"]  # the builder alone is not observed; every step of the others is
    assert {t for (s, t) in facts if s == "guest.docker"} == {"gpu-vm-02", "gpu-vm-03", "gpu-vm-04"}
    assert facts[("guest.image", "gpu-vm-03")] == fact(None, None)  # no image: a copy, whatever the builder has
    [copy] = guest_image.plan(cluster.targets["gpu-vm-03"], facts[("guest.image", "gpu-vm-03")])
    assert (copy.field, copy.before, copy.after, copy.action.how) == ("present", None, "copied from gpu-vm-01", "copy")
    [check] = guest_image.plan(cluster.targets["gpu-vm-02"], facts[("guest.image", "gpu-vm-02")])
    assert (check.field, check.before, check.action.how, check.action.only_if_missing) == ("id", A, "copy", True)
    assert check.after == ("the builder gpu-vm-01's, compared at apply: it did not answer "
                           "(gpu-vm-01: cannot connect to 10.0.0.1:22: timed out)")


def test_a_guest_with_the_image_is_not_sent_it_again_once_the_silent_builder_answers_with_the_same_id(tmp_path):
    world = DockerWorld()
    cluster = world.cluster(rb := runbook(tmp_path), tmp_path)
    ref = recipes.image_ref(rb.guests.image)
    world.images["gpu-vm-02"][ref] = world.images["gpu-vm-03"][ref] = A
    answers = world.executors["gpu-vm-01"].responses
    silent_builder(world)
    planned = {g: guest_image.plan(cluster.targets[g], guest_image.observe(Context(cluster=cluster), cluster.targets[g]))
               for g in GUESTS[1:]}
    world.executors["gpu-vm-01"].responses = answers  # back by apply
    world.images["gpu-vm-01"][ref] = A
    assert guest_image.STEP.apply_all(Context(cluster=cluster), planned) == {}
    assert world.loads == ["gpu-vm-04"] and world.images["gpu-vm-04"][ref] == A  # the one without the image


def test_a_builder_still_silent_at_apply_fails_the_copies_and_the_pulls_go_on(tmp_path):
    world = DockerWorld()
    cluster = world.cluster(rb := runbook(tmp_path), tmp_path)
    world.images["gpu-vm-02"][recipes.image_ref(rb.guests.image)] = A
    silent_builder(world)
    planned = {g: guest_image.plan(cluster.targets[g], guest_image.observe(Context(cluster=cluster), cluster.targets[g]))
               for g in GUESTS[1:]}
    failures = guest_image.STEP.apply_all(Context(cluster=cluster), planned)
    assert sorted(failures) == GUESTS[1:] and world.loads == []
    assert all("gpu-vm-01: cannot connect" in str(e) for e in failures.values())


def test_the_tree_and_the_rounds_share_one_build_timeout(tmp_path, mocker):
    """The tree took 10000 s of the copies' 10800 (`build_timeout`): the rounds' hops get what is left, not a
    build_timeout each; a receiver whose hop then failed is not tried again once the time is spent."""
    from gpuvm import image_fanout
    world = DockerWorld(EIGHT)
    world.fail["gpu-vm-07"] = "docker load"
    cluster = meshed(world, tmp_path)
    clock = [0.0]
    mocker.patch.object(guest_image, "monotonic", lambda: clock[0])
    mocker.patch.object(image_fanout, "monotonic", lambda: clock[0])
    answer = world.executors["gpu-vm-01"].responses
    tree = next(k for k in answer if isinstance(k, re.Pattern) and "bash -c" in k.pattern)

    def slow_half(call):  # the left half got it, 10000 s after the start
        for guest in EIGHT[1:5]:
            world.images[guest][call.command.split()[2]] = world.images["gpu-vm-01"][call.command.split()[2]]
        clock[0] += 10000
        return ok("")

    def late(respond):  # the hops of the first round end past the deadline
        def hop(call):
            result = respond(call)
            clock[0] = 11000
            return result
        return hop

    answer[tree] = slow_half
    for executor in world.executors.values():
        key = next(k for k in executor.responses if isinstance(k, re.Pattern) and " -p " in k.pattern)
        executor.responses[key] = late(executor.responses[key])
    planned = observe_and_plan(cluster)
    failures = guest_image.STEP.apply_all(Context(cluster=cluster), planned)
    hops = [c for e in world.executors.values() for c in e.calls if "'sudo -n docker load'" in c.command]
    assert len(hops) == 3 and all(0 < c.timeout <= 800 for c in hops)  # gpu-vm-06, -07 and -08 in one round
    [tree_call] = [c for c in world.executors["gpu-vm-01"].calls if c.command.startswith("docker save ")]
    assert tree_call.timeout == 10800
    assert list(failures) == ["gpu-vm-07"]
    assert str(failures["gpu-vm-07"]).endswith("docker load failed (exit 1): no space left on device; "
                                               "no time was left to try again")


def test_the_runbooks_stall_timeout_bounds_the_tree_and_the_hops(tmp_path):
    world = DockerWorld(EIGHT)
    world.unreachable.add("gpu-vm-06")  # its subtree goes round by round
    cluster_key(tmp_path)
    cluster = world.cluster(runbook(tmp_path, "{stall_timeout: 7.5}", guests=EIGHT, mesh=True), tmp_path)
    guest_image.STEP.apply_all(Context(cluster=cluster), observe_and_plan(cluster))
    [tree] = [c for c in world.executors["gpu-vm-01"].calls if c.command.startswith("docker save ")
              and "| bash" in c.command]
    assert tree.command.split()[-9:-7] == ["8", str(4 << 20)]  # whole seconds, and the chunk
    hops = [c for e in world.executors.values() for c in e.calls if "'sudo -n docker load'" in c.command]
    assert hops and all(' "$t/peer" $peer 8 &' in c.command for c in hops)
