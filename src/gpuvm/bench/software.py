"""The software versions a campaign ran with, as each machine taking part reports them.

Best effort: a tool that is missing or fails is left out; the first line of its answer is kept,
secrets masked. Containerised campaigns also record the image's name and id.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from gpuvm.errors import GpuvmError
from gpuvm.executors.base import Executor
from gpuvm.executors.group import at_once, run_group
from gpuvm.secrets import redact
from gpuvm.untrusted import printable

PROBES: list[tuple[str, list[str]]] = [
    ("mpirun", ["mpirun", "--version"]),
    ("nvidia_driver", ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"]),
    ("python", ["python3", "--version"]),
]


def software_versions(executors: Mapping[str, Executor], targets: Sequence[str],
                      image: Any = None) -> dict[str, dict[str, str]]:
    """Versions per target, probed on all targets at once; `image`: the training image, if any."""

    def versions(target: str) -> dict[str, str]:
        executor, found = executors[target], {}
        probes = list(PROBES)
        if image is not None:
            from gpuvm.image import image_ref

            reference = image_ref(image)
            probes.append(("image", ["docker", "image", "inspect", "--format", "{{.Id}}", reference]))
            found["image_name"] = reference
        for key, argv in probes:
            try:
                result = executor.run(argv, timeout=30, check=False)
            except GpuvmError:
                continue
            text = (result.stdout.strip() or result.stderr.strip()).splitlines()
            if result.exit_code == 0 and text:
                found[key] = printable(redact(text[0].strip())[:200])  # a guest's text, into the report
        return found

    return run_group({t: t for t in targets}, versions, at_once(targets), name="versions").raise_first()
