"""The one way gpuvm runs work on many targets at once: `run_group`, a bounded thread pool that
returns every target's outcome (fabric's `GroupResult`): one failure never hides another, and the
caller decides what a failure means (skip the target, charge it to another, raise them all)."""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable, Hashable, Mapping, Sized
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from gpuvm.errors import TargetFailures

K = TypeVar("K", bound=Hashable)
T = TypeVar("T")
R = TypeVar("R")
_pools = itertools.count()
START_WAIT_S = 10.0  # how long a worker thread may take to report itself started


@dataclass(frozen=True)
class GroupResult(Generic[K, R]):
    """Every target's outcome, in the order the targets were given: its value, or its error."""

    ok: dict[K, R] = field(default_factory=dict)
    failed: dict[K, Exception] = field(default_factory=dict)

    def raise_failures(self) -> dict[K, R]:
        """The values, when every target succeeded; else one TargetFailures naming each failed target
        (its exit code the failures' own when they share one, else 1), the values on its `.results`."""
        if self.failed:
            raise TargetFailures(dict(self.failed), results=dict(self.ok))  # type: ignore[arg-type]
        return self.ok

    def raise_first(self) -> dict[K, R]:
        """The values, when every target succeeded; else the first failure (in target order) as it is."""
        for error in self.failed.values():
            raise error
        return self.ok


MOST_AT_ONCE = 64  # remote work that only waits on guests: a 64-guest fleet in one round (`apply --parallel`'s limit)


def at_once(targets: Sized) -> int:
    """Workers for a pool over `targets`: one each, up to MOST_AT_ONCE."""
    return max(1, min(MOST_AT_ONCE, len(targets)))


def run_group(items: Mapping[K, T], fn: Callable[[T], R], max_workers: int = 8, *, name: str = "",
              on_interrupt: Callable[[], None] | None = None) -> GroupResult[K, R]:
    """`fn(item)` for every target, at most `max_workers` at once; every target runs to its end.

    Interrupted (Ctrl-C, SIGTERM), `on_interrupt` (if given) runs first, in this thread (to stop what
    the targets under way wait on, e.g. a benchmark's ranks); then the targets under way finish and
    no other starts before the interrupt goes on: what the caller does next (journal the run's end,
    log out) comes after every target's last word. An interrupt raised inside `fn` goes on too.
    """
    if not items:
        return GroupResult()
    prefix = f"gpuvm-{name}{'-' if name else ''}{next(_pools)}"
    pool = ThreadPoolExecutor(max_workers=max(1, min(max_workers, len(items))), thread_name_prefix=prefix)
    futures: dict[K, Future[R]] = {}
    try:
        for key, item in items.items():
            futures[key] = pool.submit(fn, item)
        wait(futures.values())
    except BaseException:
        if on_interrupt is not None:
            on_interrupt()
        raise
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
        _join_untracked(prefix)
    ok: dict[K, R] = {}
    failed: dict[K, Exception] = {}
    for key, future in futures.items():
        error = future.exception()
        if error is None:
            ok[key] = future.result()
        elif isinstance(error, Exception):
            failed[key] = error
        else:  # KeyboardInterrupt and friends are not a target's failure
            raise error
    return GroupResult(ok, failed)


def _join_untracked(prefix: str) -> None:
    """An interrupt that lands while `submit` starts a worker leaves that thread out of the pool's
    own list, so `shutdown` does not wait for it; it may still run a target. Wait for it by name.
    Such a thread may not have reported itself started yet (join refuses it then): wait for that,
    up to `START_WAIT_S`; one that has not started by then never runs a target."""
    for thread in threading.enumerate():
        if thread.name.startswith(prefix + "_") and thread is not threading.current_thread():
            for _ in range(round(START_WAIT_S / 0.001)):
                try:
                    thread.join()
                    break
                except RuntimeError:  # "cannot join thread before it is started": it is about to be
                    time.sleep(0.001)
