"""`gpuvm show FILE`: print a plan saved by `plan --out` as `plan` prints it (text, table or JSON)."""

from __future__ import annotations

from pathlib import Path

import typer

from gpuvm.cli.common import FORMAT, Form, fail, handle_errors, out


def register(app: typer.Typer) -> None:
    app.command("show")(show_command)


@handle_errors
def show_command(file: Path = typer.Argument(..., metavar="FILE", help="A plan saved by `plan --out`",
                                             show_default=False),
                 json_: bool = typer.Option(False, "--json", help="Print JSON (gpuvm.plan/1, as `plan --json`)"),
                 form: Form = FORMAT) -> None:
    """Print a saved plan: its changes as `plan` prints them, the runbook it was made from and the
    --allow-* flags `apply FILE` needs."""
    from gpuvm.documents import plan_json
    from gpuvm.render import print_plan
    from gpuvm.saved_plan import read

    saved = read(file)
    if saved is None:
        raise fail(f"{file}: not a saved plan (make one with: gpuvm plan RUNBOOK --out FILE)", 2)
    if json_:
        print(plan_json(saved.plan))
        return
    scope = f" --setup {saved.setup}" if saved.setup else ""
    scope += "".join(f" --target {name}" for name in saved.targets)
    needs = f"; apply needs {' '.join(saved.needs)}" if saved.needs else ""
    out.print(f"saved plan of {saved.runbook}{scope} (sha256 {saved.sha256[:12]}…){needs}",
              markup=False, highlight=False, soft_wrap=True)
    print_plan(out, saved.plan, form.value)
