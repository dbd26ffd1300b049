"""Reading a file the user named (a runbook, a key, a snapshot, an upload, results): one helper.

Every such file must be a regular file of bounded size: a path to `/dev/zero` would be read until
memory runs out, a FIFO would block `open` for ever, a directory or a device is never what the
runbook means. `read_capped` opens without blocking, checks the kind on the open descriptor (no
race with a swapped path) and reads at most one byte past the cap. Its errors name the path and
what it was read as, never the file's content; callers add the runbook line and field.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from gpuvm.errors import InputError

KIB, MIB = 1 << 10, 1 << 20
KEY_BYTES = 64 * KIB  # an SSH key (RSA 16384 is under 13 KiB)
RUNBOOK_BYTES = 16 * MIB  # a runbook of 4,096 VMs is well under 1 MB
SNAPSHOT_BYTES = 512 * MIB  # an inventory of thousands of hosts
RESULTS_BYTES = RUNBOOK_BYTES  # a campaign's results.json (or a baseline): held to the runbook's limits
UPLOAD_BYTES = 1024 * MIB  # a benchmark's upload: held in memory while it is copied

_KINDS = {stat.S_IFIFO: "a FIFO", stat.S_IFCHR: "a character device", stat.S_IFBLK: "a block device",
          stat.S_IFSOCK: "a socket", stat.S_IFDIR: "a directory"}


class FileRefused(InputError):
    """A file that cannot be read as what it should be (missing, not regular, too large)."""


def size_text(limit: int) -> str:
    return f"{limit // MIB} MB" if limit >= MIB else f"{limit // KIB} KB"


def _refuse_kind(path: Path | str, mode: int, what: str) -> None:
    if stat.S_ISDIR(mode):
        raise FileRefused(f"{path}: cannot read {what}: Is a directory")
    if not stat.S_ISREG(mode):
        kind = _KINDS.get(stat.S_IFMT(mode), "not a file")
        raise FileRefused(f"{path}: not a regular file ({kind}; the {what} must be a file)")


def _too_large(path: Path | str, limit: int, what: str) -> FileRefused:
    return FileRefused(f"{path}: larger than {size_text(limit)} (the most gpuvm reads as {what})")


def check_capped(path: Path | str, limit: int, what: str = "file") -> None:
    """What `read_capped` would refuse, found without reading (for checks before anything runs)."""
    try:
        info = os.stat(path)
    except OSError as e:
        raise FileRefused(f"{path}: cannot read {what}: {e.strerror}") from None
    _refuse_kind(path, info.st_mode, what)
    if info.st_size > limit:
        raise _too_large(path, limit, what)


def read_capped(path: Path | str, limit: int, what: str = "file") -> bytes:
    """The bytes of `path`, a regular file (symlinks followed) of at most `limit` bytes."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)  # a FIFO must not block the open
    except OSError as e:
        raise FileRefused(f"{path}: cannot read {what}: {e.strerror}") from None
    try:
        _refuse_kind(path, os.fstat(fd).st_mode, what)
        chunks, size = [], 0
        while size <= limit:
            chunk = os.read(fd, min(limit + 1 - size, 4 * MIB))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    except OSError as e:
        raise FileRefused(f"{path}: cannot read {what}: {e.strerror}") from None
    finally:
        os.close(fd)
    if size > limit:
        raise _too_large(path, limit, what)
    return b"".join(chunks)


def read_text_capped(path: Path | str, limit: int, what: str = "file") -> str:
    """`read_capped` as UTF-8 text; undecodable bytes are an error naming the path (not the bytes)."""
    raw = read_capped(path, limit, what)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw[:e.start].count(b"\n") + 1
        raise FileRefused(f"{path}:{line}: cannot read {what}: not UTF-8 text") from None
