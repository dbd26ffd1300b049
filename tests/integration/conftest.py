"""Integration fixtures: the SSH test bed (real OpenSSH servers in network namespaces)."""

from __future__ import annotations

import fcntl
import os
import shutil
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "testbed"))  # bed: the SSH test hosts
sys.path.insert(0, str(REPO / "simulator"))  # gpusim: the simulated vCenter

from bed import REQUIRED_TOOLS, TestBed  # noqa: E402


@pytest.fixture(scope="session")
def testbed(tmp_path_factory) -> TestBed:
    """Two ESXi hosts and four guests, up for the whole session. Fails (never skips) without root."""
    if os.geteuid() != 0:
        pytest.fail("the SSH test bed needs root (network and mount namespaces)")
    missing = [t for t in REQUIRED_TOOLS if shutil.which(t) is None]
    if missing or not Path("/usr/sbin/sshd").exists():
        pytest.fail(f"the SSH test bed needs {', '.join(missing) or 'sshd'}; apt-get install -y sudo openssh-server")
    # One bed per machine (fixed namespace names): concurrent test sessions take turns.
    lock = open("/tmp/gpuvm-testbed.lock", "w")
    fcntl.flock(lock, fcntl.LOCK_EX)
    bed = TestBed(tmp_path_factory.mktemp("bed"), esxi=2, guests=4)
    try:
        bed.up()
        yield bed
    finally:
        bed.down()
        lock.close()
