"""Names unique per vCenter, against two simulators built alike: both hold `esx-01` (and its VM
`esx-01-vm1`), and the runbook clones a `gpu-vm-01` into each. Shown and targeted as `east/esx-01`,
`west/gpu-vm-01`; named in vCenter as written."""

from __future__ import annotations

import json
import re

import pytest

from tests.integration.test_vcenters import SIDES, gpuvm
from tests.integration.vcenter import raw_state, simulated_vcenters
from tests.schema_check import check

pytestmark = pytest.mark.integration


@pytest.fixture
def twins(monkeypatch, tmp_path):
    """Two simulated vCenters with the same names in each (no host prefix), and a runbook naming both."""
    options = {side: dict(hosts=1, vms_per_host=1, rebind=True, templates=["ubuntu-gpu"]) for side in SIDES}
    with simulated_vcenters(monkeypatch, tmp_path, options) as (sims, lines):
        lines.append("hosts:")
        lines += [f"  - {{name: esx-01, vcenter: {side}, passthrough: [{{model: A100}}]}}" for side in SIDES]
        lines.append("vms:")
        for side in SIDES:
            lines.append(f"  - {{name: gpu-vm-01, host: esx-01, vcenter: {side}, template: ubuntu-gpu, cpus: 8, "
                         "memory_gb: 32, gpus: {mode: passthrough, count: 1}}")
            lines.append(f"  - {{name: esx-01-vm1, host: {side}/esx-01, cpus: 4}}")
        runbook = tmp_path / "twins.yaml"
        runbook.write_text("\n".join(lines) + "\n")
        yield runbook, sims


def test_same_names_in_two_vcenters_are_planned_applied_and_verified_qualified(twins, tmp_path):
    runbook, sims = twins
    assert gpuvm("validate", str(runbook)).exit_code == 0
    before = {side: raw_state(sim) for side, sim in sims.items()}
    planned = gpuvm("plan", str(runbook), "--json")
    assert planned.exit_code == 0, planned.output
    targets = {c["target"] for c in json.loads(planned.output)["changes"]}
    assert targets == {f"{side}/{name}" for side in SIDES for name in ("esx-01", "gpu-vm-01", "esx-01-vm1")}
    assert {side: raw_state(sim) for side, sim in sims.items()} == before, "a dry run changed a vCenter"

    applied = gpuvm("apply", str(runbook), "--yes", "--allow-power-off")
    assert applied.exit_code == 0, applied.output
    assert "east/gpu-vm-01" in applied.output and "west/gpu-vm-01" in applied.output
    for side, sim in sims.items():  # named in vCenter as written, not as gpuvm shows them
        state = raw_state(sim)
        assert not [name for name in state if "/" in name], state.keys()
        assert state["gpu-vm-01"]["power"] == "poweredOn" and len(state["gpu-vm-01"]["pci"]) == 1, (side, state)
    journal = "".join(p.read_text() for p in (tmp_path / "state").rglob("*.jsonl"))
    assert '"east/gpu-vm-01"' in journal and '"west/esx-01"' in journal

    replanned = gpuvm("plan", str(runbook), "--detailed-exitcode")
    assert replanned.exit_code == 0 and "No changes" in replanned.output, replanned.output
    assert gpuvm("verify", str(runbook)).exit_code == 0

    listed = gpuvm("inventory", str(runbook), "--json")  # and inventoried: every object, each named
    assert listed.exit_code == 0, listed.output
    document = json.loads(listed.stdout)
    assert check(document) == "inventory"
    assert {(h["name"], h["vcenter"]) for h in document["hosts"]} == {(f"{side}/esx-01", side) for side in SIDES}
    assert {(v["name"], v["host"], v["vcenter"]) for v in document["vms"]} == {
        (f"{side}/{name}", f"{side}/esx-01", side) for side in SIDES for name in ("gpu-vm-01", "esx-01-vm1")}
    shown = gpuvm("inventory", str(runbook))
    assert shown.exit_code == 0 and all(f"{side}/gpu-vm-01" in shown.stdout for side in SIDES), shown.output


def test_target_a_qualified_host_plans_only_its_vcenters_and_a_bare_shared_name_is_refused(twins):
    runbook, _ = twins
    west = gpuvm("plan", str(runbook), "--json", "--target", "west/esx-01")
    assert west.exit_code == 0, west.output
    assert {c["target"] for c in json.loads(west.output)["changes"]} == \
        {"west/esx-01", "west/gpu-vm-01", "west/esx-01-vm1"}

    ambiguous = gpuvm("plan", str(runbook), "--target", "esx-01")
    assert ambiguous.exit_code == 2
    assert "--target esx-01: a name in several vCenters; give one of east/esx-01, west/esx-01" in ambiguous.output


def test_inventory_qualifies_a_name_two_vcenters_hold_and_never_shows_one_for_a_vcenter_not_reached(twins, tmp_path):
    """A runbook naming east's esx-01 only: west's esx-01 is shown too, as west/esx-01 (and east's as
    east/esx-01); with east not reached, a warning naming it, exit 3, and west's esx-01 never shown as
    the runbook's esx-01."""
    runbook, sims = twins
    vcenters = runbook.read_text().split("hosts:")[0]
    east_only = tmp_path / "east-only.yaml"
    east_only.write_text(vcenters + "hosts:\n  - {name: esx-01, vcenter: east}\n")
    both = gpuvm("inventory", str(east_only), "--json")
    assert both.exit_code == 0, both.output
    assert sorted(h["name"] for h in json.loads(both.stdout)["hosts"]) == ["east/esx-01", "west/esx-01"]

    east_down = tmp_path / "east-down.yaml"
    east_down.write_text(east_only.read_text().replace(sims["east"].url, "https://127.0.0.1:1/sdk"))
    for args in ((), ("--json",)):
        shown = gpuvm("inventory", str(east_down), *args)
        assert shown.exit_code == 3, shown.output
        assert "vCenter east not reached" in shown.stderr and "esx-01" in shown.stderr, shown.stderr
    document = json.loads(shown.stdout)
    assert check(document) == "inventory" and list(document["not_reached"]) == ["east"]
    assert any("vCenter east not reached" in w for w in document["warnings"])
    assert [(h["name"], h["vcenter"]) for h in document["hosts"]] == [("west/esx-01", "west")]
    assert {v["host"] for v in document["vms"]} == {"west/esx-01"}
    text = gpuvm("inventory", str(east_down)).stdout
    assert "west/esx-01" in text and not re.search(r"(?<![/\w-])esx-01(?![\w-])", text), text
