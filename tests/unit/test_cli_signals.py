"""SIGTERM stops a command as Ctrl-C does: one handler for both while a command runs (the premise of
tests/integration/test_interrupts.py, which stops each boundary cleanly with one of the two)."""

from __future__ import annotations

import os
import signal

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


def test_sigterm_mid_command_exits_130_saying_interrupted(capsys):
    @common.handle_errors
    def command() -> None:
        os.kill(os.getpid(), signal.SIGTERM)
        raise AssertionError("not interrupted")

    from gpuvm.executors.base import UNDER_WAY

    try:
        command()
    except common.typer.Exit as stopped:
        assert stopped.exit_code == 130
    else:
        raise AssertionError("no exit")
    finally:
        UNDER_WAY.reset()  # the handler told every later command not to start
    assert "interrupted" in capsys.readouterr().err


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
        ended.assert_called_once_with(130)
    finally:
        UNDER_WAY.reset()
