"""Executors: run commands and move files on a target (SSH, this machine, or a scripted fake)."""

from gpuvm.executors.base import CommandResult, Executor
from gpuvm.executors.fake import FakeExecutor
from gpuvm.executors.group import run_parallel
from gpuvm.executors.local import LocalExecutor
from gpuvm.executors.ssh import SshExecutor

__all__ = ["CommandResult", "Executor", "FakeExecutor", "LocalExecutor", "SshExecutor", "run_parallel"]
