"""guest.slurm's apply_all: the controller before the compute guests, and a controller that fails
holds the compute guests back (each told why) instead of reporting them done."""

from __future__ import annotations

import re

from gpuvm.desired.slurm import Partition, SlurmCluster, SlurmNode
from gpuvm.desired.ssh import DesiredGuest, Login
from gpuvm.executors.base import CommandResult
from gpuvm.executors.fake import FakeExecutor
from gpuvm.plan import Change
from gpuvm.remote import Cluster
from gpuvm.steps import guest_slurm
from gpuvm.steps.base import Context

GUESTS = ("ctl", "n1", "n2")
CLUSTER = SlurmCluster("lab", "ctl", ("n1", "n2"), (Partition("gpu", ("n1", "n2"), True),))
NODES = "NodeName=n1 NodeAddr=10.0.0.2 State=IDLE\nNodeName=n2 NodeAddr=10.0.0.3 State=IDLE\n"


def _setup(tmp_path, controller_fails: bool):
    targets = {n: DesiredGuest(n, Login(f"10.0.0.{i + 1}"), slurm=SlurmNode(CLUSTER)) for i, n in enumerate(GUESTS)}
    executors = {n: FakeExecutor(n) for n in GUESTS}
    for name, fake in executors.items():
        if name == "ctl" and controller_fails:
            fake.responses[re.compile("apt-get install")] = CommandResult("", 100, "", "E: Unable to locate package slurmctld")
        fake.responses[re.compile("scontrol show node")] = CommandResult("", 0, NODES, "")
        fake.responses[re.compile("")] = CommandResult("", 0, "", "")
    cluster = Cluster(tmp_path, targets, executors)
    install = {n: [Change(guest_slurm.NAME, n, "packages", "installed", None, "munge",
                          action=guest_slurm.InstallPackages(("munge",)))] for n in GUESTS}
    return cluster, executors, install


def test_a_failed_controller_holds_the_compute_guests_back(tmp_path):
    cluster, executors, changes = _setup(tmp_path, controller_fails=True)
    failures = guest_slurm.STEP.apply_all(Context(cluster=cluster), changes, 2)
    assert "Unable to locate package slurmctld" in str(failures["ctl"])
    assert {n: str(failures[n]) for n in ("n1", "n2")} == {
        n: "guest.slurm: not configured: the controller ctl failed" for n in ("n1", "n2")}
    assert executors["n1"].commands == [] and executors["n2"].commands == []


def test_the_controller_first_then_the_nodes_then_slurm_is_asked(tmp_path):
    cluster, executors, changes = _setup(tmp_path, controller_fails=False)
    assert guest_slurm.STEP.apply_all(Context(cluster=cluster), changes, 2) == {}
    assert all(any("apt-get install -y munge" in c for c in executors[n].commands) for n in GUESTS)
    assert executors["ctl"].commands[-1] == "scontrol show node -o"  # waited for, once the nodes were applied
    assert (tmp_path / "slurm" / "munge.key").exists()  # made once, before the guests


def test_a_wait_for_slurmctld_ends_at_an_interrupt_not_at_its_bound(mocker):
    """SIGTERM sets UNDER_WAY.interrupted: the poll stops at once instead of polling out its 30 s."""
    import importlib

    import pytest

    from gpuvm.errors import RemoteCommandError
    from gpuvm.executors.base import UNDER_WAY

    apply = importlib.import_module("gpuvm.steps.guest_slurm.apply")
    ping = mocker.patch.object(apply, "_scontrol", return_value=CommandResult("", 1, "", "not answering"))
    target = mocker.Mock(spec=DesiredGuest)
    target.name = "gpu-vm-01"
    UNDER_WAY.interrupted.set()
    try:
        with pytest.raises(RemoteCommandError, match="interrupted while waiting for Slurm"):
            apply._wait_controller(target, mocker.Mock(spec=Cluster), timeout=30.0)
        assert ping.call_count == 1  # one ping, then the interrupt: no polling on
    finally:
        UNDER_WAY.reset()
