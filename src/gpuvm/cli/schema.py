"""`gpuvm schema NAME`: print a JSON Schema gpuvm ships (the runbook's, or a `--json` document's)."""

from __future__ import annotations

import typer

from gpuvm.cli.common import fail, handle_errors


def register(app: typer.Typer) -> None:
    app.command("schema")(schema_command)


@handle_errors
def schema_command(name: str = typer.Argument(..., metavar="NAME", show_default=False,
                                              help="runbook, or a command that prints JSON: plan, apply, verify, "
                                                   "inventory, bench-run, bench-compare, size, locks, saved-plan; "
                                                   "or error (any command's, with --json)"),
                   markdown: bool = typer.Option(False, "--markdown",
                                                 help="runbook only: the reference (docs/runbook.md) instead")) -> None:
    """Print the JSON Schema of the runbook (for editors: the playbooks' yaml-language-server line), or
    of a command's --json document."""
    import json

    from gpuvm.documents import VERSIONS, schema

    if name == "runbook":
        from gpuvm.runbook.reference import reference_markdown
        from gpuvm.runbook.schema import schema_text

        typer.echo(reference_markdown() if markdown else schema_text(), nl=False)
        return
    if name not in VERSIONS:
        raise fail(f"no schema named {name!r}: runbook, {', '.join(sorted(VERSIONS))}", 2)
    if markdown:
        raise fail("--markdown is for the runbook's schema only", 2)
    typer.echo(json.dumps(schema(name), indent=2))
