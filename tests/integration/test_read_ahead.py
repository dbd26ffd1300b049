"""`gpuvm inventory`, `plan` and `verify` send their reads before the runbook is validated
(gpuvm/read_ahead.py), against the simulator: the read goes out first, and what the user sees (a
plan, a bad runbook, a refused login) is what the run without the read ahead says, with every
session ended. A fleet's read sent ahead is read by the child process that plans its vCenter, on
the session the parent opened (vsphere/fleet.py)."""

from __future__ import annotations

import os
import threading

import pytest
from typer.testing import CliRunner

from gpusim import Simulator
from gpuvm.cli.main import app
from gpuvm.runbook.model import Runbook
from gpuvm.vsphere.session import Session
from tests.integration.test_vcenters import fleet  # noqa: F401 (a fixture)
from tests.integration.test_vsphere_flow import LAB_FILE, vsphere_only
from tests.integration.vcenter import pyvmomi, use_simulator

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def sim():
    with Simulator(hosts=2, vms_per_host=2) as running:
        yield running


@pytest.fixture
def lab(sim, monkeypatch, tmp_path):
    use_simulator(monkeypatch, sim, tmp_path / "state")
    return vsphere_only(LAB_FILE, tmp_path / "lab.yaml")


def gpuvm(*args: str):
    return CliRunner().invoke(app, list(args), catch_exceptions=False)


def sessions(sim: Simulator) -> int:
    """The simulator's sessions but the one counting them."""
    with pyvmomi(sim) as si:
        return len(si.content.sessionManager.sessionList) - 1


def read_during_validation(mocker, wait: float = 10) -> threading.Event:
    """Set when the inventory read was sent while the runbook was being validated: the validation
    waits (up to `wait` seconds) for it to be sent."""
    sent, during = threading.Event(), threading.Event()
    send, validate = Session.send, Runbook.model_validate

    def sending(self, mo, method, *args):
        if method == "RetrievePropertiesEx":
            sent.set()
        return send(self, mo, method, *args)

    def validating(data):
        if sent.wait(wait):
            during.set()
        return validate(data)

    mocker.patch.object(Session, "send", sending)
    mocker.patch.object(Runbook, "model_validate", side_effect=validating)
    return during


def test_inventory_sends_its_read_while_the_runbook_is_validated(lab, sim, mocker):
    during = read_during_validation(mocker)
    shown = gpuvm("inventory", str(lab))
    assert shown.exit_code == 0, shown.output
    assert "esx-01" in shown.output and "esx-02" in shown.output
    assert during.is_set()
    assert sessions(sim) == 0


def test_a_runbook_that_is_not_valid_is_refused_as_without_the_read_ahead(lab, sim, mocker):
    lab.write_text(lab.read_text().replace("vms:", "vms_of: []\nvms:", 1))
    ahead = gpuvm("inventory", str(lab))
    mocker.patch("gpuvm.read_ahead.resolve_target", side_effect=ValueError("no read ahead"))
    plain = gpuvm("inventory", str(lab))
    assert ahead.exit_code == plain.exit_code != 0
    assert ahead.output == plain.output and f"{lab}:" in ahead.output and "vms_of" in ahead.output, ahead.output
    assert sessions(sim) == 0


def test_a_refused_login_names_the_runbooks_field_as_without_the_read_ahead(lab, sim, mocker, monkeypatch):
    monkeypatch.setenv("GPUVM_VCENTER_PASSWORD", "not-the-password")
    ahead = gpuvm("inventory", str(lab))
    mocker.patch("gpuvm.read_ahead.resolve_target", side_effect=ValueError("no read ahead"))
    plain = gpuvm("inventory", str(lab))
    assert ahead.exit_code == plain.exit_code != 0
    assert ahead.output == plain.output and "login refused" in ahead.output and f"{lab}:7:" in ahead.output, ahead.output


def test_no_read_ahead_with_tls_verification_off(lab, sim, mocker):
    """Turned off, it is said (a warning) before vCenter is reached: so the runbook is validated first."""
    during = read_during_validation(mocker, wait=2)
    shown = gpuvm("inventory", str(lab), "--insecure")
    assert shown.exit_code == 0, shown.output
    assert "TLS certificate verification is OFF" in shown.output
    assert not during.is_set()


def without_read_ahead(mocker) -> None:
    mocker.patch("gpuvm.read_ahead.resolve_target", side_effect=ValueError("no read ahead"))


@pytest.mark.parametrize("command, code", [("plan", 2), ("verify", 5)])
def test_plan_and_verify_send_their_read_while_the_runbook_is_validated(lab, sim, mocker, command, code):
    during = read_during_validation(mocker)
    ahead = gpuvm(command, str(lab), *(["--detailed-exitcode"] if command == "plan" else []))
    assert ahead.exit_code == code, ahead.output
    assert during.is_set()
    assert sessions(sim) == 0
    mocker.stopall()
    without_read_ahead(mocker)
    assert gpuvm(command, str(lab), *(["--detailed-exitcode"] if command == "plan" else [])).output == ahead.output


def test_a_fleets_reads_are_sent_ahead_and_read_on_the_parents_sessions(fleet, mocker, tmp_path):
    """Each vCenter logged in to once, by the parent, while the runbook is validated; the child that
    plans the second vCenter reads the answer on the parent's session and logs it out."""
    runbook, sims = fleet
    logins = tmp_path / "logins"
    enter, validate = Session.__enter__, Runbook.model_validate

    def logged_in(self):
        with logins.open("a") as record:  # a file: the children's logins are seen too
            record.write(f"{os.getpid()} {self.target.url}\n")
        return enter(self)

    mocker.patch.object(Session, "__enter__", logged_in)
    mocker.patch.object(Runbook, "model_validate",
                        side_effect=lambda data: logins.open("a").write("validated\n") and validate(data))
    ahead = gpuvm("plan", str(runbook), "--detailed-exitcode")
    assert ahead.exit_code == 2, ahead.output
    seen = logins.read_text().splitlines()
    assert sorted(seen) == sorted([f"{os.getpid()} {sim.url}" for sim in sims.values()] + ["validated"]), seen
    assert {side: sessions(sim) for side, sim in sims.items()} == {side: 0 for side in sims}

    logins.unlink()
    without_read_ahead(mocker)
    plain = gpuvm("plan", str(runbook), "--detailed-exitcode")
    assert plain.output == ahead.output
    assert logins.read_text().splitlines()[0] == "validated"


def test_a_fleets_refused_login_is_the_same_vcenter_not_reached(fleet, mocker, monkeypatch):
    runbook, sims = fleet
    monkeypatch.setenv("WEST_PASSWORD", "not-the-password")
    ahead = gpuvm("plan", str(runbook), "--detailed-exitcode")
    assert ahead.exit_code == 3, ahead.output
    assert "vCenter west not reached" in ahead.output and "login refused" in ahead.output, ahead.output
    assert f"{runbook}:" in ahead.output, ahead.output  # the password_env field's line
    without_read_ahead(mocker)
    assert gpuvm("plan", str(runbook), "--detailed-exitcode").output == ahead.output
    assert {side: sessions(sim) for side, sim in sims.items()} == {side: 0 for side in sims}
