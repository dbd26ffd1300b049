"""The whole pipeline on the simulator plus the SSH test hosts, through the real CLI.

validate → plan → apply (hosts, VMs, guests) → re-plan empty → verify clean, on the lab runbook
(playbooks/lab.yaml) with its key and known_hosts paths pointed at this session's test bed.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from ruamel.yaml import YAML
from typer.testing import CliRunner

from gpusim import Simulator
from gpuvm.cli.main import app
from tests.integration.vcenter import LAB_MIG, env_for, raw_state, reboot_hook, use_simulator

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


@pytest.fixture(autouse=True, scope="module")
def fresh_bed(testbed):
    """These tests change every test host: start from new ones, and leave new ones behind."""
    testbed.up()
    yield
    testbed.up()


@pytest.fixture
def lab(testbed, tmp_path, monkeypatch):
    hook = reboot_hook(testbed)
    with Simulator(hosts=2, vms_per_host=2, on_reboot=hook, mig=LAB_MIG) as sim:
        use_simulator(monkeypatch, sim, tmp_path / "state")
        yield sim, lab_for_bed(testbed, tmp_path / "lab.yaml")


def gpuvm(*args: str):
    return CliRunner().invoke(app, list(args), catch_exceptions=False)


def test_full_pipeline(lab, testbed):
    sim, runbook = lab
    # the campaign at 1 and 4 guests (scaling to compare against the baseline), once each: 1, 2 and 4
    # are test_bench_run's test_pytorch_workloads_over_one_two_and_four_guests, two repeats of a point
    # (median, spread, compare) its test_local_scaling_campaign_then_compare_and_report
    text = runbook.read_text()
    assert "nodes: [1, 2, 4]" in text and "repeats: 2 " in text, "the lab's campaign changed: narrow it here again"
    runbook.write_text(text.replace("nodes: [1, 2, 4]", "nodes: [1, 4]", 1).replace("repeats: 2 ", "repeats: 1 ", 1))
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

    for guest in ("gpu-vm-01", "gpu-vm-02"):  # ConnectX ATS active, not only set for the next boot
        assert testbed.state(guest)["mlx"]["ATS_ENABLED"]["current"] == "True(1)"

    again = gpuvm("plan", str(runbook), "--detailed-exitcode")
    assert again.exit_code == 0, again.output
    assert gpuvm("verify", str(runbook)).exit_code == 0

    # A card whose ATS is set for the next boot but not active after gpuvm's reboot for it is drift; the
    # next apply reboots that host again only with --allow-repeat-reboot (exit 4 without: issue 21, item
    # 4), shutting its VMs down first
    mlx = testbed.state("gpu-vm-02")["mlx"]
    mlx["ATS_ENABLED"]["current"] = "False(0)"
    testbed.set_state("gpu-vm-02", "mlx", mlx)
    drift = gpuvm("verify", str(runbook))
    assert drift.exit_code == 5 and "ATS_ENABLED (current)" in drift.output and "pending" in drift.output, drift.output
    repeat = gpuvm("apply", str(runbook), "--yes", "--allow-host-reboot", "--allow-power-off")
    assert repeat.exit_code == 4 and "esx-01" in repeat.output and "--allow-repeat-reboot" in repeat.output, repeat.output
    refused = gpuvm("apply", str(runbook), "--yes", "--allow-host-reboot", "--allow-repeat-reboot")
    assert refused.exit_code == 2 and "--allow-power-off" in refused.output, refused.output
    rebooted = gpuvm("apply", str(runbook), "--yes", "--allow-host-reboot", "--allow-power-off",
                     "--allow-repeat-reboot")
    assert rebooted.exit_code == 0, rebooted.output
    assert testbed.state("gpu-vm-02")["mlx"]["ATS_ENABLED"]["current"] == "True(1)"
    assert gpuvm("verify", str(runbook)).exit_code == 0

    # The benchmark campaign: a real PyTorch training (DDP over gloo, mpirun) across the guests over the SSH mesh,
    # and the same on this machine as the bare-metal baseline; then compare and report.
    vm_run = gpuvm("bench", "run", str(runbook), "--out", str(out := runbook.parent / "results"))
    assert vm_run.exit_code == 0, vm_run.output
    [vm_results] = [p for p in out.iterdir() if p.is_dir()]
    local = gpuvm("bench", "run", str(runbook), "--local", "--out", str(base := runbook.parent / "baseline"))
    assert local.exit_code == 0, local.output
    [bm_results] = [p for p in base.iterdir() if p.is_dir()]
    compared = gpuvm("bench", "compare", str(vm_results), "--baseline", str(bm_results))
    assert compared.exit_code == 0, compared.output
    assert "resnet18-weak-scaling" in compared.output and "speedup" in compared.output.lower()
    report = gpuvm("bench", "report", str(vm_results), "--baseline", str(bm_results), "--out", str(runbook.parent / "report"))
    assert report.exit_code == 0, report.output
    html = (runbook.parent / "report" / "report.html").read_text()
    assert "resnet18-weak-scaling" in html and "data:image/png;base64," in html
    log = next((vm_results / "logs").rglob("repeat-1.log")).read_text()
    assert "Total img/sec on" in log


VC_CANARY = "vc-CANARY-5f1e9a"
KEY_CANARY = "key-CANARY-03bd77"


def test_secrets_never_leak(testbed, tmp_path, monkeypatch):
    """A canary vCenter password and key passphrase appear in no output, plan, journal, log or file."""
    import subprocess

    key = tmp_path / "protected_key"
    key.write_bytes(testbed.client_key.read_bytes())
    key.chmod(0o600)
    subprocess.run(["ssh-keygen", "-q", "-p", "-N", KEY_CANARY, "-f", str(key)], check=True)
    runbook = lab_for_bed(testbed, tmp_path / "lab.yaml")
    text = runbook.read_text().replace(str(testbed.client_key), str(key))
    text = text.replace("sudo: true}", "sudo: true, passphrase_env: GPUVM_KEY_PASSPHRASE}")
    text = text.replace("user: root, key_file", "user: root, passphrase_env: GPUVM_KEY_PASSPHRASE, key_file")
    # one point of the campaign over all four guests: each guest's SSH with the protected key, its logs and
    # results.json are what the canary must stay out of; more points and repeats would only repeat those
    one_point = text.replace("nodes: [1, 2, 4]", "nodes: [4]", 1).replace("repeats: 2 ", "repeats: 1 ", 1)
    assert "nodes: [4]" in one_point and "repeats: 1 " in one_point, "the lab's campaign changed: narrow it here again"
    text = one_point
    runbook.write_text(text)
    assert text.count("passphrase_env") == 6
    state = tmp_path / "state"
    hook = reboot_hook(testbed)
    outputs = []
    with Simulator(hosts=2, vms_per_host=2, password=VC_CANARY, on_reboot=hook, mig=LAB_MIG) as sim:
        env = dict(env_for(sim), GPUVM_STATE_DIR=str(state), GPUVM_KEY_PASSPHRASE=KEY_CANARY,
                   PATH="/usr/bin:/bin")
        for args in (["validate"], ["inventory", "--save", str(tmp_path / "inv.json")], ["plan"], ["plan", "--json"],
                     ["apply", "--yes", "--allow-host-reboot"], ["verify"],
                     ["bench", "run", "--out", str(tmp_path / "results")]):
            words = args[:2] + [str(runbook)] + args[2:] if args[0] == "bench" else [args[0], str(runbook), *args[1:]]
            done = subprocess.run([sys.executable, "-m", "gpuvm.cli.main", *words],
                                  env=env, capture_output=True, text=True, timeout=300)
            outputs.append(done.stdout + done.stderr)
            assert done.returncode == 0, done.stdout + done.stderr
        bad = subprocess.run([sys.executable, "-m", "gpuvm.cli.main", "plan", str(runbook)],
                             env=dict(env, GPUVM_VCENTER_PASSWORD=VC_CANARY + "x"), capture_output=True, text=True)
        outputs.append(bad.stdout + bad.stderr)
        assert bad.returncode == 3 and "login refused" in bad.stderr
        wrong_key = subprocess.run([sys.executable, "-m", "gpuvm.cli.main", "plan", str(runbook)],
                                   env=dict(env, GPUVM_KEY_PASSPHRASE=KEY_CANARY[::-1]), capture_output=True, text=True)
        outputs.append(wrong_key.stdout + wrong_key.stderr)
        assert wrong_key.returncode != 0 and "Traceback" not in wrong_key.stderr
    everything = "\n".join(outputs)
    files = [p for p in tmp_path.rglob("*") if p.is_file() and p != key]
    for path in files:
        everything += path.read_bytes().decode(errors="replace")
    assert {"journal.jsonl", "results.json"} <= {p.name for p in files}
    assert VC_CANARY not in everything and KEY_CANARY not in everything
    assert oct(state.stat().st_mode & 0o777) == "0o700"


def test_unknown_host_keys_are_refused_unless_accepted(lab, testbed, tmp_path):
    _, runbook = lab
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    runbook.write_text(runbook.read_text().replace(str(testbed.known_hosts_file), str(empty)))
    refused = gpuvm("plan", str(runbook))
    said = " ".join(refused.output.split())  # each target's error note, wrapped to the terminal's width
    assert refused.exit_code == 3  # every SSH target not observed, each with why
    assert "error: esx-01: not observed: host key for 10.250.0.11:22 is unknown (ssh-ed25519 SHA256:" in said
    assert "pass --accept-new-host-keys" in said and "6 target(s) not observed" in said, refused.output
    accepted = gpuvm("plan", str(runbook), "--accept-new-host-keys")
    assert accepted.exit_code == 0, accepted.output
    recorded = empty.read_text().splitlines()
    assert len(recorded) == 6 and all(" ssh-ed25519 " in line for line in recorded)
    assert gpuvm("plan", str(runbook)).exit_code == 0  # now known
