"""gpuvm.bench.runs: a benchmark campaign as library calls, the CLI only parsing and rendering
(issue 23): setups checked, then the user asked, then each layout applied with the command's
ApplyOptions; the dry run's lines; `gpuvm size`'s inputs gathered below the CLI."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from typer.testing import CliRunner

from gpuvm.apply_options import ApplyOptions
from gpuvm.bench import runs as bench_runs
from gpuvm.bench.runs import CampaignChoice, dry_run, prepare_campaign
from gpuvm.cli.main import app
from gpuvm.errors import InputError, RemoteCommandError, TargetFailures
from gpuvm.plan import Change, Disruption, Plan
from gpuvm.runs import Access, Applied
from gpuvm.sizing.inputs import sizing_of
from tests.unit.test_bench_setups import book

POWER_OFF = Change("vm.hardware", "vm2", "pci device (new)", "device", None, "gpu", Disruption.VM_POWER_OFF)


class View:
    def __init__(self, events: list):
        self.events = events

    def planned(self, stage, plan):
        self.events.append(("planned", stage.setup, len(plan.changes)))

    def applying(self, stage):
        self.events.append(("applying", stage.setup))

    def plan(self, plan):
        self.events.append(("plan", len(plan.changes)))


@pytest.fixture
def lab(tmp_path, mocker):
    book(tmp_path)  # rb.yaml: setups one and two
    events: list = []
    plans = mocker.patch.object(bench_runs, "plan_loaded", return_value=(Plan([POWER_OFF]), None))
    applied = mocker.patch.object(bench_runs, "apply_loaded", side_effect=lambda book, access, options, show_plan: (
        events.append(("apply", options)), show_plan(Plan([POWER_OFF])), Applied(Plan()))[-1])
    confirm = mocker.Mock(side_effect=lambda: events.append(("confirm",)))
    access = Access(state_dir=tmp_path / "state")
    return SimpleNamespace(path=tmp_path / "rb.yaml", events=events, plans=plans, applied=applied, confirm=confirm,
                           access=access)


def test_setups_are_planned_then_confirmed_then_applied_with_the_options(lab):
    allowed = ApplyOptions(allow_power_off=True)
    prepared = prepare_campaign(lab.path, CampaignChoice(), lab.access, allowed, View(lab.events), lab.confirm)
    assert lab.events == [("planned", "one", 1), ("planned", "two", 1), ("confirm",)]  # nothing applied yet
    assert [stage.setup for stage in prepared.stages] == ["one", "two"]
    prepared.layout(prepared.stages[1])
    assert lab.events[3:] == [("applying", "two"), ("apply", allowed), ("plan", 1)]
    assert lab.applied.call_args.args[:2] == (prepared.stages[1].runbook, lab.access)


def test_a_setup_that_needs_a_flag_not_given_is_refused_before_asking(lab):
    with pytest.raises(InputError, match=r"setup two: VM\(s\) vm2 must be powered off .*--allow-power-off"):
        prepare_campaign(lab.path, CampaignChoice(), lab.access, ApplyOptions(), View(lab.events), lab.confirm)
    lab.confirm.assert_not_called()
    lab.applied.assert_not_called()


def test_a_layout_whose_apply_failed_stops_the_campaign(lab, mocker):
    failed = Applied(Plan(), SimpleNamespace(failed={"vm2 (vm.hardware)": RemoteCommandError("boom")},
                                                 observed=set()))
    lab.applied.side_effect = None
    lab.applied.return_value = failed
    prepared = prepare_campaign(lab.path, CampaignChoice(), lab.access, ApplyOptions(allow_power_off=True),
                                View(lab.events), None)
    with pytest.raises(TargetFailures, match=r"vm2 \(vm.hardware\): boom") as raised:
        prepared.layout(prepared.stages[0])
    assert raised.value.exit_code == RemoteCommandError.exit_code


def test_a_campaign_without_setups_plans_nothing_and_asks_nothing(tmp_path, mocker):
    from tests.unit.test_bench_setups import RUN

    book(tmp_path, RUN)
    plans = mocker.patch.object(bench_runs, "plan_loaded")
    confirm = mocker.Mock()
    prepared = prepare_campaign(tmp_path / "rb.yaml", CampaignChoice(), Access(state_dir=tmp_path / "state"),
                                ApplyOptions(), View([]), confirm)
    assert prepared.layout is None and [stage.setup for stage in prepared.stages] == [None]
    plans.assert_not_called()
    confirm.assert_not_called()


def test_the_dry_run_reads_each_guests_port_map_once_and_says_when_it_could_not(lab, mocker):
    read = mocker.patch.object(bench_runs, "read_port_maps", side_effect=RemoteCommandError("guest vm1: no answer"))
    lines = list(dry_run(lab.path, CampaignChoice(only=("c",)), lab.access))
    assert lines[0] == "setup one: vm1 on (2 passthrough GPU(s)), vm2 off (parked)"
    assert "network: not derived (guest vm1: no answer)" in lines
    assert "setup two: vm1 on (1 passthrough GPU(s)), vm2 on (1 passthrough GPU(s))" in lines
    assert [call.args[1][0].vm for call in read.call_args_list] == ["vm1", "vm2"]  # vm1 once for both setups
    lab.plans.assert_not_called()  # a dry run plans no layout against vCenter


def test_the_commands_build_one_apply_options_value_from_their_flags(lab, mocker, tmp_path):
    apply_runbook = mocker.patch("gpuvm.runs.apply_runbook", return_value=Applied(Plan()))
    result = CliRunner().invoke(app, ["apply", str(lab.path), "--yes", "--allow-power-off", "--allow-destroy",
                                      "--parallel", "3", "--max-unavailable", "2", "--shutdown-timeout", "60"])
    assert result.exit_code == 0, result.output
    assert apply_runbook.call_args.args[2] == ApplyOptions(allow_power_off=True, allow_destroy=True, parallel=3,
                                                           max_unavailable=2, shutdown_timeout=60)
    prepare = mocker.patch.object(bench_runs, "prepare_campaign", side_effect=InputError("refused"))
    result = CliRunner().invoke(app, ["bench", "run", str(lab.path), "--yes", "--allow-host-reboot"])
    assert result.exit_code == 2 and "refused" in result.output
    assert prepare.call_args.args[3] == ApplyOptions(allow_host_reboot=True)


def test_sizing_is_gathered_below_the_cli(tmp_path):
    sized = sizing_of(None, {"model": "resnet50", "gpus": 4, "precision": None})
    assert (sized.spec.model, sized.spec.gpus, sized.spec.precision) == ("resnet50", 4, "fp32")
    with pytest.raises(InputError, match="^--gpus: "):
        sizing_of(None, {"gpus": 0})
