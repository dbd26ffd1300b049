"""guest.driver against the SSH test bed: the stand-in nvidia-smi reports what the stand-in NVIDIA
installer put in place, so plan → apply → re-plan is empty for real, on two guests in parallel: one
without a driver (a fresh clone), one running an older driver that a GPU process holds at first."""

from __future__ import annotations

import hashlib

import pytest

from gpuvm.errors import RemoteCommandError, TargetFailures
from gpuvm.executors.group import run_group
from gpuvm.plan import Disruption
from gpuvm.remote import build_cluster
from gpuvm.runbook.loader import load_runbook
from gpuvm.steps import guest_driver
from gpuvm.steps.base import Context
from tests.integration.vcenter import guest_ssh
from bed import nvidia_run_package

pytestmark = pytest.mark.integration

GUESTS = ("gpu-vm-01", "gpu-vm-02")
VERSION = "535.183.01"
OLD = "470.82.01"  # what the stand-in nvidia-smi reports until an installer ran


@pytest.fixture
def bed(testbed):
    saved = {name: testbed.state(name) for name in GUESTS}
    for name in GUESTS:  # each guest's /tmp is its own: the package goes where the installer URL points
        folder = testbed.host_dir(name) / "tmp" / "drivers"
        folder.mkdir(parents=True, exist_ok=True)
        nvidia_run_package(folder / f"NVIDIA-Linux-x86_64-{VERSION}.run", VERSION)
    yield testbed
    for name, state in saved.items():
        testbed.set_state(name, "driver_version", state.get("driver_version", OLD))
        testbed.set_state(name, "gpu_processes", state.get("gpu_processes", []))


def genuine_sha256(bed) -> str:
    """The digest of the stand-in package the fixture put on the guests (the same on each)."""
    package = bed.host_dir(GUESTS[0]) / "tmp" / "drivers" / f"NVIDIA-Linux-x86_64-{VERSION}.run"
    return hashlib.sha256(package.read_bytes()).hexdigest()


def cluster_for(bed, tmp_path):
    path = tmp_path / "runbook.yaml"
    path.write_text(
        f"ssh: {{known_hosts: {bed.known_hosts_file}}}\nhosts: [{{name: esx-01}}]\n"
        "vms: [" + ", ".join(f"{{name: {g}, host: esx-01}}" for g in GUESTS) + "]\n"
        f"guests:\n  driver: {{version: '{VERSION}', installer: 'file:///tmp/drivers/NVIDIA-Linux-x86_64-{{version}}.run', "
        f"sha256: {genuine_sha256(bed)}}}\n"
        "  hosts:\n" + "".join(f"  - {{vm: {g}, ssh: {guest_ssh(bed, g)}}}\n" for g in GUESTS))
    return build_cluster(load_runbook(path), tmp_path / "state")


def test_driver_installed_and_replaced_then_nothing_to_do(bed, tmp_path):
    bed.set_state("gpu-vm-01", "driver_version", None)  # a fresh clone: no driver yet
    bed.set_state("gpu-vm-02", "gpu_processes", [4242])  # a training process holds the old driver
    cluster = cluster_for(bed, tmp_path)
    ctx = Context(cluster=cluster)
    step = guest_driver.STEP

    def plan(name):
        return step.plan(cluster.targets[name], step.observe(ctx, cluster.targets[name]))

    planned = run_group({g: g for g in GUESTS}, plan).raise_failures()
    assert [(c.before, c.after, c.disruption) for c in planned["gpu-vm-01"]] == [(None, VERSION, Disruption.NONE)]
    assert [(c.before, c.after, c.disruption) for c in planned["gpu-vm-02"]] == [(OLD, VERSION, Disruption.VM_POWER_OFF)]

    def apply(name):
        step.apply(ctx, cluster.targets[name], planned[name])

    with pytest.raises(TargetFailures) as failed:
        run_group({g: g for g in GUESTS}, apply).raise_failures()
    assert list(failed.value.failures) == ["gpu-vm-02"]
    assert "appears to already be loaded" in str(failed.value.failures["gpu-vm-02"])
    assert "stop it or reboot the VM" in str(failed.value.failures["gpu-vm-02"])
    assert bed.state("gpu-vm-01")["driver_version"] == VERSION
    assert bed.state("gpu-vm-02").get("driver_version", OLD) == OLD

    bed.set_state("gpu-vm-02", "gpu_processes", [])
    apply("gpu-vm-02")
    assert run_group({g: g for g in GUESTS}, plan).raise_failures() == {g: [] for g in GUESTS}
    for g in GUESTS:  # the downloaded package is removed
        assert not list((bed.host_dir(g) / "tmp").glob("gpuvm-install.*"))


def test_a_tampered_installer_is_never_run(bed, tmp_path):
    """The package on the guest is not the one the runbook's sha256 names: apply fails that guest
    naming both digests, and the package never ran (its side effect, a marker file, is absent)."""
    bed.set_state("gpu-vm-01", "driver_version", None)
    genuine, cluster = genuine_sha256(bed), cluster_for(bed, tmp_path)  # the runbook holds the genuine digest
    package = bed.host_dir("gpu-vm-01") / "tmp" / "drivers" / f"NVIDIA-Linux-x86_64-{VERSION}.run"
    marker = bed.host_dir("gpu-vm-01") / "tmp" / "tampered-installer-ran"
    package.write_text(f"#!/bin/sh\ntouch /tmp/{marker.name}\n" + package.read_text().split("\n", 1)[1])
    tampered = hashlib.sha256(package.read_bytes()).hexdigest()
    ctx, target = Context(cluster=cluster), cluster.targets["gpu-vm-01"]
    changes = guest_driver.STEP.plan(target, guest_driver.STEP.observe(ctx, target))
    with pytest.raises(RemoteCommandError) as failed:
        guest_driver.STEP.apply(ctx, target, changes)
    assert f"has sha256 {tampered}, the runbook's sha256 is {genuine}: not run" in str(failed.value)
    assert not marker.exists()
    assert bed.state("gpu-vm-01")["driver_version"] is None  # nothing installed
    assert not list((bed.host_dir("gpu-vm-01") / "tmp").glob("gpuvm-install.*"))  # the download removed
