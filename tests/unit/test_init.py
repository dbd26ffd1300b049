"""`gpuvm init` reads the vCenter govc's variables name: without them it says which to set (it has
no runbook whose fields to name), before anything connects."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from gpuvm.cli.main import app

GOVC = {"GOVC_URL": "https://vc.example.com/sdk", "GOVC_USERNAME": "administrator@vsphere.local",
        "GOVC_PASSWORD": "a-secret-pass"}


@pytest.mark.parametrize("missing", [["GOVC_URL"], ["GOVC_USERNAME", "GOVC_PASSWORD"]])
def test_init_without_govcs_variables_names_the_ones_to_set(missing, monkeypatch, tmp_path, mocker):
    connect = mocker.patch("gpuvm.connecting.connect")
    for name, value in GOVC.items():
        monkeypatch.setenv(name, value)
    for name in missing:
        monkeypatch.delenv(name)
    result = CliRunner().invoke(app, ["init", str(tmp_path / "lab.yaml")])
    assert result.exit_code == 2 and f"set {', '.join(missing)}" in result.stderr, result.output
    assert "<runbook>" not in result.stderr
    connect.assert_not_called()
    assert not (tmp_path / "lab.yaml").exists()


def test_init_takes_the_user_and_password_govc_url_carries(monkeypatch, tmp_path, mocker):
    connect = mocker.patch("gpuvm.connecting.connect", side_effect=RuntimeError("connecting"))
    for name in GOVC:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("GOVC_URL", "administrator@vsphere.local:a-secret-pass@vc.example.com")
    with pytest.raises(RuntimeError, match="connecting"):
        CliRunner().invoke(app, ["init", str(tmp_path / "lab.yaml")], catch_exceptions=False)
    connect.assert_called_once()
