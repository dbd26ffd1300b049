"""Reading a file the user named (a runbook, a key, a snapshot, an upload, results): one helper.
Writing one (a snapshot, a starter runbook, launch files, results, a report): another.

Every such file must be a regular file of bounded size: a path to `/dev/zero` would be read until
memory runs out, a FIFO would block `open` for ever, a directory or a device is never what the
runbook means. `read_capped` opens without blocking, checks the kind on the open descriptor (no
race with a swapped path) and reads at most one byte past the cap. Its errors name the path and
what it was read as, never the file's content; callers add the runbook line and field.

A write that fails (no such directory, no permission, a full disk) is one error naming the path and
the reason (`writing`), and a command checks the path it will write before its work (`check_writable`):
an inventory of thousands of hosts is not read only to fail at its last step.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager
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
    """A file that cannot be read or written as what it should be (missing, not regular, too large,
    not writable)."""


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


@contextmanager
def writing(path: Path | str, what: str = "file") -> Iterator[None]:
    """Writes under it that fail raise one FileRefused naming the path (the one the OS names, where it
    names one: a directory made on the way) and the reason; never an OSError's traceback."""
    try:
        yield
    except OSError as e:
        failed = e.filename if isinstance(e.filename, str) else path
        raise FileRefused(f"{failed}: cannot write {what}: {e.strerror or e}") from None


def write_text(path: Path | str, text: str, what: str = "file") -> Path:
    """Write `text` (UTF-8) to `path`, whose directory must exist; errors as `writing`'s."""
    with writing(path, what):
        Path(path).write_text(text, encoding="utf-8")
    return Path(path)


def check_writable(path: Path | str, what: str = "file", directory: bool = False) -> None:
    """What writing `path` would refuse, found without writing: a file in an existing directory, or
    (`directory`) a directory made with its parents. Root passes the permission checks, as its
    writes do."""
    path = Path(path)

    def refuse(code: int, where: Path = path) -> None:
        raise FileRefused(f"{where}: cannot write {what}: {os.strerror(code)}")

    if path.is_dir() != directory and path.exists():
        refuse(errno.ENOTDIR if directory else errno.EISDIR)
    if path.exists():
        if not os.access(path, os.W_OK | (os.X_OK if directory else 0)):
            refuse(errno.EACCES)
        return
    parent = path.parent
    while directory and not parent.exists() and parent != parent.parent:
        parent = parent.parent  # made on the way
    if not parent.is_dir():
        refuse(errno.ENOTDIR if parent.exists() else errno.ENOENT, parent if directory else path)
    if not os.access(parent, os.W_OK | os.X_OK):
        refuse(errno.EACCES, parent)
