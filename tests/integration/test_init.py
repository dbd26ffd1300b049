"""`gpuvm init` against the simulator: the starter runbook it writes is valid and describes the world as
it is (its plan is empty), before and after the lab is applied; an existing file is kept without --force."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from gpusim import Simulator
from gpuvm.cli.main import app
from tests.integration.test_vsphere_flow import LAB_FILE, vsphere_only
from tests.integration.vcenter import LAB_MIG, use_simulator

pytestmark = pytest.mark.integration


def gpuvm(*args: object):
    return CliRunner().invoke(app, [str(a) for a in args], catch_exceptions=False)


def test_init_validate_plan_round_trip(monkeypatch, tmp_path):
    with Simulator(hosts=2, vms_per_host=2, mig=LAB_MIG) as sim:
        use_simulator(monkeypatch, sim)
        monkeypatch.setenv("GOVC_PASSWORD", sim.password)
        monkeypatch.setenv("GPUVM_STATE_DIR", str(tmp_path / "state"))
        starter = tmp_path / "starter.yaml"

        written = gpuvm("init", starter)
        assert written.exit_code == 0, written.stderr
        assert "written (2 host(s), 4 VM(s))" in written.stdout
        text = starter.read_text()
        assert "#   0000:17:00.0  GA100 [A100 PCIe 80GB]  10de:20b5  NUMA 0  off" in text
        assert '# - address: "0000:4b:00.0"   # MT28908 Family [ConnectX-6], NUMA 0' in text
        assert "gpusim-pass" not in text and sim.password not in text
        assert gpuvm("validate", starter).exit_code == 0
        first = gpuvm("plan", starter, "--detailed-exitcode")
        assert first.exit_code == 0, first.stdout + text  # it describes the world as is

        kept = gpuvm("init", starter)
        assert kept.exit_code == 2 and "exists: pass --force to overwrite it" in kept.stderr
        assert starter.read_text() == text

        lab = vsphere_only(LAB_FILE, tmp_path / "lab.yaml")  # GPUs, NICs, vGPU and dynamic DirectPath in place
        assert gpuvm("apply", lab, "--yes", "--allow-host-reboot").exit_code == 0
        assert gpuvm("init", starter, "--force").exit_code == 0
        text = starter.read_text()
        assert 'gpus: {mode: passthrough, count: 2, addresses: ["0000:17:00.0", "0000:31:00.0"]}' in text
        assert 'gpus: {mode: vgpu, profile: "grid_a100d-3-40c", count: 1}' in text
        assert gpuvm("validate", starter).exit_code == 0
        replanned = gpuvm("plan", starter, "--detailed-exitcode")
        assert replanned.exit_code == 0, replanned.stdout
