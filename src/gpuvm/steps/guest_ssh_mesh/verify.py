"""Proof that the mesh works: every guest logs in to a peer, and is logged in to, with the mesh key alone.

A ring first (N logins, not N·(N-1): 4,032 SSH handshakes at 64 guests, and even 4,032 bare
connections to the peers' sshd, cost a 2-core test bed minutes): each guest logs in to the next
one (as the mesh user, `BatchMode`, strict host keys), so every guest's key, config and
known_hosts are used and every guest's sshd and authorized_keys accept them. The files are the
same on every guest (the plan compares each one's with the desired text), so what holds for one
pair holds for all, except reachability between guests the ring does not pair (a filtered VLAN
between two ESXi hosts), which the campaign's own launch then meets. When anything in the ring
fails, every ordered pair is tried, so the error names exactly the pairs that cannot log in.
One command per guest, every guest at once. A failed pair is charged to the guest that ran ssh.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from gpuvm.errors import RemoteCommandError, TargetFailures
from gpuvm.executors.group import run_parallel
from gpuvm.steps.guest_ssh_mesh.name import NAME
from gpuvm.steps.guest_ssh_mesh.files import IDENTITY, Peer
from gpuvm.steps.guest_ssh_mesh.guests import as_mesh_user, mesh_guests, mesh_user, script_error
from gpuvm.remote import Cluster, RemoteTarget
from gpuvm.secrets import redact

VERIFY_CONNECT_TIMEOUT = 5
VERIFY_BATCH = 16  # logins a guest starts at once when checking its peers


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


def _detail(target: RemoteTarget, error: Exception) -> str:
    text = str(error)
    return text[len(target.name) + 2:] if text.startswith(target.name + ": ") else text


def verify_mesh(cluster: Cluster, parallel: int = 8, among: list[str] | None = None) -> list[FailedPair]:
    """The mesh of the guests (`among`, default all) works: the ring, then, when anything in it
    fails, every ordered pair with a login (see the module docstring). The pairs that fail."""
    failed = _check_pairs(cluster, parallel, among, ring=True)
    return _check_pairs(cluster, parallel, among, ring=False) if failed else []


def _check_pairs(cluster: Cluster, parallel: int, among: list[str] | None, ring: bool) -> list[FailedPair]:
    """One command per guest, every guest at once; within a guest, all its peers at once. `ring`:
    a login to the next guest only; else a login to every peer."""
    guests = {n: t for n, t in mesh_guests(cluster).items() if among is None or n in among}
    peers = [Peer(n, t.access.address, t.access.port, "", "") for n, t in guests.items()]
    following = {p.name: peers[(i + 1) % len(peers)] for i, p in enumerate(peers)}

    def check(target: RemoteTarget) -> list[FailedPair]:
        others = [p for p in peers if p.name != target.name]
        if not others:
            return []
        user = mesh_user(target, cluster)
        logins = [following[target.name]] if ring else others
        script = _verify_script(user, logins)
        timeout = max(cluster.command_timeout, VERIFY_CONNECT_TIMEOUT * 4)
        result = target.executor.run_script(as_mesh_user(target, user, script), timeout=timeout, check=False)
        if result.exit_code != 0:
            raise script_error(target, "the mesh check", result)
        return parse_verify(target.name, logins, result.stdout)

    try:
        results = run_parallel(guests, check, max(1, parallel))
    except TargetFailures as e:
        results = dict(e.results)
        for name, error in e.failures.items():
            results[name] = [FailedPair(name, p.name, f"could not run the check: {_detail(guests[name], error)}")
                             for p in peers if p.name != name and (not ring or p == following[name])]
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
