"""What the mesh files in a guest's ~/.ssh hold, and how ours merge with what is there (pure).

- `id_ed25519_gpuvm` (0600) and `.pub`: the cluster key; its public line is appended to
  `authorized_keys` (other keys kept);
- `known_hosts`: every guest's host key for `addr` (or `[addr]:port`) and, when `container_port`
  is set, `[addr]:container_port` with the same key (containers run with `--network=host` on the
  VM's host keys);
- `config`: a block between `# BEGIN gpuvm` / `# END gpuvm` with `Host <addresses>` using that key,
  `StrictHostKeyChecking yes`, `BatchMode yes`. It sets no `Port`: `Host` matches any port, so
  the same block serves the VMs' sshd and the containers' (`ssh -p <container_port> addr`, what
  `mpirun -mca plm_rsh_args "-p 12345"` sends). The block goes first in the file (ssh takes
  the first value it finds) and ends with `Host *`, so the user's own lines keep their meaning.

Everything must be owned by the mesh user and not group/world writable: ssh refuses otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gpuvm.ssh_keys import MESH_IDENTITY, known_hosts_name
from gpuvm.steps.guest_ssh_mesh.key import MeshKey

IDENTITY = MESH_IDENTITY
BEGIN, END = "# BEGIN gpuvm", "# END gpuvm"


@dataclass(frozen=True)
class MeshFiles:
    """A guest's ~/.ssh as the mesh cares about it. `stats`: name → (owner, mode); "." is the dir."""

    user: str
    home: str
    stats: dict[str, tuple[str, int]] = field(default_factory=dict)
    key_digest: str | None = None  # sha256 of id_ed25519_gpuvm (the private key itself is never read back)
    texts: dict[str, str] = field(default_factory=dict)  # .pub, authorized_keys, known_hosts, config


@dataclass(frozen=True)
class Peer:
    name: str
    address: str
    port: int
    key_type: str
    key: str  # base64 host key blob


def mode_problem(files: MeshFiles, name: str, private: bool = False) -> str | None:
    """Why ssh would refuse this file (owner, or writable/readable by others), or None."""
    owner, mode = files.stats[name]
    bad = 0o077 if private or name == "." else 0o022
    problems = ([f"owner {owner}"] if owner != files.user else []) + ([f"mode {mode:o}"] if mode & bad else [])
    return ", ".join(problems) or None


# ------------------------------------------------------------------------------ known_hosts



def known_host_lines(peers: tuple[Peer, ...], container_port: int | None) -> list[str]:
    lines = []
    for peer in peers:
        names = [known_hosts_name(peer.address, peer.port)]
        if container_port is not None and container_port != peer.port:
            names.append(known_hosts_name(peer.address, container_port))
        lines += [f"{name} {peer.key_type} {peer.key}" for name in names]
    return lines


def merge_known_hosts(existing: str | None, lines: list[str]) -> tuple[str, int, int]:
    """known_hosts with `lines` in it: (text, lines already present, stale lines dropped).

    A stale line names one of our hosts exactly, with the same key type but another key (the
    guest was reinstalled); it is dropped. Every other line is kept as it is.
    """
    wanted = {(line.split()[0], line.split()[1]): line.split()[2] for line in lines}
    kept, present, stale = [], set(), 0
    for raw in (existing or "").splitlines():
        fields = raw.split()
        if len(fields) >= 3 and not raw.startswith(("#", "@", "|")):
            names, key_type, key = fields[0].split(","), fields[1], fields[2]
            ours = [n for n in names if (n, key_type) in wanted]
            if ours and all(wanted[(n, key_type)] != key for n in ours):
                stale += 1
                continue
            present.update((n, key_type) for n in ours if wanted[(n, key_type)] == key)
        kept.append(raw)
    missing = [line for line in lines if (line.split()[0], line.split()[1]) not in present]
    text = "".join(line + "\n" for line in kept + missing)
    return text, len(lines) - len(missing), stale


# ----------------------------------------------------------------------------------- config


def config_block(peers: tuple[Peer, ...]) -> str:
    addresses = " ".join(dict.fromkeys(p.address for p in peers))
    return (f"{BEGIN}: the SSH mesh between the cluster's guests (managed by gpuvm; edits here are replaced)\n"
            f"Host {addresses}\n"
            f"    IdentityFile ~/.ssh/{IDENTITY}\n"
            "    IdentitiesOnly yes\n"
            "    StrictHostKeyChecking yes\n"
            "    BatchMode yes\n"
            "Host *\n"
            f"{END}\n")


def split_config(text: str | None) -> tuple[str, str | None, str]:
    """(before, the gpuvm block or None, after) of an ssh config."""
    lines = (text or "").splitlines(keepends=True)
    start = next((i for i, line in enumerate(lines) if line.startswith(BEGIN)), None)
    if start is None:
        return "".join(lines), None, ""
    end = next((i for i in range(start, len(lines)) if lines[i].strip() == END), len(lines) - 1)
    return "".join(lines[:start]), "".join(lines[start:end + 1]), "".join(lines[end + 1:])


def merge_config(text: str | None, block: str) -> str:
    """The config with `block` in place of the old gpuvm block, or first when there was none."""
    before, old, after = split_config(text)
    if old is None:
        rest = before if not before or before.endswith("\n") else before + "\n"
        return block + ("\n" + rest if rest else "")
    return before + block + after


# -------------------------------------------------------------------------- authorized_keys


def has_key(text: str, public_line: str) -> bool:
    blob = public_line.split()[1]
    return any(blob in line.split() for line in text.splitlines() if not line.lstrip().startswith("#"))


def authorize(text: str | None, public_line: str) -> str:
    """authorized_keys with the key in it (appended once; other keys kept)."""
    text = text or ""
    if has_key(text, public_line):
        return text
    return text + ("" if not text or text.endswith("\n") else "\n") + public_line + "\n"


# ------------------------------------------------------------------------ the files to write


def wanted_files(fields: set[str], files: MeshFiles, key: MeshKey, peers: tuple[Peer, ...],
                 container_port: int | None) -> dict[str, tuple[bytes, int]]:
    """The files to write for the changed fields: name → (content, mode), merged with what is there."""
    out: dict[str, tuple[bytes, int]] = {}
    if "identity" in fields:
        out[IDENTITY] = (key.private_bytes(), 0o600)
        out[IDENTITY + ".pub"] = ((key.public_line + "\n").encode(), 0o644)
    if "authorized_keys" in fields:
        out["authorized_keys"] = (authorize(files.texts.get("authorized_keys"), key.public_line).encode(), 0o600)
    if "known_hosts" in fields:
        text, _, _ = merge_known_hosts(files.texts.get("known_hosts"), known_host_lines(peers, container_port))
        out["known_hosts"] = (text.encode(), 0o644)
    if "config" in fields:
        out["config"] = (merge_config(files.texts.get("config"), config_block(peers)).encode(), 0o600)
    return out
