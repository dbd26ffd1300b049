"""A scripted executor for unit tests of steps: canned responses, and a record of every call.

    fake = FakeExecutor("gpu-vm-01", {
        "nvidia-smi -L": CommandResult("nvidia-smi -L", 0, GPU_LIST, ""),
        re.compile(r"mlxconfig .* set ATS_ENABLED=true"): lambda call: ok(call.command),
    })

Keys are matched against the command line *without* the `sudo -n ` prefix: an exact string
first, then regular expressions (`re.search`) in insertion order. A callable receives the
`FakeCall` and returns a `CommandResult`. An unmatched command exits 127, like a missing tool.
`put` and `get` work on an in-memory file table, `files`.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from typing import BinaryIO, Callable, Mapping, Union

from gpuvm.executors.base import CommandResult, Executor, check_result

Response = Union[CommandResult, Callable[["FakeCall"], CommandResult]]


@dataclass(frozen=True)
class FakeCall:
    command: str  # without the sudo prefix
    sudo: bool
    stdin: bytes | None
    timeout: float

    @property
    def line(self) -> str:
        """The full command line as it would go to the host."""
        return f"sudo -n {self.command}" if self.sudo else self.command


def ok(command: str, stdout: str = "") -> CommandResult:
    return CommandResult(command, 0, stdout, "")


class FakeExecutor(Executor):
    def __init__(self, name: str, responses: Mapping[Union[str, re.Pattern], Response] | None = None):
        self.name = name
        self.responses: dict[Union[str, re.Pattern], Response] = dict(responses or {})
        self.calls: list[FakeCall] = []
        self.files: dict[str, tuple[bytes, int]] = {}
        self.closed = False

    @property
    def commands(self) -> list[str]:
        """Every command line run so far, sudo prefix included."""
        return [call.line for call in self.calls]

    def _execute(
        self, command: str, timeout: float, check: bool, stdin: bytes | None, stdout_to: BinaryIO | None
    ) -> CommandResult:
        # Record what the caller asked for: the command without `sudo -n` (a script without its
        # `sh -c` wrapper), and whether it was to run as root.
        sudo = command.startswith("sudo -n ")
        if sudo:
            command = command[len("sudo -n "):]
            if command.startswith("sh -c "):
                command = shlex.split(command)[2]
        return self._answer(command, sudo, timeout, check, stdin, stdout_to)

    def put(self, data: bytes, path: str, mode: int = 0o644, sudo: bool = False) -> None:
        self.calls.append(FakeCall(f"put {path} mode {mode:o}", sudo, data, 0))
        self.files[path] = (data, mode)

    def get(self, path: str) -> bytes:
        self.calls.append(FakeCall(f"get {path}", False, None, 0))
        if path not in self.files:
            return check_result(self.name, CommandResult(f"cat {path}", 1, "", f"cat: {path}: No such file or directory"))  # type: ignore[return-value]
        return self.files[path][0]

    def close(self) -> None:
        self.closed = True

    def _answer(
        self, command: str, sudo: bool, timeout: float, check: bool, stdin: bytes | None, stdout_to: BinaryIO | None
    ) -> CommandResult:
        call = FakeCall(command, sudo, stdin, timeout)
        self.calls.append(call)
        response = self._lookup(command)
        if response is None:
            result = CommandResult(call.line, 127, "", f"fake: no response for `{command}`")
        else:
            result = response(call) if callable(response) else response
            result = CommandResult(call.line, result.exit_code, result.stdout, result.stderr)
        if stdout_to is not None:
            stdout_to.write(result.stdout.encode())
            result = CommandResult(result.command, result.exit_code, "", result.stderr)
        return check_result(self.name, result) if check else result

    def _lookup(self, command: str) -> Response | None:
        if command in self.responses:
            return self.responses[command]
        for key, response in self.responses.items():
            if isinstance(key, re.Pattern) and key.search(command):
                return response
        return None
