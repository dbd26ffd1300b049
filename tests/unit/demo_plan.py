"""The demo's plan (`gpuvm plan playbooks/lab.yaml --json` on the simulator and the SSH test hosts, as
scripts/demo.sh runs it), captured in data/demo_plan.json, as a Plan again."""

from __future__ import annotations

import json
from pathlib import Path

from gpuvm.plan import Change, Disruption, Note, Plan

DEMO_PLAN = Path(__file__).parent / "data" / "demo_plan.json"
_APPLIED = object()  # an action: the change is carried out by its step (not pending)


def demo_plan() -> Plan:
    data = json.loads(DEMO_PLAN.read_text())
    changes = [Change(c["step"], c["target"], c["resource"], c["field"], c["before"], c["after"],
                      Disruption(c["disruption"]), None if c["pending"] else _APPLIED) for c in data["changes"]]
    return Plan(changes=changes, notes=[Note(**n) for n in data["notes"]])
