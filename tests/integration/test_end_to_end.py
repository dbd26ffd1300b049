"""The whole pipeline on the simulator plus the SSH test hosts, through the real CLI.

validate → plan → apply (hosts, VMs, guests) → re-plan empty → verify clean, on the lab runbook
(playbooks/lab.yaml) with its key and known_hosts paths pointed at this session's test bed.
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

import pytest
from ruamel.yaml import YAML
from typer.testing import CliRunner

from gpuvm.cli.main import app
from gpuvm.simulator import Simulator
from tests.integration.vcenter import env_for, raw_state

pytestmark = pytest.mark.integration
REPO = Path(__file__).parents[2]


def lab_for_bed(bed, target: Path) -> Path:
    yaml = YAML()
    data = yaml.load((REPO / "playbooks" / "lab.yaml").read_text())
    data["ssh"]["known_hosts"] = str(bed.known_hosts_file)
    for entry in data["hosts"] + data["guests"]["hosts"]:
        if "ssh" in entry:
            entry["ssh"]["key_file"] = str(bed.client_key)
    with target.open("w") as out:
        yaml.dump(data, out)
    return target


@pytest.fixture
def lab(testbed, tmp_path, monkeypatch):
    hook = f"{shlex.quote(sys.executable)} {REPO / 'testbed' / 'bed.py'} reboot \"$GPUSIM_HOST\" --root {testbed.root}"
    with Simulator(hosts=2, vms_per_host=2, on_reboot=hook) as sim:
        for key, value in env_for(sim).items():
            monkeypatch.setenv(key, value)
        monkeypatch.setenv("GPUVM_STATE_DIR", str(tmp_path / "state"))
        yield sim, lab_for_bed(testbed, tmp_path / "lab.yaml")


def gpuvm(*args: str):
    return CliRunner().invoke(app, list(args), catch_exceptions=False)


def test_full_pipeline(lab, testbed):
    sim, runbook = lab
    assert gpuvm("validate", str(runbook)).exit_code == 0

    before_vc, before_bed = raw_state(sim), {h.name: testbed.state(h.name) for h in testbed.hosts}
    planned = gpuvm("plan", str(runbook), "--detailed-exitcode")
    assert planned.exit_code == 2, planned.output
    assert "esxi.ats" in planned.output
    assert raw_state(sim) == before_vc
    assert {h.name: testbed.state(h.name) for h in testbed.hosts} == before_bed, "a dry run changed a test host"

    applied = gpuvm("apply", str(runbook), "--yes", "--allow-host-reboot")
    assert applied.exit_code == 0, applied.output
    assert testbed.state("esx-01")["kernel"]["atsSupport"]["runtime"] == "TRUE"  # set, then the reboot took it

    again = gpuvm("plan", str(runbook), "--detailed-exitcode")
    assert again.exit_code == 0, again.output
    assert gpuvm("verify", str(runbook)).exit_code == 0
