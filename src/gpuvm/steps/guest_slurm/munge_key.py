"""The cluster's munge key: 1024 random bytes, made once, kept in the state directory
(`<state>/slurm/munge.key`, 0600) and copied to every Slurm guest (/etc/munge/munge.key, 0400,
owned by munge). A secret: a plan, the journal and errors show only `digest_shown`."""

from __future__ import annotations

import hashlib
import os
import secrets
import threading
from dataclasses import dataclass
from pathlib import Path

from gpuvm.errors import InputError
from gpuvm.files import KEY_BYTES, read_capped

SIZE = 1024  # bytes, as mungekey makes by default
_lock = threading.Lock()


@dataclass(frozen=True)
class MungeKey:
    path: Path
    sha256: str  # compared with the guests' copy

    def data(self) -> bytes:
        return read_capped(self.path, KEY_BYTES, "munge key")


def digest_shown(sha256: str) -> str:
    """What a plan shows of a munge key: enough of its digest to tell two apart, nothing of the key."""
    return f"sha256:{sha256[:12]}"


def key_path(state_dir: Path) -> Path:
    return Path(state_dir) / "slurm" / "munge.key"


def load_munge_key(state_dir: Path) -> MungeKey | None:
    """The existing key, or None when none was made yet (reading never makes one)."""
    path = key_path(state_dir)
    if not path.exists():
        return None
    data = read_capped(path, KEY_BYTES, "munge key")
    if len(data) < 32:
        raise InputError(f"{path}: {len(data)} bytes is too short for a munge key; remove it to make a new one")
    return MungeKey(path, hashlib.sha256(data).hexdigest())


def munge_key(state_dir: Path) -> MungeKey:
    """The key, made on first use; one key whatever the number of parallel callers (threads, processes)."""
    with _lock:
        path = key_path(state_dir)
        if not path.exists():
            path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}")
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            try:
                os.write(fd, secrets.token_bytes(SIZE))
                os.fsync(fd)
            finally:
                os.close(fd)
            try:
                os.link(tmp, path)  # whole or not at all; a process that made one first keeps its own
            except FileExistsError:
                pass
            finally:
                tmp.unlink(missing_ok=True)
        made = load_munge_key(state_dir)
        assert made is not None
        return made
