"""A real Slurm cluster on the SSH test bed's guests, for the tests and benchmarks that launch
through it (Debian's munge, slurmctld and slurmd, started in each guest's own namespaces).

The guests share this machine's /run and /var, so every path a daemon writes is in the guest's own
/tmp (`STATE`), the munge socket included (`AuthInfo=socket=...`); /etc/slurm/slurm.conf and the
munge key are the guest's own (its /etc). No cgroups (proctrack/linuxproc, task/none): the guests
share this machine's. slurmctld runs on the first guest, slurmd on every guest; nodes are listed in
runbook order (rank 0 of a job runs on the first of its nodes in that order)."""

from __future__ import annotations

import os
import secrets
import subprocess
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

STATE = "/tmp/gpuvm-slurm"  # in each guest: its /tmp
SOCKET = f"{STATE}/munge.socket"


def slurm_conf(bed, guests: Sequence[str], cpus: int) -> str:
    controller = guests[0]
    nodes = "".join(f"NodeName={g} NodeAddr={bed.address(g)} CPUs={cpus} State=UNKNOWN\n" for g in guests)
    return f"""\
ClusterName=gpuvm-bed
SlurmctldHost={controller}({bed.address(controller)})
SlurmUser=root
AuthType=auth/munge
AuthInfo=socket={SOCKET}
CredType=cred/munge
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
SchedulerType=sched/backfill
StateSaveLocation={STATE}/ctld
SlurmdSpoolDir={STATE}/d
SlurmctldPidFile={STATE}/slurmctld.pid
SlurmdPidFile={STATE}/slurmd.pid
SlurmctldLogFile={STATE}/slurmctld.log
SlurmdLogFile={STATE}/slurmd.log
SlurmctldTimeout=30
SlurmdTimeout=30
KillWait=5
MinJobAge=600
{nodes}PartitionName=bed Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""


def in_guest(bed, name: str, script: str, check: bool = True) -> subprocess.CompletedProcess:
    """`script` as root inside the guest's namespaces (those of its sshd: its /etc, /tmp, network)."""
    pid = (bed.host_dir(name) / "run" / "sshd.pid").read_text().strip()
    result = subprocess.run(["nsenter", "-t", pid, "--net", "--mount", "--uts", "sh", "-c", script],
                            capture_output=True, text=True, timeout=60)
    if check and result.returncode != 0:
        raise RuntimeError(f"{name}: {script}: exit {result.returncode}: {result.stdout}{result.stderr}")
    return result


def start(bed, guests: Sequence[str], timeout: float = 60) -> None:
    """munged everywhere, slurmctld on the first guest, slurmd on all; waits until every node is idle."""
    stop(bed, guests)  # daemons a run before left (they would write into the state removed below)
    cpus = os.cpu_count() or 1
    key = secrets.token_bytes(1024)
    conf = slurm_conf(bed, guests, cpus)
    for name in guests:
        etc = bed.host_dir(name) / "etc"
        (etc / "slurm").mkdir(exist_ok=True)
        (etc / "slurm" / "slurm.conf").write_text(conf)
        (etc / "slurm" / "cgroup.conf").write_text("CgroupPlugin=cgroup/v1\n")  # none used; no autodetect
        (etc / "munge").mkdir(exist_ok=True)
        (etc / "munge" / "munge.key").write_bytes(key)
        for path, mode in ((etc / "munge", 0o700), (etc / "munge" / "munge.key", 0o400)):
            os.chown(path, 0, 0)
            os.chmod(path, mode)
        in_guest(bed, name, f"rm -rf {STATE} && mkdir -p {STATE}/ctld {STATE}/d && chmod 755 {STATE} && "
                            f"munged --socket={SOCKET} --pid-file={STATE}/munged.pid --log-file={STATE}/munged.log "
                            f"--seed-file={STATE}/munged.seed --key-file=/etc/munge/munge.key")
    in_guest(bed, guests[0], "slurmctld")
    for name in guests:
        in_guest(bed, name, "slurmd")
    deadline = time.monotonic() + timeout
    while True:
        states = in_guest(bed, guests[0], "sinfo -h -N -o '%N %t'", check=False).stdout.split()
        if states.count("idle") == len(guests):
            return
        if time.monotonic() > deadline:
            logs = in_guest(bed, guests[0], f"tail -n 20 {STATE}/slurmctld.log", check=False).stdout
            raise RuntimeError(f"Slurm nodes not idle after {timeout:g}s: {states}\n{logs}")
        time.sleep(0.5)


def stop(bed, guests: Sequence[str]) -> None:
    """Every daemon `start` started, by its pid file, every guest at once; returns once they have
    exited (slurmctld saves its state on SIGTERM: a `start` right after must not remove that
    directory under it), SIGKILL after 10 s."""
    script = (f"pids=; for d in slurmd slurmctld munged; do f={STATE}/$d.pid; [ -f $f ] || continue; "
              f"p=$(cat $f); kill $p 2>/dev/null && pids=\"$pids $p\"; done; i=0; "
              f"while [ $i -lt 100 ]; do alive=; for p in $pids; do kill -0 $p 2>/dev/null && alive=1; done; "
              f"[ -z \"$alive\" ] && break; sleep 0.1; i=$((i+1)); done; "
              f"for p in $pids; do kill -9 $p 2>/dev/null; done; true")
    with ThreadPoolExecutor(max(1, len(guests))) as pool:
        list(pool.map(lambda name: in_guest(bed, name, script, check=False), guests))


def squeue(bed, controller: str) -> list[str]:
    """The job ids Slurm still has pending or running."""
    out = in_guest(bed, controller, "squeue -h -o %i", check=False)
    return out.stdout.split()
