"""The journal: every attempted change appended as one JSON line in the state directory.

It records what was done (started / done / failed, with the error), so that after a failure or a
killed run the user can see exactly how far gpuvm got. It is an audit log, never read to plan:
what gpuvm owns lives on the vCenter objects (`vsphere/owned.py`, `vsphere/intent.py`), so plan,
apply and verify cost the same over a journal of a million lines as over none.

The log rotates (journal.jsonl → journal.jsonl.1 … .KEEP past MAX_BYTES). Runs may share a state
directory: each write (and rotation) holds an flock on journal.lock, so they rotate one at a time.
A line a killed run left half-written never hides the next record (each write starts on a fresh
line) and readers skip it with a warning. The state directory holds regular files only: a symlink
is refused, never followed, and a FIFO never blocks. A write that fails (a full disk) stops the run with one line.
"""

from __future__ import annotations

import errno
import fcntl
import json
import logging
import os
import stat
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from gpuvm.errors import GpuvmError, InputError
from gpuvm.plan import Change
from gpuvm.secrets import scrub

JOURNAL = "journal.jsonl"
MAX_BYTES = 64 * 1024 * 1024  # a journal past this size rotates (a 4,096-VM apply writes ~29 MB)
KEEP = 3  # rotated journals kept: journal.jsonl.1 (newest) … .3
LOCK = "journal.lock"  # flock'd while a run writes (or rotates) the journal: runs may share a state directory
MAX_LINE = 1024 * 1024  # readers skip longer lines (gpuvm writes none near this)

log = logging.getLogger(__name__)


class JournalError(GpuvmError):
    """The journal could not be written (a full disk, a quota, an I/O error): the run stops before
    its next act, its locks released; what it recorded on the objects stays for the next run."""

    exit_code = 1
    code = "journal"


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


def open_regular(path: Path, flags: int) -> int | None:
    """A descriptor on `path`, which must be a regular file: a symlink is refused, not followed
    (O_NOFOLLOW), a FIFO or device never blocks (O_NONBLOCK) and is refused. None: no such file
    (and `flags` does not create it)."""
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o600)
    except FileNotFoundError:
        if flags & os.O_CREAT:
            raise
        return None
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.ENXIO, errno.EISDIR):  # a symlink; a FIFO with no reader; a folder
            raise InputError(_not_regular(path)) from None
        raise
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise InputError(_not_regular(path))
    return fd


def _not_regular(path: Path) -> str:
    kind = "a symbolic link" if path.is_symlink() else "not a regular file"
    return (f"{path}: {kind}; the state directory holds regular files only (remove it, or give another "
            "directory with --state-dir or GPUVM_STATE_DIR)")


def past_entries(explicit: Path | None = None) -> list[dict[str, Any]]:
    """Every entry of the state directory's journal (the current file, not the rotated ones), oldest
    first; none when there is no journal yet (nothing is created). For history and tests: gpuvm
    never reads it to plan."""
    return list(read_entries(state_path(explicit) / JOURNAL))


def read_entries(path: Path, max_line: int = MAX_LINE) -> Iterator[dict[str, Any]]:
    """The entries of one journal file, read line by line (bounded memory). A line cut short by a
    kill, longer than `max_line`, nested too deep to decode or not an object is skipped with a warning."""
    fd = open_regular(path, os.O_RDONLY)
    if fd is None:
        return
    with os.fdopen(fd, "rb") as file:
        number = 0
        while line := file.readline(max_line + 1):
            number += 1
            if len(line) > max_line and not line.endswith(b"\n"):
                while (rest := file.readline(max_line + 1)) and not rest.endswith(b"\n"):
                    pass  # the rest of the long line
                log.warning("%s:%d: skipped a line longer than %d bytes", path, number, max_line)
                continue
            try:
                row = json.loads(line)
            except (ValueError, RecursionError):  # cut short by a kill; nested past the decoder's depth
                log.warning("%s:%d: skipped a line that is not a whole JSON record", path, number)
                continue
            if isinstance(row, dict):
                yield row
            else:
                log.warning("%s:%d: skipped a line that is not a journal entry", path, number)


def write_all(fd: int, data: bytes) -> None:
    """os.write until every byte is written (it may write fewer than asked)."""
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        if written <= 0:
            raise OSError(errno.EIO, "the write made no progress")
        view = view[written:]


class Journal:
    def __init__(self, directory: Path, max_bytes: int = MAX_BYTES, keep: int = KEEP):
        self.path = directory / JOURNAL
        self.run_id = uuid.uuid4().hex[:12]
        self.max_bytes, self.keep = max_bytes, keep
        self._lock = threading.Lock()
        if (fd := open_regular(self.path, os.O_RDONLY)) is not None:  # refused before anything is touched
            os.close(fd)

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
        data = "".join(lines).encode()
        fd = None
        try:
            with self._lock, self._held():
                fd = self._open_for_append()
                if _ends_torn(fd):  # a killed run's half line: ours starts on a line of its own
                    data = b"\n" + data
                write_all(fd, data)
            os.fsync(fd)  # a killed run still leaves what it did on disk
        except OSError as e:
            raise JournalError(f"journal {self.path}: cannot write ({e.strerror or e}): the run stops here; "
                               "its locks are released and what it began is recorded on the objects "
                               "for the next run") from None
        finally:
            if fd is not None:
                os.close(fd)

    @contextmanager
    def _held(self) -> Iterator[None]:
        """The state directory's journal to this run alone (an flock on journal.lock): runs sharing it
        rotate it one at a time, and a line another run is writing is never taken for a torn one."""
        lock = _open_created(self.path.with_name(LOCK))
        try:
            fcntl.flock(lock, fcntl.LOCK_EX)
            yield
        finally:
            os.close(lock)  # the flock goes with it

    def _open_for_append(self) -> int:
        fd = _open_created(self.path, os.O_RDWR | os.O_APPEND)
        if os.fstat(fd).st_size < self.max_bytes:
            return fd
        os.close(fd)
        self._rotate()
        return _open_created(self.path, os.O_RDWR | os.O_APPEND)

    def _rotate(self) -> None:
        """journal.jsonl → .1 → .2 … → .keep (the oldest dropped)."""
        for n in range(self.keep - 1, 0, -1):
            older = self.path.with_name(f"{JOURNAL}.{n}")
            if older.exists():
                os.replace(older, self.path.with_name(f"{JOURNAL}.{n + 1}"))
        os.replace(self.path, self.path.with_name(f"{JOURNAL}.1"))


def _open_created(path: Path, flags: int = os.O_RDONLY) -> int:
    """`open_regular`, the file created if need be."""
    fd = open_regular(path, flags | os.O_CREAT)
    assert fd is not None
    return fd


def _ends_torn(fd: int) -> bool:
    """Whether the file's last byte is not a newline (a line a killed run left half-written)."""
    size = os.fstat(fd).st_size
    return size > 0 and os.pread(fd, 1, size - 1) != b"\n"
