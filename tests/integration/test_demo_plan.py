"""The plan example of the README and the user guide rests on tests/unit/data/demo_plan.json: it must
be what `gpuvm plan playbooks/lab.yaml --json` prints today on the lab `make demo` starts
(scripts/demo.sh: gpusim with two hosts, two VMs each, MIG on esx-02's GPUs 0 and 1, and fresh SSH
test hosts), guests included, so the example cannot go stale silently. When this fails because the plan changed on purpose, regenerate the
file from this run (`GPUVM_WRITE_DEMO_PLAN=1`) and update both examples and their summary lines
(tests/unit/test_readme_plan.py checks them against the file)."""

from __future__ import annotations

import json
import os

import pytest
from typer.testing import CliRunner

from gpusim import Simulator
from gpuvm.cli.main import app
from tests.integration.test_end_to_end import lab_for_bed
from tests.integration.vcenter import LAB_MIG, use_simulator
from tests.unit.demo_plan import DEMO_PLAN

pytestmark = pytest.mark.integration
KEYS = ("step", "target", "resource", "field", "before", "after", "disruption", "pending")


def test_the_demo_plan_the_readme_shows_is_todays(testbed, tmp_path, monkeypatch):
    testbed.up()  # fresh test hosts, as `make demo` starts them
    with Simulator(hosts=2, vms_per_host=2, mig=LAB_MIG) as sim:
        use_simulator(monkeypatch, sim, tmp_path / "state")
        result = CliRunner().invoke(app, ["plan", str(lab_for_bed(testbed, tmp_path / "lab.yaml")), "--json"],
                                    catch_exceptions=False)
    assert result.exit_code == 0, result.output
    live = json.loads(result.stdout)
    if os.environ.get("GPUVM_WRITE_DEMO_PLAN"):
        DEMO_PLAN.write_text(json.dumps({k: live[k] for k in ("changes", "notes", "summary")}, indent=2) + "\n")
    captured = json.loads(DEMO_PLAN.read_text())
    assert [{k: c[k] for k in KEYS} for c in live["changes"]] == [{k: c[k] for k in KEYS} for c in captured["changes"]]
    assert live["notes"] == captured["notes"]
    assert live["summary"] == captured["summary"]
