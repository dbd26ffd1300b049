"""The cluster's SSH key pair for the mesh between guests: one ed25519 key, made once, kept in the state.

`<state>/mesh/id_ed25519` (0600, OpenSSH format, comment `gpuvm-mesh`) and its `.pub`. The
private key is read only to be copied to the guests; it never appears in a plan, a journal or
an error. Everything shown about it is the public fingerprint (`SHA256:…`, as `ssh-keygen -l`).
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
from dataclasses import dataclass
from pathlib import Path

from gpuvm.errors import InputError
from gpuvm.files import KEY_BYTES, read_capped
from gpuvm.ssh_keys import line_fingerprint

log = logging.getLogger(__name__)

COMMENT = "gpuvm-mesh"
_lock = threading.Lock()


@dataclass(frozen=True)
class MeshKey:
    """The key pair on disk. Holds no key material itself: `private_bytes()` reads it when needed."""

    private_path: Path
    public_line: str  # "ssh-ed25519 AAAA… gpuvm-mesh"
    private_digest: str  # sha256 of the private key file: compared with the guests' copy, never shown

    @property
    def blob(self) -> str:
        """The base64 key blob, the part of the public line that identifies the key."""
        return self.public_line.split()[1]

    @property
    def fingerprint(self) -> str:
        return line_fingerprint(self.public_line)

    def private_bytes(self) -> bytes:
        return read_capped(self.private_path, KEY_BYTES, "mesh key")


def key_path(state_dir: Path) -> Path:
    return Path(state_dir) / "mesh" / "id_ed25519"


def load_cluster_key(state_dir: Path) -> MeshKey | None:
    """The existing key pair, or None when none was made yet (reading never creates one)."""
    path = key_path(state_dir)
    if not path.exists():
        return None
    from cryptography.hazmat.primitives import serialization

    data = read_capped(path, KEY_BYTES, "mesh key")
    try:
        private = serialization.load_ssh_private_key(data, password=None)
    except (ValueError, TypeError) as e:
        raise InputError(f"{path}: not an unencrypted OpenSSH private key ({e}); remove it to make a new mesh key") from None
    if path.stat().st_mode & 0o077:
        log.warning("%s was readable by others; tightened to 0600", path)
        path.chmod(0o600)
    public = private.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    line = f"{public.decode()} {COMMENT}"
    return MeshKey(path, line, hashlib.sha256(data).hexdigest())


def cluster_key(state_dir: Path) -> MeshKey:
    """The key pair, made on first use. Safe against parallel callers (threads and processes)."""
    with _lock:
        existing = load_cluster_key(state_dir)
        if existing is not None:
            return existing
        _generate(key_path(state_dir))
        made = load_cluster_key(state_dir)
        assert made is not None
        log.info("made the SSH mesh key %s (%s)", made.private_path, made.fingerprint)
        return made


def _generate(path: Path) -> None:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    path.parent.chmod(0o700)
    key = Ed25519PrivateKey.generate()
    private = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
                                serialization.NoEncryption())
    public = key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    # write beside, then link into place: the key appears whole or not at all, and a concurrent
    # process that made its own first keeps its own (os.link refuses to replace)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.write(fd, private)
        os.fsync(fd)
    finally:
        os.close(fd)
    try:
        os.link(tmp, path)
        pub = path.with_suffix(".pub")
        pub.write_text(f"{public.decode()} {COMMENT}\n")
        pub.chmod(0o644)
    except FileExistsError:
        pass
    finally:
        tmp.unlink(missing_ok=True)
