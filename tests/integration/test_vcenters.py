"""Several vCenters in one runbook, against two simulators: one plan, one apply, one verify, one exit code."""

from __future__ import annotations

import re

import pytest
from typer.testing import CliRunner

from gpusim import Simulator
from gpuvm.cli.main import app
from tests.integration.vcenter import raw_state, simulated_vcenters

pytestmark = pytest.mark.integration
SIDES = ("east", "west")


def gpuvm(*args: str):
    return CliRunner().invoke(app, list(args), catch_exceptions=False)


@pytest.fixture
def fleet(monkeypatch, tmp_path):
    """Two simulated vCenters (east-esx-01, west-esx-01), each with its own password and certificate,
    and a runbook naming both; govc's variables unset, so every setting comes from the runbook."""
    options = {side: dict(hosts=1, vms_per_host=2, rebind=True, host_prefix=f"{side}-") for side in SIDES}
    with simulated_vcenters(monkeypatch, tmp_path, options) as (sims, lines):
        lines.append("hosts:")
        lines += [f"  - {{name: {side}-esx-01, vcenter: {side}, passthrough: [{{model: A100}}]}}" for side in SIDES]
        lines.append("vms:")
        lines += [f"  - {{name: {side}-esx-01-vm1, host: {side}-esx-01, cpus: 8, memory_gb: 32, "
                  "gpus: {mode: passthrough, count: 1}}" for side in SIDES]
        runbook = tmp_path / "fleet.yaml"
        runbook.write_text("\n".join(lines) + "\n")
        yield runbook, sims


def _vm(sim: Simulator, side: str) -> dict:
    return raw_state(sim)[f"{side}-esx-01-vm1"]


def test_two_vcenters_are_planned_applied_and_verified_as_one(fleet):
    runbook, sims = fleet
    before = {side: raw_state(sim) for side, sim in sims.items()}
    planned = gpuvm("plan", str(runbook), "--detailed-exitcode")
    assert planned.exit_code == 2, planned.output
    for side in SIDES:  # each vCenter's host and VM, planned against its own inventory
        assert f"{side}-esx-01" in planned.output and f"{side}-esx-01-vm1" in planned.output
    assert {side: raw_state(sim) for side, sim in sims.items()} == before, "a dry run changed a vCenter"

    applied = gpuvm("apply", str(runbook), "--yes")
    assert applied.exit_code == 0, applied.output
    for side, sim in sims.items():
        vm = _vm(sim, side)
        assert vm["power"] == "poweredOn" and len(vm["pci"]) == 1, (side, vm)

    replanned = gpuvm("plan", str(runbook), "--detailed-exitcode")
    assert replanned.exit_code == 0 and "No changes" in replanned.output, replanned.output
    assert gpuvm("verify", str(runbook)).exit_code == 0


def test_target_a_vcenter_changes_only_its_hosts_and_vms(fleet):
    runbook, sims = fleet
    east_before = raw_state(sims["east"])
    planned = gpuvm("plan", str(runbook), "--target", "west", "--detailed-exitcode")
    assert planned.exit_code == 2, planned.output
    assert re.search(r"^west-esx-01-vm1$", planned.output, re.M) and not re.search(r"^east-", planned.output, re.M)
    assert "not targeted: 14 change(s) on east-esx-01, east-esx-01-vm1" in planned.output

    applied = gpuvm("apply", str(runbook), "--target", "west", "--yes")
    assert applied.exit_code == 0, applied.output
    assert _vm(sims["west"], "west")["power"] == "poweredOn"
    assert raw_state(sims["east"]) == east_before, "--target west changed vCenter east"
    assert gpuvm("verify", str(runbook), "--target", "west").exit_code == 0
    assert gpuvm("verify", str(runbook)).exit_code == 5  # east still differs from the runbook

    unknown = gpuvm("plan", str(runbook), "--target", "north")
    assert unknown.exit_code == 2 and "vCenters: east, west" in unknown.output, unknown.output


def test_a_vcenter_down_leaves_its_targets_not_observed_and_plans_the_other(fleet):
    runbook, sims = fleet
    sims["east"].stop()
    planned = gpuvm("plan", str(runbook))
    assert planned.exit_code == 3, planned.output
    assert "west-esx-01-vm1" in planned.output
    assert re.search(r"east-esx-01.*vCenter east not reached", planned.output), planned.output
    assert "Traceback" not in planned.output

    applied = gpuvm("apply", str(runbook), "--yes")
    assert applied.exit_code == 3, applied.output  # west applied; east not observed
    assert _vm(sims["west"], "west")["power"] == "poweredOn"
    verified = gpuvm("verify", str(runbook))
    assert verified.exit_code == 3 and "vCenter east not reached" in verified.output, verified.output


def test_one_vcenter_named_twice_is_refused_on_connect_and_nothing_is_touched(monkeypatch, tmp_path):
    """`east` and `west` are one simulator, reached as 127.0.0.1 and as localhost: the runbook cannot
    tell (it validates), the instance UUID can: plan and apply refuse it right after logging in (exit 2,
    naming both entries), before a lease or an intent is written (was: apply failed on its own lease,
    "gpuvm.lease.<run> exists already")."""
    from tests.integration.test_concurrent_applies import field_names

    options = {"east": dict(hosts=2, vms_per_host=0, rebind=True)}
    with simulated_vcenters(monkeypatch, tmp_path, options) as (sims, lines):
        sim = sims["east"]
        lines.append(lines[1].replace("name: east", "name: west").replace("127.0.0.1", "localhost"))
        lines += ["hosts:", "  - {name: esx-01, vcenter: east, passthrough: [{model: A100}]}",
                  "  - {name: esx-02, vcenter: west, passthrough: [{model: A100}]}"]
        runbook = tmp_path / "twice.yaml"
        runbook.write_text("\n".join(lines) + "\n")
        assert "localhost" in runbook.read_text() and "127.0.0.1" in runbook.read_text()
        before = raw_state(sim)
        assert gpuvm("validate", str(runbook)).exit_code == 0
        for command in (["plan"], ["apply", "--yes"]):
            refused = gpuvm(*command, str(runbook))
            assert refused.exit_code == 2, refused.output
            assert re.search(r"twice\.yaml:3: vcenters\[1\]: vCenter 'west' \(https://localhost:\d+/sdk\) is vCenter "
                             r"'east' \(\S*twice\.yaml:2: vcenters\[0\], https://127\.0\.0\.1:\d+/sdk\) again: the same "
                             r"instance", " ".join(refused.output.split())), refused.output
        assert raw_state(sim) == before
        assert not [name for name in field_names(sim) if name.startswith("gpuvm.")]
