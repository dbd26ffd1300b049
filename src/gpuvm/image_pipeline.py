"""The image down a pipelined binary tree over the SSH mesh: every guest loads the stream while it
passes it on to its two children, so the whole tree takes about one transfer (two on a guest's
uplink) instead of one transfer a round.

The builder runs `docker save ref | relay …`; a relay (`RELAY`, bash) feeds its stdin to its own
`docker load` and to `ssh child relay …` for each of its children, over the mesh key, with
strict host keys. A guest's descendants travel as arguments in pre-order: the first half is its
left child's subtree (that child first), the rest its right child's (`split`). `image_feed.feed`
goes on feeding the others when one reader fails, so a guest whose load fails still passes the
image on, and cuts off a reader that takes no bytes for its bound (`image_feed.STALL`, one more
per level below it), so a load that stops reading costs its own subtree, not the whole tree.
Nothing here says which guest got what: the caller checks every receiver's image id afterwards
and serves the rest round by round (`image_fanout.fan_out`), which names whose side failed.

Addresses and users travel unquoted inside the remote command, so a guest whose address, port or
user is not plain (`SAFE`) is left to the rounds.
"""

from __future__ import annotations

import base64
import re
import shlex
from dataclasses import dataclass

from gpuvm.executors.base import command_line
from gpuvm.image_fanout import MESH_SSH, Hop
from gpuvm.image_feed import CHUNK, FEED, STALL
from gpuvm.steps.guest_ssh_mesh.files import IDENTITY

SAFE = re.compile(r"[A-Za-z0-9._:%@][A-Za-z0-9._:%@-]*")  # no leading '-': ssh and sudo would read an option


@dataclass(frozen=True)
class Relay:
    """A guest of the tree: where the mesh reaches it, how it loads, whom it sends as."""

    address: str
    port: int
    load_sudo: bool
    mesh_user: str | None  # ssh to its children as this user (None: the login user)

    @property
    def token(self) -> str | None:
        """`address,port,load,user` as the relays pass it on; None when a word is not plain."""
        words = [self.address, str(int(self.port)), "1" if self.load_sudo else "0", self.mesh_user]
        if not all(w is None or SAFE.fullmatch(w) for w in words):
            return None
        return ",".join(w or "-" for w in words)  # "-": the login user


def split(descendants: list) -> tuple[list, list]:
    """A guest's descendants (pre-order) as its left child's subtree and its right child's."""
    half = (len(descendants) + 1) // 2
    return descendants[:half], descendants[half:]


def levels(sender: str, receivers: list[str]) -> list[list[Hop]]:
    """The tree's hops, level by level (what the relays do, for messages, benches and tests)."""
    out: list[list[Hop]] = []

    def walk(parent: str, descendants: list[str], depth: int) -> None:
        for subtree in split(descendants):
            if subtree:
                if len(out) <= depth:
                    out.append([])
                out[depth].append(Hop(parent, subtree[0]))
                walk(subtree[0], subtree[1:], depth + 1)

    walk(sender, receivers, 0)
    return out


# $1: this script, base64 (passed on); $2: this guest's load: "-" none (the builder), 0 or 1 (sudo);
# $3: the user to ssh as ("-": the login user); $4: the stall (`image_feed.STALL`); $5: the chunk;
# then its descendants' tokens, pre-order. Every reader started before `feed` opens their fifos.
RELAY = FEED + f"""set -u
self=$1 load=$2 user=$3 stall=$4 chunk=$5; shift 5
t=$(mktemp -d) || exit 1
trap 'rm -rf "$t"' EXIT
trap 'trap "" TERM; kill 0; exit 143' TERM INT HUP
if [ "$user" = - ]; then as=""; home=$HOME; else as="sudo -n -u $user -H"; home=$(getent passwd "$user" | cut -d: -f6); fi
send() {{  # $1: the child's token; then the child's own descendants (exec: the reader's pid is ssh's)
  IFS=, read -r addr port cload cuser <<< "$1"; shift
  exec $as ssh {MESH_SSH} -i "$home/.ssh/{IDENTITY}" -p "$port" "$addr" "bash -c \\"\\$(echo $self | base64 -d)\\" relay $self $cload $cuser $stall $chunk $*"
}}
outs=() pids=() bounds=()
if [ "$load" != - ]; then
  mkfifo "$t/load"
  loader=(docker load); if [ "$load" = 1 ]; then loader=(sudo -n docker load); fi
  "${{loader[@]}}" < "$t/load" > /dev/null 2>&1 &
  outs+=("$t/load") pids+=($!) bounds+=("$stall")
fi
half=$(( ($# + 1) / 2 ))  # split(): the left child's subtree, then the right child's
if [ $# -gt 0 ]; then
  mkfifo "$t/left"; send "${{@:1:half}}" < "$t/left" > /dev/null 2>&1 &
  outs+=("$t/left") pids+=($!) bounds+=("$(bound "$stall" "$half")")
fi
if [ $# -gt 1 ]; then
  mkfifo "$t/right"; send "${{@:half+1}}" < "$t/right" > /dev/null 2>&1 &
  outs+=("$t/right") pids+=($!) bounds+=("$(bound "$stall" $(( $# - half )))")
fi
feed
wait
"""


def pipeline_script(ref: str, relays: list[Relay], *, save_sudo: bool, mesh_user: str | None,
                    stall: int = STALL, chunk: int = CHUNK) -> str:
    """The builder's command: its `docker save` into the relay of the whole tree (`relays` in order);
    a guest that takes no `chunk` within `stall` seconds (one more per level below it) is cut off."""
    tokens = [r.token for r in relays]
    if not relays or None in tokens or (mesh_user is not None and not SAFE.fullmatch(mesh_user)):
        raise ValueError("every relay needs a plain address, port and user")
    encoded = base64.b64encode(RELAY.encode()).decode()
    save = command_line(["docker", "save", ref], save_sudo)
    relay = ["bash", "-c", RELAY, "relay", encoded, "-", mesh_user or "-", str(int(stall)), str(int(chunk)), *tokens]
    return f"{save} | {shlex.join(relay)}"
