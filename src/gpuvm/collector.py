"""The garbage collector paused while gpuvm makes objects in bulk (an inventory read, a plan, their
transfer between processes): they hold no cycles to collect, and the collector's passes over
hundreds of thousands of them would cost more than making them (a third of a plan's time)."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


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
