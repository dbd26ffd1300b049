"""`gpuvm plan` run as its own process (`python -m gpuvm.cli.main`, as the console script runs it),
which ends without the interpreter's teardown (gpuvm.collector, cli/common.finish): what it prints
is whole and its exit status is the plan's, as when its command runs inside a caller (CliRunner)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from gpusim import Simulator
from gpuvm.cli.main import app
from tests.integration.test_vsphere_flow import LAB_FILE, vsphere_only
from tests.integration.vcenter import LAB_MIG, use_simulator

pytestmark = pytest.mark.integration


def test_plan_as_a_process_prints_the_whole_plan_and_exits_with_its_status(monkeypatch, tmp_path):
    with Simulator(hosts=2, vms_per_host=2, mig=LAB_MIG) as sim:
        use_simulator(monkeypatch, sim, tmp_path / "state")
        lab = vsphere_only(LAB_FILE, tmp_path / "lab.yaml")
        args = ["plan", str(lab), "--detailed-exitcode"]
        process = subprocess.run([sys.executable, "-m", "gpuvm.cli.main", *args], capture_output=True,
                                 text=True, env={**os.environ, "COLUMNS": "200"}, timeout=120)
        inside = CliRunner().invoke(app, args, env={"COLUMNS": "200"}, catch_exceptions=False)
    assert process.returncode == inside.exit_code == 2, process.stderr  # changes to make
    assert process.stdout == inside.stdout  # flushed before the process ended: nothing lost
    assert process.stdout.splitlines()[-1].startswith("Plan: ")
