"""Every file gpuvm writes where the user says (`--save`, `--out`, `init`'s runbook, results, reports)
fails with one line naming the path and why, exit 2, never a traceback (issue 33, item 8); a command
checks its path before it asks vCenter or runs anything."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpuvm.bench.results import load_results, save_results
from gpuvm.cli.main import app
from gpuvm.files import FileRefused, check_writable, write_text
from gpuvm.runbook.model import Runbook
from gpuvm.vsphere.facts import Inventory
from gpuvm.vsphere.shown import Shown

FIXTURES = Path(__file__).parents[1] / "fixtures"
SNAPSHOT = FIXTURES / "inventory" / "lab.json"
STUDY_VM = Path(__file__).parents[2] / "playbooks" / "results" / "study-vm"
GUESTS = """\
hosts: [{name: esx-01}]
vms: [{name: vm1, host: esx-01}]
guests:
  hosts: [{vm: vm1, ssh: {address: 10.0.0.11}}]
"""


def gpuvm(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


def one_error_line(result, message: str) -> None:
    assert result.exit_code == 2, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert "Traceback" not in result.output
    errors = [line for line in result.output.splitlines() if line.startswith("error")]
    assert errors == [f"error: {message}"], result.output


@pytest.fixture
def a_file(tmp_path) -> Path:
    """A regular file where a directory would have to be."""
    path = tmp_path / "file"
    path.write_text("")
    return path


def test_inventory_save_into_a_missing_directory_is_refused_before_vcenter_is_asked(tmp_path, mocker):
    read = mocker.patch("gpuvm.connecting.inventory_of")
    runbook = tmp_path / "rb.yaml"
    runbook.write_text(GUESTS)
    result = gpuvm("inventory", runbook, "--save", "/nonexistent/dir/x")
    one_error_line(result, "/nonexistent/dir/x: cannot write snapshot: No such file or directory")
    read.assert_not_called()


def test_inventory_save_writes_the_snapshot_it_can_read_back(tmp_path, mocker):
    mocker.patch("gpuvm.connecting.inventory_of", return_value=(Shown(Inventory.load(SNAPSHOT)), Runbook()))
    runbook, saved = tmp_path / "rb.yaml", tmp_path / "snap.json"
    runbook.write_text(GUESTS)
    assert gpuvm("inventory", runbook, "--save", saved, "--json").exit_code == 0
    assert Inventory.load(saved) == Inventory.load(SNAPSHOT)


def test_init_below_a_file_is_refused_before_vcenter_is_asked(a_file, mocker):
    discover = mocker.patch("gpuvm.connecting.discover")
    result = gpuvm("init", a_file / "lab.yaml")
    one_error_line(result, f"{a_file / 'lab.yaml'}: cannot write runbook: Not a directory")
    discover.assert_not_called()


def test_launch_files_into_a_directory_below_a_file(tmp_path, a_file):
    runbook = tmp_path / "rb.yaml"
    runbook.write_text(GUESTS)
    one_error_line(gpuvm("launch-files", runbook, "--out", a_file / "launch"),
                   f"{a_file / 'launch'}: cannot write launch files: Not a directory")


def test_bench_report_into_a_directory_below_a_file(a_file):
    one_error_line(gpuvm("bench", "report", STUDY_VM, "--out", a_file / "report"),
                   f"{a_file / 'report'}: cannot write the report: Not a directory")


def test_bench_run_out_below_a_file_is_refused_before_anything_runs(tmp_path, a_file, mocker):
    prepare = mocker.patch("gpuvm.bench.runs.prepare_campaign")
    runbook = tmp_path / "rb.yaml"
    runbook.write_text(GUESTS)
    one_error_line(gpuvm("bench", "run", runbook, "--yes", "--out", a_file / "results"),
                   f"{a_file}: cannot write results: Not a directory")
    prepare.assert_not_called()


def test_results_that_cannot_be_saved_name_their_path(a_file):
    results = load_results(STUDY_VM)
    with pytest.raises(FileRefused, match=rf"^{a_file}/run/logs: cannot write results: Not a directory$"):
        save_results(a_file / "run", results)
    assert load_results(save_results(a_file.parent / "run", results)) == results


@pytest.mark.parametrize("make, directory, message", [
    (lambda p: None, False, "{p}: cannot write snapshot: No such file or directory"),  # the parent is missing
    (lambda p: p.mkdir(parents=True), False, "{p}: cannot write snapshot: Is a directory"),
    (lambda p: p.parent.mkdir() or p.touch(), True, "{p}: cannot write snapshot: Not a directory"),
])
def test_check_writable_refuses_what_the_write_would(tmp_path, make, directory, message):
    path = tmp_path / "missing" / "x"
    make(path)
    with pytest.raises(FileRefused, match=f"^{re.escape(message.format(p=path))}$"):
        check_writable(path, "snapshot", directory=directory)
    target = path / "y" if directory else path
    with pytest.raises(FileRefused, match=f"^{re.escape(str(target))}: cannot write snapshot: "):  # the write itself
        write_text(target, "{}", "snapshot")


def test_check_writable_passes_what_can_be_written(tmp_path):
    check_writable(tmp_path / "new.json", "snapshot")
    check_writable(tmp_path / "a" / "b" / "c", "results", directory=True)  # made with its parents
    assert write_text(tmp_path / "new.json", "{}\n").read_text() == "{}\n"
