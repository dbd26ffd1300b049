"""The one small interface every executor implements: run a command, put or get a file.

Commands are argv lists, quoted with `shlex.join` so that no value is ever re-read by a shell;
`run_script` is for fixed shell text whose values the caller quoted with `shlex.quote`.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from typing import BinaryIO, Sequence, TypedDict, Unpack

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
