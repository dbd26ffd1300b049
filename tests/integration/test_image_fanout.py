"""The image over the mesh for real: eight bed guests with real dockerds, the mesh set up by
guest.ssh_mesh, a small image on the builder; guest.image sends it down the pipelined tree (every
guest loads and passes on), one guest's `docker load` failing: it is retried round by round
(`docker save | ssh peer docker load` from two other guests), then a re-run finishes."""

from __future__ import annotations

import re
import shutil
import time

import pytest

from fanout import add_guests, small_image, start_docker, stop_docker, write_runbook
from gpuvm.executors.group import run_group
from gpuvm.image import image_ref
from gpuvm.image_fanout import OPERATOR_BYTES
from gpuvm.remote import build_cluster
from gpuvm.runbook.loader import load_runbook
from gpuvm.steps import guest_image, guest_ssh_mesh
from gpuvm.steps.base import Context

pytestmark = pytest.mark.integration

IMAGE_BYTES = 8 << 20
BROKEN = "fan-02"  # a leaf of the tree: its load fails on every try of the first run


class Counting:
    """An executor that counts the bytes gpuvm's process sends and receives through it."""

    def __init__(self, inner, tally: list[int]):
        self.inner, self.name, self.tally = inner, inner.name, tally

    def run(self, argv, **kwargs):
        return self._counted(self.inner.run(argv, **kwargs), kwargs)

    def run_script(self, script, **kwargs):
        self.tally[0] += len(script)
        return self._counted(self.inner.run_script(script, **kwargs), kwargs)

    def _counted(self, result, kwargs):
        self.tally[0] += len(kwargs.get("stdin") or b"") + len(result.stdout) + len(result.stderr)
        return result

    def __getattr__(self, name):
        return getattr(self.inner, name)


@pytest.fixture
def eight(testbed, tmp_path):
    if shutil.which("dockerd") is None:
        pytest.fail("the fan-out test needs Docker: apt-get install -y docker.io")
    names, added = add_guests(testbed, 8)
    try:
        start_docker(testbed, names)
        yield names
    finally:
        stop_docker(testbed, names)
        for name in added:
            testbed.remove(name)


def plan(cluster, step):
    """Every guest observed at once (as the engine does), then planned."""
    ctx = Context(cluster=cluster)
    facts = run_group(cluster.targets, lambda t: step.observe(ctx, t), 8).raise_failures()
    return {n: step.plan(cluster.targets[n], fact) for n, fact in facts.items()}


def test_tree_ship_to_eight_guests_with_a_failing_hop_resumed_by_a_rerun(testbed, eight, tmp_path):
    book = load_runbook(write_runbook(testbed, eight, tmp_path / "runbook.yaml"))
    ref = image_ref(book.guests.image)
    want = small_image(testbed, eight[0], ref, IMAGE_BYTES)
    (tmp_path / "state").mkdir()
    cluster = build_cluster(book, tmp_path / "state")
    tally = [0]
    try:
        assert guest_ssh_mesh.apply_all(Context(cluster=cluster), plan(cluster, guest_ssh_mesh)) == {}
        state = testbed.state(BROKEN)["docker"]
        testbed.set_state(BROKEN, "docker", {**state, "fail": {"load": "write /var/lib/docker/tmp: no space left on device"}})
        planned = plan(cluster, guest_image)
        assert [n for n, cs in planned.items() if cs] == eight[1:]  # the builder has it already
        for name, executor in list(cluster.executors.items()):
            cluster.executors[name] = Counting(executor, tally)
        OPERATOR_BYTES.reset()
        said: list[tuple[str, str]] = []
        failures = guest_image.apply_all(Context(cluster=cluster, say=lambda t, s: said.append((t, s))), planned)

        # BROKEN's load failed in the tree (the guests under it got the image all the same), then from two senders
        assert list(failures) == [BROKEN], failures
        message = str(failures[BROKEN])
        assert re.match(rf"{BROKEN}: guest.image: image {re.escape(ref)} from (gpu-vm|fan)-\d\d: docker load failed "
                        r"\(exit 1\): write /var/lib/docker/tmp: no space left on device$", message), message
        copies = [(t, s) for t, s in said if " over the mesh in " in s and "copied from" in s]
        assert sorted(t for t, _ in copies) == sorted(n for n in eight[1:] if n != BROKEN)
        assert any(re.fullmatch(rf"image {re.escape(ref)} down a pipelined tree of 3 level\(s\) to 6 of 7 guest\(s\) "
                                r"in \d+ s", s) for t, s in said if t == eight[0]), said
        assert any(re.fullmatch(rf"image {re.escape(ref)} copied to 6 of 7 guest\(s\) over the mesh in a pipelined "
                                r"tree and 2 round\(s\), \d+ s", s) for t, s in said if t == eight[0]), said
        testbed.set_state(BROKEN, "docker", state)  # the disk has room again

        replanned = plan(cluster, guest_image)
        assert [n for n, cs in replanned.items() if cs] == [BROKEN]  # the others are skipped
        assert guest_image.apply_all(Context(cluster=cluster), {BROKEN: replanned[BROKEN]}) == {}
        assert plan(cluster, guest_image) == {n: [] for n in eight}
    finally:
        cluster.close()

    assert OPERATOR_BYTES.bytes == 0  # gpuvm's own count: no image byte through this machine
    assert tally[0] < IMAGE_BYTES // 16, tally  # and all gpuvm's SSH traffic together is far below one image
    ids = {n: testbed.docker(n, "image", "inspect", "--format", "{{.Id}}", ref).stdout.strip() for n in eight}
    assert ids == {n: want for n in eight}


def test_a_guest_whose_load_stops_reading_is_cut_off_and_its_subtree_served(testbed, eight, tmp_path):
    """The builder's left child (over three guests) has a `docker load` that reads nothing for 300 s;
    with a 2 s stall it is cut off in the tree, its subtree still gets the stream, and its own tries
    round by round are cut off too: the apply ends in seconds, not at the load's 300 s."""
    path = write_runbook(testbed, eight, tmp_path / "runbook.yaml")
    path.write_text(path.read_text().replace("gpus: false}", "gpus: false, stall_timeout: 2}"))
    book = load_runbook(path)
    ref = image_ref(book.guests.image)
    want = small_image(testbed, eight[0], ref, IMAGE_BYTES)
    (tmp_path / "state").mkdir()
    cluster = build_cluster(book, tmp_path / "state")
    stuck = eight[1]
    try:
        assert guest_ssh_mesh.apply_all(Context(cluster=cluster), plan(cluster, guest_ssh_mesh)) == {}
        state = testbed.state(stuck)["docker"]
        testbed.set_state(stuck, "docker", {**state, "stall": {"load": 300}})
        started = time.monotonic()
        failures = guest_image.apply_all(Context(cluster=cluster), plan(cluster, guest_image))
        took = time.monotonic() - started
        testbed.set_state(stuck, "docker", state)
    finally:
        cluster.close()
    assert list(failures) == [stuck], failures
    assert str(failures[stuck]).endswith("docker load took no bytes for 2 s: cut off"), failures
    assert took < 120, took  # the stalled load alone would hold it 300 s
    others = [n for n in eight if n != stuck]
    ids = {n: testbed.docker(n, "image", "inspect", "--format", "{{.Id}}", ref).stdout.strip() for n in others}
    assert ids == {n: want for n in others}
