"""What `load_runbook` accepts as a file (issue 11, items 3 and 4): regular files of sane size in
UTF-8 or UTF-16; FIFOs, devices, directories, other encodings and alias bombs are one clear error,
at once, without reading without bound."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from gpuvm.errors import InputError
from gpuvm.runbook import document
from gpuvm.runbook.loader import load_runbook

LAB = Path(__file__).parents[2] / "playbooks" / "lab.yaml"


@pytest.mark.parametrize("make", [
    lambda d: (os.mkfifo(d / "rb.yaml"), d / "rb.yaml")[1],
    lambda d: Path("/dev/zero"),
    lambda d: Path("/dev/urandom"),
], ids=["fifo", "dev-zero", "dev-urandom"])
def test_not_a_regular_file_is_refused_without_reading(tmp_path, make):
    path = make(tmp_path)
    with pytest.raises(InputError, match=f"^{path}: not a regular file"):
        load_runbook(path)


def test_a_directory_is_refused(tmp_path):
    with pytest.raises(InputError, match="cannot read runbook: Is a directory"):
        load_runbook(tmp_path)


def test_utf16_and_utf8_with_bom_are_read(tmp_path):
    for name, encoding in (("utf16.yaml", "utf-16"), ("bom.yaml", "utf-8-sig")):
        (tmp_path / name).write_bytes(LAB.read_text().encode(encoding))
        assert [h.name for h in load_runbook(tmp_path / name).hosts] == ["esx-01", "esx-02"]


def test_a_file_over_the_size_cap_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(document, "MAX_BYTES", 1024)
    shutil.copy(LAB, tmp_path / "big.yaml")
    with pytest.raises(InputError, match="larger than 1 KB"):
        load_runbook(tmp_path / "big.yaml")


def test_expansion_is_counted_without_expanding():
    from ruamel.yaml import YAML

    levels = ["a: &a [x, x, x, x, x, x, x, x, x, x]"]
    for i in range(1, 30):
        below = "a" if i == 1 else f"l{i - 1}"
        levels.append(f"l{i}: &l{i} [" + ", ".join([f"*{below}"] * 10) + "]")
    bomb = "\n".join(levels) + "\n"
    data = YAML(typ="rt").load(bomb)
    assert document.expanded_size(data, {}) > 10 ** 30  # counted, not built
