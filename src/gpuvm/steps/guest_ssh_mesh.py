"""guest.ssh_mesh: keyless SSH between every pair of guests, for mpirun and horovodrun.

One ed25519 key for the cluster (`gpuvm.keys`, kept in the state directory) goes to every guest
for the mesh user (`guests.ssh_mesh.user`, default the guest's SSH user), in `~/.ssh`:

- `id_ed25519_gpuvm` (0600) and `.pub`; the public key appended to `authorized_keys` (other keys kept);
- `known_hosts`: every guest's host key, taken from the connection gpuvm itself verified
  (`host_key_line()`, never ssh-keyscan), for `addr` (or `[addr]:port`) and, when
  `container_port` is set, `[addr]:container_port` with the same key (containers run with
  `--network=host` on the VM's host keys);
- `config`: a block between `# BEGIN gpuvm` / `# END gpuvm` with `Host <addresses>` using that key,
  `StrictHostKeyChecking yes`, `BatchMode yes`. It sets no `Port`: `Host` matches any port, so
  the same block serves the VMs' sshd and the containers' (`ssh -p <container_port> addr`, what
  `mpirun -mca plm_rsh_args "-p 12345"` sends). The block goes first in the file (ssh takes
  the first value it finds) and ends with `Host *`, so the user's own lines keep their meaning.

Everything is owned by the mesh user and not group/world writable (ssh refuses otherwise);
when the mesh user is not the login user, files are read and written with sudo. Each guest is
read with one command and written with one (a tar on stdin, moved into place file by file), so
the private key travels only on stdin. `verify_mesh` proves every ordered pair logs in: each
guest tries all its peers at once in one command; `apply_all` writes every guest in parallel,
then verifies once.
"""

from __future__ import annotations

import base64
import io
import shlex
import tarfile
from dataclasses import dataclass, field

from gpuvm.errors import ConnectError, GpuvmError, RemoteCommandError, TargetFailures
from gpuvm.executors.group import run_parallel
from gpuvm.keys import MeshKey, cluster_key, fingerprint, load_cluster_key
from gpuvm.plan import Change
from gpuvm.remote import Cluster, RemoteTarget, run
from gpuvm.secrets import redact

NAME = "guest.ssh_mesh"
IDENTITY = "id_ed25519_gpuvm"
BEGIN, END = "# BEGIN gpuvm", "# END gpuvm"
FILES = (".", IDENTITY, IDENTITY + ".pub", "authorized_keys", "known_hosts", "config")
VERIFY_CONNECT_TIMEOUT = 5
VERIFY_BATCH = 16  # logins a guest starts at once when checking its peers

# ------------------------------------------------------------------------------------ facts


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


@dataclass(frozen=True)
class MeshFact:
    files: MeshFiles
    key: MeshKey | None  # None: not made yet (apply makes it)
    peers: tuple[Peer, ...]  # every reachable guest, this one included
    container_port: int | None = None


def _read_script(user: str) -> str:
    names = " ".join(shlex.quote(n) for n in FILES)
    texts = " ".join(shlex.quote(n) for n in FILES[2:])
    return f"""user={shlex.quote(user)}
home=$(getent passwd "$user" | cut -d: -f6)
if [ -z "$home" ]; then echo "user $user not found (getent passwd)" >&2; exit 3; fi
d="$home/.ssh"
echo "@@gpuvm home $home"
for n in {names}; do
  f="$d/$n"; [ "$n" = . ] && f="$d"
  if [ -e "$f" ]; then echo "@@gpuvm stat $n $(stat -c '%U %a' "$f")"; fi
done
if [ -f "$d/{IDENTITY}" ]; then echo "@@gpuvm digest $(sha256sum < "$d/{IDENTITY}" | cut -d' ' -f1)"; fi
for n in {texts}; do
  if [ -f "$d/$n" ]; then echo "@@gpuvm file $n $(base64 < "$d/$n" | tr -d '\\n')"; fi
done
"""


def parse_mesh_files(user: str, output: str) -> MeshFiles:
    """Parse the read script's output (pure)."""
    home, stats, digest, texts = "", {}, None, {}
    for line in output.splitlines():
        if not line.startswith("@@gpuvm "):
            continue
        kind, _, rest = line[len("@@gpuvm "):].partition(" ")
        if kind == "home":
            home = rest
        elif kind == "stat":
            name, owner, mode = rest.split(" ")
            stats[name] = (owner, int(mode, 8))
        elif kind == "digest":
            digest = rest.strip() or None
        elif kind == "file":
            name, _, data = rest.partition(" ")
            texts[name] = base64.b64decode(data).decode(errors="replace")
    return MeshFiles(user, home, stats, digest, texts)


def mesh_user(target: RemoteTarget, cluster: Cluster) -> str:
    mesh = cluster.runbook.guests.ssh_mesh  # type: ignore[union-attr]
    return (mesh.user if mesh and mesh.user else None) or target.access.user


def _as_other_user(target: RemoteTarget, user: str) -> bool:
    return user != target.access.user


def read_files(target: RemoteTarget, cluster: Cluster, user: str) -> MeshFiles:
    result = target.executor.run_script(_read_script(user), sudo=_as_other_user(target, user),
                                        timeout=cluster.command_timeout, check=False)
    if result.exit_code != 0:
        raise _script_error(target, f"reading ~{user}/.ssh", result)
    return parse_mesh_files(user, result.stdout)


def mesh_guests(cluster: Cluster) -> dict[str, RemoteTarget]:
    return {n: t for n, t in cluster.of_role("guest").items() if t.guest is not None}


def peer_host_keys(cluster: Cluster) -> tuple[tuple[Peer, ...], dict[str, Exception]]:
    """Every guest's verified host key (from gpuvm's own connection), and the guests unreachable.

    An unreachable guest fails its own observe; the others plan a mesh over the reachable ones.
    """
    peers, unreachable = [], {}
    for name, target in mesh_guests(cluster).items():
        line = getattr(target.executor, "host_key_line", None)
        if line is None:
            unreachable[name] = ConnectError(f"{name}: {NAME}: the executor cannot tell the host key")
            continue
        try:
            _, key_type, key = line().split()[:3]
        except GpuvmError as e:
            unreachable[name] = e
            continue
        peers.append(Peer(name, target.access.address, target.access.port, key_type, key))
    return tuple(peers), unreachable


def wanted(target: RemoteTarget, cluster: Cluster) -> bool:
    guests = cluster.runbook.guests
    return target.guest is not None and guests is not None and guests.ssh_mesh is not None and guests.ssh_mesh.enabled


def observe(target: RemoteTarget, cluster: Cluster) -> MeshFact:
    files = read_files(target, cluster, mesh_user(target, cluster))
    peers, _ = peer_host_keys(cluster)
    mesh = cluster.runbook.guests.ssh_mesh  # type: ignore[union-attr]
    return MeshFact(files, load_cluster_key(cluster.state_dir), peers, mesh.container_port if mesh else None)


# ---------------------------------------------------------------------- wanted files (pure)


def _host_name(address: str, port: int) -> str:
    return address if port == 22 else f"[{address}]:{port}"


def known_host_lines(peers: tuple[Peer, ...], container_port: int | None) -> list[str]:
    lines = []
    for peer in peers:
        names = [_host_name(peer.address, peer.port)]
        if container_port is not None and container_port != peer.port:
            names.append(_host_name(peer.address, container_port))
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


def authorize(text: str | None, public_line: str) -> str:
    """authorized_keys with the key in it (appended once; other keys kept)."""
    text = text or ""
    if _has_key(text, public_line):
        return text
    return text + ("" if not text or text.endswith("\n") else "\n") + public_line + "\n"


def _has_key(text: str, public_line: str) -> bool:
    blob = public_line.split()[1]
    return any(blob in line.split() for line in text.splitlines() if not line.lstrip().startswith("#"))


# ---------------------------------------------------------------------------------- plan


def _resource(files: MeshFiles, name: str) -> str:
    return f"~{files.user}/.ssh" + ("" if name == "." else f"/{name}")


def _mode_problem(files: MeshFiles, name: str, private: bool = False) -> str | None:
    """Why ssh would refuse this file (owner, or writable/readable by others), or None."""
    owner, mode = files.stats[name]
    bad = 0o077 if private or name == "." else 0o022
    problems = ([f"owner {owner}"] if owner != files.user else []) + ([f"mode {mode:o}"] if mode & bad else [])
    return ", ".join(problems) or None


def plan(target: RemoteTarget, fact: MeshFact, cluster: Cluster) -> list[Change]:
    files, key = fact.files, fact.key
    spec = {"user": files.user, "home": files.home}
    fp = f"mesh key {key.fingerprint}" if key else "new mesh key (made on apply)"
    changes = []

    def change(name: str, field_: str, before: str, after: str) -> None:
        changes.append(Change(NAME, target.name, _resource(files, name), field_, before, after, spec=dict(spec)))

    if "." not in files.stats:
        change(".", "directory", "missing", f"0700, owner {files.user}")
    elif problem := _mode_problem(files, "."):
        change(".", "directory", problem, f"0700, owner {files.user}")

    pub = files.texts.get(IDENTITY + ".pub")
    if IDENTITY not in files.stats:
        change(IDENTITY, "identity", "missing", fp)
    elif key is None or files.key_digest != key.private_digest or (pub or "").split()[:2] != key.public_line.split()[:2]:
        change(IDENTITY, "identity", f"another key {_fingerprint_or(pub)}", fp)
    elif problem := (_mode_problem(files, IDENTITY, private=True)
                     or (IDENTITY + ".pub" in files.stats and _mode_problem(files, IDENTITY + ".pub"))):
        change(IDENTITY, "identity", problem, fp)

    authorized = files.texts.get("authorized_keys")
    if key is None or authorized is None or not _has_key(authorized, key.public_line):
        change("authorized_keys", "authorized_keys", "missing mesh key", f"{fp} authorized")
    elif problem := _mode_problem(files, "authorized_keys"):
        change("authorized_keys", "authorized_keys", problem, f"{fp} authorized")

    lines = known_host_lines(fact.peers, fact.container_port)
    _, present, stale = merge_known_hosts(files.texts.get("known_hosts"), lines)
    if present < len(lines) or stale:
        before = f"{present} of {len(lines)} guest host keys" + (f", {stale} stale" if stale else "")
        change("known_hosts", "known_hosts", before, f"{len(lines)} guest host keys")
    elif problem := _mode_problem(files, "known_hosts"):
        change("known_hosts", "known_hosts", problem, f"{len(lines)} guest host keys")

    _, block, _ = split_config(files.texts.get("config"))
    if block != config_block(fact.peers):
        change("config", "config", "no gpuvm block" if block is None else "gpuvm block differs",
               f"gpuvm block for {len(fact.peers)} guests")
    elif problem := _mode_problem(files, "config"):
        change("config", "config", problem, f"gpuvm block for {len(fact.peers)} guests")
    return changes


def _fingerprint_or(public_line: str | None) -> str:
    try:
        return fingerprint(public_line or "")
    except (IndexError, ValueError):
        return "(unreadable)"


# --------------------------------------------------------------------------------- apply


def _write_script(user: str, home: str, chown: bool) -> str:
    own = f'chown {shlex.quote(user)}: "$f"' if chown else ":"
    return f"""set -e
umask 077
d={shlex.quote(home + "/.ssh")}
mkdir -p "$d"; chmod 700 "$d"
f="$d"; {own}
t=$(mktemp -d "$d/.gpuvm.XXXXXX")
trap 'rm -rf "$t"' EXIT
tar -x -o -p -f - -C "$t"
for f in "$t"/*; do
  [ -e "$f" ] || continue
  {own}
  mv -f "$f" "$d/${{f##*/}}"
done
"""


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


def _tar(files: dict[str, tuple[bytes, int]]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for name, (data, mode) in files.items():
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), mode
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def apply(target: RemoteTarget, changes: list[Change], cluster: Cluster) -> None:
    if not changes:
        return
    user = mesh_user(target, cluster)
    key = cluster_key(cluster.state_dir)
    files = read_files(target, cluster, user)  # again: merge with what is there now, not at plan time
    peers, _ = peer_host_keys(cluster)
    mesh = cluster.runbook.guests.ssh_mesh  # type: ignore[union-attr]
    content = wanted_files({c.field for c in changes}, files, key, peers, mesh.container_port if mesh else None)
    other = _as_other_user(target, user)
    result = target.executor.run_script(_write_script(user, files.home, chown=other), sudo=other,
                                        stdin=_tar(content), timeout=cluster.command_timeout, check=False)
    if result.exit_code != 0:
        raise _script_error(target, f"writing ~{user}/.ssh", result)


def _script_error(target: RemoteTarget, what: str, result) -> RemoteCommandError:
    """The error for a failed script: its last error line, not the script's text."""
    lines = [line.strip() for line in (result.stderr or result.stdout).strip().splitlines() if line.strip()]
    detail = lines[-1] if lines else "no output"
    return RemoteCommandError(redact(f"{target.name}: {NAME}: {what} failed (exit {result.exit_code}): {detail}"))


def _detail(target: RemoteTarget, error: Exception) -> str:
    text = str(error)
    return text[len(target.name) + 2:] if text.startswith(target.name + ": ") else text


# -------------------------------------------------------------------------------- verify


@dataclass(frozen=True)
class FailedPair:
    origin: str  # the guest that ran ssh
    peer: str  # the guest it could not log in to
    reason: str


def _verify_script(user: str, peers: list[Peer]) -> str:
    """All peers at once (VERIFY_BATCH at a time); a login that timed out is tried once more, alone."""
    tries = "\n".join(f"probe {shlex.quote(p.address)} {p.port} & batch" for p in peers)
    return f"""user={shlex.quote(user)}
home=$(getent passwd "$user" | cut -d: -f6)
t=$(mktemp -d)
trap 'rm -rf "$t"' EXIT
probe() {{
  if out=$(ssh -o BatchMode=yes -o StrictHostKeyChecking=yes -o ConnectTimeout={VERIFY_CONNECT_TIMEOUT} \\
        -o IdentitiesOnly=yes -i "$home/.ssh/{IDENTITY}" -p "$2" "$1" true 2>&1 </dev/null); then
    echo "OK $1:$2" > "$t/$1:$2"
  else
    echo "FAIL $1:$2 $(printf '%s' "$out" | tr -d '\\r' | grep -v '^Warning: ' | tail -n 1)" > "$t/$1:$2"
  fi
}}
n=0
batch() {{ n=$((n + 1)); [ $((n % {VERIFY_BATCH})) -ne 0 ] || wait; }}
{tries}
wait
for f in "$t"/*; do
  [ -e "$f" ] || continue
  if grep -q '^FAIL .*timed out' "$f"; then p=${{f##*/}}; probe "${{p%:*}}" "${{p##*:}}"; fi
done
cat "$t"/* 2>/dev/null
"""


def parse_verify(origin: str, peers: list[Peer], output: str) -> list[FailedPair]:
    """Failing pairs from one guest's verify output (pure); a peer with no line failed too."""
    seen: dict[str, tuple[bool, str]] = {}
    for line in output.splitlines():
        status, _, rest = line.partition(" ")
        where, _, reason = rest.partition(" ")
        if status in ("OK", "FAIL"):
            seen[where] = (status == "OK", reason.strip())
    failed = []
    for peer in peers:
        ok, reason = seen.get(f"{peer.address}:{peer.port}", (False, "no answer from the check"))
        if not ok:
            failed.append(FailedPair(origin, peer.name, reason or "ssh failed"))
    return failed


def verify_mesh(cluster: Cluster, parallel: int = 8, among: list[str] | None = None) -> list[FailedPair]:
    """Every ordered pair of guests (`among`, default all) logs in with the mesh key alone.

    One command per guest, every guest at once; within a guest, all its peers are tried at once.
    """
    guests = {n: t for n, t in mesh_guests(cluster).items() if among is None or n in among}
    peers = [Peer(n, t.access.address, t.access.port, "", "") for n, t in guests.items()]

    def check(target: RemoteTarget) -> list[FailedPair]:
        others = [p for p in peers if p.name != target.name]
        if not others:
            return []
        user = mesh_user(target, cluster)
        script = _verify_script(user, others)
        timeout = max(cluster.command_timeout, VERIFY_CONNECT_TIMEOUT * 4)
        if _as_other_user(target, user):
            result = run(target, cluster, ["sudo", "-n", "-u", user, "-H", "sh", "-c", script], sudo=False,
                         timeout=timeout, check=False)
        else:
            result = target.executor.run_script(script, timeout=timeout, check=False)
        if result.exit_code != 0:
            raise _script_error(target, "the mesh check", result)
        return parse_verify(target.name, others, result.stdout)

    try:
        results = run_parallel(guests, check, max(1, parallel))
    except TargetFailures as e:
        results = dict(e.results)
        for name, error in e.failures.items():
            results[name] = [FailedPair(name, p.name, f"could not run the check: {_detail(guests[name], error)}")
                             for p in peers if p.name != name]
    return [pair for name in guests for pair in results.get(name, [])]


def mesh_error(pairs: list[FailedPair], total: int | None = None) -> RemoteCommandError:
    """One error with a small table of the failing pairs."""
    width = max([len("from")] + [len(p.origin) for p in pairs])
    width_to = max([len("to")] + [len(p.peer) for p in pairs])
    rows = [f"  {'from':<{width}}  {'to':<{width_to}}  reason"]
    rows += [f"  {p.origin:<{width}}  {p.peer:<{width_to}}  {p.reason}" for p in pairs]
    of = f" of {total}" if total is not None else ""
    return RemoteCommandError(redact(f"{NAME}: {len(pairs)}{of} guest pair(s) cannot log in with the mesh key:\n"
                                     + "\n".join(rows)))


def check_mesh(cluster: Cluster, parallel: int = 8) -> None:
    """verify_mesh, raising `mesh_error` when any pair fails (for `gpuvm verify`)."""
    pairs = verify_mesh(cluster, parallel)
    if pairs:
        n = len(mesh_guests(cluster))
        raise mesh_error(pairs, n * (n - 1))


def apply_all(cluster: Cluster, changes_by_target: dict[str, list[Change]],
              parallel: int | None = None) -> dict[str, Exception]:
    """Write every guest's files in parallel, then verify the whole mesh once. Failures by target.

    A pair that fails verification is charged to the guest that could not log in (`from`).
    """
    workers = parallel or min(32, max(1, len(mesh_guests(cluster))))
    if any(changes_by_target.values()):
        cluster_key(cluster.state_dir)  # made once, before the guests race for it
    items = {n: (cluster.targets[n], c) for n, c in changes_by_target.items() if c}
    failures: dict[str, Exception] = {}
    try:
        run_parallel(items, lambda item: apply(item[0], item[1], cluster), workers)
    except TargetFailures as e:
        failures.update(e.failures)
    healthy = [n for n in mesh_guests(cluster) if n not in failures]
    by_origin: dict[str, list[FailedPair]] = {}
    for pair in verify_mesh(cluster, workers, among=healthy):
        by_origin.setdefault(pair.origin, []).append(pair)
    for origin, pairs in by_origin.items():
        failures[origin] = mesh_error(pairs)
    return failures


class GuestSshMeshStep:
    name, role = NAME, "guest"
    wanted = staticmethod(wanted)
    observe = staticmethod(observe)
    plan = staticmethod(plan)
    apply = staticmethod(apply)
    apply_all = staticmethod(apply_all)
