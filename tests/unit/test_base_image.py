"""testbed/base_image.py: the Debian mirror the base image is bootstrapped from is the one apt uses;
the container test's base carries exactly what gpuvm's Dockerfile installs with apt for its image."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "testbed"))

from base_image import PRELOADED, debian_mirror  # noqa: E402

from gpuvm.image import render_dockerfile  # noqa: E402
from gpuvm.runbook.guests import Image  # noqa: E402

DEB822 = """\
Types: deb
# http://snapshot.debian.org/archive/debian/20250520T000000Z
URIs: http://deb.debian.org/debian
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: http://deb.debian.org/debian-security
Suites: bookworm-security
Components: main
"""


def test_deb822_sources(tmp_path):
    (tmp_path / "debian.sources").write_text(DEB822)
    assert debian_mirror("bookworm", [tmp_path / "debian.sources"]) == "http://deb.debian.org/debian"


def test_one_line_sources_and_other_suites_skipped(tmp_path):
    (tmp_path / "a.list").write_text("deb https://packages.cloud.google.com/apt cloud-sdk-bookworm main\n")
    (tmp_path / "sources.list").write_text(
        "# a mirror\ndeb [arch=amd64] http://mirror.example/debian/ bookworm main contrib\n")
    assert debian_mirror("bookworm", [tmp_path / "a.list", tmp_path / "sources.list"]) == "http://mirror.example/debian"


def test_no_mirror_for_the_suite(tmp_path):
    (tmp_path / "sources.list").write_text("deb http://deb.debian.org/debian bullseye main\n")
    with pytest.raises(RuntimeError, match="no Debian mirror for bookworm"):
        debian_mirror("bookworm", [tmp_path / "sources.list", tmp_path / "missing.list"])


def test_the_preloaded_base_carries_what_the_container_tests_dockerfile_installs():
    """The image of tests/integration/test_container_campaign.py (distro MPI and PyTorch, inbox RDMA):
    every package its apt-get lines name is in PRELOADED, so its build downloads none; and nothing
    more: the base holds no package (or its dependencies) the Dockerfile would not install itself."""
    text = render_dockerfile(Image(base="gpuvm-base/debian:bookworm", mpi="distro", framework="pytorch",
                                   framework_from="distro", ofed="inbox", horovod=None, gpus=False))
    installs = re.findall(r"apt-get install -y --no-install-recommends((?:\s+(?:\\\n)?\s*[a-z0-9.+-]+)+)", text)
    named = {word for block in installs for word in block.replace("\\", " ").split()}
    assert named == set(PRELOADED), named ^ set(PRELOADED)
