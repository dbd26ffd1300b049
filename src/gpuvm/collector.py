"""The garbage collector paused while gpuvm makes objects in bulk (an inventory read, a plan, their
transfer between processes): they hold no cycles to collect, and the collector's passes over
hundreds of thousands of them would cost more than making them (a third of a plan's time).

And, in a process that ends with its command (`gpuvm plan`), the biggest of them left to the OS
instead of freed: freeing is work the OS does for nothing when the process ends. lxml's tree of a
4,096-VM inventory answer takes as long to free (0.2 s) as to build; the interpreter's teardown of
the plan and the modules another 0.1 s. (Instagram ends its Python workers with `os._exit` for the
same reason; clang leaves its AST unfreed at exit, `-disable-free`.)
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

_left: list[Any] | None = None  # what this process leaves to the OS at its end; None: freed as usual


@contextmanager
def paused() -> Iterator[None]:
    """No collection inside; the collector as it was after (nested pauses keep it off)."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if collecting:
            gc.enable()


def leave_to_exit() -> None:
    """This process ends when its command does, without the interpreter's teardown (the CLI's
    `finish`): from now on what is `discard`ed is kept, for the OS to reclaim at once."""
    global _left
    if _left is None:
        _left = []


def leaving() -> bool:
    """Whether this process leaves what it discards to the OS (`leave_to_exit`)."""
    return _left is not None


def discard(obj: Any) -> None:
    """`obj` is no longer needed: freed with its last reference, as usual, or kept to the end of a
    process that leaves it to the OS."""
    if _left is not None:
        _left.append(obj)
