"""Connection settings (issue 11, items 3, 6 and 12): bad vCenter URLs, CA bundles and state
directories are one clear error naming where they came from; TLS precedence is command line, then
runbook, then govc's variables."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from gpuvm.cli.main import app
from gpuvm.errors import InputError
from gpuvm.journal import state_dir
from gpuvm.runbook.vcenters import VCenter
from gpuvm.vsphere.session import resolve_target

BAD_URLS = [
    ("https://vc.example.com:99999/sdk", "Port out of range"),
    ("https://vc.example.com:http/sdk", "is not a valid URL"),
    ("https://[::1/sdk", "Invalid IPv6 URL"),
    ("https://vc.example.com/sdk\x1b[2J", "contains control characters"),
    ("https://vc.exa\nmple.com/sdk", "contains control characters"),
    ("ftp://vc.example.com", "is not an https URL"),
    ("https:///sdk", "names no host"),
]


@pytest.fixture(autouse=True)
def _password(monkeypatch):
    monkeypatch.setenv("VC_PASSWORD", "secret-x")
    for name in ("GOVC_URL", "GOVC_INSECURE", "GOVC_TLS_CA_CERTS", "GOVC_USERNAME", "GOVC_PASSWORD"):
        monkeypatch.delenv(name, raising=False)


def vcenter(**fields) -> VCenter:
    return VCenter(user="admin", password_env="VC_PASSWORD", **fields)


@pytest.mark.parametrize("url, why", BAD_URLS)
def test_a_bad_govc_url_is_one_clear_error(monkeypatch, url, why):
    monkeypatch.setenv("GOVC_URL", url)
    with pytest.raises(InputError, match=f"^GOVC_URL: .*{why}") as e:
        resolve_target(vcenter())
    assert "\x1b" not in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("url, why", BAD_URLS)
def test_a_bad_runbook_url_fails_validate_with_file_and_line(tmp_path, url, why):
    runbook = tmp_path / "rb.yaml"
    escaped = url.encode("unicode_escape").decode().replace('"', '\\"')
    runbook.write_text(f'vcenter:\n  url: "{escaped}"\n  user: admin\n  password_env: VC_PASSWORD\nhosts: []\nvms: []\n')
    result = CliRunner().invoke(app, ["validate", str(runbook)])
    assert result.exit_code == 2 and f"{runbook}:2: vcenter.url:" in result.output and why in result.output, result.output
    assert "\x1b" not in result.output and "Traceback" not in result.output


def test_validate_checks_govc_url_when_the_runbook_names_none(tmp_path, monkeypatch):
    runbook = tmp_path / "rb.yaml"
    runbook.write_text("vcenter: {user: admin, password_env: VC_PASSWORD}\nhosts: []\nvms: []\n")
    monkeypatch.setenv("GOVC_URL", "https://vc:70000/sdk")
    result = CliRunner().invoke(app, ["validate", str(runbook)])
    assert result.exit_code == 2 and "GOVC_URL" in result.output and "valid (" not in result.output


@pytest.mark.parametrize("flag, runbook, env, off", [
    (False, None, "1", True),  # govc's variable fills the gap
    (False, False, "1", False),  # the runbook's explicit false wins over GOVC_INSECURE
    (False, True, "0", True),
    (True, False, "0", True),  # the command line wins over both
    (False, None, None, False),
])
def test_tls_verification_precedence(monkeypatch, flag, runbook, env, off):
    monkeypatch.setenv("GOVC_URL", "https://vc.example.com/sdk")
    if env is not None:
        monkeypatch.setenv("GOVC_INSECURE", env)
    assert resolve_target(vcenter(insecure=runbook), insecure=flag).insecure is off


@pytest.mark.parametrize("make, why", [
    (lambda d: d, "is not a file"),
    (lambda d: (d / "empty.pem").touch() or d / "empty.pem", "is empty"),
    (lambda d: (d / "junk.pem").write_text("not a certificate\n") and d / "junk.pem", "is not a PEM bundle"),
    (lambda d: d / "missing.pem", "does not exist"),
], ids=["directory", "empty", "not-pem", "missing"])
def test_a_bad_ca_bundle_is_named(tmp_path, make, why):
    with pytest.raises(InputError, match=f"^vcenter.ca_file: .*{why}"):
        resolve_target(vcenter(url="https://vc.example.com/sdk", ca_file=make(tmp_path)))


def test_a_state_dir_that_is_a_file_is_one_clear_error(tmp_path):
    (tmp_path / "state").write_text("")
    with pytest.raises(InputError, match="state directory .*state: cannot create or use it"):
        state_dir(tmp_path / "state")
    with pytest.raises(InputError, match="cannot create or use it"):
        state_dir(tmp_path / "state" / "below")
