"""Reading and writing the mesh files in a guest's ~/.ssh, one command each.

Reading prints owners, modes, the private key's digest (never the key) and the other files'
text; writing takes a tar on stdin and moves it into place file by file, so the private key
travels only on stdin. When the mesh user is not the login user, both run with sudo and the
written files are given to that user.
"""

from __future__ import annotations

import base64
import io
import shlex
import tarfile

from gpuvm.steps.guest_ssh_mesh.files import IDENTITY, MeshFiles
from gpuvm.steps.guest_ssh_mesh.guests import as_other_user, script_error
from gpuvm.remote import Cluster, RemoteTarget

FILES = (".", IDENTITY, IDENTITY + ".pub", "authorized_keys", "known_hosts", "config")


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


def read_files(target: RemoteTarget, cluster: Cluster, user: str) -> MeshFiles:
    result = target.executor.run_script(_read_script(user), sudo=as_other_user(target, user),
                                        timeout=cluster.command_timeout, check=False)
    if result.exit_code != 0:
        raise script_error(target, f"reading ~{user}/.ssh", result)
    return parse_mesh_files(user, result.stdout)


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


def _tar(files: dict[str, tuple[bytes, int]]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for name, (data, mode) in files.items():
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), mode
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def write_files(target: RemoteTarget, cluster: Cluster, user: str, home: str,
                content: dict[str, tuple[bytes, int]]) -> None:
    """Write `content` (name → (bytes, mode)) into `home`/.ssh, owned by `user`."""
    other = as_other_user(target, user)
    result = target.executor.run_script(_write_script(user, home, chown=other), sudo=other,
                                        stdin=_tar(content), timeout=cluster.command_timeout, check=False)
    if result.exit_code != 0:
        raise script_error(target, f"writing ~{user}/.ssh", result)
