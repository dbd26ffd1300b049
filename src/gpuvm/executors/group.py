"""Run one function for many targets in a bounded thread pool; one failure never hides another."""

from __future__ import annotations

import itertools
import threading
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import Callable, Mapping, TypeVar

from gpuvm.errors import TargetFailures

T = TypeVar("T")
R = TypeVar("R")
_pools = itertools.count()


def run_parallel(items: Mapping[str, T], fn: Callable[[T], R], max_workers: int = 8) -> dict[str, R]:
    """`fn(item)` for every target; the results by target name, in the order of `items`.

    Every target runs to its end. If any raised, `TargetFailures` is raised afterwards with
    each failure by target, and the successful results on its `.results`. Interrupted (Ctrl-C,
    SIGTERM), the targets under way finish and no other starts before the interrupt goes on: what
    the caller does next (journal the run's end, log out) comes after every target's last word.
    """
    if not items:
        return {}
    prefix = f"gpuvm-{next(_pools)}"
    pool = ThreadPoolExecutor(max_workers=max(1, min(max_workers, len(items))), thread_name_prefix=prefix)
    futures: dict[str, Future[R]] = {}
    try:
        for name, item in items.items():
            futures[name] = pool.submit(fn, item)
        wait(futures.values())
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
        _join_untracked(prefix)
    results: dict[str, R] = {}
    failures: dict[str, Exception] = {}
    for name, future in futures.items():
        error = future.exception()
        if error is None:
            results[name] = future.result()
        elif isinstance(error, Exception):
            failures[name] = error
        else:  # KeyboardInterrupt and friends are not a target's failure
            raise error
    if failures:
        raise TargetFailures(failures, results=results)
    return results


def _join_untracked(prefix: str) -> None:
    """An interrupt that lands while `submit` starts a worker leaves that thread out of the pool's
    own list, so `shutdown` does not wait for it; it may still run a target. Wait for it by name."""
    for thread in threading.enumerate():
        if thread.name.startswith(prefix + "_") and thread is not threading.current_thread():
            thread.join()
