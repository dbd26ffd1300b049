"""Host reboots that drain, not kill (issue 36), against real Slurm: Debian's munged, slurmctld and
slurmd brought up in the bed guest of esx-01's VM by gpuvm's own guest.slurm (the guest is its own
controller; its node is named after the VM). A job running there: `apply` without
--drain-timeout is refused up front naming it; with it the node is drained, the job ends on its own
before any VM stops, the host reboots and the node is idle again. A run SIGKILLed while the node is
drained leaves the drain recorded on the host; one more apply finishes the reboot and resumes the node."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from datetime import datetime

import pytest
from typer.testing import CliRunner

from gpusim import Simulator
from gpuvm.cli.main import app
from tests.integration.test_guest_slurm import on, without_slurm
from tests.integration.test_reboot_kills import entries, intents
from tests.integration.vcenter import KILLED_RUN_LEASE, guest_ssh, once_unlocked, raw_state, use_simulator

pytestmark = pytest.mark.integration
GUEST = "gpu-vm-01"  # esx-01-vm1's guest in the bed (one VM per host)
NODE = "esx-01-vm1"  # its Slurm node: named after the VM
FLAGS = ("--yes", "--allow-host-reboot", "--allow-power-off")


def gpuvm(*args: str):
    return CliRunner().invoke(app, list(args), catch_exceptions=False)


def write_runbook(bed, path, passthrough: tuple[str, ...] = ()) -> None:
    gpus = ", ".join(f'{{address: "{a}"}}' for a in passthrough)
    path.write_text(
        "vcenter: {user: administrator@vsphere.local, password_env: GPUVM_VCENTER_PASSWORD}\n"
        f"ssh: {{known_hosts: {bed.known_hosts_file}, command_timeout: 120}}\n"
        f"hosts: [{{name: esx-01, passthrough: [{gpus}], allow_maintenance: true, allow_reboot: true}}]\n"
        "vms: [{name: esx-01-vm1, host: esx-01, firmware: bios}]\n"
        f"guests:\n  hosts:\n    - {{vm: esx-01-vm1, ssh: {guest_ssh(bed, GUEST)}}}\n"
        "slurm: {controller: esx-01-vm1, cluster_name: drain, cgroup: null}\n")  # the bed has no cgroup tree


def node(bed) -> dict[str, str]:
    """The node's state and reason, as the controller shows them."""
    line = on(bed, GUEST, f"scontrol show node -o {NODE}").stdout
    state = line.split(" State=")[1].split()[0]
    reason = line.split(" Reason=")[1].rsplit(" [", 1)[0].strip() if " Reason=" in line else ""
    return {"state": state, "reason": reason}


def wait_for(ready, what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        assert time.monotonic() < deadline, f"not {what} after {timeout:.0f} s"
        time.sleep(0.5)


def submit(bed, seconds: int) -> str:
    """A batch job on the node, running, that writes when it ended (epoch seconds) into /tmp."""
    job = on(bed, GUEST, f"sbatch --parsable -J train -o /tmp/job-%j.out --wrap 'sleep {seconds}; date +%s.%N'")
    job_id = job.stdout.strip()
    wait_for(lambda: on(bed, GUEST, f"squeue -h -j {job_id} -o %T").stdout.strip() == "RUNNING", f"job {job_id} running")
    return job_id


@pytest.fixture
def bed(testbed):
    without_slurm(testbed, [GUEST])
    yield testbed
    without_slurm(testbed, [GUEST])


def test_a_reboot_drains_the_node_waits_for_its_job_resumes_it_and_a_killed_drain_is_resumed_by_the_next_apply(
        bed, tmp_path, monkeypatch):
    book = tmp_path / "rb.yaml"
    write_runbook(bed, book)
    journal = tmp_path / "state" / "journal.jsonl"
    with Simulator(hosts=1, vms_per_host=1, vm_power="on") as sim:
        use_simulator(monkeypatch, sim, tmp_path / "state")
        up = gpuvm("apply", str(book), "--yes")  # Slurm from nothing, by gpuvm's own guest.slurm
        assert up.exit_code == 0, up.output
        wait_for(lambda: node(bed)["state"] == "IDLE", "the node idle")

        write_runbook(bed, book, ("0000:17:00.0",))  # a change that waits for esx-01's reboot
        before = raw_state(sim)
        job = submit(bed, 12)
        refused = gpuvm("apply", str(book), *FLAGS)
        assert refused.exit_code != 0, refused.output
        assert (f"host esx-01 must reboot while Slurm job(s) {job} ({bed.host(GUEST).user}: train) run on its nodes "
                f"{NODE}: pass --drain-timeout" in refused.output), refused.output
        assert raw_state(sim) == before and node(bed)["state"] in ("ALLOCATED", "MIXED")  # not drained

        applied = gpuvm("apply", str(book), *FLAGS, "--drain-timeout", "120")
        assert applied.exit_code == 0, applied.output
        ended = float(on(bed, GUEST, f"cat /tmp/job-{job}.out").stdout.strip())  # the job ran to its end
        first_stop = next(e for e in entries(journal) if e.get("act") == "power-off" and e.get("state") == "recorded")
        assert datetime.fromisoformat(first_stop["time"]).timestamp() >= ended, "a VM stopped before the job ended"
        assert raw_state(sim)["esx-01"]["booted"] != before["esx-01"]["booted"], "the host did not reboot"
        assert node(bed) == {"state": "IDLE", "reason": ""} and not intents()

        # SIGKILL while the node is drained (the run waits for a job), then one more apply
        write_runbook(bed, book, ("0000:17:00.0", "0000:31:00.0"))
        job = submit(bed, 8)
        run = subprocess.Popen([sys.executable, "-m", "gpuvm.cli.main", "apply", str(book), *FLAGS,
                                "--drain-timeout", "120"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               env=dict(os.environ, **KILLED_RUN_LEASE))
        wait_for(lambda: "DRAIN" in node(bed)["state"] or run.poll() is not None, "the node drained")
        run.send_signal(signal.SIGKILL)
        output = run.communicate(timeout=60)[0]
        assert run.returncode == -signal.SIGKILL, output
        drained = node(bed)
        assert "DRAIN" in drained["state"] and drained["reason"].startswith("gpuvm: reboot of esx-01 (run "), drained
        assert "drain" in intents().get("esx-01", []), intents()
        planned = json.loads(gpuvm("plan", str(book), "--json").output)
        assert any(c["target"] == "esx-01" and c["resource"] == "slurm nodes" for c in planned["changes"]), planned
        wait_for(lambda: not on(bed, GUEST, f"squeue -h -j {job} -o %T").stdout.strip(), f"job {job} ended")

        again = once_unlocked(lambda: gpuvm("apply", str(book), *FLAGS, "--drain-timeout", "60"), lambda r: r.exit_code)
        assert again.exit_code == 0, output + "\n--- re-run:\n" + again.output
        assert node(bed) == {"state": "IDLE", "reason": ""} and not intents()
        verified = gpuvm("verify", str(book))
        assert verified.exit_code == 0, verified.output
