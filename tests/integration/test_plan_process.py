"""`gpuvm plan` and `gpuvm inventory` run as their own process (`python -m gpuvm.cli.main`, as the
console script runs it), which ends without the interpreter's teardown (gpuvm.collector,
cli/common.finish): what it prints is whole and its exit status is the command's, as when the same
command ends the usual way (its click command called directly, which is not the process:
`Gpuvm.__call__` is bypassed)."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from gpusim import Simulator
from tests.integration.test_vsphere_flow import LAB_FILE, vsphere_only
from tests.integration.vcenter import LAB_MIG, use_simulator

pytestmark = pytest.mark.integration
USUAL_END = "import sys, typer.main; from gpuvm.cli.main import app; typer.main.get_command(app)(sys.argv[1:])"


@pytest.mark.parametrize("form", [["--json"], ["--format", "text"]])  # print()'s buffer; rich flushes its own
def test_plan_as_a_process_prints_the_whole_plan_and_exits_with_its_status(monkeypatch, tmp_path, form):
    with Simulator(hosts=2, vms_per_host=2, mig=LAB_MIG) as sim:
        use_simulator(monkeypatch, sim, tmp_path / "state")
        args = ["plan", str(vsphere_only(LAB_FILE, tmp_path / "lab.yaml")), "--detailed-exitcode", *form]
        env = {**{k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}, "COLUMNS": "200"}  # buffered, as a user runs it
        process, usual = (subprocess.run([sys.executable, *start, *args], capture_output=True, text=True, env=env,
                                         timeout=120) for start in (["-m", "gpuvm.cli.main"], ["-c", USUAL_END]))
    assert process.returncode == usual.returncode == 2, process.stderr  # changes to make
    assert process.stdout == usual.stdout and process.stdout.strip()  # flushed before the process ended


@pytest.mark.parametrize("form", [["--json"], []])
def test_inventory_as_a_process_prints_it_whole_and_saves_the_whole_snapshot(monkeypatch, tmp_path, form):
    """`inventory` ends its process as `plan` does (its thousands of objects left to the OS)."""
    saved = tmp_path / "snapshot.json"
    outputs = []
    with Simulator(hosts=2, vms_per_host=2, mig=LAB_MIG) as sim:
        use_simulator(monkeypatch, sim, tmp_path / "state")
        args = ["inventory", str(vsphere_only(LAB_FILE, tmp_path / "lab.yaml")), "--save", str(saved), *form]
        env = {**{k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}, "COLUMNS": "200"}
        for start in (["-m", "gpuvm.cli.main"], ["-c", USUAL_END]):
            done = subprocess.run([sys.executable, *start, *args], capture_output=True, text=True, env=env, timeout=120)
            outputs.append((done, re.sub(r'"taken": "[^"]+"', "", saved.read_text())))
            saved.unlink()
    (process, process_saved), (usual, usual_saved) = outputs
    assert process.returncode == usual.returncode == 0, process.stderr
    untimed = [re.sub(r'"taken": "[^"]+"', "", done.stdout) for done in (process, usual)]
    assert untimed[0] == untimed[1] and "esx-01" in untimed[0]  # flushed before the process ended
    assert process_saved == usual_saved and '"vms"' in process_saved
