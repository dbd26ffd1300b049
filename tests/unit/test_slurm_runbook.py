"""The runbook's slurm section (runbook/slurm.py): defaults, errors at file:line: field, and the
desired state each guest gets (resolve_slurm.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuvm.desired.slurm import CgroupConstraints, Partition
from gpuvm.errors import InputError
from gpuvm.resolve_ssh import resolve_ssh
from gpuvm.runbook.loader import load_runbook

BASE = """\
hosts: [{name: esx-01}]
vms:
  - {name: gpu-vm-01, host: esx-01}
  - {name: gpu-vm-02, host: esx-01, gpus: {mode: vgpu, profile: grid_a100d-3-40c}}
  - {name: gpu-vm-03, host: esx-01}
guests:
  hosts:
    - {vm: gpu-vm-01, ssh: {address: 10.0.0.11}}
    - {vm: gpu-vm-02, ssh: {address: 10.0.0.12}}
    - {vm: gpu-vm-03, ssh: {address: 10.0.0.13}, mig: all-3g.40gb}
"""


def _load(tmp_path: Path, slurm: str):
    path = tmp_path / "rb.yaml"
    path.write_text(BASE + slurm)
    return load_runbook(path)


def test_defaults_every_guest_is_a_compute_node_in_one_partition(tmp_path):
    targets = resolve_ssh(_load(tmp_path, "slurm: {controller: gpu-vm-01}\n"))
    node = targets["gpu-vm-01"].slurm
    assert node.cluster.compute == ("gpu-vm-01", "gpu-vm-02", "gpu-vm-03")
    assert node.cluster.partitions == (Partition("gpu", ("gpu-vm-01", "gpu-vm-02", "gpu-vm-03"), True),)
    assert node.cluster.mpi_default == "pmi2" and node.cluster.cgroup == CgroupConstraints()
    assert targets["gpu-vm-02"].slurm.gres_type == "grid_a100d-3-40c"  # the VM's vGPU profile
    assert targets["gpu-vm-01"].slurm.gres_type is None
    assert all(targets[n].slurm.cluster is node.cluster or targets[n].slurm.cluster == node.cluster for n in targets)


def test_a_guest_neither_controller_nor_compute_is_no_slurm_node(tmp_path):
    book = _load(tmp_path, "slurm:\n  controller: gpu-vm-01\n  compute: [gpu-vm-02]\n  cgroup: null\n"
                           "  mpi_default: pmix\n  partitions: [{name: a}, {name: b, nodes: [gpu-vm-02], default: true}]\n")
    targets = resolve_ssh(book)
    assert targets["gpu-vm-03"].slurm is None
    cluster = targets["gpu-vm-01"].slurm.cluster
    assert cluster.compute == ("gpu-vm-02",) and cluster.cgroup is None and cluster.mpi_default == "pmix"
    assert [(p.name, p.default) for p in cluster.partitions] == [("a", False), ("b", True)]


@pytest.mark.parametrize("slurm, line, message", [
    ("slurm: {controller: gpu-vm-09}\n", 11, "slurm.controller: 'gpu-vm-09' is not a guest (guests: gpu-vm-01, gpu-vm-02, gpu-vm-03)"),
    ("slurm:\n  controller: gpu-vm-01\n  compute: [gpu-vm-01, nope]\n", 13, "slurm.compute[1]: 'nope' is not a guest"),
    ("slurm:\n  controller: gpu-vm-01\n  compute: [gpu-vm-01]\n  partitions: [{name: p, nodes: [gpu-vm-02]}]\n", 14,
     "slurm.partitions[0].nodes[0]: 'gpu-vm-02' is not a compute guest (compute: gpu-vm-01)"),
    ("slurm:\n  controller: gpu-vm-01\n  mpi_default: openmpi\n", 13, "slurm.mpi_default"),
    ("slurm:\n  controller: gpu-vm-01\n  extra: [\"ClusterName=x\"]\n", 13,
     "ClusterName is written by gpuvm from the runbook"),
    ("slurm:\n  controller: gpu-vm-01\n  extra: [\"not a line\"]\n", 13, "is not one slurm.conf line Key=Value"),
    ("slurm:\n  controller: gpu-vm-01\n  partitions: [{name: a}, {name: a}]\n", 11, "partition a is declared twice"),
    ("slurm:\n  controller: gpu-vm-01\n  partitions: [{name: '1x'}]\n", 13, "is not a Slurm name"),
    ("slurm:\n  controller: gpu-vm-01\n  partitions: [{name: a, max_time: soon}]\n", 13, "is not a Slurm time"),
])
def test_errors_name_file_line_and_field(tmp_path, slurm, line, message):
    with pytest.raises(InputError) as caught:
        _load(tmp_path, slurm)
    text = str(caught.value)
    assert f"rb.yaml:{line}:" in text and message in text, text


def test_slurm_needs_guests(tmp_path):
    path = tmp_path / "rb.yaml"
    path.write_text("hosts: [{name: esx-01}]\nslurm: {controller: gpu-vm-01}\n")
    with pytest.raises(InputError, match=r"rb.yaml:2: slurm: slurm runs on the guests: give guests.hosts"):
        load_runbook(path)
