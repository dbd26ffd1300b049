"""Values in vCenter are input (issue 33, point 1), through the real CLI against the simulator: a
16 kB nested value, and records gpuvm did not write, in every attribute gpuvm keeps (gpuvm.intent on
a host, the runbook's VM, a VM on its host it does not name, a VM elsewhere and a template;
gpuvm.owned on the host; a lease and a lock on the root folder). plan, apply and verify finish
without a traceback, name each, and act on none: the host stays in maintenance mode, the VM stays
off, every value stays as it was."""

from __future__ import annotations

import json

import pytest
from pyVmomi import vim
from typer.testing import CliRunner

from gpusim import Simulator
from gpuvm.cli.main import app
from tests.integration.vcenter import pyvmomi, use_simulator

pytestmark = pytest.mark.integration

RUNBOOK = """\
vcenter: {user: administrator@vsphere.local, password_env: GPUVM_VCENTER_PASSWORD}
hosts: [{name: esx-01, allow_maintenance: true, allow_reboot: true}]
vms: [{name: esx-01-vm1, host: esx-01, firmware: bios, cpus: 2, power: "off"}]
"""
DEEP = "[" * 8_000 + "]" * 8_000
SINCE = "2026-11-25T16:50:17+00:00"
FOREIGN = {  # (attribute, object) → a record gpuvm did not write
    ("gpuvm.intent", "esx-01"): '{"maintenance": 42}',  # an admin's maintenance mode
    ("gpuvm.owned", "esx-01"): '{"passthrough": ["0000:17:00.0"], "released": [], "by": "ops"}',
    ("gpuvm.intent", "esx-01-vm1"): json.dumps({"power-off": {"run": "ops", "why": "x", "since": SINCE,
                                                              "data": {"host": "esx-01", "restore": "poweredOn"}}}),
    ("gpuvm.intent", "esx-01-vm2"): json.dumps({"power-off": {"why": "stopped by ops", "since": SINCE,  # no gpuvm run
                                                              "data": {"host": "esx-01", "restore": "poweredOn"}}}),
    ("gpuvm.intent", "esx-02-vm1"): "reserved for the storage team",
    ("gpuvm.intent", "ubuntu-gpu"): json.dumps({"clone esx-01-vm3": {"run": "0123456789ab", "why": "x", "since": SINCE,
                                                                     "data": {"vm": "esx-01-vm9"}}}),
    ("gpuvm.lease.0123456789ab", "root"): "lease of the ops team",
    ("gpuvm.lock.esx-02", "root"): '{"run": "ops"}',
}


def gpuvm(*args: str):
    return CliRunner().invoke(app, list(args), catch_exceptions=False)


def plant(sim: Simulator, values: dict[tuple[str, str], str]) -> None:
    """Each value on its object, as someone with the privilege could write it; esx-01 in maintenance
    mode (an operator's), the VM esx-01-vm2 off."""
    with pyvmomi(sim) as si:
        content = si.RetrieveContent()
        view = content.viewManager.CreateContainerView(content.rootFolder, [vim.HostSystem, vim.VirtualMachine], True)
        objects = {"root": content.rootFolder, **{obj.name: obj for obj in view.view}}
        view.DestroyView()
        manager = content.customFieldsManager
        keys = {}
        for field, name in values:
            if field not in keys:
                keys[field] = manager.AddCustomFieldDef(name=field, moType=vim.Folder if name == "root" else None).key
            manager.SetField(entity=objects[name], key=keys[field], value=values[field, name])
        objects["esx-01-vm2"].PowerOffVM_Task()
        objects["esx-01"].EnterMaintenanceMode_Task(timeout=0)


def found(sim: Simulator) -> dict[tuple[str, str], str]:
    """Every value of gpuvm's attributes, read back with plain pyVmomi; esx-01's maintenance mode, esx-01-vm2's power."""
    with pyvmomi(sim) as si:
        content = si.RetrieveContent()
        names = {f.key: f.name for f in content.customFieldsManager.field}
        view = content.viewManager.CreateContainerView(content.rootFolder, [vim.HostSystem, vim.VirtualMachine], True)
        out = {(names[v.key], "root"): v.value for v in content.rootFolder.customValue}
        for obj in view.view:
            out |= {(names[v.key], obj.name): v.value for v in obj.customValue or [] if v.value}
            if obj.name == "esx-01":
                out["maintenance", "esx-01"] = str(obj.runtime.inMaintenanceMode)
            if obj.name == "esx-01-vm2":
                out["power", "esx-01-vm2"] = str(obj.runtime.powerState)
        view.DestroyView()
        return out


@pytest.mark.parametrize("kind", ["16 kB nested", "foreign records"])
def test_foreign_values_everywhere_are_reported_by_plan_apply_and_verify_and_never_acted_on(kind, tmp_path, monkeypatch):
    runbook = tmp_path / "rb.yaml"
    runbook.write_text(RUNBOOK)
    values = {place: DEEP if kind == "16 kB nested" else value for place, value in FOREIGN.items()}
    with Simulator(hosts=2, vms_per_host=2, templates=["ubuntu-gpu"]) as sim:
        use_simulator(monkeypatch, sim, tmp_path / "state")
        plant(sim, values)
        before = found(sim)
        assert before["maintenance", "esx-01"] == "True" and before["power", "esx-01-vm2"] == "poweredOff"
        planned = gpuvm("plan", str(runbook))
        applied = gpuvm("apply", str(runbook), "--yes", "--allow-power-off", "--allow-host-reboot")
        verified = gpuvm("verify", str(runbook))
        for result in (planned, applied, verified):
            assert "Traceback" not in result.output and "RecursionError" not in result.output, result.output
        assert planned.exit_code == 0 and applied.exit_code == 0, planned.output + applied.output
        assert "cpus" in planned.output and "No changes" not in applied.output  # apply did the runbook's work
        assert verified.exit_code == 0, verified.output  # warned of, not drift: no apply ever acts on them
        assert "`apply` finishes or undoes it" not in planned.output + verified.output
        for output in (planned.output, verified.output):
            text = " ".join(output.split())
            for field, name in FOREIGN:
                shown = "root folder" if name == "root" else name
                assert f"{shown}: {field} holds a value gpuvm did not write" in text, (field, name, text)
        after = found(sim)
        assert after["maintenance", "esx-01"] == "True", "gpuvm took an admin's host out of maintenance mode"
        assert after["power", "esx-01-vm2"] == "poweredOff", "gpuvm powered on a VM on someone else's record"
        assert {p: v for p, v in after.items() if p in values} == values  # nothing overwritten
