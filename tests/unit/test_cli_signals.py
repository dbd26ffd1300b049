"""SIGTERM stops a command as Ctrl-C does: one handler for both while a command runs (the premise of
tests/integration/test_interrupts.py, which stops each boundary cleanly with one of the two). Each
signal has one exit status at every moment of a run: 128 + its number (130 SIGINT, 143 SIGTERM)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from gpuvm.cli import common


def test_sigterm_and_sigint_have_one_handler_while_a_command_runs_and_theirs_after():
    before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    seen = {}

    @common.handle_errors
    def command() -> None:
        seen.update({s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)})

    command()
    assert seen[signal.SIGTERM] is seen[signal.SIGINT] is common._interrupt
    assert {s: signal.getsignal(s) for s in before} == before


@pytest.mark.parametrize("signum, status", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_signal_mid_command_exits_128_plus_its_number_saying_interrupted(capsys, signum, status):
    @common.handle_errors
    def command(json_: bool) -> None:
        os.kill(os.getpid(), signum)
        raise AssertionError("not interrupted")

    from gpuvm.executors.base import UNDER_WAY

    try:
        command(json_=True)
    except common.typer.Exit as stopped:
        assert stopped.exit_code == status
    else:
        raise AssertionError("no exit")
    finally:
        UNDER_WAY.reset()  # the handler told every later command not to start
    printed = capsys.readouterr()
    assert f"interrupted by {signum.name}" in printed.err
    assert json.loads(printed.out) | {"message": ""} == {"schema": "gpuvm.error/1", "code": "interrupted",
                                                          "exit": status, "message": "", "file": None, "line": None}


def test_a_second_signal_while_the_first_unwinds_ends_the_process_at_once(mocker):
    from gpuvm.executors.base import UNDER_WAY

    ended = mocker.patch.object(common.os, "_exit", side_effect=SystemExit)
    mocker.patch.object(UNDER_WAY, "stop_all")
    try:
        try:
            common._interrupt(signal.SIGTERM, None)
        except KeyboardInterrupt:
            pass
        ended.assert_not_called()  # the first unwinds: locks released, the run's end journaled
        try:
            common._interrupt(signal.SIGINT, None)
        except SystemExit:
            pass
        ended.assert_called_once_with(130)  # the second signal's status: SIGINT
    finally:
        UNDER_WAY.reset()


# While gpuvm loads (here: as it imports typer, before any command runs), the console script's entry
# point has its handlers installed already.
LOADING = """
import os, signal, sys
from importlib.metadata import entry_points

class SignalOnImport:
    def find_spec(self, name, path=None, target=None):
        if name == "typer":
            os.kill(os.getpid(), signal.{signal})
        return None

sys.argv = ["gpuvm", "validate", "rb.yaml", "--json"]
[script] = entry_points(group="console_scripts", name="gpuvm")
sys.meta_path.insert(0, SignalOnImport())
sys.exit(script.load()())
"""


@pytest.mark.parametrize("signum, status", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_signal_while_gpuvm_loads_exits_as_one_mid_command_would(signum, status):
    ran = subprocess.run([sys.executable, "-c", LOADING.format(signal=signum.name)], capture_output=True, text=True,
                         timeout=60)
    assert ran.returncode == status, ran.stderr
    assert f"interrupted by {signum.name}" in ran.stderr and "Traceback" not in ran.stderr
    assert json.loads(ran.stdout)["exit"] == status
