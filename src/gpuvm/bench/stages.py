"""A campaign run stage by stage: the runbook's points, or each setup's after its layout is applied.

`preflight` comes first, before anything is touched: it plans every setup against the world as it
is now (the plans the CLI prints) and refuses the campaign when a flag is missing — a setup's own
plan needs it, or the next setup changes the layout of a VM the previous one runs (its devices
change only while it is off: `--allow-power-off`). `run_stages` then, for each stage: applies its
layout (the engine, through `layout`), connects to its guests, reads their port maps
(`ibdev2netdev`, for the derived network), plans its points and measures them. Results are
written after every stage, so a campaign stopped halfway keeps what it measured.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from contextlib import nullcontext
from datetime import UTC, datetime
from pathlib import Path

from gpuvm.apply_options import ApplyOptions
from gpuvm.bench.campaign import PlannedPoint, Stage, plan_campaign, taking_part
from gpuvm.bench.guest_lock import GuestLocks
from gpuvm.bench.network import read_port_maps
from gpuvm.bench.recording import Campaign, Recorder
from gpuvm.bench.results import save_results
from gpuvm.bench.runner import CampaignRunner, Observer
from gpuvm.engine import check_allowed
from gpuvm.errors import InputError
from gpuvm.licensing import refuse_unlicensed
from gpuvm.executors.base import Executor
from gpuvm.plan import Plan
from gpuvm.desired import Desired
from gpuvm.runbook.model import Runbook
from gpuvm.steps import reboot_memo

Connect = Callable[[Runbook, Sequence[PlannedPoint]], Mapping[str, Executor]]


def preflight(stages: Sequence[Stage], plan: Callable[[Runbook], tuple[Plan, Desired]],
              show: Callable[[Stage, Plan], None], allowed: ApplyOptions) -> None:
    """Refuse, before anything is touched, a campaign whose setups need a flag not given, as `apply`
    would refuse each: a host rebooted again for what its last reboot did not activate first
    (RepeatedReboot, exit 4), then the disruptions not allowed (InputError, exit 2)."""
    problems = []
    repeats = []
    for stage in stages:
        planned, desired = plan(stage.runbook)
        show(stage, planned)
        if not allowed.allow_repeat_reboot:
            repeats += [f"setup {stage.setup}: {message}" for message in reboot_memo.refused_in(planned)]
        try:
            check_allowed(planned, desired, allowed)
        except InputError as e:
            problems += [f"setup {stage.setup}: {line.strip()}" for line in str(e).splitlines()[1:]]
    if repeats:
        raise reboot_memo.RepeatedReboot("refusing to run the campaign; nothing was changed:\n  " + "\n  ".join(repeats))
    if not allowed.allow_power_off:
        for before, after in zip(stages, stages[1:], strict=False):
            if moved := relaid(before.runbook, after.runbook):
                problems.append(f"setup {before.setup} → {after.setup}: VM(s) {', '.join(moved)} change layout "
                                "and must be powered off: pass --allow-power-off")
    if problems:
        raise InputError("refusing to run the campaign; nothing was changed:\n  " + "\n  ".join(problems))


def relaid(before: Runbook, after: Runbook) -> list[str]:
    """VMs powered on in `before` whose definition `after` changes."""
    later = {vm.name: vm for vm in after.vms}
    return [vm.name for vm in before.vms if vm.power == "on" and later.get(vm.name, vm) != vm]


def run_stages(runbook: Runbook, stages: Sequence[Stage], directory: Path, connect: Connect, *,
               local: bool = False, layout: Callable[[Stage], None] | None = None,
               observer: Callable[[Stage], Observer] | None = None,
               now: Callable[[], datetime] = lambda: datetime.now(UTC), allow_unlicensed: bool = False) -> Campaign:
    """Every stage in order; results written after each (and after Ctrl-C or an error). A stage whose
    licensed guests (`guests.licensing`) are unlicensed is refused unless `allow_unlicensed`."""
    started = now()
    campaign = Campaign(directory)
    recorder = Recorder(runbook, [], local)
    software: dict[str, dict[str, str]] = {}

    def save() -> None:
        campaign.results_file = save_results(directory, recorder.results(started, now(), software, campaign.note()))

    try:
        for stage in stages:
            if stage.setup is not None and layout is not None:
                layout(stage)
            _run_stage(stage, directory, connect, local, recorder, campaign, software,
                       observer(stage) if observer else None, None if allow_unlicensed else now)
            save()
            if campaign.interrupted:
                break
    except KeyboardInterrupt:
        campaign.interrupted = True
    finally:
        if campaign.runs_total:
            save()
    return campaign


def _run_stage(stage: Stage, directory: Path, connect: Connect, local: bool, recorder: Recorder,
               campaign: Campaign, software: dict, observer: Observer | None,
               licence_check: Callable[[], datetime] | None = None) -> None:
    book = stage.runbook
    points = plan_campaign(book, local=local, only=stage.only, setup=stage.setup)
    executors = connect(book, points)
    try:
        if not local and licence_check is not None:
            refuse_unlicensed(book, executors, licence_check())
        if not local:  # again, with the network derived from the guests' port maps
            guests = [g for g in (book.guests.hosts if book.guests else []) if g.vm in taking_part(points)]
            points = plan_campaign(book, only=stage.only, setup=stage.setup, ports=read_port_maps(executors, guests))
        if stage.setup is not None:
            recorder.add_stage(stage.setup, book, points)
        else:
            recorder.points.extend(points)
        runner = CampaignRunner(book, points, executors, directory, local=local, observer=observer,
                                recorder=recorder)
        with nullcontext() if local else GuestLocks(executors, directory.name):  # one campaign per guest
            runner.prepare()
            runner.measure(campaign, software)
    finally:
        for executor in executors.values():
            executor.close()
