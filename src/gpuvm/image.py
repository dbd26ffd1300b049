"""The training image's recipe: the Dockerfile rendered from `templates/Dockerfile.j2`, and its tag.

The tag is the first 12 hex digits of the recipe's sha256, so "does this guest have the right
image?" is one `docker image inspect` and never a build. Used by the `guest.docker` step (which
builds and ships the image) and by benchmark campaigns (which run it).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from functools import lru_cache

from gpuvm.errors import InputError
from gpuvm.runbook.model import Image
from gpuvm.templating import environment

HOST_KEYS_DIR = "/etc/ssh/vm"  # where containers see the VM's /etc/ssh (read-only): sshd's host keys


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
    values.update(openmpi_series=".".join(image.openmpi.split(".")[:2]), host_keys_dir=HOST_KEYS_DIR)
    try:
        return compiled.render(values)
    except UndefinedError as e:
        raise InputError(f"guest.docker: Dockerfile template: {e.message}") from None


@lru_cache(maxsize=8)
def recipe(image: Image) -> Recipe:
    body = render_dockerfile(image)
    digest = hashlib.sha256(body.encode()).hexdigest()
    return Recipe(body.rstrip("\n") + f"\nLABEL org.gpuvm.recipe={digest}\n", digest, f"{image.name}:{digest[:12]}")


def image_ref(image: Image) -> str:
    """The local name:tag of the training image (what `docker run` uses on every guest)."""
    return recipe(image).ref


def container_run_args(image: Image) -> list[str]:
    """The `docker run` words a training container needs: host network, RDMA, GPUs, the VM's host keys."""
    return ["--network=host", "--ipc=host", "--cap-add=IPC_LOCK", "--device=/dev/infiniband", "--gpus", "all",
            "-v", f"/etc/ssh:{HOST_KEYS_DIR}:ro"]
