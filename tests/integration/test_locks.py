"""`gpuvm locks` (issue 34), against the simulator: the lease and locks of an apply killed outright
(SIGKILL, lease of 300 s) are listed with its run, refuse the next apply (exit 7) until broken, and once
`--break` ends them the next apply proceeds at once; its intents stay listed for that apply to finish.
Breaking the lease of a run still alive stops it at its next change (exit 8)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from contextlib import ExitStack

import pytest

from gpusim import Simulator
from gpuvm.vsphere.lock import HostLocks
from gpuvm.vsphere.session import Session, Target
from tests.integration.vcenter import simulated_vcenters, use_simulator
from tests.integration.test_reboot_kills import BOUNDARIES, FLAGS, RUNBOOK, entries, gpuvm
from tests.schema_check import check

pytestmark = pytest.mark.integration

INTENT = BOUNDARIES["intent-recorded"]  # the run holds its locks by then


def start_apply(runbook, journal, ttl: str) -> tuple[subprocess.Popen, str]:
    """An apply in a process of its own, once it has recorded its intent to enter maintenance mode (its
    locks held), and its run id."""
    run = subprocess.Popen([sys.executable, "-m", "gpuvm.cli.main", "apply", str(runbook), *FLAGS],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           env=dict(os.environ, GPUVM_LOCK_TTL=ttl))
    deadline = time.monotonic() + 30
    while not (found := [e for e in entries(journal) if INTENT.items() <= e.items()]):
        assert run.poll() is None and time.monotonic() < deadline, run.communicate()[0]
        time.sleep(0.002)
    return run, found[0]["run"]


def listed(runbook) -> list[dict]:
    shown = gpuvm("locks", str(runbook), "--json")
    assert shown.exit_code == 0, shown.output
    document = json.loads(shown.output)
    assert check(document) == "locks"
    return document["rows"]


@pytest.fixture
def runbook(tmp_path):
    path = tmp_path / "rb.yaml"
    path.write_text(RUNBOOK)
    return path


def test_the_lease_of_a_killed_apply_is_listed_and_broken_so_the_next_apply_proceeds_at_once(runbook, tmp_path,
                                                                                          monkeypatch):
    journal = tmp_path / "state" / "journal.jsonl"
    with Simulator(hosts=1, vms_per_host=2, vm_power="on", latency={"EnterMaintenanceMode_Task": "2s"}) as sim:
        use_simulator(monkeypatch, sim, tmp_path / "state")
        run, killed = start_apply(runbook, journal, ttl="300")
        run.send_signal(signal.SIGKILL)
        run.communicate(timeout=30)

        rows = listed(runbook)
        mine = {(row["kind"], row["object"]) for row in rows if row["run"] == killed}
        assert {("lease", killed), ("lock", "esx-01"), ("intent", "esx-01")} <= mine, rows
        assert all(row["state"] == "live" for row in rows if row["run"] == killed and row["kind"] != "intent"), rows
        table = gpuvm("locks", str(runbook))
        assert table.exit_code == 0 and killed in table.output and "esx-01" in table.output, table.output

        refused = gpuvm("apply", str(runbook), *FLAGS)
        assert refused.exit_code == 7 and "locked by another gpuvm run" in refused.output, refused.output

        unknown = gpuvm("locks", str(runbook), "--break", "0123456789ab", "--yes")
        assert unknown.exit_code == 2 and killed in unknown.output, unknown.output
        asked = gpuvm("locks", str(runbook), "--break", killed)  # no terminal: refused with a hint
        assert asked.exit_code == 2 and "--yes" in asked.output, asked.output
        assert {("lease", killed), ("lock", "esx-01")} <= {(r["kind"], r["object"]) for r in listed(runbook)}

        broken = gpuvm("locks", str(runbook), "--break", killed, "--yes")
        assert broken.exit_code == 0, broken.output
        assert "intents stay" in broken.output, broken.output
        left = listed(runbook)
        assert not [row for row in left if row["run"] == killed and row["kind"] in ("lease", "lock")], left
        assert ("intent", "esx-01") in {(r["kind"], r["object"]) for r in left if r["run"] == killed}, left
        assert any(e["status"] == "locks-broken" and e["broken_run"] == killed and e["who"] for e in entries(journal))

        again = gpuvm("apply", str(runbook), *FLAGS)  # at once: no wait for the lease of 300 s
        assert again.exit_code == 0, again.output
        assert not [row for row in listed(runbook) if row["run"] == killed], "the apply finished the killed run's act"


def test_breaking_the_lease_of_a_live_apply_stops_it_at_its_next_change_with_exit_8(runbook, tmp_path, monkeypatch):
    journal = tmp_path / "state" / "journal.jsonl"
    with Simulator(hosts=1, vms_per_host=2, vm_power="on", latency={"EnterMaintenanceMode_Task": "4s"}) as sim:
        use_simulator(monkeypatch, sim, tmp_path / "state")
        run, live = start_apply(runbook, journal, ttl="3")  # renewed (and the fence checked) every second
        broken = gpuvm("locks", str(runbook), "--break", live, "--yes")
        assert broken.exit_code == 0, broken.output
        output = run.communicate(timeout=60)[0]
        assert run.returncode == 8, output
        assert "lease" in output and "lost" in output, output


def test_a_fleet_runbook_lists_and_breaks_a_run_in_every_vcenter_each_row_naming_its_vcenter(tmp_path, monkeypatch):
    sides = ("east", "west")
    options = {side: dict(hosts=1, vms_per_host=1, host_prefix=f"{side}-") for side in sides}
    with simulated_vcenters(monkeypatch, tmp_path, options) as (sims, lines):
        lines += ["hosts:", *(f"  - {{name: {side}-esx-01, vcenter: {side}}}" for side in sides)]
        runbook = tmp_path / "fleet.yaml"
        runbook.write_text("\n".join(lines) + "\n")
        run = "0123456789ab"
        with ExitStack() as stack:
            holders = []
            for side in sides:
                sim = sims[side]
                session = stack.enter_context(Session(Target(host=sim.host, port=sim.port, path="/sdk",
                                                             user=sim.username, password=sim.password,
                                                             insecure=False, ca_file=sim.cert_file)))
                holders.append(stack.enter_context(HostLocks(session, [f"{side}-esx-01"], run, ttl=300)))
            rows = listed(runbook)
            assert {(r["vcenter"], r["kind"], r["object"]) for r in rows if r["run"] == run} == {
                *((side, "lease", run) for side in sides), *((side, "lock", f"{side}-esx-01") for side in sides)}
            table = gpuvm("locks", str(runbook))
            assert table.exit_code == 0 and "vcenter" in table.output and "west" in table.output, table.output

            broken = gpuvm("locks", str(runbook), "--break", run, "--yes", "--json")
            assert broken.exit_code == 0, broken.output
            document = json.loads(broken.stdout)
            assert check(document) == "locks" and document["broken"]["run"] == run
            assert document["broken"]["removed"] == {side: [f"lease gpuvm.lease.{run}", f"the lock of host {side}-esx-01"]
                                                     for side in sides}
            assert not [r for r in listed(runbook) if r["run"] == run]
            for held in holders:
                held._renew_once()  # its next renewal: the fence finds its lease gone
                assert held.lost is not None and "removed in vCenter" in held.lost
