"""The bench beds' guests back to no mesh: what bench/ssh_mesh.py and bench/campaign_scale.py do
before each size (a module of its own: importing a bench script runs its set-up)."""

from __future__ import annotations

import os
import pwd
from pathlib import Path

from bed import TestBed

from gpuvm.steps.guest_ssh_mesh.files import IDENTITY


def reset(bed: TestBed, n: int) -> None:
    """Each of the first `n` guests' ~gpuadmin/.ssh back to the bed's: only the client key authorised."""
    user = pwd.getpwnam("gpuadmin")
    client = Path(f"{bed.client_key}.pub").read_text()
    for i in range(1, n + 1):
        d = bed.host_dir(f"gpu-vm-{i:02d}") / "home" / "gpuadmin" / ".ssh"
        for name in (IDENTITY, IDENTITY + ".pub", "known_hosts", "config"):
            (d / name).unlink(missing_ok=True)
        (d / "authorized_keys").write_text(client)
        os.chown(d / "authorized_keys", user.pw_uid, user.pw_gid)
        os.chmod(d / "authorized_keys", 0o600)
