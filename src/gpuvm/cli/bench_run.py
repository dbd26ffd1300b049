"""`gpuvm bench run`: a thin command over gpuvm.bench.runs (dry run, check and prepare the campaign,
run it); it renders the setups' plans, the progress and the outcome."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from gpuvm.cli.common import DRAIN_TIMEOUT, access, err, escape, fail, handle_errors, interactive, interrupted_exit, out


def register(app: typer.Typer) -> None:
    """Add `run` to the `bench` sub-app."""
    app.command("run")(run_command)


@handle_errors
def run_command(
    runbook: Annotated[Path, typer.Argument(help="The runbook (YAML) with a `benchmarks` section.", show_default=False)],
    only: Annotated[list[str] | None, typer.Option("--only", help="Run only this benchmark (repeatable).")] = None,
    setup: Annotated[list[str] | None, typer.Option("--setup", help="Run only this setup (repeatable).")] = None,
    out_dir: Annotated[Path, typer.Option("--out", "-o", help="Where the results directory is created.")] = Path("results"),
    local: Annotated[bool, typer.Option("--local", help="Run on this machine (bare-metal baseline), not on the guests.")] = False,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Print every command that would run; run nothing.")] = False,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Apply the setups' layouts without asking.")] = False,
    allow_power_off: Annotated[bool, typer.Option(help="Setups: allow powering VMs off (guest shutdown first).")] = False,
    allow_host_reboot: Annotated[bool, typer.Option(help="Setups: allow maintenance mode and host reboots.")] = False,
    allow_repeat_reboot: Annotated[bool, typer.Option(
        help="Setups: allow rebooting a host again for a change still pending after gpuvm rebooted it for that "
             "change.")] = False,
    drain_timeout: Annotated[float | None, DRAIN_TIMEOUT] = None,
    accept_new_host_keys: Annotated[bool, typer.Option(
        "--accept-new-host-keys", help="Trust SSH host keys seen for the first time (records them).")] = False,
    state_dir: Annotated[Path | None, typer.Option(
        "--state-dir", help="State directory: known_hosts (default $GPUVM_STATE_DIR or .gpuvm)")] = None,
    insecure: Annotated[bool, typer.Option("--insecure", help="Setups: turn TLS verification of vCenter OFF.")] = False,
    json_: Annotated[bool, typer.Option("--json", help="At the end, print what ran and where its results are as "
                                                       "JSON (schema gpuvm.bench-run/1); progress stays on stderr.")] = False,
    allow_unlicensed: Annotated[bool, typer.Option(
        "--allow-unlicensed", help="Measure guests whose NVIDIA vGPU licence is missing or about to end "
                                   "(refused by default: the figures would measure the licence).")] = False,
    repeats: Annotated[str | None, typer.Option(
        "--repeats", help="Repeats of every point, for every benchmark: a number, or auto (until the median's 95 % "
                          "interval is within each benchmark's repeats_target, default ±1 %, or repeats_max runs).",
        show_default=False)] = None,
) -> None:
    """Run the runbook's benchmarks: every point, warm-ups, repeats; logs and results.json under --out.
    With `benchmarks.setups`, each setup's layout is planned and applied (as `gpuvm apply`) before its runs."""
    from gpuvm.apply_options import ApplyOptions
    from gpuvm.bench.runs import CampaignChoice, dry_run as dry_run_lines, prepare_campaign, run_campaign

    from gpuvm.files import check_writable

    choice = CampaignChoice(local, tuple(only or ()), tuple(setup or ()), repeats)
    reach = access(insecure, accept_new_host_keys, state_dir)
    if dry_run:
        for line in dry_run_lines(runbook, choice, reach):
            out.print(line, highlight=False, markup=False, soft_wrap=True)
        return
    check_writable(out_dir, "results", directory=True)  # before a setup is applied or a benchmark runs
    prepared = prepare_campaign(runbook, choice, reach, ApplyOptions(allow_power_off=allow_power_off,
                                                                     allow_host_reboot=allow_host_reboot,
                                                                     allow_repeat_reboot=allow_repeat_reboot,
                                                                     drain_timeout=drain_timeout),
                                _SetupView(err if json_ else out), confirm=None if yes else _confirm)
    with _Progress() as progress:
        campaign = run_campaign(prepared, out_dir, progress, allow_unlicensed=allow_unlicensed)
    if json_:
        print(campaign_json(campaign))
    if campaign.results_file is None:
        raise fail("interrupted before any benchmark ran" if campaign.interrupted else "no benchmark ran",
                   interrupted_exit() if campaign.interrupted else 1)
    if not json_:
        out.print(f"results: {campaign.results_file}", highlight=False, markup=False, soft_wrap=True)
    if campaign.interrupted:
        raise fail(f"interrupted after {campaign.runs_done} of {campaign.runs_total} run(s); "
                   f"what was measured is in {campaign.results_file}", interrupted_exit())
    campaign.raise_for_failures()
    if not json_:
        out.print(f"compare: gpuvm bench compare {campaign.directory}", highlight=False, markup=False, soft_wrap=True)


def campaign_json(campaign: Any) -> str:
    """What a campaign did (gpuvm.bench-run/1)."""
    from dataclasses import asdict

    from gpuvm.documents import document, dumps

    return dumps(document("bench-run", directory=str(campaign.directory),
                          results=None if campaign.results_file is None else str(campaign.results_file),
                          runs_done=campaign.runs_done, runs_total=campaign.runs_total,
                          interrupted=campaign.interrupted, failures=[asdict(f) for f in campaign.failures],
                          note=campaign.note()))


def _confirm() -> None:
    """Asked before the setups' layouts are applied (not with --yes), on stderr; stopping raises."""
    if not interactive():
        raise fail("not running: no terminal to ask on; pass --yes to apply the setups without asking", 2)
    if not typer.confirm("Apply each setup in turn and run its benchmarks?", default=False, err=True):
        raise fail("not run", 1)


class _SetupView:
    """The setups' plans on `console` (stderr with --json), and each setup's start on stderr."""

    def __init__(self, console: Any):
        self.console = console

    def planned(self, stage: Any, plan: Any) -> None:
        from gpuvm.bench.runs import layout_line
        from gpuvm.render import print_plan

        self.console.print(f"setup {stage.setup} (planned from the layout as it is now): {layout_line(stage.runbook)}",
                           highlight=False, markup=False, soft_wrap=True)
        print_plan(self.console, plan)

    def applying(self, stage: Any) -> None:
        err.print(f"setup {stage.setup}: applying its layout", highlight=False, markup=False)

    def plan(self, plan: Any) -> None:
        from gpuvm.render import print_plan

        print_plan(self.console, plan)


class _Progress:
    """The campaign on stderr: a bar with run i of n, benchmark, point, and the last figure."""

    def __enter__(self) -> _Progress:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self._progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                  TimeElapsedColumn(), TextColumn("{task.fields[last]}"), console=err.rich,
                                  transient=False)
        self._progress.__enter__()
        self._task: Any = None
        return self

    def __exit__(self, *exc: object) -> None:
        self._progress.__exit__(*exc)

    def note(self, line: str) -> None:
        self._progress.console.print(line, highlight=False, markup=False, soft_wrap=True)

    def started(self, index: int, total: int, bench: str, point: str, label: str) -> None:
        if self._task is None or index == 1:  # a campaign's next setup starts a new bar
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
