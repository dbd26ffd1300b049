"""One SSH mesh over the guests of two vCenters (two simulators, the test bed's four guests): guest steps
run once over every guest, whatever vCenter its VM is in; a vCenter down leaves its guests in their
peers' mesh at their last verified place."""

from __future__ import annotations

import pytest

from gpuvm.journal import state_dir
from gpuvm.remote import build_cluster
from gpuvm.runbook.loader import load_runbook
from tests.integration.test_guest_ssh_mesh import HOME, _reset
from tests.integration.test_vcenters import SIDES, gpuvm
from tests.integration.vcenter import simulated_vcenters

pytestmark = pytest.mark.integration
GUESTS = {f"{side}-esx-01-vm{i}": f"gpu-vm-0{2 * n + i}" for n, side in enumerate(SIDES) for i in (1, 2)}


@pytest.fixture
def mesh(monkeypatch, tmp_path, testbed):
    """Two vCenters (east, west) with two VMs each, every VM's guest one of the bed's, all in one mesh."""
    options = {side: dict(hosts=1, vms_per_host=2, rebind=True, host_prefix=f"{side}-") for side in SIDES}
    with simulated_vcenters(monkeypatch, tmp_path, options) as (sims, lines):
        lines.append(f"ssh: {{known_hosts: {testbed.known_hosts_file}, connect_timeout: 5, command_timeout: 60}}")
        lines += ["hosts:", *(f"  - {{name: {side}-esx-01, vcenter: {side}}}" for side in SIDES)]
        lines += ["vms:", *(f"  - {{name: {vm}, host: {vm[:-4]}}}" for vm in GUESTS)]
        lines += ["guests:", "  ssh_mesh: {}", "  hosts:"]
        lines += [f"    - {{vm: {vm}, ssh: {{address: {testbed.address(bed)}, user: gpuadmin, "
                  f"key_file: {testbed.client_key}}}}}" for vm, bed in GUESTS.items()]
        runbook = tmp_path / "mesh.yaml"
        runbook.write_text("\n".join(lines) + "\n")
        cluster = build_cluster(load_runbook(runbook), state_dir(tmp_path / "state"))
        try:
            yield runbook, sims, cluster
        finally:
            _reset(cluster)
            cluster.close()


def _mesh_files(cluster, guest: str) -> str:
    return cluster.executors[guest].run_script(f"cat {HOME}/config {HOME}/known_hosts").stdout


def _logs_in(cluster, origin: str, peer: str) -> bool:
    """The mesh user of `origin` logs in to `peer` as a user would: plain ssh, its ~/.ssh/config choosing the key."""
    address = cluster.targets[peer].login.address
    result = cluster.executors[origin].run_script(f"ssh -o BatchMode=yes -o ConnectTimeout=5 {address} true </dev/null",
                                                  check=False)
    return result.exit_code == 0


def test_the_first_apply_meshes_the_guests_of_both_vcenters(mesh):
    runbook, _, cluster = mesh
    applied = gpuvm("apply", str(runbook), "--yes")
    assert applied.exit_code == 0, applied.output  # was 4: each vCenter's guests written and checked alone
    assert all(_logs_in(cluster, a, b) for a in GUESTS for b in GUESTS if a != b)
    verified = gpuvm("verify", str(runbook))
    assert verified.exit_code == 0 and "SSH mesh: all 4 guests reach each other." in verified.output, verified.output


def test_a_vcenter_down_keeps_its_guests_in_their_peers_mesh(mesh):
    runbook, sims, cluster = mesh
    assert gpuvm("apply", str(runbook), "--yes").exit_code == 0
    east = [vm for vm in GUESTS if vm.startswith("east-")]
    before = {vm: _mesh_files(cluster, vm) for vm in east}
    sims["west"].stop()

    planned = gpuvm("plan", str(runbook))
    assert planned.exit_code == 3 and "guest.ssh_mesh" not in planned.output, planned.output
    applied = gpuvm("apply", str(runbook), "--yes")
    assert applied.exit_code == 3 and "vCenter west not reached" in applied.output, applied.output
    assert {vm: _mesh_files(cluster, vm) for vm in east} == before, "the mesh files of east's guests were rewritten"
    assert all(_logs_in(cluster, a, b) for a in east for b in GUESTS if a != b)  # west's guests still run
