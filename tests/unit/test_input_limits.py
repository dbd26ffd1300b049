"""Inputs that passed `validate` and failed later (issue 22, item 9): errors about a file never
echo its content, and every file a runbook points at is a regular file of bounded size."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpuvm.cli.main import app

HASH = "$6$Zx9sAltSalt$VeryLongSecretPasswordHashThatMustNeverBePrinted0123456789"
SNAPSHOT = Path(__file__).parents[1] / "fixtures" / "inventory" / "lab.json"
VALID = Path(__file__).parents[1] / "fixtures" / "bad_runbooks" / "130-bool-timeout.yaml"


def gpuvm(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


@pytest.mark.parametrize("content", [
    f"root:{HASH}:19000:0:99999:7:::\ndaemon:*:19000:0:99999:7:::\n",  # /etc/shadow's shape
    f"root: {HASH}\n",
    f"password: {HASH}\npassword: {HASH}x\n",  # a duplicate key: YAML's message quotes both values
    f"vcenter: {{user: admin, '{HASH}': 1}}\nhosts: []\nvms: []\n",
])
def test_an_error_about_a_secret_file_never_prints_its_content(tmp_path, content):
    secret = tmp_path / "shadow"
    secret.write_text(content)
    runbook = tmp_path / "lab.yaml"
    runbook.symlink_to(secret)
    result = gpuvm("validate", runbook)
    assert result.exit_code == 2, result.output
    assert re.search(r"lab\.yaml:\d+: ", result.output), result.output  # still names line and field
    assert "Zx9sAltSalt" not in result.output and "VeryLongSecret" not in result.output, result.output
    assert "19000" not in result.output
