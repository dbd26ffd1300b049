"""Proof that the mesh works: every ordered pair of guests logs in with the mesh key alone.

Each guest tries all its peers in one command (as the mesh user, `BatchMode`, strict host keys),
a batch at a time; every guest runs at once. A failed pair is charged to the guest that ran ssh.

N guests make N·(N-1) logins. What the whole check has in flight is bounded (`LOGINS_IN_FLIGHT`,
split between the guests checked at once), not guests × batch: at 64 guests that would be ~1,000
logins at once, which guests sharing cores (the test bed: every guest on one machine) cannot
finish before their connect timeouts. Each login has a hard limit (`LOGIN_LIMIT_S`), so a guest's
check ends within a time derived from its peers (`check_timeout`): a slow login is a pair that
"timed out", never the whole guest's check cut off.
"""

from __future__ import annotations

import math
import shlex
from dataclasses import dataclass
from time import monotonic

from gpuvm.errors import RemoteCommandError
from gpuvm.executors.group import run_group
from gpuvm.steps.guest_ssh_mesh.name import NAME
from gpuvm.steps.guest_ssh_mesh.files import IDENTITY, Peer
from gpuvm.steps.guest_ssh_mesh.guests import as_mesh_user, mesh_guests, mesh_user, script_error
from gpuvm.desired.ssh import DesiredGuest
from gpuvm.remote import Cluster
from gpuvm.secrets import redact

VERIFY_CONNECT_TIMEOUT = 5
LOGIN_LIMIT_S = VERIFY_CONNECT_TIMEOUT + 10  # one login in all (connect, key exchange, auth, `true`)
VERIFY_BATCH = 16  # most logins one guest starts at once when checking its peers
LOGINS_IN_FLIGHT = 128  # most logins the whole check has at once, every guest together
CHECK_SLACK_S = 30  # a guest's check beyond its logins: the script's start, its files, the answer


@dataclass(frozen=True)
class FailedPair:
    origin: str  # the guest that ran ssh
    peer: str  # the guest it could not log in to
    reason: str


def batch_size(guests_at_once: int) -> int:
    """Logins one guest has in flight: its share of LOGINS_IN_FLIGHT, at most VERIFY_BATCH, at least 1."""
    return max(1, min(VERIFY_BATCH, LOGINS_IN_FLIGHT // max(1, guests_at_once)))


def check_timeout(peers: int, batch: int) -> float:
    """A guest's whole check: its rounds of `batch` logins, each at most LOGIN_LIMIT_S, twice (the logins
    that failed are tried once more), and slack. Derived from the peers, not the fixed command timeout."""
    return 2 * math.ceil(peers / max(1, batch)) * LOGIN_LIMIT_S + CHECK_SLACK_S


def _verify_script(user: str, peers: list[Peer], batch: int = VERIFY_BATCH) -> str:
    """All peers, `batch` at a time, each login cut off after LOGIN_LIMIT_S; the logins that failed are
    tried once more, `batch` at a time again: a busy moment (a connect or login timed out, a neighbour
    not resolved in time: "No route to host") is not a broken pair; a broken one fails again, quickly."""
    tries = "\n".join(f"probe {shlex.quote(p.address)} {p.port} & batch" for p in peers)
    return f"""user={shlex.quote(user)}
home=$(getent passwd "$user" | cut -d: -f6)
t=$(mktemp -d)
trap 'rm -rf "$t"' EXIT
limit() {{ if command -v timeout >/dev/null; then timeout -k 2 {LOGIN_LIMIT_S} "$@"; else "$@"; fi; }}
probe() {{
  if out=$(limit ssh -o BatchMode=yes -o StrictHostKeyChecking=yes -o ConnectTimeout={VERIFY_CONNECT_TIMEOUT} \\
        -o IdentitiesOnly=yes -i "$home/.ssh/{IDENTITY}" -p "$2" "$1" true 2>&1 </dev/null); then
    echo "OK $1:$2" > "$t/$1:$2"
  else
    rc=$?
    why=$(printf '%s' "$out" | tr -d '\\r' | grep -v '^Warning: ' | tail -n 1)
    [ "$rc" -ne 124 ] && [ "$rc" -ne 137 ] || why="login timed out: not done after {LOGIN_LIMIT_S} s"
    echo "FAIL $1:$2 $why" > "$t/$1:$2"
  fi
}}
n=0
batch() {{ n=$((n + 1)); [ $((n % {batch})) -ne 0 ] || wait; }}
{tries}
wait
n=0
for f in "$t"/*; do
  [ -e "$f" ] || continue
  if grep -q '^FAIL ' "$f"; then p=${{f##*/}}; probe "${{p%:*}}" "${{p##*:}}" & batch; fi
done
wait
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


def _detail(target: DesiredGuest, error: Exception) -> str:
    text = str(error)
    return text[len(target.name) + 2:] if text.startswith(target.name + ": ") else text


def verify_mesh(cluster: Cluster, parallel: int = 8, among: list[str] | None = None) -> list[FailedPair]:
    """Every ordered pair of guests (`among`, default all) logs in with the mesh key alone.

    One command per guest, `parallel` guests at once; within a guest, its peers a batch at a time (its
    share of LOGINS_IN_FLIGHT), so the whole check never has more than that many logins at once.
    """
    guests = {n: t for n, t in mesh_guests(cluster).items() if among is None or n in among}
    peers = [Peer(n, t.login.address, t.login.port, "", "") for n, t in guests.items()]
    workers = max(1, parallel)
    batch = batch_size(min(workers, len(guests)))

    def check(target: DesiredGuest) -> list[FailedPair]:
        others = [p for p in peers if p.name != target.name]
        if not others:
            return []
        user = mesh_user(target)
        script = _verify_script(user, others, batch)
        timeout = check_timeout(len(others), batch)
        started = monotonic()
        try:
            result = cluster.executors[target.name].run_script(as_mesh_user(target, user, script), timeout=timeout,
                                                               check=False)
        except RemoteCommandError:
            if monotonic() - started < timeout:
                raise
            # the executor's timeout error quotes the whole script: name the check instead
            raise RemoteCommandError(f"{target.name}: {NAME}: the mesh check of {len(others)} peers did not "
                                     f"finish in {timeout:g} s") from None
        if result.exit_code != 0:
            raise script_error(target, "the mesh check", result)
        return parse_verify(target.name, others, result.stdout)

    checked = run_group(guests, check, workers, name="mesh")
    results = dict(checked.ok)
    for name, error in checked.failed.items():
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
