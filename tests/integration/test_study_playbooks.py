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


@pytest.mark.parametrize("name, hosts, vms_per_host", [("study-scenario1", 1, 2), ("study-scenario2", 4, 1)])
def test_study_runbook_applies_and_verifies_with_every_setting_active(tmp_path, monkeypatch, name, hosts, vms_per_host):
    """The vSphere half of each study runbook, applied on a simulated lab of its shape with its VMs
    running: plan → apply (VMs shut down for the reboots, hosts one at a time) → verify clean, every
    passthrough device active, every VM on with its GPUs."""
    from ruamel.yaml import YAML

    from tests.integration.test_vsphere_flow import vsphere_only
    from tests.integration.vcenter import env_for, raw_state

    runbook = vsphere_only(PLAYBOOKS / f"{name}.yaml", tmp_path / f"{name}.yaml")
    yaml = YAML()
    data = yaml.load(runbook.read_text())
    data["vcenter"].pop("url")  # the simulator's, from GOVC_URL
    data["vcenter"]["password_env"] = "GPUVM_VCENTER_PASSWORD"
    data.pop("benchmarks", None)
    with runbook.open("w") as out:
        yaml.dump(data, out)
    with Simulator(hosts=hosts, vms_per_host=vms_per_host, vm_power="on") as sim:
        for key, value in env_for(sim).items():
            monkeypatch.setenv(key, value)
        monkeypatch.setenv("GPUVM_STATE_DIR", str(tmp_path / "state"))
        run = CliRunner().invoke
        assert run(app, ["plan", str(runbook), "--detailed-exitcode"]).exit_code == 2
        applied = run(app, ["apply", str(runbook), "--yes", "--allow-host-reboot", "--allow-power-off"])
        assert applied.exit_code == 0, applied.output
        assert run(app, ["verify", str(runbook)]).exit_code == 0
        state = raw_state(sim)
        for host in (f"esx-0{i}" for i in range(1, hosts + 1)):
            assert all(enabled == active for _, enabled, active in state[host]["passthru"])
        vms = [v for v in state if "-vm" in v]
        assert vms and all(state[v]["power"] == "poweredOn" and len(state[v]["pci"]) >= 2 for v in vms)


def study_for_bed(bed, name: str, target: Path) -> Path:
    """A study runbook pointed at the simulator and the SSH test bed: its ESXi shells and guests are
    the bed's test hosts, in order. The NGC training image cannot be pulled here: it is left out."""
    from ruamel.yaml import YAML

    from bed import GUEST_USER

    yaml = YAML()
    data = yaml.load((PLAYBOOKS / f"{name}.yaml").read_text())
    data["vcenter"].pop("url")
    data["vcenter"]["password_env"] = "GPUVM_VCENTER_PASSWORD"
    data["ssh"] = {"known_hosts": str(bed.known_hosts_file)}
    for i, host in enumerate(data["hosts"], 1):
        host["ssh"].update(address=bed.address(f"esx-{i:02d}"), key_file=str(bed.client_key))
    for i, guest in enumerate(data["guests"]["hosts"], 1):
        guest["ssh"].update(address=bed.address(f"gpu-vm-{i:02d}"), user=GUEST_USER, key_file=str(bed.client_key))
    data["guests"].pop("image")
    data.pop("benchmarks")
    with target.open("w") as out:
        yaml.dump(data, out)
    return target


def test_study_scenario2_end_to_end_with_every_setting_active(testbed, tmp_path, monkeypatch):
    """Scenario 2 whole (the image aside): four hosts with ESXi shells and four guests, VMs running.
    plan → apply → verify clean; ATS active on every ESXi host and every ConnectX card (set, then
    activated by the one reboot of each host), passthrough active, every VM on."""
    from bed import TestBed

    from tests.integration.vcenter import env_for, raw_state, reboot_hook

    testbed.down()  # the session's bed has two ESXi shells: this lab needs four
    bed = TestBed(tmp_path / "bed", esxi=4, guests=4)
    try:
        bed.up()
        runbook = study_for_bed(bed, "study-scenario2", tmp_path / "scenario2.yaml")
        with Simulator(hosts=4, vms_per_host=1, vm_power="on", on_reboot=reboot_hook(bed, vms_per_host=1)) as sim:
            for key, value in env_for(sim).items():
                monkeypatch.setenv(key, value)
            monkeypatch.setenv("GPUVM_STATE_DIR", str(tmp_path / "state"))
            run = CliRunner().invoke
            assert run(app, ["plan", str(runbook), "--detailed-exitcode"]).exit_code == 2
            applied = run(app, ["apply", str(runbook), "--yes", "--allow-host-reboot", "--allow-power-off"])
            assert applied.exit_code == 0, applied.output
            verified = run(app, ["verify", str(runbook)])
            assert verified.exit_code == 0, verified.output
            state = raw_state(sim)
        for i in range(1, 5):
            assert all(enabled == active for _, enabled, active in state[f"esx-0{i}"]["passthru"])
            assert state[f"esx-0{i}-vm1"]["power"] == "poweredOn" and len(state[f"esx-0{i}-vm1"]["pci"]) == 2
            assert bed.state(f"esx-0{i}")["kernel"]["atsSupport"]["runtime"] == "TRUE"
            assert bed.state(f"gpu-vm-0{i}")["mlx"]["ATS_ENABLED"]["current"] == "True(1)"
        assert "rebooted" in " ".join(applied.output.split())
    finally:
        bed.down()
        testbed.up()
