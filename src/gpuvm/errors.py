"""The small taxonomy of errors a user can see. The exit code tells the kind.

Every expected failure is one of these; the CLI prints `str(error)` on one line (or a few,
for aggregate errors) and exits with `exit_code`, never with a traceback. With `--json` it prints a
`gpuvm.error/1` document too, whose `code` names the kind (`code` below).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

DOCUMENT_VERSION = 1  # of gpuvm.error, an error under --json (src/gpuvm/schemas/error.json)
SHOWN = 5  # names a message lists before it counts the rest


def listed(names: Iterable[object], limit: int = SHOWN) -> str:
    """Names for a message, kept short whatever their number: 'h1, h2, h3, … (9,997 more)'."""
    items = [str(n) for n in names]
    more = f", … ({len(items) - limit:,} more)" if len(items) > limit else ""
    return ", ".join(items[:limit]) + more


_WHERE = re.compile(r"(.+?):(\d+): ")  # an input error's "file:line: field: problem"


def error_document(message: str, exit_code: int, code: str) -> dict[str, Any]:
    """What an error is under `--json` (gpuvm.error/1): its kind (`code`), the process's exit status,
    the message, and the file and line of an input error's (first) problem, null where none is named."""
    where = _WHERE.match(message) if code == "input" else None
    return {"schema": f"gpuvm.error/{DOCUMENT_VERSION}", "code": code, "exit": exit_code, "message": message,
            "file": where[1] if where else None, "line": int(where[2]) if where else None}


class GpuvmError(Exception):
    """Base of every expected failure."""

    exit_code = 1
    code = "error"  # the kind, for scripts: the `code` of its gpuvm.error/1 document


class InputError(GpuvmError):
    """The runbook, a results file or a command-line argument is wrong. Nothing was touched."""

    exit_code = 2
    code = "input"


class ConnectError(GpuvmError):
    """A peer (vCenter, an SSH host) could not be reached or refused us."""

    exit_code = 3
    code = "connect"

    def __init__(self, message: str, field: str | None = None):
        super().__init__(message)
        self.field = field  # the runbook's vcenter field responsible (url, password_env, ca_file), if any


class HostKeyError(ConnectError):
    """An SSH host key is unknown, changed or revoked: an error, never "not reachable yet"."""

    code = "host-key"


class ObserveError(ConnectError):
    """A target answered, but not what gpuvm can read (a command failed or timed out, a value it
    cannot trust): like one that does not answer, it is not observed (exit 3), and only it."""

    code = "observe"


class RemoteCommandError(GpuvmError):
    """A command on a remote host failed or timed out."""

    exit_code = 4
    code = "remote-command"


class TaskError(GpuvmError):
    """A vSphere task or call ended in a fault."""

    exit_code = 4
    code = "task"


class DriftError(GpuvmError):
    """`verify` found the world differs from the runbook."""

    exit_code = 5
    code = "drift"


class BenchmarkError(GpuvmError):
    """A benchmark run failed, or its output held no figure."""

    exit_code = 6
    code = "benchmark"


class LockedError(GpuvmError):
    """Another gpuvm run holds the lock of a host this run would change. Nothing was touched."""

    exit_code = 7
    code = "locked"


class LeaseLostError(GpuvmError):
    """This run's lease on its hosts' locks ran out (renewals failed) or was broken: it stopped
    changing anything before another run could take the hosts over. Re-run `apply`."""

    exit_code = 8
    code = "lease-lost"


MAX_LINES = 20  # failed targets a TargetFailures names one per line
NOT_OBSERVED = " (observe)"  # a failure's key ("target (step)") when apply could not observe the target


def counted(failed: Iterable[str], not_observed: int, skipped: int | None = None, every: bool = False) -> str:
    """How a run's targets ended, as `plan` counts them: a target apply could not observe (`NOT_OBSERVED`)
    is "not observed" as in the plan, and failed ("1 other target(s) failed, 2 not observed (1 failed)").
    `every`: zero counts too."""
    keys = list(failed)
    unseen = sum(1 for key in keys if key.endswith(NOT_OBSERVED))
    parts = [f"{len(keys) - unseen:,} {'other ' if unseen else ''}target(s) failed"] if len(keys) > unseen or every else []
    if skipped is not None:
        parts.append(f"{skipped:,} skipped")
    if unseen + not_observed or every:
        why = "" if not unseen else " (failed)" if not not_observed else f" ({unseen:,} failed)"
        parts.append(f"{unseen + not_observed:,} {'' if parts else 'target(s) '}not observed{why}")
    return ", ".join(parts)


class TargetFailures(GpuvmError):
    """Some targets of a run failed, or were not observed (`not_observed`: why); the others finished.
    Carries one line per target, and counts each kind apart ("1 target(s) failed, 4 not observed")."""

    code = "targets-failed"

    def __init__(self, failures: dict[str, GpuvmError | Exception], results: dict | None = None,
                 not_observed: dict[str, str] | None = None):
        self.failures = failures
        self.not_observed = not_observed or {}
        self.results = results if results is not None else {}  # the targets that succeeded
        entries = [f"{target}: {error}" for target, error in failures.items()]
        entries += [f"{target} (not observed): {why}" for target, why in self.not_observed.items()]
        lines = entries[:MAX_LINES]
        if len(entries) > MAX_LINES:
            lines.append(f"… and {len(entries) - MAX_LINES:,} more (the journal has every one)")
        if self.not_observed:
            self.code = "targets-failed" if failures else "not-observed"
        super().__init__(counted(failures, len(self.not_observed)) + ":\n  " + "\n  ".join(lines))

    @property
    def exit_code(self) -> int:  # type: ignore[override]
        codes = {getattr(e, "exit_code", 1) for e in self.failures.values()}
        codes |= {ConnectError.exit_code} if self.not_observed else set()
        return codes.pop() if len(codes) == 1 else 1
