"""`gpuvm init`: write a starter runbook from what the vCenter named by govc's variables has."""

from __future__ import annotations

from pathlib import Path

import typer

from gpuvm.cli.common import access, fail, handle_errors, out


def register(app: typer.Typer) -> None:
    app.command("init")(init_command)


@handle_errors
def init_command(runbook: Path = typer.Argument(..., help="The runbook file to write", show_default=False),
                 force: bool = typer.Option(False, "--force", help="Overwrite the file if it exists"),
                 insecure: bool = typer.Option(False, "--insecure", help="Turn TLS certificate verification OFF")) -> None:
    """Write a starter runbook (hosts, their GPUs and NICs, the VMs) from vCenter: GOVC_URL,
    GOVC_USERNAME, GOVC_PASSWORD (and GOVC_TLS_CA_CERTS / GOVC_INSECURE) say which."""
    from gpuvm.files import check_writable, write_text
    from gpuvm.connecting import discover
    from gpuvm.starter import starter_runbook

    if runbook.exists() and not force:  # refused before vCenter is asked anything
        raise fail(f"{runbook} exists: pass --force to overwrite it", 2)
    check_writable(runbook, "runbook")
    inventory, target = discover(access(insecure))
    write_text(runbook, starter_runbook(inventory, target.url, target.user), "runbook")
    out.print(f"{runbook}: written ({len(inventory.hosts)} host(s), {len(inventory.vms)} VM(s)); "
              f"check it with `gpuvm validate {runbook}`, then edit it")
