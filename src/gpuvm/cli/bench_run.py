"""`gpuvm bench run`: a thin command over gpuvm.bench.campaign (plan) and gpuvm.bench.runner
(prepare, run, write results)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape

from gpuvm.cli.common import err, fail, handle_errors, load, out


def register(app: typer.Typer) -> None:
    """Add `run` to the `bench` sub-app."""
    app.command("run")(run_command)


@handle_errors
def run_command(
    runbook: Annotated[Path, typer.Argument(help="The runbook (YAML) with a `benchmarks` section.", show_default=False)],
    only: Annotated[list[str] | None, typer.Option("--only", help="Run only this benchmark (repeatable).")] = None,
    out_dir: Annotated[Path, typer.Option("--out", "-o", help="Where the results directory is created.")] = Path("results"),
    local: Annotated[bool, typer.Option("--local", help="Run on this machine (bare-metal baseline), not on the guests.")] = False,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Print every command that would run; run nothing.")] = False,
    accept_new_host_keys: Annotated[bool, typer.Option(
        "--accept-new-host-keys", help="Trust SSH host keys seen for the first time (records them).")] = False,
    state_dir: Annotated[Path | None, typer.Option(
        "--state-dir", help="State directory: known_hosts (default $GPUVM_STATE_DIR or .gpuvm)")] = None,
) -> None:
    """Run the runbook's benchmarks: every point, warm-ups, repeats; logs and results.json under --out."""
    from gpuvm.bench.campaign import describe, plan_campaign
    from gpuvm.bench.recording import results_directory
    from gpuvm.bench.runner import CampaignRunner, executors_for
    from gpuvm.journal import state_dir as make_state_dir

    book = load(runbook)
    points = plan_campaign(book, local=local, only=only or ())
    if dry_run:
        workdir = "<results>/work" if local else book.benchmarks.workdir
        for line in describe(points, workdir):
            out.print(line, highlight=False, markup=False, soft_wrap=True)
        return
    directory = results_directory(out_dir, book)
    executors = executors_for(book, points, local, make_state_dir(state_dir), accept_new_host_keys)
    try:
        with _Progress() as progress:
            runner = CampaignRunner(book, points, executors, directory, local=local, observer=progress)
            try:
                runner.prepare()
            except KeyboardInterrupt:
                raise fail("interrupted before any benchmark ran", 130) from None
            campaign = runner.run()
    finally:
        for executor in executors.values():
            executor.close()
    out.print(f"results: {campaign.results_file}", highlight=False, markup=False, soft_wrap=True)
    if campaign.interrupted:
        raise fail(f"interrupted after {campaign.runs_done} of {campaign.runs_total} run(s); "
                   f"what was measured is in {campaign.results_file}", 130)
    campaign.raise_for_failures()
    out.print(f"compare: gpuvm bench compare {campaign.directory}", highlight=False, markup=False, soft_wrap=True)


class _Progress:
    """The campaign on stderr: a bar with run i of n, benchmark, point, and the last figure."""

    def __enter__(self) -> _Progress:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self._progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                  TimeElapsedColumn(), TextColumn("{task.fields[last]}"), console=err,
                                  transient=False)
        self._progress.__enter__()
        self._task: Any = None
        return self

    def __exit__(self, *exc: object) -> None:
        self._progress.__exit__(*exc)

    def started(self, index: int, total: int, bench: str, point: str, label: str) -> None:
        if self._task is None:
            self._task = self._progress.add_task("", total=total, last="")
        self._progress.update(self._task, description=f"run {index}/{total} {bench} {point} {label}")

    def finished(self, index: int, total: int, bench: str, point: str, label: str,
                 value: float | None, unit: str, error: str | None) -> None:
        from gpuvm.secrets import redact

        if error is None:
            figure = f"{value:,.2f} {unit}".strip()
            self._progress.console.print(f"[green]✓[/] {escape(f'{bench} {point} {label}: {figure}')}",
                                         highlight=False, markup=True)
        else:
            figure = "failed"
            self._progress.console.print(f"[red]✗[/] {escape(f'{bench} {point} {label}: {redact(error)}')}",
                                         highlight=False, markup=True, soft_wrap=True)
        self._progress.update(self._task, advance=1, last=f"last: {figure}")
