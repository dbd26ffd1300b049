"""guest.slurm on the SSH test bed's four guests, through the CLI with the simulator: Debian's real
munged, slurmctld and slurmd, installed (the bed's apt stand-in) and started by gpuvm's own steps
(the bed's systemctl runs the real daemons in each guest's namespaces). One apply from guests with
nothing installed brings up a cluster whose nodes are idle with the GRES the runbook implies; a
second plan is empty; a stopped slurmd is drift in verify (exit 5) and one apply fixes it; a MIG
layout change in the runbook changes the node's GRES types in the same plan as the MIG change, and
once applied the node is idle with each MIG device bound through its device files; a compute guest
that stops answering holds the controller's files (its node line kept) and is said in the plan (exit 3)."""

from __future__ import annotations

import shutil
import subprocess
import time

import pytest
from typer.testing import CliRunner

from gpuvm.cli.main import app
from tests.integration.vcenter import guest_ssh, use_simulator

pytestmark = pytest.mark.integration

VMS = {"esx-01-vm1": "gpu-vm-01", "esx-01-vm2": "gpu-vm-02", "esx-02-vm1": "gpu-vm-03", "esx-02-vm2": "gpu-vm-04"}
A100 = "gpu:a100-80gb-pcie:4"  # the stand-in nvidia-smi's four A100 80GB PCIe


def write_runbook(bed, path, mig_on_last: bool = False) -> None:
    guests = "".join(f"    - {{vm: {vm}, ssh: {guest_ssh(bed, guest)}"
                     + (", mig: all-3g.40gb" if mig_on_last and guest == "gpu-vm-04" else "") + "}\n"
                     for vm, guest in VMS.items())
    path.write_text(
        "vcenter: {user: administrator@vsphere.local, password_env: GPUVM_VCENTER_PASSWORD}\n"
        f"ssh: {{known_hosts: {bed.known_hosts_file}, command_timeout: 120}}\n"
        "hosts: [{name: esx-01}, {name: esx-02}]\n"
        "vms: [" + ", ".join(f"{{name: {vm}, host: {vm[:6]}}}" for vm in VMS) + "]\n"
        f"guests:\n  hosts:\n{guests}"
        # the bed's guests have no systemd cgroup tree of their own: no cgroup plugins
        "slurm: {controller: esx-01-vm1, cluster_name: bed, cgroup: null, partitions: [{name: gpu}, {name: pair, "
        "nodes: [esx-01-vm1, esx-01-vm2]}]}\n")


def on(bed, guest: str, command: str, check: bool = True) -> subprocess.CompletedProcess:
    """`command` on a bed guest, over SSH as its user."""
    h = bed.host(guest)
    done = subprocess.run(["ssh", "-i", str(h.key_file), "-o", f"UserKnownHostsFile={bed.known_hosts_file}",
                           "-o", "BatchMode=yes", "-p", str(h.port), f"{h.user}@{h.address}", command],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 or not check, (command, done.stdout, done.stderr)
    return done


def sinfo(bed) -> dict[str, tuple[str, str]]:
    """Slurm's own view, from the controller: node → (state, GRES)."""
    out = on(bed, "gpu-vm-01", "sinfo -h -N -p gpu -o '%N %t %G'").stdout
    return {line.split()[0]: (line.split()[1], line.split()[2]) for line in out.splitlines() if line.strip()}


SLURM_PACKAGES = ("munge", "slurmctld", "slurmd", "slurm-client")


def without_slurm(bed, guests) -> None:
    """The guests as if Slurm and munge were never installed (the bed lives for the whole session, and
    another test's cluster, its ClusterName in slurmctld's state, must not meet this one's): daemons
    stopped, their state, logs, files and key removed, the packages uninstalled."""
    from bed import OWN_DIRS

    for guest in guests:
        on(bed, guest, "sudo -n systemctl stop slurmd; sudo -n systemctl stop slurmctld; "
                       "sudo -n systemctl stop munge; true", check=False)
        etc = bed.host_dir(guest) / "etc"
        for entry in [*(e for own in OWN_DIRS for e in bed.own_dir(guest, own).glob("*")),
                      *(etc / "slurm").glob("*.conf"), etc / "munge" / "munge.key", etc / "default" / "slurmd"]:
            shutil.rmtree(entry) if entry.is_dir() and not entry.is_symlink() else entry.unlink(missing_ok=True)
        packages = bed.state(guest).get("packages", {})
        bed.set_state(guest, "packages", {k: v for k, v in packages.items() if k not in SLURM_PACKAGES})


@pytest.fixture
def bed(testbed):
    without_slurm(testbed, VMS.values())
    yield testbed
    without_slurm(testbed, VMS.values())  # the daemons gpuvm started end with the guest's processes at down()


def test_a_cluster_from_nothing_then_drift_then_a_mig_change(bed, tmp_path, monkeypatch):
    from gpusim import Simulator

    runbook = tmp_path / "runbook.yaml"
    write_runbook(bed, runbook)

    def gpuvm(*args):
        return CliRunner().invoke(app, [*args, str(runbook)], catch_exceptions=False)

    with Simulator(hosts=2, vms_per_host=2) as sim:
        use_simulator(monkeypatch, sim, tmp_path / "state")
        started = time.monotonic()
        applied = gpuvm("apply", "--yes")
        assert applied.exit_code == 0, applied.output
        print(f"first apply: {time.monotonic() - started:.1f} s")
        assert sinfo(bed) == {vm: ("idle", A100) for vm in VMS}  # Slurm's node names: the VMs', not the hosts' names
        key = (tmp_path / "state" / "slurm" / "munge.key").read_bytes()
        for guest in VMS.values():  # one key, the cluster's, 0400 munge on every guest
            assert (bed.host_dir(guest) / "etc" / "munge" / "munge.key").read_bytes() == key
            assert on(bed, guest, "sudo -n stat -c '%a %U' /etc/munge/munge.key").stdout.strip() == "400 munge"
        assert key.hex()[:16] not in applied.output and key.hex()[:16] not in (tmp_path / "state" / "journal.jsonl").read_text()
        assert gpuvm("plan", "--detailed-exitcode").exit_code == 0

        on(bed, "gpu-vm-03", "sudo -n systemctl stop slurmd")
        drift = gpuvm("verify")
        assert drift.exit_code == 5, drift.output
        assert "service slurmd" in drift.output and "esx-02-vm1" in drift.output
        assert gpuvm("apply", "--yes").exit_code == 0
        assert sinfo(bed)["esx-02-vm1"] == ("idle", A100)
        assert gpuvm("plan", "--detailed-exitcode").exit_code == 0

        write_runbook(bed, runbook, mig_on_last=True)
        planned = gpuvm("plan")
        assert "guest.mig" in planned.output and "gpu:a100-80gb-pcie:4 → gpu:3g.40gb:8" in planned.output, planned.output
        assert "slurm.conf" in planned.output and "gres.conf" in planned.output

        # a compute guest stops answering: the controller's files keep its node line (not planned, not
        # rewritten without it), and the plan says so on it and is incomplete (exit 3)
        bed.stop_sshd("gpu-vm-04")
        try:
            held = gpuvm("plan", "--detailed-exitcode")
        finally:
            bed.start_sshd("gpu-vm-04")
        assert held.exit_code == 3, held.output
        assert "warning: esx-01-vm1: compute guest esx-02-vm2 not read (" in held.output
        assert "/etc/slurm/slurm.conf content" in planned.output and "/etc/slurm/slurm.conf content" not in held.output

        # the MIG layout applied: slurmd binds each MIG instance through its devices (gres.conf
        # MultipleFiles: the GPU's /dev/nvidia<N>, its GPU and compute instances' /dev/nvidia-caps)
        started = time.monotonic()
        applied = gpuvm("apply", "--yes")
        assert applied.exit_code == 0, applied.output
        print(f"MIG apply: {time.monotonic() - started:.1f} s")
        assert sinfo(bed)["esx-02-vm2"] == ("idle", "gpu:3g.40gb:8"), sinfo(bed)
        node = on(bed, "gpu-vm-01", "scontrol show node esx-02-vm2 -o").stdout
        assert "State=IDLE " in node and "Gres=gpu:3g.40gb:8" in node, node
        gres = [line for line in (bed.host_dir("gpu-vm-01") / "etc" / "slurm" / "gres.conf").read_text().splitlines()
                if line.startswith("NodeName=esx-02-vm2 ")]
        files = [line.split("MultipleFiles=")[1].split()[0].split(",") for line in gres if "MultipleFiles=" in line]
        assert len(gres) == 8 and len(files) == 8, gres
        assert {f[0] for f in files} == {f"/dev/nvidia{i}" for i in range(4)}  # two instances on each GPU
        caps = [cap for f in files for cap in f[1:]]
        assert len(caps) == 16 and len(set(caps)) == 16 and all(c.startswith("/dev/nvidia-caps/nvidia-cap") for c in caps)
        assert gpuvm("plan", "--detailed-exitcode").exit_code == 0
