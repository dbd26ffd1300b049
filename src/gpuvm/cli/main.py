"""gpuvm's command line: thin commands over the library (heavy imports happen inside them)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from gpuvm.cli.common import connect, err, fail, handle_errors, interactive, load, observe, out, remote

app = typer.Typer(no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False,
                  help="Turn vSphere hosts with NVIDIA GPUs into a deep-learning cluster, and prove it performs.")
@app.callback()
def _setup() -> None:
    """Warnings (e.g. a newly trusted SSH host key and its fingerprint) go to stderr, one line each."""
    import logging

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s: %(message)s")
    logging.getLogger("paramiko").setLevel(logging.ERROR)  # its transport chatter; failures reach us as errors


bench_app = typer.Typer(no_args_is_help=True, help="Run, compare and report benchmark campaigns.")
app.add_typer(bench_app, name="bench")

RUNBOOK = typer.Argument(..., exists=False, help="The runbook (YAML)", show_default=False)
INSECURE = typer.Option(False, "--insecure", help="Turn TLS certificate verification OFF (says so loudly)")
ACCEPT_KEYS = typer.Option(False, "--accept-new-host-keys",
                           help="Trust SSH host keys seen for the first time (records them, prints fingerprints)")
STATE = typer.Option(None, "--state-dir", help="State directory: journal, keys (default $GPUVM_STATE_DIR or .gpuvm)")


@app.command()
@handle_errors
def validate(runbook: Path = RUNBOOK) -> None:
    """Check a runbook: prints 'valid' or errors with file:line and field (exit 2)."""
    book = load(runbook)
    out.print(f"{runbook}: valid ({len(book.hosts)} host(s), {len(book.vms)} VM(s))")


@app.command()
@handle_errors
def inventory(runbook: Path = RUNBOOK, save: Optional[Path] = typer.Option(None, help="Write a snapshot file"),
              insecure: bool = INSECURE) -> None:
    """Hosts, their GPUs and NICs (model, PCI address, NUMA, passthrough state), and VMs."""
    from gpuvm.render import print_inventory

    facts = observe(load(runbook), insecure)
    print_inventory(out, facts)
    if save:
        facts.save(save)
        out.print(f"snapshot written to {save}")


@app.command()
@handle_errors
def plan(runbook: Path = RUNBOOK,
         snapshot: Optional[Path] = typer.Option(None, help="Plan from an inventory snapshot, without vCenter"),
         json_: bool = typer.Option(False, "--json", help="Print the plan as JSON"),
         detailed_exitcode: bool = typer.Option(False, "--detailed-exitcode",
                                                help="Exit 0: no changes, 2: changes, 1: error"),
         accept_new_host_keys: bool = ACCEPT_KEYS, state_dir: Optional[Path] = STATE,
         insecure: bool = INSECURE) -> None:
    """Dry run: every change on every host and VM, disruptive ones marked. Changes nothing."""
    from gpuvm.engine import make_plan
    from gpuvm.errors import GpuvmError
    from gpuvm.render import plan_json, print_plan

    try:
        book = load(runbook)
        inventory = observe(book, insecure, snapshot)
        if snapshot is not None:
            the_plan, _ = make_plan(book, inventory)
        else:
            with remote(book, accept_new_host_keys, state_dir) as (cluster, facts, down):
                the_plan, _ = make_plan(book, inventory, cluster, facts, down)
    except GpuvmError as e:
        raise fail(str(e), 1 if detailed_exitcode else e.exit_code) from None
    if json_:
        print(plan_json(the_plan))
    else:
        print_plan(out, the_plan)
    if detailed_exitcode and not the_plan.empty:
        raise typer.Exit(2)


@app.command()
@handle_errors
def apply(runbook: Path = RUNBOOK,
          yes: bool = typer.Option(False, "--yes", "-y", help="Apply without asking"),
          allow_power_off: bool = typer.Option(False, help="Allow powering VMs off (guest shutdown first)"),
          allow_host_reboot: bool = typer.Option(False, help="Allow maintenance mode and host reboots"),
          parallel: int = typer.Option(8, min=1, max=64, help="Targets changed at once"),
          state_dir: Optional[Path] = STATE,
          shutdown_timeout: float = typer.Option(300, help="Seconds to wait for a guest shutdown"),
          accept_new_host_keys: bool = ACCEPT_KEYS, insecure: bool = INSECURE) -> None:
    """Show the plan, ask (or --yes), apply it in parallel, journal every change."""
    from gpuvm.engine import apply_plan, check_allowed, make_plan, raise_failures
    from gpuvm.journal import Journal, state_dir as make_state_dir
    from gpuvm.render import print_plan
    from gpuvm.steps.base import Context, Options
    from gpuvm.vsphere.inventory import read_inventory

    book = load(runbook)
    with connect(book, insecure) as session, \
            remote(book, accept_new_host_keys, state_dir, parallel) as (cluster, seen, down):
        facts = read_inventory(session)
        the_plan, desired = make_plan(book, facts, cluster, seen, down)
        print_plan(out, the_plan)
        if the_plan.empty and not down:
            return
        check_allowed(the_plan, desired, allow_power_off, allow_host_reboot)
        if not yes:
            if not interactive():
                raise fail("not applying: no terminal to ask on; pass --yes to apply without asking", 2)
            if not typer.confirm("Apply these changes?", default=False):
                raise fail("not applied", 1)
        journal = Journal(make_state_dir(state_dir))
        options = Options(allow_power_off=allow_power_off, allow_host_reboot=allow_host_reboot,
                          shutdown_timeout=shutdown_timeout, guest_boot_timeout=book.ssh.boot_timeout)

        def progress(step: str, target: str, status: str) -> None:
            mark = "[red]✗[/]" if status.startswith("failed") else ("[green]✓[/]" if status.startswith("done") else "…")
            err.print(f"{mark} {step:<17} {target}: {status}", highlight=False)

        context = Context(session, facts, options, cluster, down)
        outcome = apply_plan(the_plan, desired, context, journal, parallel, progress)
    done = sum(len(c) for c in outcome.done.values())
    out.print(f"Applied {done} of {len(the_plan.changes)} change(s) in {outcome.seconds:.1f} s; "
              f"{len(outcome.failed)} target(s) failed, {len(outcome.skipped)} skipped. Journal: {journal.path}")
    for target, reason in outcome.skipped.items():
        err.print(f"skipped {target}: {reason}", highlight=False)
    raise_failures(outcome)


@app.command()
@handle_errors
def verify(runbook: Path = RUNBOOK, accept_new_host_keys: bool = ACCEPT_KEYS, state_dir: Optional[Path] = STATE,
           insecure: bool = INSECURE) -> None:
    """Exit non-zero (5) if the world drifted from the runbook, listing the drift."""
    from gpuvm.engine import make_plan
    from gpuvm.errors import DriftError
    from gpuvm.render import print_plan

    book = load(runbook)
    inventory = observe(book, insecure)
    with remote(book, accept_new_host_keys, state_dir) as (cluster, facts, down):
        if down:
            raise DriftError("drift: guest(s) not reachable over SSH:\n  " +
                             "\n  ".join(f"{name}: {reason}" for name, reason in down.items()))
        the_plan, _ = make_plan(book, inventory, cluster, facts)
        if not the_plan.empty:
            print_plan(out, the_plan)
            raise DriftError(f"drift: {len(the_plan.changes)} change(s) needed to match {runbook}")
        if cluster is not None and book.guests and book.guests.ssh_mesh and book.guests.ssh_mesh.enabled:
            from gpuvm.mesh.verify import check_mesh

            check_mesh(cluster)  # every ordered pair of guests logs in with the mesh key
            out.print(f"SSH mesh: all {len(cluster.of_role('guest'))} guests reach each other.")
    out.print("No drift: infrastructure matches the runbook.")


@app.command("launch-files")
@handle_errors
def launch_files(runbook: Path = RUNBOOK,
                 directory: Path = typer.Option(Path("."), "--out", help="Directory to write into")) -> None:
    """Write the Open MPI hostfile and horovodrun's host list for all the runbook's guests."""
    from gpuvm.launch import write_launch_files

    for name, path in write_launch_files(load(runbook), directory).items():
        out.print(f"{name}: {path}")


def _register_optional() -> None:
    """Sub-commands that live in their own modules."""
    try:
        from gpuvm.cli import bench_report, bench_run
    except ImportError:
        return
    bench_report.register(bench_app)
    bench_run.register(bench_app)


_register_optional()

if __name__ == "__main__":
    app()
