"""Errors are data under `--json`: a command that ends in an error prints one gpuvm.error/1 document on
stdout (its message on stderr too), unless its own document already told how it ended. The library
calls behind the commands are mocked; the input errors are real ones."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from gpuvm import connecting, runs
from gpuvm.cli.main import app
from gpuvm.errors import ConnectError, DriftError, LockedError
from gpuvm.plan import Change, Plan
from tests.schema_check import check


def gpuvm(*args: object):
    return CliRunner().invoke(app, [str(a) for a in args])


def documents(stdout: str) -> list[dict]:
    return [json.loads(line) for line in stdout.splitlines()]


def test_an_input_error_is_one_document_naming_its_file_and_line(tmp_path):
    runbook = tmp_path / "rb.yaml"
    runbook.write_text("vcenter: {user: admin}\nhosts:\n  - {name: esx-01, bogus: 1}\nvms: []\n")
    result = gpuvm("plan", runbook, "--json")
    [error] = documents(result.stdout)
    assert check(error) == "error" and result.exit_code == error["exit"] == 2
    assert error["code"] == "input" and (error["file"], error["line"]) == (str(runbook), 3)
    assert "hosts[0].bogus" in error["message"] and "hosts[0].bogus" in result.stderr


def test_a_connection_error_is_one_document_and_without_json_none(mocker):
    mocker.patch.object(connecting, "inventory_of", side_effect=ConnectError("https://vc/sdk: cannot connect: refused"))
    result = gpuvm("inventory", "lab.yaml", "--json")
    [error] = documents(result.stdout)
    assert check(error) == "error" and result.exit_code == error["exit"] == 3
    assert (error["code"], error["message"], error["file"]) == ("connect", "https://vc/sdk: cannot connect: refused", None)
    assert "cannot connect" in result.stderr
    plain = gpuvm("inventory", "lab.yaml")
    assert plain.exit_code == 3 and plain.stdout == ""


def test_plan_with_detailed_exitcode_names_the_kind_and_the_status_it_exits_with(mocker):
    mocker.patch.object(runs, "plan_runbook", side_effect=LockedError("esx-01: locked by run r1"))
    result = gpuvm("plan", "lab.yaml", "--json", "--detailed-exitcode")
    [error] = documents(result.stdout)
    assert (error["code"], error["exit"], result.exit_code) == ("locked", 1, 1)


def test_verify_prints_its_own_document_for_drift_and_no_second_one(mocker):
    drift = DriftError("drift")
    drift.plan = Plan(changes=[Change("vm.hardware", "train-01", "vm", "cpus", 4, 8)])
    mocker.patch.object(runs, "verify_runbook", side_effect=drift)
    result = gpuvm("verify", "lab.yaml", "--json")
    assert result.exit_code == 5
    assert [check(d) for d in [json.loads(result.stdout)]] == ["verify"]  # exactly one document


def test_apply_ends_its_stream_with_the_error_that_stopped_it(mocker, tmp_path):
    def refused(*args, show_plan, **kwargs):
        show_plan(Plan(changes=[Change("vm.hardware", "train-01", "vm", "cpus", 4, 8)]))
        raise LockedError("esx-01: locked by another gpuvm run")

    mocker.patch.object(runs, "apply_runbook", side_effect=refused)
    (book := tmp_path / "lab.yaml").write_text("hosts: [{name: esx-01}]\n")  # read first: a saved plan, or a runbook
    result = gpuvm("apply", str(book), "--json", "--yes")
    events = documents(result.stdout)
    assert [check(e) for e in events] == ["apply", "error"] and result.exit_code == events[-1]["exit"] == 7
    assert events[-1]["code"] == "locked"


def test_a_wrong_flag_or_value_under_json_is_one_document_too_and_the_usage_error_stays_on_stderr():
    for args, named in ((["plan", "lab.yaml", "--json", "--bogus"], "--bogus"),
                        (["plan", "lab.yaml", "--format", "json", "--json"], "--format"),
                        (["bench", "compare", "r", "--json", "--max-overhead"], "--max-overhead")):
        result = gpuvm(*args)
        [error] = documents(result.stdout)
        assert check(error) == "error" and result.exit_code == error["exit"] == 2, result.output
        assert error["code"] == "input" and named in error["message"] and named in result.stderr
    plain = gpuvm("plan", "lab.yaml", "--bogus")
    assert plain.exit_code == 2 and plain.stdout == "" and "--bogus" in plain.stderr


def test_a_wrong_flag_with_detailed_exitcode_exits_1_not_2_which_would_read_as_changes():
    result = gpuvm("plan", "lab.yaml", "--detailed-exitcode", "--taget", "esx-01", "--json")
    [error] = documents(result.stdout)
    assert result.exit_code == error["exit"] == 1 and "--taget" in error["message"]
