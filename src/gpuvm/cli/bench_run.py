"""`gpuvm bench run`: a thin command over gpuvm.bench.campaign (plan) and gpuvm.bench.runner
(prepare, run, write results)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from gpuvm.cli.common import access, err, escape, fail, handle_errors, interactive, load, out


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
    from gpuvm.bench.campaign import plan_stages
    from gpuvm.bench.recording import results_directory
    from gpuvm.bench.runner import executors_for
    from gpuvm.bench.stages import preflight, run_stages
    from gpuvm.journal import state_dir as make_state_dir, state_path

    book = load(runbook)
    if repeats is not None:
        book = with_repeats(book, repeats)
    stages = plan_stages(book, local=local, only=only or (), setups=setup or ())
    keys = state_path(state_dir) if local else make_state_dir(state_dir)  # --local uses no SSH keys: creates nothing

    def connect(stage_book: Any, points: Any) -> Any:
        return executors_for(stage_book, points, local, keys, accept_new_host_keys)

    if dry_run:
        _dry_run(stages, local, connect)
        return
    layout = None
    if any(stage.setup is not None for stage in stages):
        layout = _layouts(stages, access(insecure, accept_new_host_keys, state_dir), yes, allow_power_off,
                          allow_host_reboot, preflight, err if json_ else out, allow_repeat_reboot=allow_repeat_reboot)
    directory = results_directory(out_dir, book)
    with _Progress() as progress:
        campaign = run_stages(book, stages, directory, connect, local=local, layout=layout,
                              observer=lambda stage: progress, allow_unlicensed=allow_unlicensed)
    if json_:
        print(campaign_json(campaign))
    if campaign.results_file is None:
        raise fail("interrupted before any benchmark ran" if campaign.interrupted else "no benchmark ran",
                   130 if campaign.interrupted else 1)
    if not json_:
        out.print(f"results: {campaign.results_file}", highlight=False, markup=False, soft_wrap=True)
    if campaign.interrupted:
        raise fail(f"interrupted after {campaign.runs_done} of {campaign.runs_total} run(s); "
                   f"what was measured is in {campaign.results_file}", 130)
    campaign.raise_for_failures()
    if not json_:
        out.print(f"compare: gpuvm bench compare {campaign.directory}", highlight=False, markup=False, soft_wrap=True)


def with_repeats(book: Any, text: str) -> Any:
    """The runbook with `--repeats` (a number from 1 to 100, or auto) in place of every benchmark's."""
    from gpuvm.errors import InputError

    raw = text.strip().lower()
    value: int | str = raw if raw == "auto" else int(raw) if raw.isdigit() else 0
    if value != "auto" and not 1 <= int(value) <= 100:
        raise InputError(f"--repeats {text!r}: expected a number from 1 to 100, or auto")
    if book.benchmarks is None:
        return book
    runs = [run.model_copy(update={"repeats": value}) for run in book.benchmarks.runs]
    return book.model_copy(update={"benchmarks": book.benchmarks.model_copy(update={"runs": runs})})


def campaign_json(campaign: Any) -> str:
    """What a campaign did (gpuvm.bench-run/1)."""
    from dataclasses import asdict

    from gpuvm.documents import document, dumps

    return dumps(document("bench-run", directory=str(campaign.directory),
                          results=None if campaign.results_file is None else str(campaign.results_file),
                          runs_done=campaign.runs_done, runs_total=campaign.runs_total,
                          interrupted=campaign.interrupted, failures=[asdict(f) for f in campaign.failures],
                          note=campaign.note()))


def _layouts(stages: Any, reach: Any, yes: bool, allow_power_off: bool, allow_host_reboot: bool,
             preflight: Any, console: Any, allow_repeat_reboot: bool = False) -> Any:
    """Check every setup up front (plans printed, flags, confirmation); return what applies one, as
    `gpuvm apply` does: the same flags, and the same verdict (a target failed or not observed stops
    the campaign, with its exit code)."""
    from gpuvm.render import print_plan
    from gpuvm.runs import apply_loaded, plan_loaded

    def show(stage: Any, plan: Any) -> None:
        console.print(f"setup {stage.setup} (planned from the layout as it is now): {layout_line(stage.runbook)}",
                      highlight=False, markup=False, soft_wrap=True)
        print_plan(console, plan)

    preflight(stages, lambda book: plan_loaded(book, reach), show, allow_power_off, allow_host_reboot,
              allow_repeat_reboot=allow_repeat_reboot)
    if not yes:
        if not interactive():
            raise fail("not running: no terminal to ask on; pass --yes to apply the setups without asking", 2)
        if not typer.confirm("Apply each setup in turn and run its benchmarks?", default=False, err=True):
            raise fail("not run", 1)

    def apply(stage: Any) -> None:
        err.print(f"setup {stage.setup}: applying its layout", highlight=False, markup=False)
        applied = apply_loaded(stage.runbook, reach, allow_power_off=allow_power_off,
                               allow_host_reboot=allow_host_reboot, allow_repeat_reboot=allow_repeat_reboot,
                               show_plan=lambda plan: print_plan(console, plan))
        applied.raise_for_outcome()  # not observed counts: its layout is not known to be right

    return apply


def layout_line(book: Any) -> str:
    """`vm1 on (2 passthrough GPUs), vm2 parked`: a setup's VMs in one line."""
    parts = []
    for vm in book.vms:
        if vm.power == "off":
            parts.append(f"{vm.name} off" + ("" if vm.gpus or vm.nics else " (parked)"))
            continue
        gpus = f"{vm.gpus.count} {vm.gpus.mode} GPU(s)" if vm.gpus else "no GPU"
        parts.append(f"{vm.name} on ({gpus})")
    return ", ".join(parts)


def _dry_run(stages: Any, local: bool, connect: Any) -> None:
    """Every stage's layout and commands; the derived network read (once) from the guests that answer."""
    from gpuvm.bench.campaign import plan_campaign, taking_part
    from gpuvm.bench.dry_run import describe
    from gpuvm.bench.network import read_port_maps
    from gpuvm.errors import GpuvmError

    ports: dict[str, Any] = {}
    unread: dict[str, str] = {}
    for stage in stages:
        book = stage.runbook
        if stage.setup is not None:
            out.print(f"setup {stage.setup}: {layout_line(book)}", highlight=False, markup=False, soft_wrap=True)
        points = plan_campaign(book, local=local, only=stage.only, setup=stage.setup)
        guests = [g for g in (book.guests.hosts if book.guests else []) if g.vm in taking_part(points) and g.rdma_ports]
        if guests and not local:
            for guest in guests:
                if guest.vm not in ports and guest.vm not in unread:
                    executors = connect(book, points)
                    try:
                        ports.update(read_port_maps(executors, [guest]))
                    except GpuvmError as e:
                        unread[guest.vm] = str(e)
                    finally:
                        for executor in executors.values():
                            executor.close()
            if missing := [unread[g.vm] for g in guests if g.vm in unread]:
                out.print(f"network: not derived ({'; '.join(missing)})", highlight=False, markup=False, soft_wrap=True)
            else:
                points = plan_campaign(book, only=stage.only, setup=stage.setup, ports=ports)
        workdir = "<results>/work" if local else book.benchmarks.workdir
        for line in describe(points, workdir):
            out.print(line, highlight=False, markup=False, soft_wrap=True)


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
