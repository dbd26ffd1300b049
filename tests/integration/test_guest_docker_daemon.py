"""guest.docker and guest.image on guests logged in as a non-root user without `sudo: true` (what needs root goes
through sudo anyway), and a guest whose Docker daemon is stopped: the plan starts the daemon and
does not rebuild or re-copy an image that is there."""

from __future__ import annotations

import pytest

from gpuvm.remote import build_cluster
from gpuvm.runbook.loader import load_runbook
from tests.integration.image_steps import apply_both, plan_both

pytestmark = pytest.mark.integration

GUESTS = ["gpu-vm-01", "gpu-vm-02"]


@pytest.fixture
def cluster(testbed, tmp_path):
    saved = {g: testbed.state(g)["docker"] for g in GUESTS}
    for guest in GUESTS:
        testbed.set_state(guest, "docker", {**saved[guest], "images": {}, "running": True})
    text = f"ssh: {{known_hosts: {testbed.known_hosts_file}}}\nhosts: [{{name: esx-01}}]\nvms:\n"
    text += "".join(f"  - {{name: {g}, host: esx-01}}\n" for g in GUESTS)
    text += "guests:\n  image: {name: gpuvm/horovod, horovod: 0.28.1}\n  hosts:\n"
    for g in GUESTS:
        host = testbed.host(g)
        text += f"    - {{vm: {g}, ssh: {{address: {host.address}, user: {host.user}, key_file: {host.key_file}}}}}\n"
    (tmp_path / "runbook.yaml").write_text(text)
    c = build_cluster(load_runbook(tmp_path / "runbook.yaml"), tmp_path / "state")
    yield c
    c.close()
    for guest in GUESTS:
        testbed.set_state(guest, "docker", saved[guest])


plan_all = plan_both


def test_a_stopped_daemon_is_started_by_a_non_root_login_without_rebuilding(testbed, cluster):
    assert all(t.login.user != "root" and not t.login.sudo for t in cluster.targets.values())
    assert apply_both(cluster, plan_all(cluster)) == {}
    ref = cluster.targets["gpu-vm-02"].image.ref
    built = testbed.state("gpu-vm-02")["docker"]["images"][ref]
    testbed.set_state("gpu-vm-02", "docker", {**testbed.state("gpu-vm-02")["docker"], "running": False})

    planned = plan_all(cluster)
    assert planned["gpu-vm-01"] == []
    unknown = "unknown: the docker daemon is stopped"
    assert [(c.resource, c.before, c.after) for c in planned["gpu-vm-02"]] == [
        ("service docker", "Cannot connect to the Docker daemon at unix:///var/run/docker.sock. Is the docker daemon "
                           "running?", "running"),
        ("apt source nvidia-container-toolkit", None, "deb [signed-by=/etc/apt/keyrings/nvidia-container-toolkit.asc] "
         "https://nvidia.github.io/libnvidia-container/stable/deb/$(ARCH) /, if the runtime is missing once the daemon runs"),
        ("docker runtime nvidia", unknown, "nvidia-container-toolkit, if missing once the daemon runs"),
        (f"image {ref}", unknown, "copied from gpu-vm-01, if missing once the daemon runs")]

    lines = record(cluster.executors["gpu-vm-02"])
    assert apply_both(cluster, planned) == {}
    after = testbed.state("gpu-vm-02")["docker"]
    assert after["running"] is True and after["images"][ref] == built
    assert lines[0] == "sudo -n systemctl enable --now docker"  # root's, through sudo
    assert not [line for line in lines if line.startswith(("docker load", "docker build", "nvidia-ctk"))], lines
    assert plan_all(cluster) == {g: [] for g in GUESTS}


def record(executor) -> list[str]:
    """The command lines the executor runs from now on (sudo prefix included)."""
    lines: list[str] = []
    inner = executor._run

    def run(line, **kwargs):
        lines.append(line)
        return inner(line, **kwargs)

    executor._run = run
    return lines
