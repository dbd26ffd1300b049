"""guest.docker and guest.image against the SSH test bed: plan, build once, ship, re-plan empty, dry run
touches nothing."""

from __future__ import annotations

import re

import pytest

from gpuvm.steps.base import Context
from gpuvm.executors import SshExecutor
from gpuvm.remote import build_cluster
from gpuvm.runbook.loader import load_runbook
from gpuvm.steps import guest_image
from tests.integration.image_steps import apply_both, plan_both

pytestmark = pytest.mark.integration

GUESTS = ["gpu-vm-01", "gpu-vm-02", "gpu-vm-03", "gpu-vm-04"]


class Recording:
    """An executor that notes every command line before passing it on."""

    def __init__(self, inner):
        self.inner, self.name, self.lines = inner, inner.name, []

    def run(self, argv, **kwargs):
        self.lines.append(" ".join(argv))
        return self.inner.run(argv, **kwargs)

    def run_script(self, script, **kwargs):
        self.lines.append(script)
        return self.inner.run_script(script, **kwargs)

    def put(self, *args, **kwargs):
        return self.inner.put(*args, **kwargs)

    def get(self, path):
        return self.inner.get(path)

    def close(self):
        self.inner.close()


@pytest.fixture
def cluster(testbed, tmp_path):
    for guest in GUESTS:  # every test starts from guests without images
        state = testbed.state(guest)["docker"]
        testbed.set_state(guest, "docker", {**state, "images": {}})
    text = f"ssh: {{known_hosts: {testbed.known_hosts_file}}}\nhosts: [{{name: esx-01}}]\nvms:\n"
    text += "".join(f"  - {{name: {g}, host: esx-01}}\n" for g in GUESTS)
    text += "guests:\n  image: {name: gpuvm/horovod, horovod: 0.28.1}\n  hosts:\n"
    for g in GUESTS:
        host = testbed.host(g)
        text += (f"    - {{vm: {g}, ssh: {{address: {host.address}, user: {host.user}, "
                 f"key_file: {host.key_file}, sudo: true}}}}\n")
    (tmp_path / "runbook.yaml").write_text(text)
    (tmp_path / "state").mkdir()
    c = build_cluster(load_runbook(tmp_path / "runbook.yaml"), tmp_path / "state")
    for name, executor in list(c.executors.items()):
        c.executors[name] = Recording(executor)
    yield c
    c.close()


def plain(testbed, name) -> SshExecutor:
    host = testbed.host(name)
    return SshExecutor(name, host.address, host.user, key_file=host.key_file, known_hosts=[testbed.known_hosts_file])


def observe_and_plan(cluster):
    assert all(guest_image.STEP.wanted(t) for t in cluster.targets.values())
    return plan_both(cluster)


def docker_state(testbed):
    return {g: testbed.state(g)["docker"] for g in GUESTS}


def test_plan_build_ship_replan(testbed, cluster):
    ref = cluster.targets["gpu-vm-01"].image.ref  # the recipe resolve_ssh rendered
    assert re.fullmatch(r"gpuvm/horovod:[0-9a-f]{12}", ref)
    before = docker_state(testbed)

    planned = observe_and_plan(cluster)  # a dry run: observe and plan only
    assert {g: [(c.resource, c.field, c.before, c.after) for c in cs] for g, cs in planned.items()} == {
        "gpu-vm-01": [(f"image {ref}", "present", None, "built on gpu-vm-01")],
        **{g: [(f"image {ref}", "present", None, "copied from gpu-vm-01")] for g in GUESTS[1:]},
    }
    assert docker_state(testbed) == before
    for executor in cluster.executors.values():  # observing only reads
        assert all(re.match(r"docker (version|info|image inspect) ", line) for line in executor.lines)
        executor.lines.clear()

    assert apply_both(cluster, planned) == {}
    lines = {g: cluster.executors[g].lines for g in GUESTS}
    assert [g for g in GUESTS for line in lines[g] if line.startswith("docker build")] == ["gpu-vm-01"]
    assert sum(line.startswith("docker save") for line in lines["gpu-vm-01"]) == 1
    assert all(lines[g].count("docker load") == 1 for g in GUESTS[1:])

    ids = set()
    for g in GUESTS:  # read back over a plain SSH connection
        ex = plain(testbed, g)
        ids.add(ex.run(["docker", "image", "inspect", "--format", "{{.Id}}", ref]).stdout.strip())
        ex.close()
    assert len(ids) == 1 and re.fullmatch(r"sha256:[0-9a-f]{64}", ids.pop())

    for executor in cluster.executors.values():
        executor.lines.clear()
    replanned = observe_and_plan(cluster)
    assert replanned == {g: [] for g in GUESTS}
    assert apply_both(cluster, {g: cs for g, cs in replanned.items() if cs}) == {}
    assert not any(line.startswith(("docker build", "docker save", "docker load"))
                   for executor in cluster.executors.values() for line in executor.lines)


def test_one_guest_lost_its_image(testbed, cluster):
    assert apply_both(cluster, observe_and_plan(cluster)) == {}
    ref = cluster.targets["gpu-vm-01"].image.ref
    state = testbed.state("gpu-vm-03")["docker"]
    testbed.set_state("gpu-vm-03", "docker", {**state, "images": {}})
    planned = observe_and_plan(cluster)
    assert [(g, c.after) for g, cs in planned.items() for c in cs] == [("gpu-vm-03", "copied from gpu-vm-01")]
    # the per-target apply fetches from the builder on its own
    guest_image.STEP.apply(Context(cluster=cluster), cluster.targets["gpu-vm-03"], planned["gpu-vm-03"])
    assert observe_and_plan(cluster) == {g: [] for g in GUESTS}
    assert testbed.state("gpu-vm-03")["docker"]["images"][ref] == testbed.state("gpu-vm-01")["docker"]["images"][ref]


def test_a_guest_without_the_nvidia_runtime(testbed, cluster):
    state = testbed.state("gpu-vm-02")["docker"]
    testbed.set_state("gpu-vm-02", "docker", {**state, "runtimes": {"runc": "runc"}})
    try:
        planned = observe_and_plan(cluster)
    finally:
        testbed.set_state("gpu-vm-02", "docker", state)
    runtime = [(g, c.resource, c.after) for g, cs in planned.items() for c in cs if c.resource.startswith("docker runtime")]
    assert runtime == [("gpu-vm-02", "docker runtime nvidia", "nvidia-container-toolkit")]
