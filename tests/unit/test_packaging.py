"""A clean install: every folder of the package is declared in pyproject.toml, so neither `pip install
-e .` nor the wheel build prints setuptools' "Package 'gpuvm.x' is absent from the `packages`
configuration" warnings (issue 23); data files ship as package data of the folder that holds them."""

from __future__ import annotations

import tomllib
from pathlib import Path

REPO = Path(__file__).parents[2]
SRC = REPO / "src"


def _setuptools() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["setuptools"]


def test_every_folder_of_the_package_is_a_declared_package():
    folders = {".".join(p.relative_to(SRC).parts) for p in [SRC / "gpuvm", *(SRC / "gpuvm").rglob("*")]
               if p.is_dir() and p.name != "__pycache__" and any(f.is_file() for f in p.iterdir())}
    declared = set(_setuptools()["packages"])
    assert folders - declared == set(), "add them to [tool.setuptools] packages in pyproject.toml"


def test_every_data_file_is_package_data_of_its_own_folder():
    data = _setuptools()["package-data"]
    for path in (SRC / "gpuvm").rglob("*"):
        if path.is_file() and path.suffix not in (".py", ".pyc"):
            package = ".".join(path.parent.relative_to(SRC).parts)
            assert any(path.match(pattern) for pattern in data.get(package, [])), \
                f"{path.relative_to(REPO)}: not package data of {package} in pyproject.toml"
