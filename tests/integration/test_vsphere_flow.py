"""plan → apply → re-plan against the simulated vCenter, through the real CLI."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpusim import Simulator
from gpuvm.cli.main import app
from tests.integration.vcenter import LAB_MIG, env_for, raw_state, use_simulator

pytestmark = pytest.mark.integration
LAB_FILE = Path(__file__).parents[2] / "playbooks" / "lab.yaml"


def vsphere_only(source: Path, target: Path) -> Path:
    """The lab runbook without its SSH parts (ESXi shells, guests): these tests talk to vCenter only."""
    from ruamel.yaml import YAML

    yaml = YAML()
    data = yaml.load(source.read_text())
    data.pop("guests", None)
    data.pop("ssh", None)
    for host in data["hosts"]:
        for key in ("ssh", "ats", "mig"):
            host.pop(key, None)
    with target.open("w") as out:
        yaml.dump(data, out)
    return target


@pytest.fixture(scope="module")
def lab(tmp_path_factory) -> Path:
    return vsphere_only(LAB_FILE, tmp_path_factory.mktemp("runbook") / "lab.yaml")


@pytest.fixture
def sim(monkeypatch, tmp_path):
    with Simulator(hosts=2, vms_per_host=2, mig=LAB_MIG) as running:
        use_simulator(monkeypatch, running, tmp_path / "state")
        yield running


def gpuvm(*args: str):
    return CliRunner().invoke(app, list(args), catch_exceptions=False)


def test_plan_apply_replan_is_empty_and_vms_power_on(sim, lab, tmp_path):
    before = raw_state(sim)
    planned = gpuvm("plan", str(lab), "--detailed-exitcode")
    assert planned.exit_code == 2, planned.output
    assert raw_state(sim) == before, "a dry run changed the simulator"

    applied = gpuvm("apply", str(lab), "--yes", "--allow-host-reboot")
    assert applied.exit_code == 0, applied.output
    after = raw_state(sim)
    for vm in ("esx-01-vm1", "esx-01-vm2", "esx-02-vm1", "esx-02-vm2"):
        assert after[vm]["power"] == "poweredOn", (vm, after[vm])  # so reservation and MMIO were right
        assert after[vm]["firmware"] == "efi" and after[vm]["reserved"] is True
    assert len(after["esx-01-vm1"]["pci"]) == 3  # two GPUs and a ConnectX-6 port
    assert ("pciPassthru.64bitMMIOSizeGB", "512") in after["esx-01-vm1"]["extra"]
    assert all(enabled == active for _, enabled, active in after["esx-01"]["passthru"])
    assert after["esx-02"]["graphics"] == "sharedDirect" and not after["esx-02"]["maintenance"]

    replanned = gpuvm("plan", str(lab), "--detailed-exitcode")
    assert replanned.exit_code == 0, replanned.output
    assert "No changes. Infrastructure matches the runbook." in replanned.output
    assert gpuvm("verify", str(lab)).exit_code == 0
    again = gpuvm("apply", str(lab), "--yes")
    assert again.exit_code == 0 and raw_state(sim) == after  # idempotent: no second copy of anything

    journal = [json.loads(line) for line in (tmp_path / "state" / "journal.jsonl").read_text().splitlines()]
    assert {e["status"] for e in journal} >= {"run-start", "started", "done", "run-end"}
    assert not [e for e in journal if e["status"] == "failed"]


def test_disruptive_changes_are_refused_without_flags(sim, lab):
    before = raw_state(sim)
    result = gpuvm("apply", str(lab), "--yes")
    assert result.exit_code == 2
    assert "must reboot: pass --allow-host-reboot" in result.output and "nothing was changed" in result.output
    assert raw_state(sim) == before


def test_snapshot_plan_equals_live_plan(sim, lab, tmp_path):
    snapshot = tmp_path / "inventory.json"
    assert gpuvm("inventory", str(lab), "--save", str(snapshot)).exit_code == 0
    live = json.loads(gpuvm("plan", str(lab), "--json").stdout)
    offline = json.loads(gpuvm("plan", str(lab), "--json", "--snapshot", str(snapshot)).stdout)
    assert live == offline and live["summary"]["changes"] > 0


def test_drift_is_reported_by_verify(sim, lab):
    assert gpuvm("apply", str(lab), "--yes", "--allow-host-reboot").exit_code == 0
    from pyVmomi import vim

    from tests.integration.vcenter import pyvmomi

    with pyvmomi(sim) as si:
        content = si.RetrieveContent()
        view = content.viewManager.CreateContainerView(content.rootFolder, [vim.VirtualMachine], True)
        vm = next(v for v in view.view if v.name == "esx-01-vm1")
        vm.ReconfigVM_Task(spec=vim.vm.ConfigSpec(
            extraConfig=[vim.option.OptionValue(key="pciPassthru.64bitMMIOSizeGB", value="64")]))
    result = gpuvm("verify", str(lab))
    assert result.exit_code == 5
    assert "! extraConfig pciPassthru.64bitMMIOSizeGB: 64 → 512 (VM power-off)" in result.output
    # The running VM must be powered off for the fix, then on again: two changes.
    assert "drift: 2 change(s) needed to match" in result.output and "need VM power-off" in result.output


def test_injected_reconfigure_fault_then_rerun_completes(monkeypatch, tmp_path, lab):
    with Simulator(hosts=2, vms_per_host=2, faults=["fail-reconfigure=esx-01-vm2:1"], mig=LAB_MIG) as sim:
        use_simulator(monkeypatch, sim, tmp_path / "state")
        first = gpuvm("apply", str(lab), "--yes", "--allow-host-reboot")
        assert first.exit_code == 4, first.output
        assert "esx-01-vm2 (vm.hardware): ReconfigVM failed: gpusim injected fault" in first.output
        state = raw_state(sim)
        assert state["esx-01-vm1"]["power"] == "poweredOn"  # independent targets finished
        assert state["esx-01-vm2"]["pci"] == []
        journal = [json.loads(line) for line in (tmp_path / "state" / "journal.jsonl").read_text().splitlines()]
        failed = [e for e in journal if e["status"] == "failed"]
        assert failed and all(e["target"] == "esx-01-vm2" and e["step"] == "vm.hardware" for e in failed)
        skipped = {(e["target"], e["step"]) for e in journal if e["status"] == "skipped"}
        assert ("esx-01-vm2", "vm.advanced") in skipped and ("esx-01-vm2", "vm.power") in skipped

        second = gpuvm("apply", str(lab), "--yes")
        assert second.exit_code == 0, second.output
        assert raw_state(sim)["esx-01-vm2"]["power"] == "poweredOn"
        assert gpuvm("plan", str(lab), "--detailed-exitcode").exit_code == 0


def test_bad_password_is_one_clear_line_without_traceback(sim, lab, tmp_path):
    env = dict(env_for(sim), GPUVM_VCENTER_PASSWORD="wrong-canary-pass", PATH="/usr/bin:/bin")
    result = subprocess.run([sys.executable, "-m", "gpuvm.cli.main", "plan", str(lab)], env=env,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 3
    assert "login refused for user administrator@vsphere.local" in result.stderr
    assert "Traceback" not in result.stderr and "wrong-canary-pass" not in result.stderr + result.stdout


def test_untrusted_certificate_is_refused(sim, lab, monkeypatch):
    monkeypatch.delenv("GOVC_TLS_CA_CERTS")
    result = gpuvm("plan", str(lab))
    assert result.exit_code == 3 and "TLS certificate not trusted" in result.output
    insecure = gpuvm("plan", str(lab), "--insecure")
    assert insecure.exit_code == 0 and "TLS certificate verification is OFF" in insecure.output


BAD = Path(__file__).parents[1] / "fixtures" / "bad_runbooks"


@pytest.mark.parametrize("name", ["08-type-cpus-string", "32-combo-selector-two", "46-inv-too-many-gpus",
                                  "54-inv-profile-not-offered", "58-inject-vm-name", "64-cap-vgpu-no-room",
                                  "65-cap-classic-and-dynamic", "66-cap-vcpus"])
def test_bad_runbook_apply_touches_nothing(sim, name):
    """`apply` of a broken runbook exits 2 with file:line: field, and the simulator is unchanged."""
    before = raw_state(sim)
    assert (BAD / f"{name}.yaml").is_file()
    result = subprocess.run([sys.executable, "-m", "gpuvm.cli.main", "apply", str(BAD / f"{name}.yaml"), "--yes",
                             "--allow-power-off", "--allow-host-reboot"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 2, result.stdout + result.stderr
    assert f"{name}.yaml:" in result.stderr and "Traceback" not in result.stderr
    assert re.search((BAD / f"{name}.expect").read_text().strip(), result.stderr), result.stderr
    assert raw_state(sim) == before


TOPOLOGY = """
vcenter: {password_env: GPUVM_VCENTER_PASSWORD}
hosts:
  - name: esx-01
    passthrough: [{model: A100}]
    nvlink: [["0000:17:00.0", "0000:31:00.0"], ["0000:b1:00.0", "0000:ca:00.0"]]
    allow_maintenance: true
    allow_reboot: true
  - name: esx-02
    passthrough: [{model: A100}]
    allow_maintenance: true
    allow_reboot: true
vms:
  - {name: esx-01-vm1, host: esx-01, memory_gb: 16, gpus: {mode: passthrough, count: 1}}
  - {name: esx-01-vm2, host: esx-01, memory_gb: 16, gpus: {mode: passthrough, count: 2}}
  - {name: esx-02-vm1, host: esx-02, memory_gb: 16, gpus: {mode: dynamic, count: 2}, numa_node: 1}
  - {name: esx-02-vm2, host: esx-02, memory_gb: 16, gpus: {mode: dynamic, count: 1}, numa_node: 0}
"""


def test_gpus_stay_on_one_numa_node_and_dynamic_ones_on_the_vms_node(sim, tmp_path):
    # seen: a 2-GPU VM got 31:00.0 (NUMA 0) and b1:00.0 (NUMA 1); a dynamic VM with numa_node 1 got NUMA-0 GPUs
    runbook = tmp_path / "topology.yaml"
    runbook.write_text(TOPOLOGY)
    planned = gpuvm("plan", str(runbook), "--json")
    assert planned.exit_code == 0, planned.output
    devices = [(c["target"], c["after"]) for c in json.loads(planned.stdout)["changes"] if c["field"] == "device"]
    assert ("esx-02-vm1", "dynamic 10de:20b5 (vSphere picks from 0000:b1:00.0, 0000:ca:00.0)") in devices
    assert gpuvm("apply", str(runbook), "--yes", "--allow-host-reboot").exit_code == 0
    state = raw_state(sim)
    assert [p.split(":", 1)[1] for p in state["esx-01-vm2"]["pci"]] == ["0000:b1:00.0", "0000:ca:00.0"]
    from pyVmomi import vim

    from tests.integration.vcenter import pyvmomi

    with pyvmomi(sim) as si:
        content = si.RetrieveContent()
        view = content.viewManager.CreateContainerView(content.rootFolder, [vim.VirtualMachine], True)
        assigned = {v.name: sorted(d.backing.assignedId for d in v.config.hardware.device
                                   if isinstance(d, vim.vm.device.VirtualPCIPassthrough))
                    for v in view.view if v.name.startswith("esx-02")}
        view.DestroyView()
    assert assigned == {"esx-02-vm1": ["0000:b1:00.0", "0000:ca:00.0"], "esx-02-vm2": ["0000:17:00.0"]}
    assert gpuvm("plan", str(runbook), "--detailed-exitcode").exit_code == 0
