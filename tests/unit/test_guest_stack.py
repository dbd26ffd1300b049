"""The guest stack steps' parsers, on what the tools print (guest.driver, guest.rdma)."""

from __future__ import annotations

import pytest

from gpuvm.steps.guest_driver import parse_driver_versions
from gpuvm.steps.guest_rdma import parse_dpkg_status, parse_ofed_info


@pytest.mark.parametrize("text, version", [
    ("535.183.01\n535.183.01\n535.183.01\n535.183.01\n", "535.183.01"),
    ("470.82.01\n", "470.82.01"),
    ("", None),
])
def test_driver_version_from_nvidia_smi(text, version):
    assert parse_driver_versions(text) == version


@pytest.mark.parametrize("text, version", [
    ("MLNX_OFED_LINUX-5.8-3.0.7.0:\n", "5.8-3.0.7.0"),
    ("MLNX_OFED_LINUX-23.10-1.1.9.0\n", "23.10-1.1.9.0"),
    ("", None),
])
def test_mofed_version_from_ofed_info(text, version):
    assert parse_ofed_info(text) == version


@pytest.mark.parametrize("text, version", [
    ("install ok installed 39.0-1", "39.0-1"),
    ("deinstall ok config-files 39.0-1", None),
    ("unknown ok not-installed ", None),
])
def test_rdma_core_from_dpkg_query(text, version):
    assert parse_dpkg_status(text) == version
