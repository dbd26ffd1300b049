"""The one small interface every executor implements: run a command, put or get a file.

Commands are argv lists, quoted with `shlex.join` so that no value is ever re-read by a shell;
`run_script` is for fixed shell text whose values the caller quoted with `shlex.quote`.
"""

from __future__ import annotations

import itertools
import shlex
import threading
from dataclasses import dataclass
from typing import Any, BinaryIO, Callable, Sequence, TypedDict, Unpack

from gpuvm.errors import RemoteCommandError
from gpuvm.secrets import redact


@dataclass(frozen=True)
class CommandResult:
    command: str
    exit_code: int
    stdout: str
    stderr: str

    @property
    def ok(self) -> bool:
        return self.exit_code == 0

    @property
    def last_line(self) -> str:
        """What a failed command said last: the last non-blank line of stderr, else of stdout."""
        return last_line(self.stderr) or last_line(self.stdout)


# What one command's output may hold in gpuvm's memory, per stream (stdout streamed to a file with
# `stdout_to` is not held). A tool that prints without end (~200 MB/s) is stopped past it instead of
# filling this machine's memory until its timeout.
MAX_OUTPUT = 8 * 1024 * 1024


class OutputOverflow:
    """Set by a reader thread when a stream passed the cap; the command is then stopped."""

    def __init__(self, limit: int, on_over: Callable[[], None]):
        self.limit, self._on_over = limit, on_over
        self.over = threading.Event()

    def keep(self, buffer: bytearray, chunk: bytes) -> bool:
        """Add `chunk` to `buffer`; False (and the command stopped, once) when past the cap."""
        if len(buffer) + len(chunk) > self.limit:
            if not self.over.is_set():
                self.over.set()
                self._on_over()
            return False
        buffer.extend(chunk)
        return True


class _UnderWay:
    """The commands under way in this process, each with how to stop it: an interrupt (Ctrl-C,
    SIGTERM) stops them all at once, the remote side signalled, instead of waiting for each to end
    or time out (run_group lets the targets under way finish). After it, worker threads start no
    command (`refuses`); the main thread, which unwinds the interrupt, may still clean up (stop a
    benchmark's ranks, its containers). A CLI command clears the flag when it starts (`reset`)."""

    def __init__(self) -> None:
        self._lock = threading.RLock()  # re-entrant: a signal handler may land while it is held
        self._stoppers: dict[int, Callable[[], None]] = {}
        self._ids = itertools.count()
        self.interrupted = threading.Event()

    def add(self, stop: Callable[[], None]) -> int:
        with self._lock:
            key = next(self._ids)
            self._stoppers[key] = stop
            return key

    def remove(self, key: int) -> None:
        with self._lock:
            self._stoppers.pop(key, None)

    def stop_all(self) -> None:
        self.interrupted.set()
        with self._lock:
            stoppers = list(self._stoppers.values())
        for stop in stoppers:
            try:
                stop()
            except Exception:  # best effort: the command may have ended meanwhile
                pass

    def refuses(self) -> bool:
        """Whether a command starting now, in this thread, is refused."""
        return self.interrupted.is_set() and threading.current_thread() is not threading.main_thread()

    def reset(self) -> None:
        self.interrupted.clear()


UNDER_WAY = _UnderWay()


def interrupted_message(name: str, command: str) -> str:
    return redact(f"{name}: `{command}` stopped: gpuvm was interrupted")


def overflow_message(name: str, command: str, limit: int) -> str:
    return redact(f"{name}: `{command}` printed more than gpuvm keeps: output over {limit / 2**20:g} MiB; "
                  "the command was stopped")


def raise_if_stopped(name: str, command: str, interrupted: Any, overflowed: Any, limit: int) -> None:
    """The error of a command gpuvm stopped: interrupted (Ctrl-C, SIGTERM) or past the output cap."""
    if interrupted.is_set():
        raise RemoteCommandError(interrupted_message(name, command))
    if overflowed.is_set():
        raise RemoteCommandError(overflow_message(name, command, limit))


class RunOptions(TypedDict, total=False):
    timeout: float  # seconds, default 60
    check: bool  # raise RemoteCommandError on a non-zero exit, default True
    stdin: bytes | None
    stdout_to: BinaryIO | None  # stream stdout there instead of keeping it


class Executor:
    """The one interface: run a command (argv, quoted here) or a fixed script, put and get a file.

    Implementations provide one primitive, `_execute(command_line, ...)`, which gets the final shell
    text (with `sudo -n` in front when asked): SSH, local and the tests' fake.
    """

    name: str

    def run(self, argv: Sequence[str], *, sudo: bool = False, **options: Unpack[RunOptions]) -> CommandResult:
        """Run argv, every word quoted."""
        return self._run(command_line(argv, sudo), **options)

    def run_script(self, script: str, *, sudo: bool = False, **options: Unpack[RunOptions]) -> CommandResult:
        """Run a fixed shell script (through `sh -c`)."""
        return self._run(script_line(script, sudo), **options)

    def _run(self, line: str, timeout: float = 60, check: bool = True, stdin: bytes | None = None,
             stdout_to: BinaryIO | None = None) -> CommandResult:
        return self._execute(line, timeout, check, stdin, stdout_to)

    def put(self, data: bytes, path: str, mode: int = 0o644, sudo: bool = False) -> None:
        self.run(put_argv(path, mode), sudo=sudo, stdin=data)

    def get(self, path: str) -> bytes:
        import io

        buffer = io.BytesIO()
        self.run(["cat", path], stdout_to=buffer)
        return buffer.getvalue()

    def close(self) -> None:
        pass

    def _execute(
        self, command: str, timeout: float, check: bool, stdin: bytes | None, stdout_to: BinaryIO | None
    ) -> CommandResult:
        raise NotImplementedError


def command_line(argv: Sequence[str], sudo: bool = False) -> str:
    """The shell text for argv: every word quoted; `sudo -n` (never prompt) in front if asked."""
    if isinstance(argv, str):
        raise TypeError("argv must be a list of words, not a string; use run_script for shell text")
    if not argv:
        raise ValueError("argv is empty")
    line = shlex.join(str(word) for word in argv)
    return f"sudo -n {line}" if sudo else line


def script_line(script: str, sudo: bool = False) -> str:
    """The shell text for a script; with sudo it runs under `sudo -n sh -c`."""
    return f"sudo -n sh -c {shlex.quote(script)}" if sudo else script


def put_argv(path: str, mode: int) -> list[str]:
    """A command that writes stdin to `path` with `mode` (works on ESXi's busybox too)."""
    return ["sh", "-c", 'cat > "$1" && chmod "$2" "$1"', "gpuvm-put", path, f"{mode:o}"]


def check_result(name: str, result: CommandResult) -> CommandResult:
    """Raise RemoteCommandError for a non-zero exit, naming the target, command and last error line."""
    if result.exit_code != 0:
        raise RemoteCommandError(failure_message(name, result))
    return result


def failure_message(name: str, result: CommandResult) -> str:
    last = result.last_line
    detail = f": {last}" if last else ""
    return redact(f"{name}: `{result.command}` exited {result.exit_code}{detail}")


def timeout_message(name: str, command: str, timeout: float) -> str:
    return redact(f"{name}: `{command}` timed out after {timeout:g}s; the command was stopped")


def last_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else ""
