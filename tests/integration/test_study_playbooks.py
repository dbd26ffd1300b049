"""The study's runbooks (playbooks/study-scenario*.yaml) are valid and plan cleanly against a
simulated lab of the same shape (offline, from a snapshot: their vCenter is an example address)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpusim import Simulator
from gpuvm.cli.main import app
from gpuvm.vsphere.inventory import read_inventory
from gpuvm.vsphere.session import Session, Target

pytestmark = pytest.mark.integration
PLAYBOOKS = Path(__file__).parents[2] / "playbooks"


@pytest.mark.parametrize("name, hosts, vms_per_host, gpu_devices", [
    ("study-scenario1", 1, 2, {"esx-01-vm1": 3, "esx-01-vm2": 3}),
    ("study-scenario2", 4, 1, {f"esx-0{i}-vm1": 2 for i in range(1, 5)}),
])
def test_study_runbook_plans_on_a_lab_of_its_shape(tmp_path, monkeypatch, name, hosts, vms_per_host, gpu_devices):
    monkeypatch.setenv("VCENTER_PASSWORD", "unused")
    with Simulator(hosts=hosts, vms_per_host=vms_per_host) as sim:
        target = Target(sim.host, sim.port, "/sdk", sim.username, sim.password, False, sim.cert_file)
        with Session(target) as session:
            read_inventory(session).save(tmp_path / "inventory.json")
    runbook = PLAYBOOKS / f"{name}.yaml"
    assert CliRunner().invoke(app, ["validate", str(runbook)]).exit_code == 0
    result = CliRunner().invoke(app, ["plan", str(runbook), "--snapshot", str(tmp_path / "inventory.json"), "--json"])
    assert result.exit_code == 0, result.output
    plan = json.loads(result.stdout)
    added = {}
    for change in plan["changes"]:
        if change["step"] == "vm.hardware" and change["field"] == "device":
            added[change["target"]] = added.get(change["target"], 0) + 1
    assert added == gpu_devices  # GPUs plus one ConnectX-6 port each
    mmio = {c["target"]: c["after"] for c in plan["changes"] if c["field"] == "pciPassthru.64bitMMIOSizeGB"}
    assert set(mmio.values()) == ({"512"} if name == "study-scenario1" else {"256"})
