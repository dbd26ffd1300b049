"""A compute guest the Slurm controller cannot read: the controller's files are not planned (its node
line is not dropped from slurm.conf), and the plan says so on the controller and counts the guest not observed
(exit 3), whether the guest failed its own observation too or only the controller's read of it."""

from __future__ import annotations

import dataclasses
import re
import textwrap

import pytest

from gpuvm import engine
from gpuvm.cli.main import plan_exit_code
from gpuvm.errors import ConnectError
from gpuvm.executors.base import CommandResult
from gpuvm.executors.fake import FakeExecutor
from gpuvm.remote import RemoteOptions, build_cluster
from gpuvm.runbook.loader import load_runbook
from gpuvm.steps import guest_slurm
from gpuvm.steps.guest_slurm.wanted import WantedFiles
from gpuvm.targeting import select
from gpuvm.vsphere.facts import DatastoreFacts
from tests.unit.factories import inventory, r750xa, vm

RUNBOOK = """
hosts: [{name: esx-01}]
vms:
  - {name: gpu-vm-01, host: esx-01}
  - {name: gpu-vm-02, host: esx-01}
  - {name: gpu-vm-03, host: esx-01}
guests:
  hosts:
    - {vm: gpu-vm-01, ssh: {address: 10.0.0.11, user: root}}
    - {vm: gpu-vm-02, ssh: {address: 10.0.0.12, user: root}}
    - {vm: gpu-vm-03, ssh: {address: 10.0.0.13, user: root}}
slurm: {controller: gpu-vm-01, compute: [gpu-vm-02, gpu-vm-03]}
"""
SILENT = "gpu-vm-03: cannot connect to 10.0.0.13:22: Connection refused"


def _read(name: str, address: str) -> str:
    """What guest.slurm's observe script prints on a guest with Slurm set up and running."""
    return (f"== packages ==\n" + "".join(f"{p} install ok installed\n" for p in ("munge", "slurmctld", "slurmd",
                                                                                 "slurm-client"))
            + f"== hostname ==\n{name}\n== cpus ==\n4\n== memory ==\nMemTotal: 8000000 kB\n== gpus ==\n== devices ==\n"
            + f"== key ==\n== configs ==\n== services ==\nactive\nactive\nactive\n== nodes ==\n{NODES}")


NODES = ("NodeName=gpu-vm-02 NodeAddr=10.0.0.12 State=IDLE+DRAIN Reason=Not responding [slurm@2026-11-29T01:00:00]\n"
         "NodeName=gpu-vm-03 NodeAddr=10.0.0.13 State=DOWN+NOT_RESPONDING Reason=Not responding [slurm@2026-11-29T01:00:00]\n")


def _executor(name: str, address: str, silent: bool) -> FakeExecutor:
    def refuse(call):
        raise ConnectError(SILENT)
    fake = FakeExecutor(name)
    fake.responses[re.compile(".")] = refuse if silent else CommandResult("", 0, _read(name, address), "")
    return fake


@pytest.fixture
def lab(tmp_path):
    path = tmp_path / "rb.yaml"
    path.write_text(textwrap.dedent(RUNBOOK))
    book = load_runbook(path)
    facts = inventory([r750xa("esx-01")], [vm(f"gpu-vm-0{i}", power_state="poweredOn") for i in (1, 2, 3)])
    return book, facts, tmp_path


def _cluster(tmp_path, silent: set[str]):
    addresses = {"gpu-vm-01": "10.0.0.11", "gpu-vm-02": "10.0.0.12", "gpu-vm-03": "10.0.0.13"}
    return build_cluster(load_runbook(tmp_path / "rb.yaml"), tmp_path, RemoteOptions(
        executor_factory=lambda name, access: _executor(name, addresses[name], name in silent)))


def _note(plan):
    return [n for n in plan.notes if n.step == guest_slurm.NAME]


def test_a_compute_guest_that_does_not_answer_holds_the_controllers_files_and_says_so(lab):
    book, facts, tmp_path = lab
    cluster = _cluster(tmp_path, {"gpu-vm-03"})
    observed, down = engine.observe_reachable(cluster)
    assert list(down) == ["gpu-vm-03"]
    assert observed[(guest_slurm.NAME, "gpu-vm-01")].wanted.unread == {"gpu-vm-03": SILENT}
    plan, _ = engine.make_plan(book, facts, cluster, observed, down)
    on_controller = [(c.resource, c.field) for c in plan.changes if c.target == "gpu-vm-01" and c.step == guest_slurm.NAME]
    assert not [r for r, _ in on_controller if r.startswith("/etc/slurm/")]  # slurm.conf keeps gpu-vm-03's line
    assert ("slurm node gpu-vm-02", "state") in on_controller  # the node read is still checked: resumed
    assert ("slurm node gpu-vm-03", "state") not in on_controller  # the one not read is left alone
    [note] = _note(plan)
    assert note.target == "gpu-vm-01" and note.level == "warning"  # the controller, whose files wait
    assert note.message.startswith(f"compute guest gpu-vm-03 not read ({SILENT}): slurm.conf")
    assert "gpu-vm-03" in plan.unobserved and plan_exit_code(plan, detailed=True) == 3
    assert note in select(book, ["gpu-vm-01"]).drift(plan, facts).notes  # `verify --target` the controller: said too


def test_a_compute_guest_the_controller_alone_could_not_read_is_not_observed(lab):
    """Observed on its own, but not by the controller's read of it (it went away in between): the
    controller's files are held all the same, and the plan is incomplete."""
    book, facts, tmp_path = lab
    cluster = _cluster(tmp_path, set())
    observed, down = engine.observe_reachable(cluster)
    assert down == {} and observed[(guest_slurm.NAME, "gpu-vm-01")].wanted.files  # all read: the files are planned
    key = (guest_slurm.NAME, "gpu-vm-01")
    observed[key] = dataclasses.replace(observed[key], wanted=WantedFiles(unread={"gpu-vm-02": "timed out"}))
    plan, _ = engine.make_plan(book, facts, cluster, observed, down)
    [note] = _note(plan)
    assert note.target == "gpu-vm-01" and note.message.startswith("compute guest gpu-vm-02 not read (timed out)")
    assert plan.unobserved == {"gpu-vm-02": note.message} and plan_exit_code(plan, detailed=False) == 3


def test_a_compute_guest_of_a_vm_the_plan_creates_is_known_after_apply_not_unobserved(lab):
    """Its VM is cloned by this run: apply observes it once it runs, the controller with it."""
    book, facts, tmp_path = lab
    path = tmp_path / "rb.yaml"
    path.write_text(path.read_text().replace("{name: gpu-vm-03, host: esx-01}",
                                             "{name: gpu-vm-03, host: esx-01, template: ubuntu}"))
    book = load_runbook(path)
    facts.vms.pop("gpu-vm-03")
    facts.templates = {"ubuntu": vm("ubuntu", moid="vm-ubuntu", datastores=["datastore1"], disk_gb=40)}
    facts.datastores = {"datastore1": DatastoreFacts(name="datastore1", moid="ds-1", free_gb=10000)}
    cluster = _cluster(tmp_path, {"gpu-vm-03"})
    plan, _ = engine.make_plan(book, facts, cluster, *engine.observe_reachable(cluster))
    [note] = _note(plan)
    assert note.target == "gpu-vm-01" and "gpu-vm-03 not read" in note.message and note.level == "info"
    assert plan.unobserved == {} and plan_exit_code(plan, detailed=True) == 2
