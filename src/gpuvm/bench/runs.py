"""Whole benchmark campaigns over a runbook: what `gpuvm bench run` does, as library calls.

The benchmark side of `gpuvm.runs`: calls that return data and raise `GpuvmError`s, the command
parses options, calls them and renders. `dry_run` gives the lines that say what would run;
`prepare_campaign` checks everything that can be checked before anything is touched (every setup
planned, its flags checked, the user asked); `run_campaign` then applies each setup's layout and
measures its points. Printing is the caller's: through the callbacks of `SetupView` and an
`Observer` (gpuvm.bench.runner).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from gpuvm.apply_options import ApplyOptions
from gpuvm.bench.campaign import Stage, plan_campaign, plan_stages, taking_part
from gpuvm.bench.dry_run import describe
from gpuvm.bench.network import read_port_maps
from gpuvm.bench.recording import Campaign, results_directory
from gpuvm.bench.runner import Observer, executors_for
from gpuvm.bench.stages import Connect, preflight, run_stages
from gpuvm.errors import GpuvmError, InputError
from gpuvm.journal import state_dir as make_state_dir, state_path
from gpuvm.plan import Plan
from gpuvm.runbook.loader import load_runbook
from gpuvm.runbook.model import Runbook
from gpuvm.runs import Access, apply_loaded, plan_loaded


@dataclass(frozen=True)
class CampaignChoice:
    """Which campaign of the runbook: `--local`, `--only`, `--setup` and `--repeats`."""

    local: bool = False  # on this machine (a bare-metal baseline), not on the guests
    only: tuple[str, ...] = ()  # these benchmarks (all, when empty)
    setups: tuple[str, ...] = ()  # these setups (all, when empty)
    repeats: str | None = None  # every benchmark's repeats: a number from 1 to 100, or auto


class SetupView(Protocol):
    """What a campaign with setups shows as it checks and applies them (the CLI prints it)."""

    def planned(self, stage: Stage, plan: Plan) -> None:
        """A setup's plan from the layout as it is now, before anything is touched."""

    def applying(self, stage: Stage) -> None:
        """A setup's layout is about to be applied (its plan, made under the lock, comes next)."""

    def plan(self, plan: Plan) -> None:
        """The plan a setup's layout is applied with."""


@dataclass(frozen=True)
class PreparedCampaign:
    """A campaign checked and ready to run: its runbook (with `--repeats`), its stages, how to reach
    its machines, and how to apply a setup's layout (None: it has no setups)."""

    runbook: Runbook
    stages: list[Stage]
    local: bool
    connect: Connect
    layout: Callable[[Stage], None] | None = None


def with_repeats(book: Runbook, text: str) -> Runbook:
    """The runbook with `--repeats` (a number from 1 to 100, or auto) in place of every benchmark's."""
    raw = text.strip().lower()
    value: int | str = raw if raw == "auto" else int(raw) if raw.isdigit() else 0
    if value != "auto" and not 1 <= int(value) <= 100:
        raise InputError(f"--repeats {text!r}: expected a number from 1 to 100, or auto")
    if book.benchmarks is None:
        return book
    runs = [run.model_copy(update={"repeats": value}) for run in book.benchmarks.runs]
    return book.model_copy(update={"benchmarks": book.benchmarks.model_copy(update={"runs": runs})})


def layout_line(book: Runbook) -> str:
    """`vm1 on (2 passthrough GPUs), vm2 parked`: a setup's VMs in one line."""
    parts = []
    for vm in book.vms:
        if vm.power == "off":
            parts.append(f"{vm.name} off" + ("" if vm.gpus or vm.nics else " (parked)"))
            continue
        gpus = f"{vm.gpus.count} {vm.gpus.mode} GPU(s)" if vm.gpus else "no GPU"
        parts.append(f"{vm.name} on ({gpus})")
    return ", ".join(parts)


def _staged(runbook: Path, choice: CampaignChoice, access: Access) -> PreparedCampaign:
    """The campaign's stages, checked (nothing is touched), and how to reach its machines."""
    book = load_runbook(runbook)
    if choice.repeats is not None:
        book = with_repeats(book, choice.repeats)
    stages = plan_stages(book, local=choice.local, only=choice.only, setups=choice.setups)
    # --local uses no SSH keys: it creates no state directory
    keys = state_path(access.state_dir) if choice.local else make_state_dir(access.state_dir)

    def connect(stage_book: Runbook, points: list) -> dict:
        return executors_for(stage_book, points, choice.local, keys, access.accept_new_host_keys)

    return PreparedCampaign(book, stages, choice.local, connect)


def dry_run(runbook: Path, choice: CampaignChoice, access: Access) -> Iterator[str]:
    """The lines that say what would run: every stage's layout and commands, with the network derived
    (once) from the port maps of the guests that answer. Runs nothing, changes nothing."""
    campaign = _staged(runbook, choice, access)
    ports: dict = {}
    unread: dict[str, str] = {}
    for stage in campaign.stages:
        book = stage.runbook
        if stage.setup is not None:
            yield f"setup {stage.setup}: {layout_line(book)}"
        points = plan_campaign(book, local=choice.local, only=stage.only, setup=stage.setup)
        guests = [g for g in (book.guests.hosts if book.guests else []) if g.vm in taking_part(points) and g.rdma_ports]
        if guests and not choice.local:
            for guest in guests:
                if guest.vm not in ports and guest.vm not in unread:
                    executors = campaign.connect(book, points)
                    try:
                        ports.update(read_port_maps(executors, [guest]))
                    except GpuvmError as e:
                        unread[guest.vm] = str(e)
                    finally:
                        for executor in executors.values():
                            executor.close()
            if missing := [unread[g.vm] for g in guests if g.vm in unread]:
                yield f"network: not derived ({'; '.join(missing)})"
            else:
                points = plan_campaign(book, only=stage.only, setup=stage.setup, ports=ports)
        workdir = "<results>/work" if choice.local else book.benchmarks.workdir  # type: ignore[union-attr]
        yield from describe(points, workdir)


def prepare_campaign(runbook: Path, choice: CampaignChoice, access: Access, options: ApplyOptions,
                     view: SetupView, confirm: Callable[[], None] | None = None) -> PreparedCampaign:
    """The campaign, checked before anything is touched. With setups, every setup is planned against
    the world as it is now (`view.planned`) and the campaign refused (InputError) when one needs a
    flag `options` does not give; then `confirm` (if given) is asked and raises to stop."""
    campaign = _staged(runbook, choice, access)
    if not any(stage.setup is not None for stage in campaign.stages):
        return campaign
    preflight(campaign.stages, lambda book: plan_loaded(book, access), view.planned, options)
    if confirm is not None:
        confirm()

    def layout(stage: Stage) -> None:
        view.applying(stage)
        apply_loaded(stage.runbook, access, options, show_plan=view.plan).raise_for_outcome()

    return PreparedCampaign(campaign.runbook, campaign.stages, campaign.local, campaign.connect, layout)


def run_campaign(campaign: PreparedCampaign, out_dir: Path, observer: Observer | None = None,
                 allow_unlicensed: bool = False) -> Campaign:
    """Every stage in turn (a setup's layout applied first), its points measured; results written
    under a new directory in `out_dir` after every stage, and after Ctrl-C (`Campaign.interrupted`).
    Guests not licensed (guests.licensing) are refused unless `allow_unlicensed`."""
    directory = results_directory(out_dir, campaign.runbook)
    return run_stages(campaign.runbook, campaign.stages, directory, campaign.connect, local=campaign.local,
                      layout=campaign.layout, observer=None if observer is None else lambda stage: observer,
                      allow_unlicensed=allow_unlicensed)
