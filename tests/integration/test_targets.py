"""`--target` against the simulator: a VM whose devices wait for its host is left out whole, saying
so; a host brings its VMs; apply on one host leaves the other untouched; an unknown name is exit 2."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from gpusim import Simulator
from gpuvm.cli.main import app
from tests.integration.test_vsphere_flow import LAB_FILE, vsphere_only
from tests.integration.vcenter import LAB_MIG, use_simulator

pytestmark = pytest.mark.integration


def gpuvm(*args: object):
    return CliRunner().invoke(app, [str(a) for a in args], catch_exceptions=False)


def targets(result) -> set[str]:
    return {c["target"] for c in json.loads(result.stdout)["changes"]}


def test_targets_narrow_plan_apply_and_verify(monkeypatch, tmp_path):
    with Simulator(hosts=2, vms_per_host=2, mig=LAB_MIG) as sim:
        use_simulator(monkeypatch, sim, tmp_path / "state")
        lab = vsphere_only(LAB_FILE, tmp_path / "lab.yaml")

        unknown = gpuvm("plan", lab, "--target", "esx-01", "--target", "esx-07")
        assert unknown.exit_code == 2 and "--target esx-07: no host, VM or guest of that name" in unknown.stderr

        alone = gpuvm("plan", lab, "--target", "esx-01-vm1", "--json")  # its GPUs wait for esx-01's reboot
        assert alone.exit_code == 0, alone.stderr
        plan = json.loads(alone.stdout)
        assert plan["changes"] == []
        [left] = [n for n in plan["notes"] if n["step"] == "target" and n["target"] == "esx-01-vm1"]
        assert left["message"].startswith("left out (") and "planned on its host esx-01" in left["message"]

        host = gpuvm("plan", lab, "--target", "esx-01", "--json")
        assert targets(host) == {"esx-01", "esx-01-vm1", "esx-01-vm2"}

        applied = gpuvm("apply", lab, "--target", "esx-01", "--yes", "--allow-host-reboot")
        assert applied.exit_code == 0, applied.stderr
        assert gpuvm("verify", lab, "--target", "esx-01").exit_code == 0  # no drift there
        rest = gpuvm("plan", lab, "--json")
        assert targets(rest) == {"esx-02", "esx-02-vm1", "esx-02-vm2"}  # the other host untouched
        assert gpuvm("verify", lab, "--target", "esx-02-vm2").exit_code == 5
