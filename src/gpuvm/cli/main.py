"""gpuvm's command line: thin commands over the library (heavy imports happen inside them)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from gpuvm.cli import bench_report, bench_run, init, locks, schema, show, size
from gpuvm.cli.common import (DRAIN_TIMEOUT, FORMAT, Form, Gpuvm, access, ends_process, err, fail, finish,
                              handle_errors, interactive, load, out, warn)

app = Gpuvm(no_args_is_help=True, pretty_exceptions_enable=False, rich_markup_mode=None,
            help="Turn vSphere hosts with NVIDIA GPUs into a deep-learning cluster, and prove it performs.")


def _version(asked: bool) -> None:
    if asked:
        from importlib.metadata import version

        print(f"gpuvm {version('gpuvm')}")
        raise typer.Exit()


@app.callback()
def _setup(_: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                  help="Print gpuvm's version and exit")) -> None:
    """Warnings (e.g. a newly trusted SSH host key and its fingerprint) go to stderr, one line each."""
    import logging

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s: %(message)s")
    # its transport chatter (tracebacks of refused connections at ERROR); failures reach us as errors
    logging.getLogger("paramiko").setLevel(logging.CRITICAL)
    from gpuvm.secrets import guard_output

    guard_output()  # secrets masked in log lines and in the traceback of an unexpected error


bench_app = typer.Typer(no_args_is_help=True, rich_markup_mode=None, help="Run, compare and report benchmark campaigns.")
app.add_typer(bench_app, name="bench")
bench_report.register(bench_app)
bench_run.register(bench_app)
size.register(app)
init.register(app)
schema.register(app)
locks.register(app)
show.register(app)

RUNBOOK = typer.Argument(..., exists=False, help="The runbook (YAML)", show_default=False)
INSECURE = typer.Option(False, "--insecure", help="Turn TLS certificate verification OFF (says so loudly)")
ACCEPT_KEYS = typer.Option(False, "--accept-new-host-keys",
                           help="Trust SSH host keys seen for the first time (records them, prints fingerprints)")
STATE = typer.Option(None, "--state-dir", help="State directory: journal, keys (default $GPUVM_STATE_DIR or .gpuvm)")
SETUP = typer.Option(None, "--setup", help="Lay the VMs out as this setup of benchmarks.setups")
TARGET = typer.Option([], "--target", metavar="NAME",
                      help="Only this host (with its VMs and guests), VM (with its guest) or guest; repeatable")
JSON = typer.Option(False, "--json", help="Print JSON (schema in gpuvm/schemas/, id in its \"schema\" field)")




@app.command()
@handle_errors
def validate(runbook: Path = RUNBOOK) -> None:
    """Check a runbook: prints 'valid' or errors with file:line and field (exit 2)."""
    import os

    from gpuvm.errors import InputError
    from gpuvm.runbook.vcenters import url_problem
    from gpuvm.runbook.strict import shown
    from gpuvm.secrets import without_password

    book = load(runbook)
    govc_url = os.environ.get("GOVC_URL")
    if any(not vc.url for vc in book.all_vcenters.values()) and govc_url and (problem := url_problem(govc_url)):
        raise InputError(f"GOVC_URL (the runbook names no vcenter.url): {shown(without_password(govc_url))} {problem}")
    typer.echo(f"{runbook}: valid ({len(book.hosts)} host(s), {len(book.vms)} VM(s))")


@app.command()
@handle_errors
def inventory(runbook: Path = RUNBOOK, save: Optional[Path] = typer.Option(None, help="Write a snapshot file"),
              insecure: bool = INSECURE, json_: bool = JSON) -> None:
    """Hosts, their GPUs and NICs (model, PCI address, NUMA, passthrough state), and VMs: of every
    vCenter, a name two of them hold as <vcenter>/<name>; exit 3 if a vCenter was not reached."""
    from gpuvm import collector
    from gpuvm.files import check_writable
    from gpuvm.read_ahead import read_ahead

    if save:
        check_writable(save, "snapshot")  # before vCenter is asked anything
    ends_process()  # as `plan`: the inventory's objects are left to the OS, not freed one by one
    with collector.paused():  # thousands of objects read and printed, no cycles
        with read_ahead(runbook, insecure) as ahead:  # what follows happens while vCenter prepares its answer
            from gpuvm.connecting import inventory_of
            from gpuvm.documents import inventory_json
            from gpuvm.render import print_inventory

            seen, book = inventory_of(runbook, access(insecure), ahead)
        warnings = seen.warnings(book)
        for line in warnings:  # a vCenter not reached: its objects not shown, none shown in their place
            warn(line)
        if json_:
            print(inventory_json(seen, warnings))
        else:
            print_inventory(out, seen)
        if save:
            seen.inventory.save(save)
            (err if json_ else out).print(f"snapshot written to {save}")
        finish(3 if seen.down else 0)


@app.command()
@handle_errors
def plan(runbook: Path = RUNBOOK,
         snapshot: Optional[Path] = typer.Option(None, help="Plan from an inventory snapshot, without vCenter"),
         json_: bool = JSON, form: Form = FORMAT,
         detailed_exitcode: bool = typer.Option(False, "--detailed-exitcode",
                                                help="Exit 0: no changes, 2: changes (to carry out, or left "
                                                     "out by --target), 3: some target in scope not "
                                                     "observed (worst first), 1: error"),
         accept_new_host_keys: bool = ACCEPT_KEYS, state_dir: Optional[Path] = STATE,
         insecure: bool = INSECURE, setup: Optional[str] = SETUP, target: list[str] = TARGET,
         save: Optional[Path] = typer.Option(None, "--out", metavar="FILE",
                                             help="Also write the plan to FILE, for `apply FILE` to carry out "
                                                  "exactly it (refused if anything it plans changed since)")) -> None:
    """Dry run: every change on every host and VM, disruptive ones marked. Changes nothing (but --out's file)."""
    from gpuvm import collector
    from gpuvm.errors import GpuvmError
    from gpuvm.read_ahead import read_ahead

    ends_process()  # the inventory's tree and the plan are left to the OS, not freed one by one
    with collector.paused():  # the plan and its lines: many objects, no cycles (runs.plan_runbook pauses too)
        try:
            if save is not None and snapshot is not None:
                raise fail("--out saves a live plan: not with --snapshot", 2)
            live = snapshot is None and save is None and not target  # --target's names checked before vCenter is read
            with read_ahead(runbook, insecure, reads=live) as ahead:  # vCenter prepares its answer meanwhile
                from gpuvm.documents import plan_json
                from gpuvm.render import print_plan
                from gpuvm.runs import plan_runbook

                if save is not None:
                    from gpuvm.saved_plan import plan_to_file

                    the_plan = plan_to_file(runbook, save, access(insecure, accept_new_host_keys, state_dir), setup,
                                            target).plan
                    err.print(f"plan saved to {save}; carry it out with: gpuvm apply {save}", markup=False,
                              highlight=False)
                else:
                    the_plan = plan_runbook(runbook, access(insecure, accept_new_host_keys, state_dir), snapshot,
                                            setup, target, ahead)
        except GpuvmError as e:
            raise fail(str(e), 1 if detailed_exitcode else e.exit_code, e.code) from None
        if json_:
            print(plan_json(the_plan))
        else:
            print_plan(out, the_plan, form.value)
        finish(plan_exit_code(the_plan, detailed_exitcode))  # before the collector resumes: nothing left to collect


def plan_exit_code(plan: Any, detailed: bool) -> int:
    """The worst outcome first: 3 when a target in scope was not observed (the plan is incomplete, with
    or without --detailed-exitcode); with it, 2 when there are changes, to carry out or left out by
    --target; else 0."""
    if plan.unobserved:
        return 3
    return 2 if detailed and (plan.changes or plan.left_out) else 0


@app.command()
@handle_errors
def apply(runbook: Path = typer.Argument(..., metavar="RUNBOOK|FILE", show_default=False,
                                         help="The runbook (YAML), or a plan saved by `plan --out`"),
          yes: bool = typer.Option(False, "--yes", "-y", help="Apply without asking"),
          allow_power_off: bool = typer.Option(False, help="Allow powering VMs off (guest shutdown first)"),
          allow_host_reboot: bool = typer.Option(False, help="Allow maintenance mode and host reboots"),
          allow_destroy: bool = typer.Option(False, help="Allow destroying the VMs the runbook marks state: absent"),
          allow_repeat_reboot: bool = typer.Option(False, help="Allow rebooting a host again for a change still "
                                                               "pending after gpuvm rebooted it for that change"),
          parallel: int = typer.Option(8, min=1, max=64, help="Targets changed at once"),
          max_unavailable: int = typer.Option(1, min=1, help="Hosts rebooted at once"),
          state_dir: Optional[Path] = STATE,
          shutdown_timeout: float = typer.Option(300, help="Seconds to wait for a guest shutdown"),
          drain_timeout: Annotated[Optional[float], DRAIN_TIMEOUT] = None,
          accept_new_host_keys: bool = ACCEPT_KEYS, insecure: bool = INSECURE, setup: Optional[str] = SETUP,
          json_: bool = typer.Option(False, "--json", help="One JSON document per line: the plan, each progress "
                                                           "event, a summary (schema gpuvm.apply/1)"),
          form: Form = FORMAT, target: list[str] = TARGET) -> None:
    """Show the plan, ask (or --yes), apply it in parallel, journal every change. FILE, a plan saved
    by `plan --out`: exactly it is carried out, or refused (exit 2) if it is stale."""
    from gpuvm.apply_options import ApplyOptions
    from gpuvm.cli.apply_output import ApplyOutput
    from gpuvm.runs import apply_runbook
    from gpuvm.saved_plan import apply_saved, read

    shown = ApplyOutput(json_, form.value)
    options = ApplyOptions(allow_power_off=allow_power_off, allow_host_reboot=allow_host_reboot,
                           allow_destroy=allow_destroy, allow_repeat_reboot=allow_repeat_reboot, parallel=parallel,
                           max_unavailable=max_unavailable, shutdown_timeout=shutdown_timeout,
                           drain_timeout=drain_timeout)
    saved, reach = read(runbook), access(insecure, accept_new_host_keys, state_dir)
    if saved is not None and (setup or target):
        raise fail(f"{runbook} is a saved plan: it carries its own --setup and --target", 2)
    ui = {"show_plan": shown.plan, "confirm": None if yes else _confirm, "progress": shown.progress}
    applied = (apply_saved(runbook, saved, reach, options, **ui) if saved is not None
               else apply_runbook(runbook, reach, options, setup=setup, targets=target, **ui))
    shown.summary(applied)
    applied.raise_for_outcome()  # failed or not observed: their code (3 for connections); left out: 5


def _confirm(plan: Any) -> None:
    """Asked before `apply` changes anything (not with --yes), on stderr; stopping raises."""
    if not interactive():
        raise fail("not applying: no terminal to ask on; pass --yes to apply without asking", 2)
    if not typer.confirm("Apply these changes?", default=False, err=True):
        raise fail("not applied", 1)


@app.command()
@handle_errors
def verify(runbook: Path = RUNBOOK, accept_new_host_keys: bool = ACCEPT_KEYS, state_dir: Optional[Path] = STATE,
           insecure: bool = INSECURE, setup: Optional[str] = SETUP, json_: bool = JSON, form: Form = FORMAT,
           target: list[str] = TARGET) -> None:
    """Exit 5 if the world drifted from the runbook, listing the drift; 3 if a target could not be
    observed (the drift found on the others listed too)."""
    from gpuvm.read_ahead import read_ahead

    with read_ahead(runbook, insecure, reads=not target) as ahead:  # as `plan`'s
        from gpuvm.documents import verify_json
        from gpuvm.errors import DriftError
        from gpuvm.render import print_plan
        from gpuvm.runs import NotObserved, PlanDrift, verify_runbook

        try:
            verified = verify_runbook(runbook, access(insecure, accept_new_host_keys, state_dir), setup, target, ahead)
        except (DriftError, NotObserved) as drift:
            if json_:
                print(verify_json(drift=drift))
            elif isinstance(drift, (PlanDrift, NotObserved)):
                print_plan(out, drift.plan, form.value)
            raise
    if json_:
        print(verify_json(verified=verified))
        return
    for note in verified.foreign:  # gpuvm acts on none of them: warned of, not drift
        out.print(f"warning: {note.target}: {note.message}", markup=False, highlight=False, soft_wrap=True)
    if verified.mesh_guests is not None:
        out.print(f"SSH mesh: all {verified.mesh_guests} guests reach each other.")
    out.print(verified.message)


@app.command("launch-files")
@handle_errors
def launch_files(runbook: Path = RUNBOOK,
                 directory: Path = typer.Option(Path("."), "--out", help="Directory to write into")) -> None:
    """Write the Open MPI hostfile and horovodrun's host list for all the runbook's guests."""
    from gpuvm.launch import write_launch_files

    for name, path in write_launch_files(load(runbook), directory).items():
        out.print(f"{name}: {path}")


if __name__ == "__main__":
    app()
