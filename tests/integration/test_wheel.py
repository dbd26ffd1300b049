"""The wheel is complete: built from the source tree, installed into a fresh venv outside the
checkout, its `gpuvm` renders every template (which the wheel must ship as gpuvm.templates).

The fresh venv borrows the test environment's third-party packages (a path entry, not its .pth
files, so not its editable gpuvm) instead of downloading them: gpuvm itself and its templates come
from the wheel alone. Building the wheel needs PyPI (pip's isolated build environment).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from gpuvm.image import image_ref
from gpuvm.runbook.loader import load_runbook

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
PLAYBOOKS = REPO / "playbooks"


def clean_env() -> dict[str, str]:
    """This environment without PYTHONPATH and friends, and without GPUVM_* settings."""
    return {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "GPUVM_"))}


def run(argv: list[str | Path], cwd: Path) -> str:
    result = subprocess.run([str(a) for a in argv], cwd=cwd, env=clean_env(), capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, f"{' '.join(map(str, argv))} failed:\n{result.stdout}\n{result.stderr}"
    return result.stdout


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> tuple[Path, Path]:
    """(the wheel, the fresh venv it is installed in)."""
    tmp = tmp_path_factory.mktemp("wheel")
    source = tmp / "source"  # a copy, so that the build leaves nothing in the checkout
    for name in ("src", "templates"):
        shutil.copytree(REPO / name, source / name, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, source / name)
    run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", tmp / "dist", source], cwd=tmp)
    (wheel,) = (tmp / "dist").glob("gpuvm-*.whl")

    venv = tmp / "venv"
    python = venv / "bin" / "python"
    run([sys.executable, "-m", "venv", "--without-pip", venv], cwd=tmp)
    run([sys.executable, "-m", "pip", "--python", python, "install", "-q", "--no-deps", "--no-index", wheel], cwd=tmp)
    site = Path(run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], cwd=tmp).strip())
    deps = sorted({sysconfig.get_paths()[kind] for kind in ("purelib", "platlib")})
    (site / "_gpuvm_test_deps.pth").write_text("".join(f"{path}\n" for path in deps))
    return wheel, venv


def test_the_wheel_ships_every_module_and_template(installed):
    wheel, _ = installed
    names = set(zipfile.ZipFile(wheel).namelist())
    modules = {p.relative_to(REPO / "src").as_posix() for p in (REPO / "src" / "gpuvm").rglob("*.py")}
    templates = {"gpuvm/" + p.relative_to(REPO).as_posix() for p in (REPO / "templates").rglob("*.j2")}
    assert modules <= names, f"missing from the wheel (add the package to pyproject.toml): {sorted(modules - names)}"
    assert templates <= names, f"templates missing from the wheel: {sorted(templates - names)}"
    schemas = {p.relative_to(REPO / "src").as_posix() for p in (REPO / "src" / "gpuvm" / "schemas").glob("*.json")}
    assert schemas and schemas <= names, f"JSON schemas missing from the wheel: {sorted(schemas - names)}"


def test_the_installed_gpuvm_renders_its_templates_outside_the_checkout(installed, tmp_path):
    _, venv = installed
    where = run([venv / "bin" / "python", "-c", "import gpuvm.templates as t; print(t.__file__)"], tmp_path)
    assert Path(where.strip()).is_relative_to(venv)

    # bench run --dry-run: the image tag (a hash of Dockerfile.j2's rendering), then the docker,
    # mpirun and tf_cnn_benchmarks templates.
    runbook = PLAYBOOKS / "study-scenario2.yaml"
    dry_run = run([venv / "bin" / "gpuvm", "bench", "run", runbook, "--dry-run"], tmp_path)
    ref = image_ref(load_runbook(runbook).guests.image)
    assert f" {ref} mpirun --allow-run-as-root -np 4 --hostfile " in dry_run
    assert "tf_cnn_benchmarks.py --model=resnet50 --batch_size=1024" in dry_run

    # launch-files: bench/hostfile.j2
    run([venv / "bin" / "gpuvm", "launch-files", runbook, "--out", "launch"], tmp_path)
    assert (tmp_path / "launch" / "hostfile").read_text().startswith("10.10.0.11 slots=1\n10.10.0.12 slots=1\n")

    # bench report: report.md.j2 and report.html.j2
    run([venv / "bin" / "gpuvm", "bench", "report", PLAYBOOKS / "results" / "study-vm",
         "--baseline", PLAYBOOKS / "results" / "study-baremetal.yaml", "--out", "report"], tmp_path)
    assert "resnet50-scaling" in (tmp_path / "report" / "report.md").read_text()
    assert "<html" in (tmp_path / "report" / "report.html").read_text()
