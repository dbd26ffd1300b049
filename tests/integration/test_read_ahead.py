"""`gpuvm inventory` sends its read before the runbook is validated (gpuvm/read_ahead.py), against the
simulator: the read goes out first, and what the user sees for a bad runbook or a refused login is
what the run without the read ahead says, with the session ended."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from gpusim import Simulator
from gpuvm.cli.main import app
from gpuvm.runbook.model import Runbook
from gpuvm.vsphere.session import Session
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


def test_inventory_sends_its_read_before_the_runbook_is_validated(lab, sim, mocker):
    events: list[str] = []
    send = Session.send

    def sent(self, mo, method, *args):
        events.append(method)
        return send(self, mo, method, *args)

    mocker.patch.object(Session, "send", sent)
    validate = Runbook.model_validate
    mocker.patch.object(Runbook, "model_validate", side_effect=lambda data: events.append("validated") or validate(data))
    shown = gpuvm("inventory", str(lab))
    assert shown.exit_code == 0, shown.output
    assert "esx-01" in shown.output and "esx-02" in shown.output
    assert events.index("RetrievePropertiesEx") < events.index("validated"), events
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
    events: list[str] = []
    send = Session.send
    mocker.patch.object(Session, "send", lambda self, mo, method, *args: events.append(method) or send(self, mo, method, *args))
    validate = Runbook.model_validate
    mocker.patch.object(Runbook, "model_validate", side_effect=lambda data: events.append("validated") or validate(data))
    shown = gpuvm("inventory", str(lab), "--insecure")
    assert shown.exit_code == 0, shown.output
    assert "TLS certificate verification is OFF" in shown.output
    assert events.index("validated") < events.index("RetrievePropertiesEx"), events
