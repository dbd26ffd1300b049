"""Run commands on this machine, with the same interface and quoting as over SSH.

Commands get a minimal environment (`job_environment`), as a job started over SSH would, not
gpuvm's own: the variables that hold its secrets (the vCenter password, key passphrases) never
reach a benchmark that prints its environment.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
from collections.abc import Mapping
from typing import BinaryIO

from gpuvm.errors import RemoteCommandError
from gpuvm.executors.base import (MAX_OUTPUT, UNDER_WAY, CommandResult, Executor, OutputOverflow, check_result,
                                  interrupted_message, raise_if_stopped, timeout_message)


# What a job needs of this machine's environment: where programs and libraries are, who and where
# it runs, and the GPU/MPI/NCCL settings an operator may have exported for it.
KEPT = {"PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "LANGUAGE", "TERM", "TMPDIR", "TZ",
        "LD_LIBRARY_PATH", "PYTHONPATH", "VIRTUAL_ENV", "CONDA_PREFIX"}
KEPT_PREFIXES = ("LC_", "CUDA_", "NVIDIA_", "NCCL_", "OMPI_MCA_", "GLOO_", "TORCH_", "OMP_")


def job_environment(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The variables of `environ` (default: this process's) a job is given; never a secret's value."""
    from gpuvm.secrets import is_secret

    source = os.environ if environ is None else environ
    return {k: v for k, v in source.items()
            if (k in KEPT or k.startswith(KEPT_PREFIXES)) and not is_secret(v)}


class LocalExecutor(Executor):
    """Runs each command line with `sh -c` in its own process group (killed whole on timeout)."""

    def __init__(self, name: str = "local", env: Mapping[str, str] | None = None):
        self.name = name
        self.env = dict(env) if env is not None else None  # None: job_environment() at each command
        self.max_output = MAX_OUTPUT

    def _execute(
        self, command: str, timeout: float, check: bool, stdin: bytes | None, stdout_to: BinaryIO | None
    ) -> CommandResult:
        if UNDER_WAY.refuses():
            raise RemoteCommandError(interrupted_message(self.name, command))
        proc = subprocess.Popen(
            ["sh", "-c", command],
            stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,  # its own process group, so a timeout kills all of it
            env=self.env if self.env is not None else job_environment(),
        )
        out, err = bytearray(), bytearray()
        overflow = OutputOverflow(self.max_output, lambda: _kill_group(proc, wait=False))
        threads = [
            threading.Thread(target=_pump, args=(proc.stdout, stdout_to, out, overflow), daemon=True),
            threading.Thread(target=_pump, args=(proc.stderr, None, err, overflow), daemon=True),
        ]
        if stdin is not None:
            threads.append(threading.Thread(target=_feed, args=(proc.stdin, stdin), daemon=True))
        for thread in threads:
            thread.start()
        interrupted = threading.Event()

        def interrupt() -> None:
            interrupted.set()
            _kill_group(proc, wait=False)

        under_way = UNDER_WAY.add(interrupt)
        try:
            exit_code = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            raise RemoteCommandError(timeout_message(self.name, command, timeout)) from None
        finally:
            UNDER_WAY.remove(under_way)
        raise_if_stopped(self.name, command, interrupted, overflow.over, self.max_output)
        for thread in threads:
            thread.join(timeout=5)
        result = CommandResult(command, exit_code, out.decode(errors="replace"), err.decode(errors="replace"))
        return check_result(self.name, result) if check else result


def _pump(stream, sink: BinaryIO | None, buffer: bytearray, overflow: OutputOverflow) -> None:
    for chunk in iter(lambda: stream.read1(65536), b""):
        if sink is not None:
            sink.write(chunk)
        elif not overflow.keep(buffer, chunk):
            break
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


def _kill_group(proc: subprocess.Popen, wait: bool = True) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    if wait:
        proc.wait()
