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


def _read_answer(name: str, mig: bool) -> str:
    """A compute guest's answer to guest.slurm's read: two A100s, with MIG two 3g.40gb on each."""
    lci = "".join(f"|{gpu:>4}{gi:>7}       MIG 3g.40gb          2         0          0:3     |\n"
                  "+--------------------------------------------------------------------+\n"
                  for gpu in (0, 1) for gi in (1, 2))
    minors = "".join(f"gpu{gpu}/gi{gi}/access {3 + (gpu * 15 + gi) * 9}\ngpu{gpu}/gi{gi}/ci0/access {4 + (gpu * 15 + gi) * 9}\n"
                     for gpu in (0, 1) for gi in (1, 2))
    caps = "".join(f"nvidia-cap{line.split()[1]}\n" for line in minors.splitlines())
    return (f"== hostname ==\n{name}\n== cpus ==\n8\n== memory ==\nMemTotal: 8056804 kB\n"
            "== gpus ==\n0, NVIDIA A100 80GB PCIe\n1, NVIDIA A100 80GB PCIe\n== devices ==\nnvidia0\nnvidia1\n"
            + ("== mig ==\n+--------------------------------------------------------------------+\n"
               "| Compute instances:                                                 |\n"
               "|====================================================================|\n" + lci
               + f"== mig_minors ==\n{minors}== caps ==\n{caps}" if mig else ""))


def test_gres_conf_awaiting_mig_is_rendered_from_the_devices_guest_mig_made(tmp_path):
    """The plan could only count n1's MIG devices (guest.mig had yet to make them): apply reads the
    guests again and writes each instance's MultipleFiles line."""
    from gpuvm.steps.guest_slurm.actions import GRES_CONF

    targets = {n: DesiredGuest(n, Login(f"10.0.0.{i + 1}"), slurm=SlurmNode(CLUSTER), mig="all-3g.40gb" if n == "n1" else None)
               for i, n in enumerate(GUESTS)}
    executors = {n: FakeExecutor(n) for n in GUESTS}
    for name, fake in executors.items():
        fake.responses[re.compile("== hostname ==")] = CommandResult("", 0, _read_answer(name, mig=name == "n1"), "")
        fake.responses[re.compile("scontrol show node")] = CommandResult("", 0, NODES, "")
        fake.responses[re.compile("")] = CommandResult("", 0, "", "")
    cluster = Cluster(tmp_path, targets, executors)
    write = guest_slurm.WriteFile(GRES_CONF, "NodeName=n1 Name=gpu Type=3g.40gb Count=4\n", after_mig=True)
    changes = {"ctl": [Change(guest_slurm.NAME, "ctl", GRES_CONF, "content", None, "after guest.mig", action=write)]}
    assert guest_slurm.STEP.apply_all(Context(cluster=cluster), changes, 2) == {}
    written = next(c.stdin.decode() for c in executors["ctl"].calls if GRES_CONF in c.command and c.stdin)
    n1 = [line for line in written.splitlines() if line.startswith("NodeName=n1 ")]
    assert n1 == [f"NodeName=n1 Name=gpu Type=3g.40gb MultipleFiles=/dev/nvidia{gpu},/dev/nvidia-caps/nvidia-cap{m},"
                  f"/dev/nvidia-caps/nvidia-cap{m + 1}" for gpu in (0, 1) for m in (3 + (gpu * 15 + 1) * 9, 3 + (gpu * 15 + 2) * 9)]
    assert "NodeName=n2 Name=gpu Type=a100-80gb-pcie File=/dev/nvidia0,/dev/nvidia1" in written
    assert any("systemctl restart slurmctld" in c for c in executors["ctl"].commands)
