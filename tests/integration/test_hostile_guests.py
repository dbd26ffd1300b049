"""Guests are untrusted input (issue 22, item 8), on the SSH test bed through its stand-ins: a guest
answering `ibdev2netdev` with a port name holding `$(…)` and terminal escapes is refused, named,
shown escaped, and commands nothing anywhere; a guest tool printing without end fails quickly; SIGTERM
stops a hung guest command within seconds, remote side included."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from bed import _netns_pids
from gpusim import Simulator
from gpuvm.cli.main import app
from gpuvm.errors import RemoteCommandError
from gpuvm.executors import SshExecutor
from tests.integration.test_end_to_end import lab_for_bed
from tests.integration.vcenter import LAB_MIG, env_for, use_simulator

pytestmark = pytest.mark.integration
GUESTS = ("gpu-vm-01", "gpu-vm-02", "gpu-vm-03", "gpu-vm-04")
HOSTILE = "x$(touch${IFS}/tmp/pwned)\x1b]0;owned\x07"  # runs a command in double quotes; retitles a terminal
SHOWN = "x$(touch${IFS}/tmp/pwned)\\x1b]0;owned\\x07"


@pytest.fixture(autouse=True)
def honest_guests(testbed):
    yield
    for name in GUESTS:
        for knob in ("answer", "flood", "hang"):
            testbed.set_state(name, knob, {} if knob == "answer" else [])


def pwned(testbed) -> list[str]:
    return [name for name in GUESTS if (testbed.host_dir(name) / "tmp" / "pwned").exists()]


def remote_processes(testbed, name: str, word: str) -> list[int]:
    """Processes of the guest whose command line holds `word`."""
    found = []
    for pid in _netns_pids(testbed.netns(name)):
        try:
            if word.encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                found.append(pid)
        except OSError:
            pass
    return found


def test_a_hostile_port_name_is_refused_by_plan_and_bench_run(testbed, tmp_path, monkeypatch):
    testbed.set_state("gpu-vm-02", "answer", {"ibdev2netdev": f"mlx5_0 port 1 ==> {HOSTILE} (Up)\n"})
    runbook = lab_for_bed(testbed, tmp_path / "lab.yaml")
    with Simulator(hosts=2, vms_per_host=2, mig=LAB_MIG) as sim:
        use_simulator(monkeypatch, sim, tmp_path / "state")
        planned = CliRunner().invoke(app, ["plan", str(runbook)], catch_exceptions=False)
        elsewhere = CliRunner().invoke(app, ["plan", str(runbook), "--target", "esx-02", "--detailed-exitcode"],
                                       catch_exceptions=False)
    output = planned.output
    # that guest alone is not observed, with why; the others are planned; exit 3 (not observed), not 4
    assert planned.exit_code == 3, output
    assert f"error: esx-01-vm2: not observed: `ibdev2netdev` answered '{SHOWN}' as an interface name" in output, output
    assert "1 target(s) not observed: esx-01-vm2." in output, output
    assert "\x1b" not in output and "\x07" not in output and "Traceback" not in output
    # a plan of another host does not even mention its failure
    assert elsewhere.exit_code == 2, elsewhere.output
    assert "ibdev2netdev" not in elsewhere.output and "not observed" not in elsewhere.output, elsewhere.output

    campaign = tmp_path / "campaign.yaml"
    guests = "".join(f"    - {{vm: {h.name}, ssh: {{address: {h.address}, user: {h.user}, key_file: {h.key_file}}}, "
                     "rdma_ports: [{device: mlx5_0, port: 1}]}\n" for h in map(testbed.host, GUESTS[:2]))
    campaign.write_text(f"ssh: {{known_hosts: {testbed.known_hosts_file}}}\nhosts: [{{name: esx-01}}]\n"
                        "vms: [{name: gpu-vm-01, host: esx-01}, {name: gpu-vm-02, host: esx-01}]\n"
                        f"guests:\n  hosts:\n{guests}benchmarks:\n  launcher: gpu-vm-01\n  runs:\n"
                        "    - {name: echo, kind: command, command: 'echo took 1', pattern: 'took ([0-9]+)', "
                        "nodes: [2], repeats: 1, timeout: 60}\n")
    ran = CliRunner().invoke(app, ["bench", "run", str(campaign), "--out", str(tmp_path / "out")],
                             catch_exceptions=False)
    assert ran.exit_code != 0, ran.output
    assert f"guest gpu-vm-02: cannot read the port map (ibdev2netdev): `ibdev2netdev` answered '{SHOWN}'" \
        in ran.output, ran.output
    assert "\x1b" not in ran.output
    assert not list((tmp_path / "out").glob("*/logs/echo")), "a job was launched"
    assert pwned(testbed) == []


def test_a_guest_tool_printing_without_end_fails_quickly(testbed):
    testbed.set_state("gpu-vm-02", "flood", ["nvidia-smi"])
    host = testbed.host("gpu-vm-02")
    executor = SshExecutor("esx-01-vm2", host.address, host.user, key_file=host.key_file,
                           known_hosts=[testbed.known_hosts_file])
    start = time.monotonic()
    try:
        with pytest.raises(RemoteCommandError, match=r"esx-01-vm2: `nvidia-smi -L` printed more than gpuvm keeps: "
                                                     r"output over 8 MiB; the command was stopped"):
            executor.run(["nvidia-smi", "-L"], timeout=300)
        assert time.monotonic() - start < 20
        assert executor.run(["true"]).ok  # the connection is still good
    finally:
        executor.close()
    deadline = time.monotonic() + 10
    while remote_processes(testbed, "gpu-vm-02", "nvidia-smi") and time.monotonic() < deadline:
        time.sleep(0.1)
    assert remote_processes(testbed, "gpu-vm-02", "nvidia-smi") == []


def test_sigterm_stops_a_hung_guest_command_within_seconds(testbed, tmp_path):
    """nvidia-smi hangs on esx-01-vm2's guest, the one with a MIG layout (run under sudo, as the
    lab's guests do): plan is stopped with SIGTERM while it waits; it exits 143 within seconds, not
    after the 600 s command timeout, and the hung process on the guest is gone."""
    testbed.set_state("gpu-vm-02", "hang", ["nvidia-smi"])
    runbook = lab_for_bed(testbed, tmp_path / "lab.yaml")
    state = tmp_path / "state"
    with Simulator(hosts=2, vms_per_host=2, mig=LAB_MIG) as sim:
        env = dict(os.environ, **env_for(sim), GPUVM_STATE_DIR=str(state))
        proc = subprocess.Popen([sys.executable, "-m", "gpuvm.cli.main", "plan", str(runbook)], env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 60
        while not remote_processes(testbed, "gpu-vm-02", "nvidia-smi"):
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.05)
        time.sleep(0.5)
        start = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
        took = time.monotonic() - start
    assert proc.returncode == 143 and "interrupted" in err and "Traceback" not in err, out + err
    assert took < 10, f"stopped after {took:.1f}s"
    deadline = time.monotonic() + 5
    while remote_processes(testbed, "gpu-vm-02", "nvidia-smi") and time.monotonic() < deadline:
        time.sleep(0.1)
    assert remote_processes(testbed, "gpu-vm-02", "nvidia-smi") == []
