"""guest.docker, then guest.image, on a cluster of bed guests: what the engine does with a runbook that
has an image and no SSH mesh (the mesh runs between them, and is not in these runbooks)."""

from __future__ import annotations

from gpuvm.plan import Change
from gpuvm.steps import guest_docker, guest_image
from gpuvm.steps.base import Context

STEPS = (guest_docker.STEP, guest_image.STEP)


def plan_both(cluster) -> dict[str, list[Change]]:
    """Every guest observed and planned for both steps (a dry run: nothing is changed)."""
    ctx = Context(cluster=cluster)
    return {n: [c for step in STEPS for c in step.plan(t, step.observe(ctx, t))] for n, t in cluster.targets.items()}


def apply_both(cluster, planned: dict[str, list[Change]]) -> dict[str, Exception]:
    """guest.docker on each guest, then guest.image on those it did not fail on; failures by guest."""
    ctx, failures = Context(cluster=cluster), {}
    for name, changes in planned.items():
        if docker := [c for c in changes if c.step == guest_docker.NAME]:
            try:
                guest_docker.STEP.apply(ctx, cluster.targets[name], docker)
            except Exception as e:  # noqa: BLE001 - the engine's run_group records it the same way
                failures[name] = e
    images = {n: [c for c in cs if c.step == guest_image.NAME] for n, cs in planned.items() if n not in failures}
    return failures | guest_image.STEP.apply_all(ctx, images)
