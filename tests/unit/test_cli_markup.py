"""Text from runbooks, hosts and remote commands is printed as text (issue 11, item 3): square
brackets that the terminal renderer could take as markup neither vanish nor raise."""

from __future__ import annotations

import shutil
from pathlib import Path

from typer.testing import CliRunner

from gpuvm.cli.common import fail, handle_errors
from gpuvm.cli.main import app
from gpuvm.errors import InputError
from gpuvm.plan import Change, Note, Plan
from gpuvm.render import print_plan

MARKUP = "[/bold] [red]x[/] [link=file:///etc/passwd]y[/link] [/]"


def test_a_runbook_path_with_markup_is_printed_as_it_is(tmp_path):
    runbook = tmp_path / f"lab {MARKUP.replace('/', '_')}.yaml"
    shutil.copy(Path(__file__).parents[2] / "playbooks" / "lab.yaml", runbook)
    result = CliRunner().invoke(app, ["validate", str(runbook)])
    assert result.exit_code == 0, result.output
    assert f"{runbook}: valid" in " ".join(result.output.split())


def test_an_error_message_with_markup_is_printed_as_it_is(capsys):
    @handle_errors
    def command() -> None:
        raise InputError(f"rb.yaml:3: hosts[0].name: bad name {MARKUP}")

    try:
        command()
    except Exception as e:  # typer.Exit
        assert getattr(e, "exit_code", None) == 2
    assert f"error: rb.yaml:3: hosts[0].name: bad name {MARKUP}" in " ".join(capsys.readouterr().err.split())
    assert fail(MARKUP, 3).exit_code == 3


def test_plan_rows_and_notes_with_markup_are_printed_as_they_are():
    from rich.console import Console

    console = Console(record=True, width=300, markup=False)
    plan = Plan(changes=[Change("guest.nic", f"vm {MARKUP}", "port", "ip", None, MARKUP)],
                notes=[Note(f"vm {MARKUP}", "resolve", f"last line: {MARKUP}")])
    print_plan(console, plan, "table")
    text = console.export_text()
    assert f"vm {MARKUP}" in text and f"│ {MARKUP}" in text
    print_plan(console, plan)  # the default: grouped text
    text = console.export_text()
    assert f"vm {MARKUP}\n" in text and f"+ port ip: {MARKUP}\n" in text
    assert f"warning: vm {MARKUP}: last line: {MARKUP}" in " ".join(text.split())
