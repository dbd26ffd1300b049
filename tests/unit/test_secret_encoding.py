"""Secrets masked on values before any encoding (issue 21, item 7): a password holding `"`, `\\` and
non-ASCII reaches no journal, document, results file, log line or traceback in any form, and a
password in GOVC_URL's user info is never quoted back in an error."""

from __future__ import annotations

import html
import io
import json
import logging
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpuvm import engine, secrets
from gpuvm.bench.results import load_results, save_results
from gpuvm.cli.main import app
from gpuvm.documents import document, dumps
from gpuvm.journal import Journal
from gpuvm.plan import Change
from gpuvm.runbook.loader import load_runbook
from gpuvm.steps.base import Context, Step

LAB = Path(__file__).parents[2] / "playbooks" / "lab.yaml"
STUDY_RESULTS = Path(__file__).parents[2] / "playbooks" / "results" / "study-vm"


def forms(secret: str) -> dict[str, str]:
    """Every way an encoder writes the secret: what must appear nowhere."""
    return {"raw": secret, "json": json.dumps(secret)[1:-1], "json-utf8": json.dumps(secret, ensure_ascii=False)[1:-1],
            "repr": repr(secret)[1:-1], "unicode-escape": secret.encode("unicode_escape").decode("ascii"),
            "html": html.escape(secret), "html-jinja": html.escape(secret).replace("&quot;", "&#34;").replace("&#x27;", "&#39;")}


def assert_hidden(secret: str, text: str) -> None:
    found = {name: form for name, form in forms(secret).items() if form in text}
    assert not found, f"the secret appears as {found}"


def leaves(value):
    """Every string a decoded JSON document holds (keys too)."""
    if isinstance(value, dict):
        for key, item in value.items():
            yield key
            yield from leaves(item)
    elif isinstance(value, list):
        for item in value:
            yield from leaves(item)
    elif isinstance(value, str):
        yield value


@pytest.fixture
def password(monkeypatch) -> str:
    """The vCenter password, remembered the way gpuvm learns it: loading a runbook."""
    value = 'vc"pa\\ss-é7'
    monkeypatch.setenv("GPUVM_VCENTER_PASSWORD", value)
    load_runbook(LAB)
    return value


def test_a_fault_echoing_the_password_reaches_the_journal_in_no_form(tmp_path, password):
    """A raw vSphere fault (its text is pyVmomi's dump: `msg = '…'`, the message repr-escaped)
    fails a change; the journal records the error, and the password appears in it in no form."""
    from pyVmomi import vmodl

    def apply(ctx, target, changes):
        raise vmodl.fault.InvalidArgument(msg=f"value {password} is not valid", invalidProperty="password")

    step = Step("vm.example", "vm", lambda ctx, t: None, lambda t, f: [], apply)
    change = Change("vm.example", "train-01", "vm", "note", "old", f"set by {password}")
    runner = engine._Runner(step, Context(), journal := Journal(tmp_path), None, {"train-01": object()})
    with pytest.raises(vmodl.fault.InvalidArgument):
        runner(("train-01", [change]))
    text = journal.path.read_text(encoding="utf-8")
    assert_hidden(password, text)
    entries = [json.loads(line) for line in text.splitlines()]
    assert [e["status"] for e in entries] == ["started", "failed"]
    assert "InvalidArgument" in entries[1]["error"] and secrets.MASK in entries[1]["error"]
    for value in leaves(entries):
        assert_hidden(password, value)


def test_documents_mask_values_before_json(password):
    data = document("verify", message=f"fault: {password}", notes=[{"text": repr(password)}],
                    by_key={password: 1}, error=RuntimeError(password))
    for indent in (2, None):
        text = dumps(data, indent=indent)
        assert_hidden(password, text)
        assert text.count(secrets.MASK) == 4


def test_results_files_mask_values_before_json(password, tmp_path):
    results = load_results(STUDY_RESULTS)
    results = results.model_copy(update={"note": f"vCenter said: {password}"})
    path = save_results(tmp_path, results)
    text = path.read_text(encoding="utf-8")
    assert_hidden(password, text)
    assert load_results(path).note == f"vCenter said: {secrets.MASK}"


def test_a_report_of_results_written_elsewhere_masks_the_password(password, tmp_path):
    """A results file gpuvm did not mask (another tool's, an older gpuvm's) holds the password in
    its note: the HTML report (autoescaped) and the Markdown one show it in no form."""
    from gpuvm.bench.compare import compare
    from gpuvm.bench.report import write_report

    results = load_results(STUDY_RESULTS).model_copy(update={"note": f"vCenter said: {password}"})
    written = write_report(compare(results), tmp_path / "report")
    texts = [path.read_text(encoding="utf-8") for path in written if path.suffix in (".html", ".md")]
    assert len(texts) == 2 and all("vCenter said: " in text for text in texts)
    for text in texts:
        assert_hidden(password, text)


@pytest.fixture
def guarded(monkeypatch):
    """The CLI's output guards installed on a root handler of our own, all put back afterwards."""
    monkeypatch.setattr(sys, "excepthook", sys.excepthook)
    import threading

    monkeypatch.setattr(threading, "excepthook", threading.excepthook)
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter("%(levelname)s: %(message)s"))
    root = logging.getLogger()
    root.addHandler(handler)
    try:
        secrets.guard_output()
        yield stream
    finally:
        root.removeHandler(handler)


def test_log_lines_mask_values_and_tracebacks(password, guarded):
    log = logging.getLogger("gpuvm.test")
    log.warning("login as %s refused: %r (%d tries)", "admin", password, 3)
    log.warning("session %(who)s: %(why)s", {"who": "admin", "why": [password]})
    try:
        raise ValueError({"password": password})
    except ValueError:
        log.exception("unexpected")
    text = guarded.getvalue()
    assert_hidden(password, text)
    assert "(3 tries)" in text and "ValueError" in text and text.count(secrets.MASK) >= 3


def test_an_unexpected_traceback_masks_the_password(password, guarded, capsys):
    try:
        raise KeyError(password)  # str(KeyError) is the repr of its argument
    except KeyError:
        sys.excepthook(*sys.exc_info())
    text = capsys.readouterr().err
    assert "KeyError" in text
    assert_hidden(password, text)


def test_a_cli_error_quoting_an_encoded_password_masks_it(password, mocker, tmp_path):
    """An error whose text already holds the password encoded (a fault's repr, a JSON body) is
    masked on the CLI's one error line too."""
    from gpuvm.errors import RemoteCommandError

    encoded = f"vCenter answered {json.dumps({'pw': password})} after {password!r}"
    mocker.patch("gpuvm.runs.plan_runbook", side_effect=RemoteCommandError(encoded))
    result = CliRunner().invoke(app, ["plan", str(LAB), "--state-dir", str(tmp_path)])
    assert result.exit_code == RemoteCommandError.exit_code and "vCenter answered" in result.output
    assert_hidden(password, result.output)


# --------------------------------------------------------------------------------- GOVC_URL


RUNBOOK = "vcenter: {user: admin}\nhosts: []\nvms: []\n"


@pytest.mark.parametrize("command", ["plan", "validate"])
@pytest.mark.parametrize("url", ["https://admin:Gov-c0nly-pw@vc.example.com:99999/sdk",
                                 "http://admin:Gov-c0nly-pw@vc.example.com/sdk",
                                 "https://admin:Gov-c0nly-pw@vc.example.com:http/sdk"])
def test_a_bad_govc_url_never_shows_its_password(tmp_path, monkeypatch, command, url):
    for name in ("GOVC_PASSWORD", "GOVC_USERNAME", "GPUVM_VCENTER_PASSWORD"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("GOVC_URL", url)
    (runbook := tmp_path / "rb.yaml").write_text(RUNBOOK)
    state = ["--state-dir", str(tmp_path / "state")] if command == "plan" else []
    result = CliRunner().invoke(app, [command, str(runbook), *state])
    assert result.exit_code == 2, result.output
    assert "Gov-c0nly-pw" not in result.output
    assert "admin:***@vc.example.com" in result.output


def test_a_bad_runbook_url_never_shows_its_password(tmp_path):
    (runbook := tmp_path / "rb.yaml").write_text(
        "vcenter: {url: 'https://admin:Rb-0nly-pw@vc.example.com:99999/sdk'}\nhosts: []\nvms: []\n")
    result = CliRunner().invoke(app, ["validate", str(runbook)])
    assert result.exit_code == 2 and "Rb-0nly-pw" not in result.output
    assert "rb.yaml:1" in result.output and "admin:***@vc.example.com" in result.output


@pytest.mark.parametrize("url, shown", [
    ("https://u:p@ss:w0rd@vc/sdk", "https://u:***@vc/sdk"),  # an @ in the password: the last @ ends it
    ("u:secret@vc", "u:***@vc"),
    ("https://u@vc/sdk", "https://u@vc/sdk"),  # no password
    ("https://vc/sdk", "https://vc/sdk"),
])
def test_without_password(url, shown):
    assert secrets.without_password(url) == shown
