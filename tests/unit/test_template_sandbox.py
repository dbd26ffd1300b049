"""A benchmark `command` is a template the user writes (issue 11, item 8): it renders in jinja2's
sandbox, so a dry run never reaches Python (and never runs anything)."""

from __future__ import annotations

from typer.testing import CliRunner

from gpuvm.cli.main import app


def test_a_runbook_command_renders_in_jinja2s_sandbox(tmp_path):
    canary = tmp_path / "ran"
    runbook = tmp_path / "rb.yaml"
    runbook.write_text(f"""\
benchmarks:
  runs:
    - name: evil
      kind: command
      command: "{{{{ cycler.__init__.__globals__.os.system('touch {canary}') }}}} {{{{ np }}}}"
      pattern: "x=(\\\\d+)"
""")
    result = CliRunner().invoke(app, ["bench", "run", str(runbook), "--local", "--dry-run"])
    assert result.exit_code == 2, result.output
    assert "benchmarks.runs[0].command: cannot render" in " ".join(result.output.split()), result.output
    assert "unsafe" in result.output
    assert not canary.exists()
