"""The journal: every attempted change appended as one JSON line in the state directory.

It records what was done (started / done / failed, with the error), so that after a failure or a
killed run the user can see exactly how far gpuvm got. Re-running `apply` observes the world again
and finishes the rest; the journal is the record, not the source of truth.
"""

from __future__ import annotations

import json
import os
import threading
import uuid
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from gpuvm.errors import InputError
from gpuvm.plan import Change
from gpuvm.secrets import scrub


JOURNAL = "journal.jsonl"


def state_path(explicit: Path | None = None) -> Path:
    """Where the state directory is: --state-dir, $GPUVM_STATE_DIR, or ./.gpuvm."""
    return explicit or Path(os.environ.get("GPUVM_STATE_DIR", ".gpuvm"))


def state_dir(explicit: Path | None = None) -> Path:
    """The state directory, created (mode 0700) if need be."""
    path = state_path(explicit)
    try:
        path.mkdir(parents=True, exist_ok=True)
        path.chmod(0o700)
    except OSError as e:
        raise InputError(f"state directory {path}: cannot create or use it ({e.strerror}); "
                         "give another with --state-dir or GPUVM_STATE_DIR") from None
    return path


def past_entries(explicit: Path | None = None) -> list[dict[str, Any]]:
    """Every entry of the state directory's journal, oldest first; none when there is no journal
    yet (nothing is created). A line a killed run left half-written is skipped."""
    return _read(state_path(explicit) / JOURNAL)


def _read(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        return []
    rows = []
    for line in path.read_text(errors="replace").splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict):
            rows.append(row)
    return rows


class Journal:
    def __init__(self, directory: Path):
        self.path = directory / JOURNAL
        self.run_id = uuid.uuid4().hex[:12]
        self._lock = threading.Lock()

    def record(self, status: str, change: Change | None = None, /, **extra: Any) -> None:
        self.record_all(status, [change] if change is not None else [None], **extra)

    def record_all(self, status: str, changes: list[Change | None], /, **extra: Any) -> None:
        """One entry per change, written at once and on disk when this returns. Many targets record at
        the same time: the lines go in under the lock, the flush to disk outside it, so that threads
        share flushes instead of queueing for one each (about 4 ms apiece on a small VM's disk)."""
        time = datetime.now(timezone.utc).isoformat(timespec="milliseconds")
        lines = []
        for change in changes:
            entry: dict[str, Any] = {"time": time, "run": self.run_id, "status": status}
            if change is not None:
                entry.update(change.to_dict())
            entry.update(extra)
            lines.append(json.dumps(scrub(entry), default=str, sort_keys=False) + "\n")  # values first, then JSON
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            with self._lock:
                os.write(fd, "".join(lines).encode())
            os.fsync(fd)  # a killed run still leaves what it did on disk
        finally:
            os.close(fd)
