"""What the benchmarks on a test bed share (a module of its own: importing a bench script runs its
set-up): root and the benchmarks' bed lock first, and the guests back to no mesh between sizes.

A benchmark's bed has its own names (`BENCH_NAMES`: bridge, namespaces, subnet) and its own lock,
so it runs beside the tests' bed (which `make test`'s bench smoke test may have up) without waiting
for it or touching it; two benchmarks' beds take turns."""

from __future__ import annotations

import fcntl
import os
import pwd
import sys
from pathlib import Path
from typing import IO

from bed import TestBed

from gpuvm.steps.guest_ssh_mesh.files import IDENTITY

BENCH_LOCK = "/tmp/gpuvm-bench-bed.lock"  # the benchmarks' bed (BENCH_NAMES); the tests' is /tmp/gpuvm-testbed.lock


class SshConnections:
    """Counts every SSH connection gpuvm's executors open in this process (SshExecutor._open wrapped)."""

    count = 0

    @classmethod
    def install(cls) -> type[SshConnections]:
        from gpuvm.executors.ssh import SshExecutor

        opened = SshExecutor._open

        def counting_open(executor, connection):
            cls.count += 1
            return opened(executor, connection)

        SshExecutor._open = counting_open
        return cls


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


def hold_bed(script: str, lock_path: str = BENCH_LOCK) -> IO[str] | None:
    """The benchmarks' bed lock, held (wait for another bench using it), or None when not root: the
    bed uses network namespaces."""
    if os.geteuid() != 0:
        print(f"bench/{script} needs root (the test bed uses network namespaces)", file=sys.stderr)
        return None
    lock = open(lock_path, "w")
    fcntl.flock(lock, fcntl.LOCK_EX)
    return lock
