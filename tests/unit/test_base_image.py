"""testbed/base_image.py: the Debian mirror the base image is bootstrapped from is the one apt uses."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "testbed"))

from base_image import debian_mirror  # noqa: E402

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
