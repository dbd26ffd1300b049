"""A first apply on guests that have no mesh yet (issue 27): the guest steps in the engine's order,
applied by the engine's own step runner, on four bed guests with real dockerds. The image goes
guest to guest over the mesh that the same apply set up: no image byte through gpuvm's machine.
A guest that an earlier step failed on is skipped by the engine; the others still get their mesh
and the image, and a rerun once it is fine converges it."""

from __future__ import annotations

import shutil

import pytest

from fanout import small_image, start_docker, stop_docker, write_runbook
from gpuvm.desired import Desired
from gpuvm.engine import STEPS, Outcome, _facts_of, _StepRun, observe_remote, plan_step
from gpuvm.image import image_ref
from gpuvm.image_fanout import OPERATOR_BYTES
from gpuvm.journal import Journal
from gpuvm.plan import Plan
from gpuvm.remote import build_cluster
from gpuvm.runbook.loader import load_runbook
from gpuvm.steps.base import Context

pytestmark = pytest.mark.integration

GUESTS = ["gpu-vm-01", "gpu-vm-02", "gpu-vm-03", "gpu-vm-04"]
IMAGE_BYTES = 2 << 20


@pytest.fixture
def four(testbed):
    if shutil.which("dockerd") is None:
        pytest.fail("the image tests need Docker: apt-get install -y docker.io")
    start_docker(testbed, GUESTS)
    try:
        yield GUESTS
    finally:
        stop_docker(testbed, GUESTS)


def apply_guest_steps(cluster, state, failed_before: set[str] = frozenset(), progress=None) -> tuple[Plan, Outcome]:
    """Every guest step from guest.docker on: observed and planned first (as `gpuvm apply` plans),
    then applied step by step by the engine, targets that failed before skipped."""
    steps = [s for s in STEPS if s.role == "guest"]
    steps = steps[[s.name for s in steps].index("guest.docker"):]
    ctx, desired = Context(cluster=cluster), Desired(hosts={}, vms={})
    facts = _facts_of(observe_remote(cluster, "guest").raise_failures())
    plan = Plan(changes=[c for step in steps for c in plan_step(step, ctx, desired, facts)])
    outcome = Outcome()
    run = _StepRun(plan, desired, ctx, Journal(state), 8, progress, outcome, {})
    run.failed_targets |= set(failed_before)
    for step in steps:
        run.step(step)
    return plan, outcome


def image_ids(testbed, ref: str) -> dict[str, str]:
    return {n: testbed.docker(n, "image", "inspect", "--format", "{{.Id}}", ref, check=False).stdout.strip()
            for n in GUESTS}


def test_a_first_apply_ships_the_image_over_the_mesh_it_sets_up_even_with_a_guest_held_back(testbed, four, tmp_path):
    book = load_runbook(write_runbook(testbed, four, tmp_path / "runbook.yaml"))
    ref = image_ref(book.guests.image)
    for guest in four:  # no image from an earlier test
        testbed.docker(guest, "image", "rm", "-f", ref, check=False)
    want = small_image(testbed, four[0], ref, IMAGE_BYTES)  # as if the builder had built it
    (state := tmp_path / "state").mkdir()  # no mesh key yet: a first apply
    cluster = build_cluster(book, state)
    held = "gpu-vm-03"
    OPERATOR_BYTES.reset()
    try:
        plan, outcome = apply_guest_steps(cluster, state, failed_before={held})  # say its guest.driver failed
        assert {c.target for c in plan.changes if c.step == "guest.ssh_mesh"} == set(four)
        # it has no mesh files: nobody logs in to it. That is its failure, not the three others'
        assert list(outcome.failed) == [f"{held} (guest.ssh_mesh)"], outcome.failed
        message = str(outcome.failed[f"{held} (guest.ssh_mesh)"])
        assert "cannot log in with the mesh key" in message and all(n in message for n in four), message
        assert set(outcome.skipped) == {f"{held} (guest.ssh_mesh)", f"{held} (guest.image)"}, outcome.skipped
        assert OPERATOR_BYTES.bytes == 0  # the three others got it guest to guest, over the new mesh
        assert image_ids(testbed, ref) == {n: want if n != held else "" for n in four}

        _, rerun = apply_guest_steps(cluster, state)  # it is fine now: the rerun converges it
        assert rerun.failed == {} and rerun.skipped == {}, (rerun.failed, rerun.skipped)
        assert [c.target for c in rerun.done.get(held, []) if c.step == "guest.image"] == [held]
        assert apply_guest_steps(cluster, state)[0].changes == []
    finally:
        cluster.close()
    assert OPERATOR_BYTES.bytes == 0
    assert image_ids(testbed, ref) == {n: want for n in four}
