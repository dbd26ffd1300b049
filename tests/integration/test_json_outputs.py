"""Every `--json` output, from real runs against the simulator (and a local benchmark campaign),
validated against its schema in src/gpuvm/schemas/."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from jsonschema import ValidationError
from typer.testing import CliRunner

from gpusim import Simulator
from gpuvm.cli.main import app
from tests.integration.test_vsphere_flow import LAB_FILE, vsphere_only
from tests.integration.vcenter import LAB_MIG, use_simulator
from tests.schema_check import check

pytestmark = pytest.mark.integration
REPO = Path(__file__).parents[2]


def gpuvm(*args: object):
    return CliRunner().invoke(app, [str(a) for a in args], catch_exceptions=False)


@pytest.fixture
def lab(monkeypatch, tmp_path):
    with Simulator(hosts=2, vms_per_host=2, mig=LAB_MIG) as sim:
        use_simulator(monkeypatch, sim, tmp_path / "state")
        yield vsphere_only(LAB_FILE, tmp_path / "lab.yaml")


def test_inventory_plan_apply_verify_print_documents_their_schemas_accept(lab):
    inventory = gpuvm("inventory", lab, "--json")
    assert inventory.exit_code == 0, inventory.stderr
    data = json.loads(inventory.stdout)
    assert check(data) == "inventory"
    gpus = [d for h in data["hosts"] for d in h["devices"] if d["kind"] == "gpu"]
    assert len(gpus) == 8 and {d["numa_node"] for d in gpus} == {0, 1}

    drift = gpuvm("verify", lab, "--json")
    assert drift.exit_code == 5
    drifted = json.loads(drift.stdout)
    assert check(drifted) == "verify" and drifted["drift"] and drifted["changes"]

    planned = gpuvm("plan", lab, "--json")
    plan = json.loads(planned.stdout)
    assert check(plan) == "plan" and plan["summary"]["changes"] == len(plan["changes"]) > 0
    assert plan["changes"] == drifted["changes"]

    applied = gpuvm("apply", lab, "--json", "--yes", "--allow-host-reboot")
    assert applied.exit_code == 0, applied.stderr
    events = [json.loads(line) for line in applied.stdout.splitlines()]  # one document a line
    assert [check(e) for e in events] == ["apply"] * len(events)
    assert events[0]["event"] == "plan" and events[0]["changes"] == plan["changes"]
    assert {e["state"] for e in events if e["event"] == "progress"} >= {"started", "done"}
    assert events[-1]["event"] == "summary"
    assert events[-1]["changes_done"] == events[-1]["changes_planned"] == len(plan["changes"])

    clean = gpuvm("verify", lab, "--json")
    assert clean.exit_code == 0, clean.stderr
    assert check(json.loads(clean.stdout)) == "verify" and not json.loads(clean.stdout)["drift"]
    again = gpuvm("apply", lab, "--json", "--yes")
    assert [json.loads(line)["event"] for line in again.stdout.splitlines()] == ["plan", "summary"]
    assert json.loads(again.stdout.splitlines()[-1])["applied"] is False


def test_bench_compare_and_run_print_documents_their_schemas_accept(tmp_path):
    compared = gpuvm("bench", "compare", REPO / "playbooks/results/study-vm",
                     "--baseline", REPO / "playbooks/results/study-baremetal.yaml", "--json")
    assert compared.exit_code == 0, compared.stderr
    comparison = json.loads(compared.stdout)
    assert check(comparison) == "bench-compare"
    [scaling] = [b for b in comparison["benchmarks"] if b["name"] == "resnet50-scaling"]
    point = scaling["points"][-1]
    assert point["label"] == "4 nodes" and round(point["overhead"], 3) == 0.013  # the README's 1.3 %

    runbook = tmp_path / "local.yaml"
    runbook.write_text("""\
benchmarks:
  runs:
    - {name: echo, kind: command, launch: none, command: "echo took 1.5", pattern: "took ([0-9.]+)", repeats: 2}
    - {name: broken, kind: command, launch: none, command: "false", pattern: "took ([0-9.]+)", repeats: 1}
""")
    ran = gpuvm("bench", "run", runbook, "--local", "--json", "--out", tmp_path / "out")
    assert ran.exit_code == 6, ran.stderr
    campaign = json.loads(ran.stdout)
    assert check(campaign) == "bench-run"
    assert campaign["runs_done"] == 3 and [f["bench"] for f in campaign["failures"]] == ["broken"]
    assert Path(campaign["results"]).is_file()


def test_a_document_that_breaks_its_schema_is_refused():
    with pytest.raises(ValidationError):
        check({"schema": "gpuvm.plan/1", "changes": [{"step": "vm.power"}], "notes": [], "summary": {},
               "not_observed": {}})
