"""OpenSSH's names for keys and hosts, as `ssh-keygen -l` and known_hosts write them."""

from __future__ import annotations

import base64
import hashlib

MESH_IDENTITY = "id_ed25519_gpuvm"  # the SSH mesh key's file in ~/.ssh (guests and containers)


def blob_fingerprint(blob: bytes) -> str:
    """OpenSSH's SHA256 fingerprint: `SHA256:` + unpadded base64 of the key blob's digest."""
    return "SHA256:" + base64.b64encode(hashlib.sha256(blob).digest()).decode().rstrip("=")


def line_fingerprint(public_line: str) -> str:
    """The fingerprint of a public key line (`type base64 [comment]`)."""
    return blob_fingerprint(base64.b64decode(public_line.split()[1]))


def known_hosts_name(host: str, port: int) -> str:
    """How known_hosts names a host: plain on port 22, else `[host]:port`."""
    return host if port == 22 else f"[{host}]:{port}"
