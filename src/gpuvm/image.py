"""The training image's recipe: the Dockerfile rendered from `templates/Dockerfile.j2`, and its tag.

The tag is the first 12 hex digits of the recipe's sha256, so "does this guest have the right
image?" is one `docker image inspect` and never a build. Used by the `guest.image` step (which
builds and ships the image) and by benchmark campaigns (which run it).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from functools import lru_cache

from gpuvm.errors import InputError
from gpuvm.runbook.guests import Image
from gpuvm.ssh_keys import MESH_IDENTITY
from gpuvm.templating import environment

HOST_KEYS_DIR = "/etc/ssh/vm"  # where containers see the VM's /etc/ssh (read-only): sshd's host keys
MESH_DIR = "/etc/gpuvm/mesh"  # where containers see the mesh user's ~/.ssh (read-only), copied to /root/.ssh


@dataclass(frozen=True)
class ScriptSource:
    """Benchmark scripts `image.scripts` can fetch at build time, and the program a run uses there."""

    what: str
    repo: str
    dir: str
    programs: dict[str, str]  # benchmark variant → path in the image


SCRIPT_SOURCES = {
    "tf_cnn_benchmarks": ScriptSource(
        "tf_cnn_benchmarks (tensorflow/benchmarks)", "https://github.com/tensorflow/benchmarks.git",
        "/opt/gpuvm/benchmarks",
        {"tf_cnn_benchmarks": "/opt/gpuvm/benchmarks/scripts/tf_cnn_benchmarks/tf_cnn_benchmarks.py"}),
    "horovod_examples": ScriptSource(
        "Horovod's examples", "https://github.com/horovod/horovod.git", "/opt/gpuvm/horovod",
        {"horovod_synthetic/tensorflow": "/opt/gpuvm/horovod/examples/tensorflow2/tensorflow2_synthetic_benchmark.py",
         "horovod_synthetic/pytorch": "/opt/gpuvm/horovod/examples/pytorch/pytorch_synthetic_benchmark.py"}),
}


@dataclass(frozen=True)
class Recipe:
    dockerfile: str  # the rendered text, label line included
    digest: str  # sha256 of the text without the label line
    ref: str  # name:tag, tag = digest[:12]


def render_dockerfile(image: Image, template: str | None = None) -> str:
    """The Dockerfile without its label line; StrictUndefined: a missing value is an error."""
    from jinja2 import StrictUndefined, UndefinedError

    env = environment(undefined=StrictUndefined, trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True)
    compiled = env.from_string(template) if template is not None else env.get_template("Dockerfile.j2")
    values = image.model_dump()
    scripts = [{"what": source.what, "repo": source.repo, "dir": source.dir, "ref": ref,
                "program": ", ".join(source.programs.values())}
               for key, source in SCRIPT_SOURCES.items() if (ref := getattr(image.scripts, key))]
    values.update(
        openmpi_series=".".join(image.openmpi.split(".")[:2]), host_keys_dir=HOST_KEYS_DIR, scripts=scripts,
        mesh_dir=MESH_DIR, mesh_identity=MESH_IDENTITY,
        framework_source={"base": "from the base image, else pip", "pip": "pip", "distro": "distribution packages"}[
            image.framework_from],
        # compilers and download tools: only for what is built or fetched in the image
        build_tools=bool(image.mpi == "source" or image.horovod or image.ofed != "inbox" or scripts
                         or image.framework_from == "pip"),
    )
    try:
        return compiled.render(values)
    except UndefinedError as e:
        raise InputError(f"guest.image: Dockerfile template: {e.message}") from None


@lru_cache(maxsize=8)
def recipe(image: Image) -> Recipe:
    body = render_dockerfile(image)
    digest = hashlib.sha256(body.encode()).hexdigest()
    return Recipe(body.rstrip("\n") + f"\nLABEL org.gpuvm.recipe={digest}\n", digest, f"{image.name}:{digest[:12]}")


def image_ref(image: Image) -> str:
    """The local name:tag of the training image (what `docker run` uses on every guest)."""
    return recipe(image).ref


def image_programs(image: Image) -> dict[str, str]:
    """The benchmark programs the image fetched at build time: variant → path in the image."""
    return {variant: path for key, source in SCRIPT_SOURCES.items() if getattr(image.scripts, key)
            for variant, path in source.programs.items()}


def container_run_args(image: Image, rdma: bool = True) -> list[str]:
    """The `docker run` words a training container needs: host network, RDMA, GPUs (unless the image
    says `gpus: false`), the VM's host keys. `rdma`: pass /dev/infiniband (guests with RDMA ports)."""
    return (["--network=host", "--ipc=host", "--cap-add=IPC_LOCK"]
            + (["--device=/dev/infiniband"] if rdma else [])
            + (["--gpus", "all"] if image.gpus else [])
            + ["-v", f"/etc/ssh:{HOST_KEYS_DIR}:ro"])
