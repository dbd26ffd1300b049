"""Host reboots that drain, not kill (issue 36), against real Slurm: Debian's munged, slurmctld and
slurmd run in the bed guest of the VM whose host reboots (the guest is its own controller; its node
is named after the VM). A job running there: `apply` without --drain-timeout is refused up front
naming it; with it the node is drained, the job ends on its own before any VM stops, the host
reboots and the node is idle again. A run SIGKILLed while the node is drained leaves the drain
recorded on the host; one more apply finishes the reboot and resumes the node."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpusim import Simulator
from gpuvm.cli.main import app
from tests.integration.test_reboot_kills import entries, intents
from tests.integration.vcenter import KILLED_RUN_LEASE, once_unlocked, raw_state, use_simulator

pytestmark = pytest.mark.integration
GUEST = "gpu-vm-01"  # esx-01-vm1's guest in the bed (one VM per host)
NODE = "esx-01-vm1"
DIR = "/tmp/slurm-drain"  # in the guest (its own /tmp)
FLAGS = ("--yes", "--allow-host-reboot", "--allow-power-off")


def gpuvm(*args: str):
    return CliRunner().invoke(app, list(args), catch_exceptions=False)


def in_guest(bed, script: str, check: bool = True) -> str:
    """Run `script` as root inside the guest's namespaces (its /etc, /tmp, network, hostname)."""
    pid = (bed.host_dir(GUEST) / "run" / "sshd.pid").read_text().strip()
    done = subprocess.run(["nsenter", "-t", pid, "-m", "-u", "-n", "--", "sh", "-c", script],
                          capture_output=True, text=True, timeout=60)
    assert not check or done.returncode == 0, f"{script}: {done.stdout}{done.stderr}"
    return done.stdout


def slurm_conf(address: str) -> str:
    return f"""\
ClusterName=drain
SlurmctldHost={GUEST}({address})
AuthType=auth/munge
AuthInfo=socket={DIR}/munge.sock
CryptoType=crypto/munge
SlurmUser=root
SlurmdUser=root
StateSaveLocation={DIR}/state
SlurmdSpoolDir={DIR}/spool
SlurmctldPidFile={DIR}/slurmctld.pid
SlurmdPidFile={DIR}/slurmd.pid
SlurmctldLogFile={DIR}/slurmctld.log
SlurmdLogFile={DIR}/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
ReturnToService=2
MpiDefault=none
JobCompType=jobcomp/none
NodeName={NODE} NodeHostname={GUEST} NodeAddr={address} CPUs=1 State=UNKNOWN
PartitionName=debug Nodes={NODE} Default=YES MaxTime=INFINITE State=UP
"""


@pytest.fixture(scope="module")
def slurm(testbed):
    """munged, slurmctld and slurmd in the guest, the node idle; stopped (and the config removed) after."""
    conf = testbed.host_dir(GUEST) / "etc" / "slurm" / "slurm.conf"
    saved = conf.read_bytes() if conf.exists() else None
    conf.parent.mkdir(exist_ok=True)
    conf.write_text(slurm_conf(testbed.host(GUEST).address))
    in_guest(testbed, f"rm -rf {DIR}; mkdir -p -m 0755 {DIR}/state {DIR}/spool && "
                      f"dd if=/dev/urandom of={DIR}/munge.key bs=1024 count=1 2>/dev/null && chmod 0400 {DIR}/munge.key && "
                      f"/usr/sbin/munged --force --socket={DIR}/munge.sock --key-file={DIR}/munge.key "
                      f"--pid-file={DIR}/munged.pid --log-file={DIR}/munged.log --seed-file={DIR}/munged.seed && "
                      f"/usr/sbin/slurmctld -c && /usr/sbin/slurmd -N {NODE} "
                      f"|| {{ set -x; ls -ld /tmp {DIR} {DIR}/*; tail -n 5 {DIR}/*.log; exit 1; }}")
    try:
        wait_for(lambda: node_state(testbed) == "IDLE", "the node idle")
        yield testbed
    finally:
        in_guest(testbed, f"for d in slurmd slurmctld munged; do test -f {DIR}/$d.pid && kill $(cat {DIR}/$d.pid); done",
                 check=False)
        if saved is None:
            conf.unlink()
        else:
            conf.write_bytes(saved)


def wait_for(ready, what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        assert time.monotonic() < deadline, f"not {what} after {timeout:.0f} s"
        time.sleep(0.5)


def node(bed) -> dict[str, str]:
    line = in_guest(bed, f"scontrol show node -o {NODE}")
    state = line.split(" State=")[1].split()[0]
    reason = line.split(" Reason=")[1].rsplit(" [", 1)[0].strip() if " Reason=" in line else ""
    return {"state": state, "reason": reason}


def node_state(bed) -> str:
    return node(bed)["state"]


def submit(bed, seconds: int) -> str:
    """A batch job on the node that writes when it ended (epoch seconds), once running."""
    job = in_guest(bed, f"sbatch --parsable -J train -o {DIR}/job-%j.out "
                        f"--wrap {shlex.quote(f'sleep {seconds}; date +%s.%N')}").strip()
    wait_for(lambda: in_guest(bed, f"squeue -h -j {job} -o %T").strip() == "RUNNING", f"job {job} running")
    return job


def runbook(bed, path: Path) -> Path:
    guest = bed.host(GUEST)
    path.write_text(f"""\
vcenter: {{user: administrator@vsphere.local, password_env: GPUVM_VCENTER_PASSWORD}}
ssh: {{known_hosts: {bed.known_hosts_file}}}
hosts: [{{name: esx-01, passthrough: [{{address: "0000:17:00.0"}}], allow_maintenance: true, allow_reboot: true}}]
vms: [{{name: {NODE}, host: esx-01, firmware: bios}}]
guests:
  hosts:
    - vm: {NODE}
      ssh: {{address: {guest.address}, user: {guest.user}, key_file: {guest.key_file}, sudo: true}}
slurm: {{controller: {NODE}}}
""")
    return path


def test_a_reboot_with_a_job_on_its_node_is_refused_then_drains_waits_for_the_job_and_resumes_the_node(
        slurm, tmp_path, monkeypatch):
    book = runbook(slurm, tmp_path / "rb.yaml")
    with Simulator(hosts=1, vms_per_host=1, vm_power="on") as sim:
        use_simulator(monkeypatch, sim, tmp_path / "state")
        before = raw_state(sim)
        job = submit(slurm, 12)
        refused = gpuvm("apply", str(book), *FLAGS)
        assert refused.exit_code != 0, refused.output
        assert (f"host esx-01 must reboot while Slurm job(s) {job} (root: train) run on its nodes {NODE}: "
                "pass --drain-timeout" in refused.output), refused.output
        assert raw_state(sim) == before and node_state(slurm) == "ALLOCATED"

        applied = gpuvm("apply", str(book), *FLAGS, "--drain-timeout", "120")
        assert applied.exit_code == 0, applied.output
        ended = float(in_guest(slurm, f"cat {DIR}/job-{job}.out").strip())  # the job ran to its end
        journal = entries(tmp_path / "state" / "journal.jsonl")
        first_stop = next(e for e in journal if e.get("act") == "power-off" and e.get("state") == "recorded")
        assert datetime.fromisoformat(first_stop["time"]).timestamp() >= ended, "a VM stopped before the job ended"
        assert raw_state(sim)["esx-01"]["booted"] != before["esx-01"]["booted"], "the host did not reboot"
        assert node(slurm) == {"state": "IDLE", "reason": ""} and not intents()


def test_a_run_killed_while_the_node_is_drained_leaves_it_recorded_and_the_next_apply_resumes_it(
        slurm, tmp_path, monkeypatch):
    book = runbook(slurm, tmp_path / "rb.yaml")
    with Simulator(hosts=1, vms_per_host=1, vm_power="on") as sim:
        use_simulator(monkeypatch, sim, tmp_path / "state")
        job = submit(slurm, 8)
        run = subprocess.Popen([sys.executable, "-m", "gpuvm.cli.main", "apply", str(book), *FLAGS,
                                "--drain-timeout", "120"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               env=dict(os.environ, **KILLED_RUN_LEASE))
        wait_for(lambda: "DRAIN" in node_state(slurm) or run.poll() is not None, "the node drained")
        run.send_signal(signal.SIGKILL)
        output = run.communicate(timeout=60)[0]
        assert run.returncode == -signal.SIGKILL, output
        drained = node(slurm)
        assert "DRAIN" in drained["state"] and drained["reason"].startswith("gpuvm: reboot of esx-01 (run "), drained
        assert "drain" in intents().get("esx-01", []), intents()
        planned = json.loads(gpuvm("plan", str(book), "--json").output)
        assert any(c["target"] == "esx-01" and c["resource"] == "slurm nodes" for c in planned["changes"]), planned
        wait_for(lambda: not in_guest(slurm, f"squeue -h -j {job} -o %T").strip(), f"job {job} ended", timeout=30)

        again = once_unlocked(lambda: gpuvm("apply", str(book), *FLAGS, "--drain-timeout", "60"), lambda r: r.exit_code)
        assert again.exit_code == 0, output + "\n--- re-run:\n" + again.output
        assert node(slurm) == {"state": "IDLE", "reason": ""} and not intents()
        assert gpuvm("verify", str(book)).exit_code == 0
