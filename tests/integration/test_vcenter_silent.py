"""A vCenter that stops answering (issue 33, point 3): every call to it has a bound (the runbook's
`connect_timeout`, `call_timeout`), past which its hosts and VMs are "not observed" (plan, verify) or
failed (apply), the other vCenter's planned and applied; SIGTERM ends a run blocked on it within 5 s.

East is reached through a proxy (tests/integration/silent_proxy.py) that goes silent on command, or
its simulator holds its answer to the inventory read (latency). gpuvm runs as a process: a run that
hangs is a subprocess timeout, not a test that never ends."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpusim import Simulator
from tests.integration.silent_proxy import SilentProxy
from tests.integration.vcenter import raw_state, simulated_vcenters

pytestmark = pytest.mark.integration
CONNECT, CALL = 2, 3  # the runbook's bounds for east, in seconds
LATE = 10  # seconds a run may take past its bound (a process's start, west's own work, a busy machine)


def runbook(tmp_path: Path, lines: list[str], east_url: str, east_call: float = CALL) -> Path:
    """The fleet's runbook: east at `east_url` with its bounds, west as it is; a host and a VM each."""
    text = []
    for line in lines:
        if "name: east," in line:
            line = line.replace(line.split("url: '")[1].split("'")[0], east_url)
            line = line[:-1] + f", connect_timeout: {CONNECT}, call_timeout: {east_call}}}"
        text.append(line)
    text.append("hosts:")
    text += [f"  - {{name: {side}-esx-01, vcenter: {side}, passthrough: [{{model: A100}}]}}" for side in ("east", "west")]
    text.append("vms:")
    text += [f"  - {{name: {side}-esx-01-vm1, host: {side}-esx-01, cpus: 8, memory_gb: 32, "
             "gpus: {mode: passthrough, count: 1}}" for side in ("east", "west")]
    path = tmp_path / "fleet.yaml"
    path.write_text("\n".join(text) + "\n")
    return path


def gpuvm(*args: str, timeout: float) -> tuple[subprocess.CompletedProcess, float]:
    began = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "gpuvm.cli.main", *args], capture_output=True, text=True,
                          timeout=timeout, env=dict(os.environ, COLUMNS="200"))
    return done, time.monotonic() - began


def start(*args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "gpuvm.cli.main", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=dict(os.environ, COLUMNS="200"))


def started(journal: Path) -> bool:
    text = journal.read_text() if journal.exists() else ""
    return any(json.loads(line)["status"] == "started" for line in text.splitlines(keepends=True) if line.endswith("\n"))


def wait_for_a_step(run: subprocess.Popen, journal: Path) -> None:
    deadline = time.monotonic() + 60
    while not started(journal):
        assert run.poll() is None and time.monotonic() < deadline, run.communicate()[0]
        time.sleep(0.01)


@pytest.fixture
def fleet(monkeypatch, tmp_path):
    options = {side: dict(hosts=1, vms_per_host=1, rebind=True, host_prefix=f"{side}-") for side in ("east", "west")}
    with simulated_vcenters(monkeypatch, tmp_path, options) as (sims, lines):
        yield sims, lines


def test_plan_verify_and_inventory_report_a_silent_vcenter_not_observed_within_its_connect_bound(fleet, tmp_path):
    sims, lines = fleet
    with SilentProxy(sims["east"].url) as proxy:
        book = runbook(tmp_path, lines, proxy.url)
        proxy.silence()
        for command in ("plan", "verify", "inventory"):  # inventory: the others' objects, the silent one's warned of
            done, took = gpuvm(command, str(book), timeout=CONNECT + LATE + 20)
            assert done.returncode == 3, done.stdout + done.stderr
            assert "east-esx-01" in done.stdout + done.stderr and "vCenter east not reached" in done.stdout + done.stderr
            assert f"no answer within {CONNECT:g} s" in done.stdout + done.stderr, done.stdout + done.stderr
            assert "west-esx-01-vm1" in done.stdout + done.stderr and "Traceback" not in done.stderr
            assert took < CONNECT + LATE, (command, took)


def test_a_runbook_error_is_said_at_once_while_a_silent_vcenter_is_logged_in_to_ahead(fleet, tmp_path):
    """`plan` (as `inventory` and `verify`: one read_ahead) logs in before it validates the runbook
    (gpuvm/read_ahead.py): a login under way to a silent vCenter, with a minute's connect bound,
    holds the runbook's error back by the read ahead's bounds only (1 s before the validation, 2 s
    after)."""
    sims, lines = fleet
    with SilentProxy(sims["east"].url) as proxy:
        book = runbook(tmp_path, lines, proxy.url)
        book.write_text(book.read_text().replace(f"connect_timeout: {CONNECT}", "connect_timeout: 60")
                        .replace("cpus: 8", "cpus: eight"))
        proxy.silence()
        done, took = gpuvm("plan", str(book), timeout=60)
        assert done.returncode == 2 and "cpus" in done.stderr and "Traceback" not in done.stderr, done.stderr
        assert took < 3 + LATE, took


@pytest.mark.parametrize("order", [("east", "west"), ("west", "east")], ids=["read-here", "read-in-a-child"])
def test_a_vcenter_that_holds_its_inventory_answer_is_not_observed_within_its_call_bound(monkeypatch, tmp_path, order):
    """The first vCenter is read in gpuvm's process, the others in children (vsphere/fleet.py). plan
    and verify read alike (`observe_fleet`): one of them per order (the other order's test runs the other)."""
    options = {"east": dict(hosts=1, vms_per_host=1, rebind=True, host_prefix="east-",
                            latency={"RetrievePropertiesEx": "120s"}),
               "west": dict(hosts=1, vms_per_host=1, rebind=True, host_prefix="west-")}
    with simulated_vcenters(monkeypatch, tmp_path, {side: options[side] for side in order}) as (sims, lines):
        book = runbook(tmp_path, lines, sims["east"].url)
        command = "plan" if order[0] == "east" else "verify"
        done, took = gpuvm(command, str(book), timeout=CALL + LATE + 20)
        output = done.stdout + done.stderr
        assert done.returncode == 3, output
        assert "vCenter east not reached" in output and f"did not answer RetrievePropertiesEx within {CALL:g} s" in output
        assert "west-esx-01-vm1" in output and "Traceback" not in output
        assert took < CALL + LATE, (command, took)


def test_apply_fails_the_targets_of_a_vcenter_gone_silent_within_its_bound_and_applies_the_other(fleet, tmp_path):
    sims, lines = fleet
    journal = tmp_path / "state" / "journal.jsonl"
    with SilentProxy(sims["east"].url) as proxy:
        book = runbook(tmp_path, lines, proxy.url)
        run = start("apply", str(book), "--yes")
        wait_for_a_step(run, journal)
        proxy.silence()
        silenced = time.monotonic()
        output = run.communicate(timeout=CALL + LATE + 30)[0]
        took = time.monotonic() - silenced
    assert run.returncode == 3, output
    assert "east-esx-01" in output and f"within {CALL:g} s" in output and "Traceback" not in output, output
    assert took < CALL + LATE, took
    assert raw_state(sims["west"])["west-esx-01-vm1"]["power"] == "poweredOn"  # west applied all the same


@pytest.mark.parametrize("when", ["mid-apply", "at-login"])
def test_sigterm_ends_an_apply_blocked_on_a_silent_vcenter_within_5_s(tmp_path, monkeypatch, when):
    """The bounds here are long (600 s): the signal, not a timeout, ends the run."""
    journal = tmp_path / "state" / "journal.jsonl"
    with Simulator(hosts=1, vms_per_host=1, rebind=True) as sim, SilentProxy(sim.url) as proxy:
        ca = tmp_path / "ca.pem"
        ca.write_bytes(sim.cert_file.read_bytes())
        monkeypatch.setenv("VC_PASSWORD", sim.password)
        monkeypatch.setenv("GPUVM_STATE_DIR", str(tmp_path / "state"))
        book = tmp_path / "rb.yaml"
        book.write_text(f"vcenter: {{url: '{proxy.url}', user: '{sim.username}', password_env: VC_PASSWORD, "
                        f"ca_file: '{ca}', connect_timeout: 600, call_timeout: 600}}\n"
                        "hosts: [{name: esx-01, passthrough: [{model: A100}]}]\n"
                        "vms: [{name: esx-01-vm1, host: esx-01, cpus: 8, memory_gb: 32, gpus: {mode: passthrough, count: 1}}]\n")
        if when == "at-login":
            proxy.silence()
        run = start("apply", str(book), "--yes")
        if when == "mid-apply":
            wait_for_a_step(run, journal)
            proxy.silence()
        time.sleep(2)  # blocked on east by now
        assert run.poll() is None, run.communicate()[0]
        run.send_signal(signal.SIGTERM)
        signalled = time.monotonic()
        try:
            output = run.communicate(timeout=30)[0]
        finally:
            run.kill()
        took = time.monotonic() - signalled
    assert run.returncode == 143 and "interrupted by SIGTERM" in output and "Traceback" not in output, output
    assert took < 5, took
