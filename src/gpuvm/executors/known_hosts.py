"""known_hosts files as OpenSSH reads them, line by line: one bad line never breaks every host.

Plain and hashed (`|1|...`) entries are trusted; `@revoked` keys are refused wherever they are
offered; `@cert-authority` lines are skipped (gpuvm does not check host certificates) and so are
lines that are not UTF-8 or not a key, each with a warning naming the file and line.
"""

from __future__ import annotations

import binascii
import logging
from dataclasses import dataclass, field
from pathlib import Path

import paramiko
from paramiko.hostkeys import HostKeyEntry, InvalidHostKey

log = logging.getLogger(__name__)


@dataclass
class KnownHosts:
    entries: list[HostKeyEntry] = field(default_factory=list)
    revoked: list[paramiko.PKey] = field(default_factory=list)

    def add_to(self, keys: paramiko.HostKeys) -> None:
        for entry in self.entries:
            for name in entry.hostnames:
                keys.add(name, entry.key.get_name(), entry.key)

    def is_revoked(self, key: paramiko.PKey) -> bool:
        return any(r.get_name() == key.get_name() and r.asbytes() == key.asbytes() for r in self.revoked)


def read_known_hosts(paths: list[Path]) -> KnownHosts:
    known = KnownHosts()
    for path in paths:
        try:
            raw = path.read_bytes()
        except OSError as e:
            log.warning("%s: cannot read known hosts: %s", path, e.strerror)
            continue
        for number, data in enumerate(raw.splitlines(), 1):
            _read_line(known, path, number, data)
    return known


def _read_line(known: KnownHosts, path: Path, number: int, data: bytes) -> None:
    try:
        line = data.decode("utf-8").strip()
    except UnicodeDecodeError:
        log.warning("%s:%d: not UTF-8: line skipped", path, number)
        return
    if not line or line.startswith("#"):
        return
    marker = None
    if line.startswith("@"):
        marker, _, line = line.partition(" ")
    try:
        entry = HostKeyEntry.from_line(line.strip(), lineno=number)
    except (paramiko.SSHException, InvalidHostKey, binascii.Error, ValueError, TypeError, IndexError):
        entry = None
    if entry is None or entry.key is None:
        log.warning("%s:%d: not a host key line: skipped", path, number)
    elif marker == "@revoked":
        known.revoked.append(entry.key)
    elif marker == "@cert-authority":
        log.info("%s:%d: @cert-authority skipped: gpuvm checks host keys, not host certificates", path, number)
    elif marker:
        log.warning("%s:%d: unknown marker %s: line skipped", path, number, marker)
    else:
        known.entries.append(entry)
