"""Run commands on this machine, with the same interface and quoting as over SSH."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
from typing import BinaryIO

from gpuvm.errors import RemoteCommandError
from gpuvm.executors.base import CommandResult, Executor, check_result, timeout_message


class LocalExecutor(Executor):
    """Runs each command line with `sh -c` in its own process group (killed whole on timeout)."""

    def __init__(self, name: str = "local"):
        self.name = name

    def _execute(
        self, command: str, timeout: float, check: bool, stdin: bytes | None, stdout_to: BinaryIO | None
    ) -> CommandResult:
        proc = subprocess.Popen(
            ["sh", "-c", command],
            stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,  # its own process group, so a timeout kills all of it
        )
        out, err = bytearray(), bytearray()
        threads = [
            threading.Thread(target=_pump, args=(proc.stdout, stdout_to, out), daemon=True),
            threading.Thread(target=_pump, args=(proc.stderr, None, err), daemon=True),
        ]
        if stdin is not None:
            threads.append(threading.Thread(target=_feed, args=(proc.stdin, stdin), daemon=True))
        for thread in threads:
            thread.start()
        try:
            exit_code = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            raise RemoteCommandError(timeout_message(self.name, command, timeout)) from None
        for thread in threads:
            thread.join(timeout=5)
        result = CommandResult(command, exit_code, out.decode(errors="replace"), err.decode(errors="replace"))
        return check_result(self.name, result) if check else result


def _pump(stream, sink: BinaryIO | None, buffer: bytearray) -> None:
    for chunk in iter(lambda: stream.read1(65536), b""):
        if sink is not None:
            sink.write(chunk)
        else:
            buffer.extend(chunk)
    stream.close()


def _feed(stream, data: bytes) -> None:
    try:
        stream.write(data)
    except BrokenPipeError:
        pass
    finally:
        try:
            stream.close()
        except BrokenPipeError:
            pass


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()
