"""What every command shares: one error handler, the consoles, loading, how runs reach their peers."""

from __future__ import annotations

import functools
import logging
import os
import signal
import sys
import threading
from enum import Enum
from pathlib import Path
from typing import Any, Callable, NoReturn, TypeVar

import typer
from typer.core import TyperGroup

from gpuvm import collector
from gpuvm.errors import GpuvmError, error_document
from gpuvm.secrets import redact

F = TypeVar("F", bound=Callable[..., Any])


class _Console:
    """rich's Console, made when first used: importing rich costs a start-up ~30 ms that `--help`
    and `validate` (which print plain lines) need not pay."""

    def __init__(self, stderr: bool):
        self._stderr = stderr
        self._console: Any = None

    @property
    def rich(self) -> Any:
        """The Console itself (for rich's own widgets, e.g. a Progress)."""
        if self._console is None:
            # text from runbooks and hosts is text: no markup, and no emoji codes (0000:ab:00.0 stays an address)
            console = _safe_console(stderr=self._stderr, highlight=False, markup=False, emoji=False)
            if not console.is_terminal and "COLUMNS" not in os.environ:
                console.width = 160  # logs and pipes: no terminal to fit, keep rows on one line
            self._console = console
        return self._console

    def __getattr__(self, name: str) -> Any:
        return getattr(self.rich, name)


def _safe_console(**options: Any) -> Any:
    """A rich Console whose every string (printed, a table cell, a progress line) has its control
    characters escaped before rich reads it: what guests answer reaches errors and plans, and an
    `ESC ]0;…BEL` there would retitle the operator's terminal, `ESC [2J` clear it. rich's own
    styles are added after, so colours still work."""
    from rich.console import Console

    from gpuvm.untrusted import printable

    class SafeConsole(Console):
        def render_str(self, text: str, **kwargs: Any) -> Any:
            return super().render_str(printable(text), **kwargs)

    return SafeConsole(**options)


out = _Console(stderr=False)
err = _Console(stderr=True)


def escape(text: str) -> str:
    """`text` with rich's markup escaped (what runbooks and hosts say is never markup)."""
    from rich.markup import escape as rich_escape

    return rich_escape(text)


class _Command:
    """The command under way: whether it was given --json, and the signal that interrupted it."""

    as_json = False
    stopped_by = signal.SIGINT  # a KeyboardInterrupt no handler of ours raised: Ctrl-C


class Form(str, Enum):
    """How a plan's changes are printed: grouped by target, or as one table."""

    text = "text"
    table = "table"


FORMAT = typer.Option(Form.text, "--format", help="Changes as text (grouped by target) or as one table")


def fail(message: str, code: int, kind: str | None = None) -> typer.Exit:
    """The command ends in error: `message` on stderr and exit status `code`; given --json, the
    gpuvm.error/1 document on stdout too (its `code` is `kind`, by default what the status says)."""
    message = redact(message)
    if _Command.as_json:
        from gpuvm.documents import error_json

        kind = kind or {2: "input"}.get(code, "interrupted" if code > 128 else "error")
        if (document := error_json(message, code, kind)) is not None:
            print(document, flush=True)
    err.print(f"[red]error[/]: {escape(message)}", highlight=False, markup=True, soft_wrap=True)
    return typer.Exit(code)


def interrupted_exit() -> int:
    """An interrupted command's exit status: 128 + the signal's number, as a shell reports a process
    the signal ended (130 for SIGINT, 143 for SIGTERM), at every moment of a run (gpuvm.cli.entry)."""
    return 128 + _Command.stopped_by


def _interrupt(signum: int, frame: Any) -> None:
    """SIGTERM and SIGINT: stop every command and vCenter call under way (the remote side signalled)
    from a thread of its own (the main thread may hold the locks that takes), then unwind like
    Ctrl-C, so the run journals its end within seconds instead of after each command's timeout.
    A second signal while that unwinds ends the process at once (its locks left to their lease)."""
    from gpuvm.executors.base import UNDER_WAY

    if UNDER_WAY.interrupted.is_set():
        os.write(2, b"interrupted again: exiting now (host locks not released are freed when their lease expires)\n")
        os._exit(128 + signum)
    _Command.stopped_by = signal.Signals(signum)
    UNDER_WAY.interrupted.set()  # no worker thread starts a command from now on
    threading.Thread(target=UNDER_WAY.stop_all, name="gpuvm-interrupt", daemon=True).start()
    raise KeyboardInterrupt


def handle_errors(fn: F) -> F:
    """Expected failures print one clear message and exit with their code, never a traceback; with
    --json (a `json_` parameter) a gpuvm.error/1 document too (`fail`)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        from gpuvm.documents import command_begins
        from gpuvm.executors.base import UNDER_WAY

        main = threading.current_thread() is threading.main_thread()
        previous = {s: signal.signal(s, _interrupt) for s in (signal.SIGTERM, signal.SIGINT)} if main else {}
        UNDER_WAY.reset()
        command_begins()
        _Command.as_json, _Command.stopped_by = bool(kwargs.get("json_")), signal.SIGINT
        try:
            return fn(*args, **kwargs)
        except GpuvmError as e:
            raise fail(str(e), e.exit_code, e.code) from None
        except KeyboardInterrupt:
            raise fail(f"interrupted by {_Command.stopped_by.name}", interrupted_exit(), "interrupted") from None
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler if handler is not None else signal.SIG_DFL)

    return wrapper  # type: ignore[return-value]


# the order `gpuvm --help` lists the commands in: a run's (docs/guide.md's "Commands" too)
ORDER = ("init", "validate", "inventory", "plan", "show", "apply", "verify", "bench", "locks", "launch-files", "size",
         "schema")


class _Commands(TyperGroup):
    """gpuvm's commands, listed in a run's order (ORDER). A usage error (a flag or value typer refuses)
    of a command given --json is a gpuvm.error/1 document on stdout too, as the command's own errors
    are (`fail`); typer still prints the usage on stderr and exits 2 (1 with --detailed-exitcode)."""

    def list_commands(self, ctx: Any) -> list[str]:
        return sorted(super().list_commands(ctx), key=lambda name: (ORDER + (name,)).index(name))

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        ctx.meta["gpuvm.json"] = "--json" in args
        ctx.meta["gpuvm.detailed"] = "--detailed-exitcode" in args
        return super().parse_args(ctx, args)

    def invoke(self, ctx: Any) -> Any:
        try:
            return super().invoke(ctx)
        except typer.BadParameter.__base__ as error:  # click's UsageError: a wrong flag, a value refused
            if ctx.meta.get("gpuvm.detailed"):
                error.exit_code = 1  # plan --detailed-exitcode: 2 says "changes", an error is 1
            if ctx.meta.get("gpuvm.json"):
                from gpuvm.documents import dumps

                print(dumps(error_document(redact(error.format_message()), error.exit_code, "input"), indent=None),
                      flush=True)
            raise


class Gpuvm(typer.Typer):
    """gpuvm's command line. Called (the console script, `python -m gpuvm.cli.main`), it is the
    process, which a command may then end without the interpreter's teardown (`ends_process`);
    tests run its commands through typer's CliRunner, which does not call it."""

    as_process = False

    def __init__(self, **options: Any):
        super().__init__(cls=_Commands, **options)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        Gpuvm.as_process = True
        try:
            return super().__call__(*args, **kwargs)
        finally:
            Gpuvm.as_process = False


def ends_process() -> None:
    """A command that ends the process (`plan`): run as the process, what it discards is left to
    the OS (gpuvm.collector) and `finish` ends the process without freeing anything."""
    if Gpuvm.as_process:
        collector.leave_to_exit()


def finish(code: int) -> NoReturn:
    """The command's end, with exit status `code`: after `ends_process`, the process ends now, its
    output and log flushed (gpuvm registers nothing else to run at exit); else as typer ends it,
    and so under a profiler or a coverage tracer too, which write their files at exit."""
    if collector.leaving() and sys.getprofile() is None and sys.gettrace() is None:
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    raise typer.Exit(code)


def load(runbook: Path) -> Any:
    from gpuvm.runbook.loader import load_runbook

    return load_runbook(runbook)


# `apply --drain-timeout` and `bench run --drain-timeout` (for its setups): one option, one meaning
# (ApplyOptions.drain_timeout). Used as `Annotated[Optional[float], DRAIN_TIMEOUT] = None`.
DRAIN_TIMEOUT = typer.Option("--drain-timeout", min=0, help="Seconds a host reboot waits for the Slurm jobs on its "
                             "VMs' drained nodes (without it, a reboot with jobs running there is refused)")


def access(insecure: bool = False, accept_new_host_keys: bool = False, state_dir: Path | None = None) -> Any:
    """How a run reaches its peers (gpuvm.connecting.Access), its TLS warning printed on stderr."""
    from gpuvm.connecting import Access

    return Access(insecure, accept_new_host_keys, state_dir, warn=warn)


def warn(message: str) -> None:
    err.print(f"[bold yellow]warning[/]: {escape(message)}", markup=True, soft_wrap=True)


def interactive() -> bool:
    return sys.stdin.isatty()
