"""Image distribution over the SSH mesh: a tree of guest-to-guest copies, round by round.

The builder sends to a first guest; then every guest that has the image sends to one that has
not, each round, so the holders double: N guests are served in ⌈log2(N+1)⌉ rounds (at most
⌈log2 N⌉ + 1, the builder's first send included). A hop (`docker save | ssh peer docker load`,
run on the sender) that fails leaves its receiver to another holder in a later round; a receiver
that failed `max_tries` times, or that no holder can reach, is reported with the last reason. The
schedule (`next_round`, `tree_rounds`) is pure; `fan_out` drives it with the caller's `send`.

`OPERATOR_BYTES` counts the image bytes that pass through the machine running gpuvm (the copies
it must carry itself: no mesh, or no guest could take the first copy); the tree carries none.
"""

from __future__ import annotations

import shlex
import threading
from time import monotonic
from collections.abc import Callable
from dataclasses import dataclass, field

from gpuvm.errors import RemoteCommandError
from gpuvm.executors.base import command_line
from gpuvm.executors.group import run_group
from gpuvm.image_feed import CHUNK, FEED, STALL
from gpuvm.image_feed import STALLED as STALLED_FEED
from gpuvm.steps.guest_ssh_mesh.files import IDENTITY

SSH_CONNECT_TIMEOUT = 10
# a peer that stops answering mid-transfer (gone, or a dead link) ends its ssh in about a minute,
# not at the step's timeout: the hop fails, the pipelined tree goes on to its other children
SSH_ALIVE = "-o ServerAliveInterval=15 -o ServerAliveCountMax=4"
# guest to guest over the mesh: its key only, the host keys the mesh wrote, never a prompt
MESH_SSH = (f"-o BatchMode=yes -o StrictHostKeyChecking=yes -o IdentitiesOnly=yes "
            f"-o ConnectTimeout={SSH_CONNECT_TIMEOUT} {SSH_ALIVE}")
SAVE_FAILED, LOAD_FAILED, SSH_FAILED, STALLED = 3, 4, 5, 6  # the hop script's exit codes


class ByteCounter:
    """Image bytes through gpuvm's machine: received from a builder plus sent to guests."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.bytes = 0

    def add(self, size: int) -> None:
        with self._lock:
            self.bytes += size

    def reset(self) -> int:
        """The count so far, then zero (for a bench or a test measuring one distribution)."""
        with self._lock:
            count, self.bytes = self.bytes, 0
            return count


OPERATOR_BYTES = ByteCounter()


@dataclass(frozen=True)
class Hop:
    sender: str
    receiver: str


class HopError(RemoteCommandError):
    """A failed hop, and on whose side: `sender` (it could not read its own image: it sends no more),
    `receiver` (its load failed, or gave another id) or `mesh` (ssh from the one to the other failed)."""

    def __init__(self, message: str, side: str = "receiver"):
        super().__init__(message)
        self.side = side

    @property
    def sender_at_fault(self) -> bool:
        return self.side == "sender"


class OutOfTime(RemoteCommandError):
    """A receiver left when the copies' time ran out: neither unreached nor its own failure. Its
    failed hop before, if any, is its `__cause__`."""

    @classmethod
    def after(cls, error: Exception | None) -> OutOfTime:
        if error is None:
            return cls("no time was left to send it (the copies' build_timeout)")
        out = cls(f"{error}; no time was left to try again")
        out.__cause__ = error
        return out


def next_round(holders: list[str], pending: list[str], tried: dict[str, set[str]]) -> list[Hop]:
    """One round: each holder, in order, sends to the first pending guest it has not tried yet."""
    hops, taken = [], set()
    for sender in holders:
        receiver = next((r for r in pending if r not in taken and sender not in tried.get(r, ())), None)
        if receiver is not None:
            hops.append(Hop(sender, receiver))
            taken.add(receiver)
    return hops


def tree_rounds(builder: str, receivers: list[str]) -> list[list[Hop]]:
    """The whole schedule when every hop succeeds (for plans, benches and tests)."""
    holders, pending, rounds = [builder], list(receivers), []
    while pending:
        hops = next_round(holders, pending, {})
        rounds.append(hops)
        for hop in hops:
            holders.append(hop.receiver)
            pending.remove(hop.receiver)
    return rounds


@dataclass
class FanOut:
    """What a distribution did: the hops of each round, and the receivers it could not serve."""

    rounds: list[list[Hop]] = field(default_factory=list)
    failures: dict[str, Exception] = field(default_factory=dict)
    served: list[str] = field(default_factory=list)


def fan_out(holders: list[str], receivers: list[str], send: Callable[[Hop], None], max_tries: int = 2,
            parallel: int = 64, deadline: float | None = None) -> FanOut:
    """Serve every receiver from the holders, round by round; `send(hop)` raises when a hop fails.
    No round starts once `deadline` (`time.monotonic()`) has passed: the receivers left are reported.

    A receiver whose hop failed waits for another holder in a later round; after `max_tries`
    failed hops it is reported with the last one's error. A sender that could not read its own
    image (`HopError.sender_at_fault`) sends no more, and its receiver's try is not counted; nor
    does a sender whose last `max_tries` hops all failed (its mesh key does not work, say).
    """
    holders, pending = list(dict.fromkeys(holders)), [r for r in dict.fromkeys(receivers) if r not in holders]
    tried: dict[str, set[str]] = {}
    failed: dict[str, int] = {}
    streak: dict[str, int] = {}  # a sender's failed hops since its last good one
    last: dict[str, Exception] = {}
    result = FanOut()
    while pending:
        if deadline is not None and monotonic() >= deadline:
            for receiver in pending:
                last[receiver] = OutOfTime.after(last.get(receiver))
            break
        hops = next_round(holders, pending, tried)
        if not hops:
            break
        result.rounds.append(hops)
        errors: dict[str, Exception] = dict(run_group({h.receiver: h for h in hops}, send, parallel, name="image").failed)
        for hop in hops:
            error = errors.get(hop.receiver)
            if error is None:
                streak[hop.sender] = 0
                holders.append(hop.receiver)
                pending.remove(hop.receiver)
                result.served.append(hop.receiver)
                continue
            tried.setdefault(hop.receiver, set()).add(hop.sender)
            last[hop.receiver] = error
            streak[hop.sender] = streak.get(hop.sender, 0) + 1
            if isinstance(error, HopError) and error.sender_at_fault or streak[hop.sender] >= max_tries:
                holders.remove(hop.sender)
            if isinstance(error, HopError) and error.sender_at_fault:
                continue
            failed[hop.receiver] = failed.get(hop.receiver, 0) + 1
            if failed[hop.receiver] >= max_tries:
                pending.remove(hop.receiver)
                result.failures[hop.receiver] = error
    for receiver in pending:
        result.failures[receiver] = last.get(receiver) or RemoteCommandError(
            "no guest that has the image is left to send it")
    return result


def hop_script(ref: str, address: str, port: int, *, save_sudo: bool, load_sudo: bool,
               mesh_user: str | None = None, stall: int = STALL, chunk: int = CHUNK) -> str:
    """The hop, run on the sender: `docker save ref | ssh peer docker load`, over the mesh key.

    ssh runs as the mesh user (`mesh_user`: through `sudo -u` when it is not the login user),
    with strict host keys (the mesh wrote every guest's key to known_hosts) and no prompt. The
    stream goes through `image_feed.feed`: a load that takes no `chunk` for `stall` seconds is cut
    off (STALLED), not waited on until the step's timeout. The exit code says whose side failed:
    SAVE_FAILED, LOAD_FAILED, STALLED or SSH_FAILED, with the reason on stderr. A save killed by
    SIGPIPE (141) is the load's failure, not its own. Stopped (gpuvm interrupted or timed out:
    TERM), it stops the whole pipeline, not the shell alone.
    """
    user = '"$(id -un)"' if mesh_user is None else shlex.quote(mesh_user)
    as_user = "" if mesh_user is None else f"sudo -n -u {shlex.quote(mesh_user)} -H "
    save = command_line(["docker", "save", ref], save_sudo)
    load = shlex.quote(command_line(["docker", "load"], load_sudo))
    peer = shlex.quote(address)
    feed = shlex.quote(FEED + 't=$1 chunk=$2 outs=("$3") pids=("$4") bounds=("$5"); feed')
    return f"""t=$(mktemp -d) || exit 1
trap 'rm -rf "$t"' EXIT
trap 'trap "" TERM; kill 0; exit 143' TERM INT HUP
home=$(getent passwd {user} | cut -d: -f6)
last() {{ tr -d '\r' < "$1" | grep -v '^Warning: ' | grep . | tail -n 1; }}
command -v bash > /dev/null || {{ echo "bash is not installed: it feeds the load" >&2; exit {SAVE_FAILED}; }}
mkfifo "$t/peer" || exit 1
{as_user}ssh {MESH_SSH} -i "$home/.ssh/{IDENTITY}" -p {int(port)} {peer} {load} \
  < "$t/peer" > /dev/null 2> "$t/load.err" &
peer=$!
{{ {save} 2>"$t/save.err"; echo $? > "$t/save"; }} | bash -c {feed} feed "$t" {int(chunk)} "$t/peer" $peer {int(stall)} &
wait $! 2> /dev/null  # in the background: a TERM is handled now; the shell's word on a job it cut off ("Terminated") is not the hop's
fed=$?
wait $peer 2> /dev/null
load=$?
save=$(cat "$t/save" 2>/dev/null || echo 1)
if [ "$save" != 0 ] && [ "$save" != 141 ]; then echo "docker save failed (exit $save): $(last "$t/save.err")" >&2; exit {SAVE_FAILED}; fi
if [ "$fed" = {STALLED_FEED} ]; then echo "docker load took no bytes for {int(stall)} s: cut off" >&2; exit {STALLED}; fi
if [ "$load" = 255 ]; then echo "ssh over the mesh failed: $(last "$t/load.err")" >&2; exit {SSH_FAILED}; fi
if [ "$load" != 0 ]; then echo "docker load failed (exit $load): $(last "$t/load.err")" >&2; exit {LOAD_FAILED}; fi
"""
