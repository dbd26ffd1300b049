"""Executors: run commands and move files on a target (SSH, this machine, or a scripted fake).

Each is imported when first named (`from gpuvm.executors import SshExecutor`): a run that opens no
SSH connection never imports paramiko and fabric, a fifth of a second of start-up.
"""

from importlib import import_module
from typing import Any

_MODULES = {"CommandResult": "base", "Executor": "base", "FakeExecutor": "fake", "LocalExecutor": "local",
            "SshExecutor": "ssh", "GroupResult": "group", "run_group": "group"}

__all__ = list(_MODULES)


def __getattr__(name: str) -> Any:
    if name not in _MODULES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(f"{__name__}.{_MODULES[name]}"), name)
