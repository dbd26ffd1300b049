"""`gpuvm locks RUNBOOK`: every gpuvm lease, the locks of the runbook's hosts and the intents on its
objects, in every vCenter it names; `--break RUN_ID` ends that run's lease and locks, asking first.
A thin command over gpuvm.vsphere.lock_report."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Callable, Optional

import typer

from gpuvm.cli.common import access, fail, handle_errors, interactive, load, out, warn

NOTHING = "No gpuvm lease, lock or intent on the runbook's objects."
INTENTS_STAY = ("intents stay: each is cleared only by the apply that finishes or undoes its act "
                "(run apply again)")


def register(app: typer.Typer) -> None:
    app.command("locks")(locks_command)


@handle_errors
def locks_command(
    runbook: Annotated[Path, typer.Argument(help="The runbook (YAML)", show_default=False)],
    break_: Annotated[Optional[str], typer.Option("--break", metavar="RUN_ID",
                                                  help="End this run's lease and remove its host locks (a holder "
                                                       "still alive stops at its next change, exit 8); its intents "
                                                       "stay")] = None,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Break without asking")] = False,
    json_: Annotated[bool, typer.Option("--json", help="Print JSON (schema gpuvm.locks/1)")] = False,
    state_dir: Annotated[Optional[Path], typer.Option("--state-dir", help="State directory: the journal records "
                                                      "a break (default $GPUVM_STATE_DIR or .gpuvm)")] = None,
    insecure: Annotated[bool, typer.Option("--insecure", help="Turn TLS certificate verification OFF "
                                                              "(says so loudly)")] = False,
) -> None:
    """Every gpuvm lease, lock and intent on the runbook's objects (holder, run, since, expiry, act);
    --break RUN_ID ends a run's lease and locks (after a `kill -9`: the next apply need not wait)."""
    from gpuvm.errors import ConnectError
    from gpuvm.connecting import connect_all
    from gpuvm.vsphere import lock_report

    book = load(runbook)
    with connect_all(book, access(insecure)) as (sessions, down):
        report = lock_report.observe(book, sessions, down)
        for name, why in report.down.items():
            warn(f"vCenter {name} not reached, its leases, locks and intents not shown: {why}")
        if break_ is None:
            print_report(report, json_, fleet=bool(book.vcenters))
        else:
            broken = _break(report, sessions, break_, yes, state_dir, say=_quiet if json_ else _said)
            if json_:
                print_report(report, json_, fleet=bool(book.vcenters), broken=broken)
    if report.down:
        raise ConnectError(f"vCenter(s) {', '.join(report.down)} not reached")


def print_report(report: Any, json_: bool, fleet: bool, broken: dict[str, Any] | None = None) -> None:
    """The rows as a table or one JSON document; `broken`: what `--break` removed (JSON: its `broken`)."""
    from gpuvm.documents import document, dumps
    from gpuvm.render import table

    if json_:
        extra = {} if broken is None else {"broken": broken}
        print(dumps(document("locks", rows=[row.to_dict() for row in report.rows],
                             not_reached={name: str(why) for name, why in report.down.items()}, **extra)))
        return
    if not report.rows:
        out.print(NOTHING)
        return
    columns = ["kind", "object", "run", "holder", "since", "expires", "state", "act", "why"]
    rows = [(row.kind, row.object, row.run, row.who, _when(row.since), _when(row.expires), row.state, row.act, row.why)
            for row in report.rows]
    if fleet:
        columns, rows = ["vcenter", *columns], [(row.vcenter, *cells) for row, cells in zip(report.rows, rows)]
    out.print(table("gpuvm leases, locks and intents (times: vCenter's)", columns, rows))


def _when(text: str) -> str:
    """A time of vCenter's to the second, for a table cell (as read: a time gpuvm did not write)."""
    from datetime import datetime

    try:
        return datetime.fromisoformat(text).isoformat(sep=" ", timespec="seconds")
    except ValueError:
        return text


def _said(line: str) -> None:
    out.print(line, markup=False, highlight=False)


def _quiet(line: str) -> None:
    """--json: the document says it all."""


def _break(report: Any, sessions: dict[str, Any], run: str, yes: bool, state_dir: Path | None,
           say: Callable[[str], None]) -> dict[str, Any]:
    """Break `run`'s lease and locks (asking first unless `yes`), each line said; what was broken:
    the run, what was removed in each vCenter, the intents that stay, and the closing message."""
    from gpuvm.journal import Journal, state_dir as make_state_dir
    from gpuvm.vsphere import lock, lock_report

    lock_report.check_run(run, report.seen)
    held = {name: what for name, seen in report.seen.items() if (what := lock_report.held_by(run, seen))}
    for name, what in held.items():
        say(f"vCenter {name}: {', '.join(what)}")
    holders = {row.who for row in report.rows if row.run == run and row.kind == "lease"}
    if not yes:
        _confirm(f"Break run {run}'s lease and locks (held by {', '.join(sorted(holders)) or 'an unknown holder'})?")
    journal = Journal(make_state_dir(state_dir))
    removed: dict[str, list[str]] = {}
    for name, what in held.items():
        removed[name] = lock_report.break_run(sessions[name], what)
        journal.record("locks-broken", broken_run=run, who=lock.who(), vcenter=name, removed=removed[name])
        say(f"vCenter {name}: removed {', '.join(removed[name])}")
    waiting = [row for row in report.rows if row.run == run and row.kind == "intent"]
    acts = f" ({', '.join(f'{row.act} on {row.object}' for row in waiting)})" if waiting else ""
    message = (f"Run {run}'s lease is broken: a holder still alive stops at its next change (exit 8); "
               f"its {INTENTS_STAY}{acts}.")
    say(message)
    return {"run": run, "removed": removed,
            "intents": [{"vcenter": row.vcenter, "object": row.object, "act": row.act} for row in waiting],
            "message": message}


def _confirm(question: str) -> None:
    """Asked before anything is broken (not with --yes), on stderr; stopping raises."""
    if not interactive():
        raise fail("not breaking: no terminal to ask on; pass --yes to break without asking", 2)
    if not typer.confirm(question, default=False, err=True):
        raise fail("not broken", 1)
