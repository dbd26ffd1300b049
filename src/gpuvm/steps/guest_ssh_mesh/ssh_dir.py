"""Reading and writing the mesh files in a guest's ~/.ssh, one command each, as the mesh user.

Reading prints owners, modes, the private key's digest (never the key) and the other files'
text; writing takes a tar on stdin and moves it into place file by file, so the private key
travels only on stdin. Both run as the mesh user (`as_mesh_user`): root never opens a path in
that user's home. A symbolic link at `~/.ssh` or at one of the mesh files is an error for that
guest naming it, not followed and not replaced: a link is the user's deliberate choice (dotfiles
kept elsewhere), and gpuvm would either write where it points or silently undo it. A `~/.ssh`
that is not the user's is an error too: gpuvm changes no ownership as root.
"""

from __future__ import annotations

import base64
import binascii
import io
import re
import shlex
import tarfile

from gpuvm.steps.guest_ssh_mesh.files import IDENTITY, MeshFiles
from gpuvm.steps.guest_ssh_mesh.guests import as_mesh_user, script_error
from gpuvm.parsers._common import unparseable
from gpuvm.desired.ssh import DesiredGuest
from gpuvm.remote import Cluster
from gpuvm.untrusted import UntrustedValueError, shown

FILES = (".", IDENTITY, IDENTITY + ".pub", "authorized_keys", "known_hosts", "config")
REFUSED = 4  # the scripts' exit code for a path they will not touch: a link, a ~/.ssh not the user's

# `$d/$n`: one of the paths the mesh touches; a link there stops the script, naming it
_REFUSE_LINK = """refuse_link() {
  if [ -L "$1" ]; then
    echo "$1 is a symbolic link: gpuvm neither follows nor replaces links in ~/.ssh; make it a plain file or directory" >&2
    exit """ + str(REFUSED) + """
  fi
}
"""


def _read_script(user: str) -> str:
    names = " ".join(shlex.quote(n) for n in FILES)
    texts = " ".join(shlex.quote(n) for n in FILES[2:])
    return f"""user={shlex.quote(user)}
{_REFUSE_LINK}home=$(getent passwd "$user" | cut -d: -f6)
if [ -z "$home" ]; then echo "user $user not found (getent passwd)" >&2; exit 3; fi
d="$home/.ssh"
echo "@@gpuvm home $home"
for n in {names}; do
  f="$d/$n"; [ "$n" = . ] && f="$d"
  refuse_link "$f"
  if [ -e "$f" ]; then echo "@@gpuvm stat $n $(stat -c '%U %a' "$f")"; fi
done
if [ -f "$d/{IDENTITY}" ]; then echo "@@gpuvm digest $(sha256sum < "$d/{IDENTITY}" | cut -d' ' -f1)"; fi
for n in {texts}; do
  if [ -f "$d/$n" ]; then echo "@@gpuvm file $n $(base64 < "$d/$n" | tr -d '\\n')"; fi
done
"""


def parse_mesh_files(user: str, output: str) -> MeshFiles:
    """Parse the read script's output (pure). The guest's answer is held to its grammar: the home
    directory goes into the write script (quoted), names and owners into plans."""
    home, stats, digest, texts = "", {}, None, {}
    for line in output.splitlines():
        if not line.startswith("@@gpuvm "):
            continue
        kind, _, rest = line[len("@@gpuvm "):].partition(" ")
        try:
            if kind == "home":
                home = rest if _HOME.fullmatch(rest) else _refuse(rest, "a home directory")
            elif kind == "stat":
                name, owner, mode = rest.split(" ")
                if not _WORD.fullmatch(name) or not _WORD.fullmatch(owner):
                    _refuse(rest, "a file name, owner and mode")
                stats[name] = (owner, int(mode, 8))
            elif kind == "digest":
                digest = rest.strip() or None
                if digest is not None and not re.fullmatch(r"[0-9a-f]{64}", digest):
                    _refuse(digest, "a sha256 digest")
            elif kind == "file":
                name, _, data = rest.partition(" ")
                texts[name] = base64.b64decode(data, validate=True).decode(errors="replace")
        except (ValueError, binascii.Error):
            raise unparseable(f"reading ~{user}/.ssh", "'@@gpuvm stat NAME OWNER MODE' and base64 file lines",
                              line) from None
    return MeshFiles(user, home, stats, digest, texts)


_HOME = re.compile(r"/[^\x00-\x1f\x7f]{0,4095}")
_WORD = re.compile(r"[A-Za-z0-9_.@+-]{1,255}")


def _refuse(value: str, what: str) -> str:
    raise UntrustedValueError(f"the guest answered {shown(value)} as {what}; refusing to use it")


def read_files(target: DesiredGuest, cluster: Cluster, user: str) -> MeshFiles:
    script = as_mesh_user(target, user, _read_script(user))
    result = cluster.executors[target.name].run_script(script, timeout=cluster.command_timeout, check=False)
    if result.exit_code != 0:
        raise script_error(target, f"reading ~{user}/.ssh", result)
    return parse_mesh_files(user, result.stdout)


def _write_script(user: str, home: str) -> str:
    """Runs as `user`: what it creates is the user's, and a directory that is not cannot be
    changed (said plainly rather than as chmod's "Operation not permitted")."""
    return f"""set -e
umask 077
user={shlex.quote(user)}
d={shlex.quote(home + "/.ssh")}
{_REFUSE_LINK}refuse_link "$d"
mkdir -p "$d"
owner=$(stat -c %U "$d")
if [ "$owner" != "$user" ]; then
  echo "$d is owned by $owner, not $user: gpuvm changes no ownership as root; chown it to $user" >&2; exit {REFUSED}
fi
chmod 700 "$d"
t=$(mktemp -d "$d/.gpuvm.XXXXXX")
trap 'rm -rf "$t"' EXIT
tar -x -o -p -f - -C "$t"
for f in "$t"/*; do
  [ -e "$f" ] || continue
  refuse_link "$d/${{f##*/}}"
  mv -f -T "$f" "$d/${{f##*/}}"
done
"""


def _tar(files: dict[str, tuple[bytes, int]]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for name, (data, mode) in files.items():
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), mode
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def write_files(target: DesiredGuest, cluster: Cluster, user: str, home: str,
                content: dict[str, tuple[bytes, int]]) -> None:
    """Write `content` (name → (bytes, mode)) into `home`/.ssh, as `user`."""
    script = as_mesh_user(target, user, _write_script(user, home))
    result = cluster.executors[target.name].run_script(script, stdin=_tar(content), timeout=cluster.command_timeout,
                                                       check=False)
    if result.exit_code != 0:
        raise script_error(target, f"writing ~{user}/.ssh", result)
