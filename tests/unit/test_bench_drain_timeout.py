"""`gpuvm bench run --drain-timeout`: a setup that reboots a host where Slurm jobs run drains its
nodes and waits, as `gpuvm apply --drain-timeout` does (one option definition for both); without
it, the campaign is refused up front naming the setup, the host and the jobs."""

from __future__ import annotations

import pytest
import typer
from typer.testing import CliRunner

from gpuvm.apply_options import ApplyOptions
from gpuvm.bench import runs as bench_runs
from gpuvm.errors import InputError
from gpuvm.plan import Change, Disruption, Plan
from gpuvm.runs import Access, Applied
from gpuvm.steps.slurm_drain import DrainNodes
from tests.unit.test_bench_setups import book

REBOOT = Change("host.reboot", "esx-01", "host", "reboot", None, "rebooted", Disruption.HOST_REBOOT,
                action=DrainNodes("vm1", ("vm1", "vm2"), ("12 (alice: train)",)))


def _bench_run(*args: str):
    from gpuvm.cli.bench_run import register

    app = typer.Typer()
    register(app)
    app.command("noop")(lambda: None)  # a second command keeps `run` a sub-command
    return CliRunner().invoke(app, ["run", *args])


@pytest.mark.parametrize("flag, timeout", [([], None), (["--drain-timeout", "120"], 120.0), (["--drain-timeout", "0"], 0.0)])
def test_bench_run_hands_drain_timeout_to_the_setups_apply_options(tmp_path, mocker, flag, timeout):
    book(tmp_path)
    prepare = mocker.patch.object(bench_runs, "prepare_campaign")
    mocker.patch.object(bench_runs, "run_campaign", return_value=mocker.Mock(
        results_file=tmp_path / "results.json", interrupted=False, raise_for_failures=lambda: None))
    result = _bench_run(str(tmp_path / "rb.yaml"), "--yes", "--allow-host-reboot", "--out", str(tmp_path / "out"), *flag)
    assert result.exit_code == 0, result.output
    options = prepare.call_args.args[3]
    assert options == ApplyOptions(allow_host_reboot=True, drain_timeout=timeout)


def test_a_negative_drain_timeout_is_refused_as_apply_refuses_it(tmp_path):
    from gpuvm.cli.main import app

    for command in (["bench", "run"], ["apply"]):
        result = CliRunner().invoke(app, [*command, str(tmp_path / "rb.yaml"), "--drain-timeout", "-1"])
        assert result.exit_code == 2 and "Invalid value for '--drain-timeout'" in result.output, result.output


def test_a_setup_rebooting_a_host_with_jobs_is_refused_up_front_without_a_drain_timeout(tmp_path, mocker):
    book(tmp_path)
    plan = mocker.patch.object(bench_runs, "plan_loaded", side_effect=lambda b, a: (Plan([REBOOT]), mocker.Mock(hosts={})))
    apply_loaded = mocker.patch.object(bench_runs, "apply_loaded", return_value=Applied(Plan()))
    args = (tmp_path / "rb.yaml", bench_runs.CampaignChoice(), Access(state_dir=tmp_path / "state"))
    with pytest.raises(InputError) as refused:
        bench_runs.prepare_campaign(*args, ApplyOptions(allow_host_reboot=True, allow_power_off=True), mocker.Mock())
    assert ("setup one: host esx-01 must reboot while Slurm job(s) 12 (alice: train) run on its nodes vm1, vm2: "
            "pass --drain-timeout SECONDS") in str(refused.value)
    assert plan.call_count == 2 and not apply_loaded.called  # every setup planned, nothing applied
    prepared = bench_runs.prepare_campaign(*args, ApplyOptions(allow_host_reboot=True, allow_power_off=True, drain_timeout=300),
                                           mocker.Mock())
    prepared.layout(prepared.stages[0])
    assert apply_loaded.call_args.args[2].drain_timeout == 300  # the setup's apply drains and waits up to it
