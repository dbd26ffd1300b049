"""The bad-input corpus: every broken runbook exits 2 with one message naming file, line and field.

Each `tests/fixtures/bad_runbooks/NN-name.yaml` has a `.expect` regex beside it. They are planned
offline against a snapshot of the simulator's lab (`tests/fixtures/inventory/lab.json`), so the
checks that need the inventory (missing devices, profiles not offered) run too.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpuvm.cli.main import app

FIXTURES = Path(__file__).parents[1] / "fixtures"
CORPUS = sorted((FIXTURES / "bad_runbooks").glob("*.yaml"))
SNAPSHOT = FIXTURES / "inventory" / "lab.json"


def test_corpus_is_large_enough():
    assert len(CORPUS) >= 50


@pytest.mark.parametrize("runbook", CORPUS, ids=[p.stem for p in CORPUS])
def test_bad_runbook_is_one_clear_error(runbook, monkeypatch, tmp_path):
    monkeypatch.setenv("GPUVM_VCENTER_PASSWORD", "unused")
    monkeypatch.setenv("GPUVM_STATE_DIR", str(tmp_path / "state"))
    expected = runbook.with_suffix(".expect").read_text().strip()
    result = CliRunner().invoke(app, ["plan", str(runbook), "--snapshot", str(SNAPSHOT)])
    output = result.output
    assert result.exit_code == 2, output
    assert "Traceback" not in output and result.exception is None or isinstance(result.exception, SystemExit)
    assert not any(c in output for c in "\x1b\x00\x07\r"), repr(output)  # input's control characters escaped
    assert len(output) < 2000, output[:2000]  # short, whatever the input's size
    assert not (tmp_path / "state").exists()  # nothing touched
    first = output.strip().splitlines()[0]
    assert first.startswith(f"error: {runbook}:"), first
    assert re.search(r"^error: \S+:\d+: ", first), first  # file:line
    assert re.search(expected, output), f"{expected!r} not in {output!r}"


VALID = FIXTURES / "bad_runbooks" / "69-bool-cpus.yaml"  # made valid below (cpus: 8)
# Bad input that is a command-line argument, the environment or a file's kind rather than a runbook's
# text: (id, argv after the runbook, environment, how the runbook is made, exit code, message).
ARGUMENTS = [
    ("state-dir-is-a-file", ["apply", "{rb}", "--yes", "--state-dir", "{tmp}/file"], {}, None, 2,
     r"state directory .*/file: cannot create or use it"),
    ("state-dir-below-a-file", ["apply", "{rb}", "--yes", "--state-dir", "{tmp}/file/below"], {}, None, 2,
     r"cannot create or use it"),
    ("fifo", ["plan", "{rb}"], {}, lambda rb: os.mkfifo(rb), 2, r"not a regular file"),
    ("directory", ["plan", "{rb}"], {}, lambda rb: rb.mkdir(), 2, r"cannot read runbook: Is a directory"),
    ("missing", ["plan", "{rb}"], {}, lambda rb: None, 2, r"cannot read runbook: No such file"),
    ("symlink-to-dev-zero", ["plan", "{rb}"], {}, lambda rb: rb.symlink_to("/dev/zero"), 2, r"not a regular file"),
    ("oversize", ["validate", "{rb}"], {}, lambda rb: rb.write_bytes(b"#" * (17 << 20)), 2, r"larger than 16 MB"),
    ("password-env-unset", ["plan", "{rb}"], {"GPUVM_VCENTER_PASSWORD": None, "GOVC_URL": "https://vc/sdk"}, "valid", 2,
     r"\.yaml:3: vcenter\.password_env: environment variable GPUVM_VCENTER_PASSWORD is not set"),
    ("password-too-short", ["validate", "{rb}"], {"GPUVM_VCENTER_PASSWORD": "x"}, "valid", 2,
     r"\.yaml:3: vcenter\.password_env .*shorter than 6 characters"),
    ("govc-url-bad-port", ["plan", "{rb}"], {"GOVC_URL": "https://vc:99999/sdk"}, "valid", 2, r"GOVC_URL: .*Port out of range"),
    ("govc-url-control", ["validate", "{rb}"], {"GOVC_URL": "https://vc/sdk\x1b[2J"}, "valid", 2,
     r"GOVC_URL .*contains control characters"),
    ("ca-file-not-pem", ["plan", "{rb}"], {"GOVC_URL": "https://vc.example.com/sdk"}, "ca:{tmp}/junk.pem", 2,
     r"\.yaml:\d+: vcenter\.ca_file: .*is not a PEM bundle"),
    ("ca-file-directory", ["plan", "{rb}"], {"GOVC_URL": "https://vc.example.com/sdk"}, "ca:{tmp}", 2,
     r"\.yaml:\d+: vcenter\.ca_file: .*is not a file"),
    ("ca-file-empty", ["plan", "{rb}"], {"GOVC_URL": "https://vc.example.com/sdk"}, "ca:{tmp}/file", 2,
     r"\.yaml:\d+: vcenter\.ca_file: .*is empty"),
    ("vcenter-unreachable", ["plan", "{rb}"], {"GOVC_URL": "https://127.0.0.1:9/sdk"}, "valid", 3,
     r"GOVC_URL|cannot connect"),
    ("url-unreachable", ["plan", "{rb}"], {}, "url:https://127.0.0.1:9/sdk", 3, r"\.yaml:2: vcenter\.url: .*cannot connect"),
    ("bench-template-code", ["bench", "run", "{rb}", "--local", "--dry-run"], {}, "bench", 2,
     r"benchmarks\.runs\[0\]\.command: cannot render: .*unsafe"),
    ("setup-unknown", ["plan", "{rb}", "--setup", "nope"], {}, "valid", 2, r"--setup nope: no such setup"),
]


def _runbook(tmp_path, make) -> Path:
    rb = tmp_path / "rb.yaml"
    valid = VALID.read_text().replace("cpus: true", "cpus: 8")
    if callable(make):
        make(rb)
    elif make is None or make == "valid":
        rb.write_text(valid)
    elif make.startswith("ca:"):
        rb.write_text(valid.replace("vcenter:\n", f"vcenter:\n  ca_file: {make[3:].format(tmp=tmp_path)}\n"))
    elif make.startswith("url:"):
        rb.write_text(valid.replace("vcenter:\n", f"vcenter:\n  url: {make[4:]}\n"))
    elif make == "bench":
        rb.write_text("benchmarks:\n  runs:\n    - {name: evil, kind: command, pattern: 'x=(\\d+)',\n"
                      "       command: \"{{ cycler.__init__.__globals__.os.system('true') }}\"}\n")
    return rb


@pytest.mark.parametrize("argv, env, make, code, message", [c[1:] for c in ARGUMENTS], ids=[c[0] for c in ARGUMENTS])
def test_bad_argument_or_environment_is_one_clear_error(tmp_path, monkeypatch, argv, env, make, code, message):
    (tmp_path / "file").touch()
    (tmp_path / "junk.pem").write_text("not a certificate\n")
    for name in ("GOVC_URL", "GOVC_TLS_CA_CERTS", "GOVC_INSECURE", "GOVC_USERNAME", "GOVC_PASSWORD"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("GPUVM_VCENTER_PASSWORD", "secret-long-enough")
    monkeypatch.setenv("GPUVM_STATE_DIR", str(tmp_path / "state"))
    for name, value in env.items():
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, value)
    rb = _runbook(tmp_path, make)
    before = sorted(p.name for p in tmp_path.iterdir())
    result = CliRunner().invoke(app, [a.format(rb=rb, tmp=tmp_path) for a in argv])
    output = " ".join(result.output.split())
    assert result.exit_code == code, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    assert "Traceback" not in output and "\x1b" not in output and output.startswith("error: "), output
    assert re.search(message, output), f"{message!r} not in {output!r}"
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # nothing created, no state directory


def test_the_corpus_and_the_table_hold_150_cases():
    assert len(CORPUS) + len(ARGUMENTS) >= 150
