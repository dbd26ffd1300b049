"""`gpuvm --version`, shell completion, and the user guide's step table in the engine's order (issue 14)."""

from __future__ import annotations

import re
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpuvm.cli.main import app
from gpuvm.engine import STEPS

GUIDE = Path(__file__).parents[2] / "docs" / "guide.md"


def test_version_prints_the_package_version_and_exits_0():
    result = CliRunner().invoke(app, ["--version"])
    assert result.exit_code == 0
    assert result.output == f"gpuvm {version('gpuvm')}\n"


def test_shell_completion_is_offered_installable_and_completes_commands(monkeypatch):
    help_text = CliRunner().invoke(app, ["--help"], env={"COLUMNS": "200"}).output
    assert "--install-completion" in help_text and "--show-completion" in help_text
    # the shell named, not detected: the tests' parent process need not be a shell (under `timeout`, say)
    monkeypatch.setenv("_TYPER_COMPLETE_TEST_DISABLE_SHELL_DETECTION", "1")
    script = CliRunner().invoke(app, ["--show-completion", "bash"], prog_name="gpuvm")
    assert script.exit_code == 0 and "complete -o default -F _gpuvm_completion gpuvm" in script.output
    # what the installed script runs on <TAB>: `gpuvm pl` completes to `plan`
    completed = CliRunner().invoke(app, [], prog_name="gpuvm",
                                   env={"_GPUVM_COMPLETE": "complete_bash", "COMP_WORDS": "gpuvm pl", "COMP_CWORD": "1"})
    assert completed.exit_code == 0 and completed.output.split() == ["plan"]


def guide_step_table() -> list[str]:
    """The step names of the user guide's table `| step | target | what |`, top to bottom."""
    table = GUIDE.read_text().split("| step | target | what |\n", 1)[1]
    names = []
    for line in table.splitlines()[1:]:  # after the |---| row
        if not line.startswith("|"):
            break
        names.append(re.match(r"\| `([a-z_.]+)` \|", line).group(1))
    return names


def test_the_guide_step_table_lists_every_step_in_the_order_they_run():
    assert guide_step_table() == [step.name for step in STEPS]


INVENTORY_ALONE = """
import sys
from unittest import mock
import pytest
from typer.testing import CliRunner
from gpuvm.cli.main import app
from gpuvm.runbook.model import Runbook
from gpuvm.vsphere.facts import Inventory
from gpuvm.vsphere.shown import Shown
with mock.patch("gpuvm.connecting.inventory_of", return_value=(Shown(Inventory(source="vc")), Runbook())):
    result = CliRunner().invoke(app, ["inventory", "rb.yaml", *sys.argv[1:]])
assert result.exit_code == 0, result.output
print(sorted(m for m in sys.modules if m in ("gpuvm.engine", "gpuvm.runs", "gpuvm.steps.base")))
"""


@pytest.mark.parametrize("options", [[], ["--json"]])
def test_inventory_loads_none_of_the_engine(options):
    """`gpuvm inventory` reads and prints; the plan engine's modules (a third of its start-up, issue 34)
    stay unloaded."""
    done = subprocess.run([sys.executable, "-c", INVENTORY_ALONE, *options], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
