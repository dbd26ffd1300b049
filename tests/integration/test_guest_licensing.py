"""guest.licensing against the SSH test bed: the stand-in nvidia-gridd (systemctl restart) leases a
licence only from a token in /etc/nvidia/ClientConfigToken with the FeatureType the guest's GPU kind
needs, and the stand-in `nvidia-smi -q` reports it; so plan → apply → re-plan is empty for real, on a
vGPU guest and a passthrough guest licensed for vCS, both logged in as a non-root user."""

from __future__ import annotations

import shutil
import stat

import pytest
from typer.testing import CliRunner

from gpuvm.cli.main import app
from gpuvm.errors import RemoteCommandError
from gpuvm.executors.group import run_group
from gpuvm.remote import build_cluster
from gpuvm.runbook.loader import load_runbook
from gpuvm.steps import guest_licensing
from gpuvm.steps.base import Context
from tests.integration.vcenter import guest_ssh
import _gpuvm_fake as fake  # the test bed's stand-in state (testbed/bin)

pytestmark = pytest.mark.integration

GUESTS = {"gpu-vm-01": "vgpu", "gpu-vm-02": "vcs"}
TOKEN = "eyJhbGciOiJSUzI1NiJ9.bed-licence-token-0123456789.c2lnbmF0dXJl\n"
STEP = guest_licensing.STEP


@pytest.fixture
def bed(testbed):
    for name, kind in GUESTS.items():
        testbed.set_state(name, "licensing", {"kind": kind})
        nvidia = testbed.host_dir(name) / "etc" / "nvidia"
        nvidia.mkdir(parents=True, exist_ok=True)
        (nvidia / "gridd.conf.template").write_text("# NVIDIA's template\nFeatureType=0\nEnableUI=FALSE\n")
    yield testbed
    for name in GUESTS:
        with testbed._state_env(name), fake.locked_state() as state:
            state.pop("licensing", None)
            state.pop("gridd", None)
        shutil.rmtree(testbed.host_dir(name) / "etc" / "nvidia", ignore_errors=True)


def cluster_for(bed, tmp_path, token: str = TOKEN, acquire_timeout: float = 120):
    (tmp_path / "nls.tok").write_text(token)
    path = tmp_path / "runbook.yaml"
    path.write_text(
        f"ssh: {{known_hosts: {bed.known_hosts_file}}}\nhosts: [{{name: esx-01}}]\n"
        "vms: [{name: gpu-vm-01, host: esx-01, gpus: {mode: vgpu, profile: grid_a100-40c}},\n"
        "      {name: gpu-vm-02, host: esx-01, gpus: {mode: passthrough, count: 1}}]\n"
        f"guests:\n  licensing: {{token_file: nls.tok, passthrough: vcs, acquire_timeout: {acquire_timeout}}}\n"
        "  hosts:\n" + "".join(f"  - {{vm: {g}, ssh: {guest_ssh(bed, g)}}}\n" for g in GUESTS))
    return build_cluster(load_runbook(path), tmp_path / "state")


def plan_all(cluster):
    ctx = Context(cluster=cluster)
    return run_group({g: g for g in GUESTS},
                     lambda name: STEP.plan(cluster.targets[name], STEP.observe(ctx, cluster.targets[name]))).raise_failures()


def test_licensed_then_nothing_to_do_and_a_removed_token_is_drift(bed, tmp_path):
    cluster = cluster_for(bed, tmp_path)
    assert all(cluster.targets[g].login.user != "root" for g in GUESTS)  # root's commands go through sudo
    planned = plan_all(cluster)
    assert {g: [(c.resource, c.field, c.after) for c in cs][1:] for g, cs in planned.items()} == {
        "gpu-vm-01": [("/etc/nvidia/gridd.conf", "FeatureType", "1"), ("licence (nvidia-gridd)", "License Status", "Licensed")],
        "gpu-vm-02": [("/etc/nvidia/gridd.conf", "FeatureType", "4"), ("licence (nvidia-gridd)", "License Status", "Licensed")],
    }
    assert all(TOKEN.strip() not in str(c.to_dict()) for cs in planned.values() for c in cs)  # a digest only

    ctx = Context(cluster=cluster)
    run_group({g: g for g in GUESTS}, lambda name: STEP.apply(ctx, cluster.targets[name], planned[name])).raise_failures()
    assert plan_all(cluster) == {g: [] for g in GUESTS}
    for name in GUESTS:
        token = bed.host_dir(name) / "etc" / "nvidia" / "ClientConfigToken" / "client_configuration_token_gpuvm.tok"
        assert token.read_text() == TOKEN and stat.S_IMODE(token.stat().st_mode) == 0o744
        conf = (bed.host_dir(name) / "etc" / "nvidia" / "gridd.conf").read_text()
        assert "EnableUI=FALSE" in conf  # started from the driver's template, its other settings kept
        assert bed.state(name)["gridd"]["token"] == "client_configuration_token_gpuvm.tok"

    token.unlink()  # gpu-vm-02's token is gone: the lease it held is no longer reported
    replanned = plan_all(cluster)
    assert replanned["gpu-vm-01"] == []
    assert [(c.field, c.before) for c in replanned["gpu-vm-02"]] == [
        ("token", None), ("License Status", "unlicensed (License Status: Unlicensed (Restricted))")]


def test_a_token_the_server_did_not_issue_fails_naming_the_licence(bed, tmp_path):
    """nvidia-gridd leases nothing with a token its server did not issue: apply waits acquire_timeout,
    then fails saying what nvidia-smi reports."""
    bed.set_state("gpu-vm-01", "licensing", {"kind": "vgpu", "token_sha256": "0" * 64})
    cluster = cluster_for(bed, tmp_path, acquire_timeout=0.1)
    target = cluster.targets["gpu-vm-01"]
    changes = plan_all(cluster)["gpu-vm-01"]
    with pytest.raises(RemoteCommandError, match=r"after 0.1 s the guest is unlicensed \(License Status: "
                                                 r"Unlicensed \(Restricted\)\): check the token"):
        STEP.apply(Context(cluster=cluster), target, changes)


def test_bench_run_refuses_an_unlicensed_guest_unless_allowed(bed, tmp_path):
    cluster = cluster_for(bed, tmp_path)
    ctx = Context(cluster=cluster)
    planned = plan_all(cluster)
    run_group({g: g for g in GUESTS}, lambda name: STEP.apply(ctx, cluster.targets[name], planned[name])).raise_failures()
    (bed.host_dir("gpu-vm-02") / "etc" / "nvidia" / "ClientConfigToken" / "client_configuration_token_gpuvm.tok").unlink()
    runbook = tmp_path / "runbook.yaml"
    runbook.write_text(runbook.read_text() + "benchmarks:\n  launcher: gpu-vm-02\n  runs:\n"
                       "    - {name: echo, kind: command, command: 'echo took 1', pattern: 'took ([0-9]+)', "
                       "nodes: [1], repeats: 1, timeout: 60}\n")

    def bench(*flags):
        return CliRunner().invoke(app, ["bench", "run", str(runbook), "--out", str(tmp_path / "out"), *flags],
                                  catch_exceptions=False)

    refused = bench()
    assert refused.exit_code == 5, refused.output
    assert "refusing to benchmark" in refused.output
    assert "gpu-vm-02: unlicensed (License Status: Unlicensed (Restricted))" in refused.output
    assert not list((tmp_path / "out").glob("*/logs/echo")), "a job was launched"
    allowed = bench("--allow-unlicensed")
    assert allowed.exit_code == 0, allowed.output


def test_apply_licenses_a_vcs_passthrough_guest_then_verify_catches_the_removed_token(bed, tmp_path, monkeypatch):
    """Through the CLI, on the simulator and the test bed: plan shows the licence, apply converges,
    plan is empty and verify clean; without the token verify reports the guest unlicensed (exit 5)."""
    from gpusim import Simulator
    from tests.integration.vcenter import use_simulator

    h = bed.host("gpu-vm-02")  # licensed for vCS by the fixture
    (tmp_path / "nls.tok").write_text(TOKEN)
    runbook = tmp_path / "runbook.yaml"
    runbook.write_text(
        f"vcenter: {{user: administrator@vsphere.local, password_env: GPUVM_VCENTER_PASSWORD}}\n"
        f"ssh: {{known_hosts: {bed.known_hosts_file}}}\n"
        "hosts: [{name: esx-01, passthrough: [{model: A100}]}]\n"
        "vms: [{name: esx-01-vm1, host: esx-01, cpus: 8, memory_gb: 32, gpus: {mode: passthrough, count: 1}}]\n"
        "guests:\n  licensing: {token_file: nls.tok, passthrough: vcs}\n"
        f"  hosts: [{{vm: esx-01-vm1, ssh: {{address: {h.address}, user: {h.user}, key_file: {h.key_file}}}}}]\n")

    def gpuvm(*args):
        return CliRunner().invoke(app, [*args, str(runbook)], catch_exceptions=False)

    with Simulator(hosts=1, vms_per_host=1, rebind=True) as sim:
        use_simulator(monkeypatch, sim, tmp_path / "state")
        applied = gpuvm("apply", "--yes")
        assert applied.exit_code == 0, applied.output
        assert "guest.licensing" in applied.output and TOKEN.strip() not in applied.output
        assert gpuvm("plan", "--detailed-exitcode").exit_code == 0
        assert gpuvm("verify").exit_code == 0
        (bed.host_dir("gpu-vm-02") / "etc" / "nvidia" / "ClientConfigToken" / "client_configuration_token_gpuvm.tok").unlink()
        drift = gpuvm("verify")
    assert drift.exit_code == 5, drift.output
    assert "unlicensed (License Status: Unlicensed (Restricted))" in drift.output
    journal = (tmp_path / "state" / "journal.jsonl").read_text()
    assert "guest.licensing" in journal and TOKEN.strip() not in journal
