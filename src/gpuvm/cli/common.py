"""What every command shares: one error handler, the consoles, loading and connecting."""

from __future__ import annotations

import functools
import os
import sys
from pathlib import Path
from contextlib import contextmanager
from typing import Any, Callable, Iterator, TypeVar

import typer
from rich.console import Console

from gpuvm.errors import GpuvmError
from gpuvm.secrets import redact

F = TypeVar("F", bound=Callable[..., Any])

def _console(stderr: bool = False) -> Console:
    console = Console(stderr=stderr, highlight=False)
    if not console.is_terminal and "COLUMNS" not in os.environ:
        console.width = 160  # logs and pipes: no terminal to fit, keep rows on one line
    return console


out = _console()
err = _console(stderr=True)


def fail(message: str, code: int) -> typer.Exit:
    err.print(f"[red]error[/]: {redact(message)}", highlight=False, markup=True, soft_wrap=True)
    return typer.Exit(code)


def handle_errors(fn: F) -> F:
    """Expected failures print one clear message and exit with their code; never a traceback."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except GpuvmError as e:
            raise fail(str(e), e.exit_code) from None
        except KeyboardInterrupt:
            raise fail("interrupted", 130) from None

    return wrapper  # type: ignore[return-value]


def load(runbook: Path) -> Any:
    from gpuvm.runbook.loader import load_runbook

    return load_runbook(runbook)


def observe(runbook: Any, insecure: bool, snapshot: Path | None = None) -> Any:
    """The inventory: from a snapshot file, or read live from vCenter in one request."""
    from gpuvm.vsphere.facts import Inventory

    if snapshot is not None:
        return Inventory.load(snapshot)
    with connect(runbook, insecure) as session:
        from gpuvm.vsphere.inventory import read_inventory

        return read_inventory(session)


@contextmanager
def remote(runbook: Any, accept_new_host_keys: bool, state: Path | None = None, parallel: int = 8) -> Iterator[Any]:
    """The SSH targets of the runbook and what they look like now: (cluster, facts, unreachable
    guests), or (None, {}, {})."""
    from gpuvm.engine import observe_reachable
    from gpuvm.journal import state_dir
    from gpuvm.remote import RemoteOptions, build_cluster

    if not runbook.guests and not any(h.ssh for h in runbook.hosts):
        yield None, {}, {}
        return
    cluster = build_cluster(runbook, state_dir(state), RemoteOptions(accept_new_host_keys=accept_new_host_keys))
    try:
        yield (cluster, *observe_reachable(cluster, parallel))
    finally:
        cluster.close()


def connect(runbook: Any, insecure: bool) -> Any:
    from gpuvm.vsphere.session import Session, resolve_target

    target = resolve_target(runbook.vcenter, insecure)
    if target.insecure:
        err.print(f"[bold yellow]warning[/]: TLS certificate verification is OFF for {target.url}: "
                  "anyone on the network path can impersonate vCenter and read the password", soft_wrap=True)
    return Session(target)


def interactive() -> bool:
    return sys.stdin.isatty()
