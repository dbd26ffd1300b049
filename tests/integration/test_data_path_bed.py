"""Seed 002's data-path experiment on the SSH test bed: gpuvm writes a JPEG dataset on each guest
(their own disks: the bed's guests have /home of their own), trains on it and on synthetic tensors
in one campaign, `bench compare` gives the data path's overhead per point, and fio reads at random
on both guests at once beside it."""

from __future__ import annotations

import json
import shutil

import pytest

from gpuvm.bench.results import load_results
from tests.integration.test_bench_run import BED_MPI, PYTHON, all_logs, bed_runbook, gpuvm, keyless_mesh, \
    results_dir

pytestmark = pytest.mark.integration


def test_dataset_written_on_the_guests_then_files_against_synthetic_and_fio(testbed, tmp_path):
    if shutil.which("fio") is None:
        pytest.fail("fio is not installed: apt-get install fio (the Makefile's APT_PACKAGES has it)")
    with keyless_mesh(testbed):
        runbook = bed_runbook(testbed, tmp_path / "data.yaml", f"""\
    - name: rn18
      kind: pytorch_train
      model: resnet18
      python: {PYTHON}
      batch_size: 4
      data: datasets/jpegs
      dataset: {{files: 16, file_kb: 8}}
      compare_synthetic: true
      args: [--image-size, "32", --num-iters, "2", --num-batches-per-iter, "2", --num-warmup-batches, "1",
             --workers, "0"]
      nodes: [2]
      repeats: 1
      timeout: 240
      env: {{OMP_NUM_THREADS: "1"}}
      mpirun_args: {BED_MPI}
    - name: disk
      kind: storage
      data: .                         # the workdir: fio lays out gpuvm-randread-<guest>.0.0 there
      scenario: concurrent
      groups: [[gpu-vm-01, gpu-vm-02]]
      args: [--size=8m, --numjobs=1, --iodepth=4, --runtime=1]
      repeats: 1
      timeout: 60
""")
        result = gpuvm("bench", "run", runbook, "--out", tmp_path / "out", "--state-dir", tmp_path / "state")
        assert (tmp_path / "out").is_dir(), result.output
        directory = results_dir(tmp_path / "out")
        assert result.exit_code == 0, result.output + all_logs(directory)
        assert "dataset datasets/jpegs: written on gpu-vm-01, gpu-vm-02" in result.output
        for name in ("gpu-vm-01", "gpu-vm-02"):
            written = testbed.host_dir(name) / "home" / "gpuadmin" / ".gpuvm-bench" / "datasets" / "jpegs"
            assert json.loads((written / ".gpuvm-dataset").read_text()) == {"files": 16, "file_kb": 8}
            assert len(list(written.glob("*.jpg"))) == 16

        results = load_results(directory)
        train = results.benchmark("rn18")
        assert [(p.nodes, p.data) for p in train.points] == [(2, "files"), (2, "synthetic")]
        assert all(p.repeats[0].value > 0 for p in train.points)
        two = (directory / train.points[0].repeats[0].log).read_text()
        assert "Data read:" in two and "from 16 files" in two  # each rank read its guest's own files

        [both] = results.benchmark("disk").points
        assert both.vms == 2 and set(both.repeats[0].per_vm) == {"gpu-vm-01", "gpu-vm-02"}
        assert both.repeats[0].metrics["gpu-vm-02/read_iops"] > 0

        compared = gpuvm("bench", "compare", directory)
        assert compared.exit_code == 0, compared.output
        assert "rn18: data path overhead (files against synthetic data): 2 nodes " in compared.output
