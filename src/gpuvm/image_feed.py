"""A stream to several readers at once, each reader cut off when it stops taking bytes: how a relay of
the pipelined tree (`image_pipeline.RELAY`) feeds its own `docker load` and its children's ssh, and
how a hop (`image_fanout.hop_script`) feeds its peer's load.

`tee` would do, but one reader that stops reading (a `docker load` stuck on its disk, a child relay
doing the same further down) blocks it, and with it every other reader and the whole tree above,
until the step's timeout. `feed` (bash, GNU coreutils only: nothing else is sure to be on a guest)
reads its stdin a chunk at a time into a file and writes each chunk to every reader at once, each
write under `timeout`: a reader that has not taken a whole chunk within its bound is killed and
dropped; one that exits (a failed load, a lost child) is dropped; the others go on. The next chunk
is read while this one is written, so receiving and sending overlap as they do through a pipe.

Only writes are bounded: a relay whose own sender is slow waits without cutting anyone. A relay
blocked by a stalled reader of its own holds its sender for up to its longest bound, so a reader
that is itself a relay gets one stall more per level below it (`bound`): the relay nearest the
stalled load cuts it off first, and no relay above cuts a subtree that is only waiting.
"""

from __future__ import annotations

STALL = 60  # seconds a reader may take no chunk before it is cut off
CHUNK = 4 << 20  # bytes a reader must take within its bound (at least CHUNK / STALL bytes/s: 70 KB/s)
STALLED = 124  # feed's exit when it cut a reader off for a stall (timeout's own code)

# bash, sourced into a script that sets `t` (a private temp directory), `chunk`, and the readers:
# `outs` (fifos), `pids` (the process reading each) and `bounds` (seconds). Stdin: the stream.
FEED = """bits() { local n=$1 b=0; while [ "$n" -gt 0 ]; do b=$((b + 1)); n=$((n / 2)); done; echo $b; }
bound() { echo $(( $1 * ($(bits "$2") + 1) )); }  # $1: the stall; $2: the reader's subtree, in guests
feed() {
  local fds=() w=() i fd rc cur=0 reader cut=0
  exec 3<&0  # a background command's stdin is /dev/null: the readers of chunks take it from fd 3
  for i in "${!outs[@]}"; do exec {fd}>"${outs[i]}"; fds[i]=$fd; done
  head -c "$chunk" > "$t/c0"
  while [ ${#fds[@]} -gt 0 ] && [ -s "$t/c$cur" ]; do
    head -c "$chunk" <&3 > "$t/c$((1 - cur))" & reader=$!
    w=()
    for i in "${!fds[@]}"; do timeout "${bounds[i]}" cat "$t/c$cur" >&"${fds[i]}" & w[i]=$!; done
    for i in "${!w[@]}"; do
      wait "${w[i]}" && continue
      rc=$?
      if [ "$rc" = 124 ]; then cut=1; kill "${pids[i]}" 2> /dev/null; fi
      fd=${fds[i]}; exec {fd}>&-; unset 'fds[i]'
    done
    if [ ${#fds[@]} -eq 0 ]; then kill "$reader" 2> /dev/null; fi
    wait "$reader"
    cur=$((1 - cur))
  done
  for fd in "${fds[@]}"; do exec {fd}>&-; done
  exec 3<&-
  [ "$cut" = 0 ] || return 124
}
"""
