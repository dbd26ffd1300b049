"""Datasets a campaign writes (`dataset:`), and a run measured on files and on synthetic tensors
(`compare_synthetic: true`): the runbook's rules, the planned points, the marker script run by a
real shell, and the data path's overhead in `bench compare`."""

from __future__ import annotations

import re
import shlex
import sys

import pytest

from gpuvm.bench.campaign import plan_campaign, uploads
from gpuvm.bench.compare import compare
from gpuvm.bench.datasets import MARKER, DatasetWrite, planned_datasets, write_datasets
from gpuvm.bench.dry_run import describe
from gpuvm.bench.report import notes
from gpuvm.bench.results import Benchmark, Point, Repeat, Results
from gpuvm.errors import InputError, TargetFailures
from gpuvm.executors.local import LocalExecutor
from tests.unit.test_bench_run import book, one_run

TRAIN = dict(kind="pytorch_train", data="/mnt/jpegs", dataset={"files": 48, "file_kb": 20}, nodes=[1, 2])


def test_each_point_on_files_and_on_synthetic_tensors(tmp_path):
    points = plan_campaign(book(tmp_path, one_run(**TRAIN, compare_synthetic=True)))
    assert [(p.label, p.data) for p in points] == [("nodes-1-files", "files"), ("nodes-1-synthetic", "synthetic"),
                                                   ("nodes-2-files", "files"), ("nodes-2-synthetic", "synthetic")]
    files, synthetic = (shlex.split(p.jobs[0].command) for p in points[:2])
    assert files[files.index("--data-dir") + 1] == "/mnt/jpegs" and "--data-dir" not in synthetic


def test_datasets_are_written_where_files_are_read(tmp_path):
    runbook = book(tmp_path, "runs:\n" + "\n".join(
        f"  - {{name: {name}, kind: pytorch_train, data: /mnt/jpegs, dataset: {{files: 48, file_kb: 20}}, "
        f"nodes: {nodes}, program: train.py}}" for name, nodes in (("a", [1]), ("b", [2]))))
    points = plan_campaign(runbook)
    assert planned_datasets(points) == [DatasetWrite("/mnt/jpegs", 48, 20, "python3", ("vm1", "vm2"))]
    # the training workload writes them: shipped to every guest even where the run has its own program
    assert {(u.target, u.destination) for u in uploads(runbook, points, local=False)} == {
        ("vm1", "pytorch_train.py"), ("vm2", "pytorch_train.py")}
    assert describe(points, ".gpuvm-bench")[0] == (
        "dataset /mnt/jpegs: 48 files of 20 KB, written where missing on vm1, vm2")
    local = plan_campaign(book(tmp_path, one_run(**TRAIN, compare_synthetic=True), infra=""), local=True)
    assert [d.targets for d in planned_datasets(local)] == [("local",)]


@pytest.mark.parametrize("fields, error", [
    (dict(kind="pytorch_train", dataset={"files": 1, "file_kb": 1}), r"runs\[0\]: `dataset` is read only with kind "
     r"pytorch_train and a `data` directory"),
    (dict(kind="tf_cnn_benchmarks", data="/d", compare_synthetic=True), r"runs\[0\]: `compare_synthetic` is read only"),
    (dict(TRAIN, dataset={"files": 0, "file_kb": 1}), r"runs\[0\]\.dataset\.files: Input should be greater than"),
    (dict(TRAIN, dataset={"files": 1}), r"runs\[0\]\.dataset\.file_kb: required field is missing"),
])  # fmt: skip
def test_bad_datasets_name_file_line_and_field(tmp_path, fields, error):
    with pytest.raises(InputError, match=r"lab\.yaml:\d+: benchmarks\." + error):
        plan_campaign(book(tmp_path, one_run(**fields)))


def test_two_runs_asking_for_different_files_at_one_path(tmp_path):
    section = ("runs:\n  - {name: a, kind: pytorch_train, data: /d, dataset: {files: 10, file_kb: 20}}\n"
               "  - {name: b, kind: pytorch_train, data: /d, dataset: {files: 11, file_kb: 20}}\n")
    with pytest.raises(InputError, match=r"lab\.yaml:\d+: benchmarks\.runs\[1\]\.dataset: runs\[0\] asks for another "
                                         r"dataset at '/d'"):
        plan_campaign(book(tmp_path, section))


# ------------------------------------------------------------------ the marker script, in a real shell

WRITER = """\
import pathlib, sys
args = sys.argv[1:]
if "FAIL" in pathlib.Path(args[1]).name:
    sys.exit("cannot write")
out = pathlib.Path(args[1]); out.mkdir(parents=True, exist_ok=True)
for i in range(int(args[3])):
    (out / f"{i:08d}.jpg").write_bytes(b"x" * int(float(args[5]) * 1000))
"""


def write(tmp_path, path, files=3, targets=("local",)):
    """write_datasets with this machine as every target (so they share a disk, as on a shared mount);
    a stand-in for pytorch_train.py's --write-dataset as the writer."""
    (tmp_path / "pytorch_train.py").write_text(WRITER)
    lines: list[str] = []
    executors = {t: LocalExecutor(t) for t in targets}
    write_datasets(executors, [DatasetWrite(str(path), files, 1, sys.executable, tuple(targets))], str(tmp_path),
                   local=False, note=lines.append)
    return lines


def test_written_once_then_found_and_a_write_cut_short_is_done_again(tmp_path):
    data = tmp_path / "data"
    assert write(tmp_path, data, targets=("vm1", "vm2")) == [f"dataset {data}: written on vm1; present on vm2"]
    assert sorted(p.name for p in data.iterdir()) == [MARKER, "00000000.jpg", "00000001.jpg", "00000002.jpg"]
    assert (data / MARKER).read_text() == '{"files": 3, "file_kb": 1}\n'
    assert write(tmp_path, data) == [f"dataset {data}: present on local"]
    (data / MARKER).write_text('writing {"files": 3, "file_kb": 1}\n')
    assert write(tmp_path, data) == [f"dataset {data}: written on local"]


def test_never_writes_into_a_directory_it_did_not_make_or_over_another_dataset(tmp_path):
    mine = tmp_path / "imagenet"
    mine.mkdir()
    (mine / "n01440764").mkdir()
    with pytest.raises(TargetFailures, match=r"local: dataset .*imagenet: .*imagenet: not empty, and not a dataset "
                                             r"gpuvm wrote: refusing to write into it"):
        write(tmp_path, mine)
    write(tmp_path, tmp_path / "data", files=3)
    with pytest.raises(TargetFailures, match=r'holds another dataset \(\{"files": 3, "file_kb": 1\}\): remove it'):
        write(tmp_path, tmp_path / "data", files=4)
    with pytest.raises(TargetFailures, match=r"dataset .*FAIL: cannot write"):
        write(tmp_path, tmp_path / "FAIL")
    assert (tmp_path / "FAIL" / MARKER).read_text().startswith("writing ")  # done again next time


# ------------------------------------------------------------------------------ the data path's overhead


def test_compare_gives_the_data_path_overhead_per_point():
    def point(nodes, data, values):
        return Point(nodes=nodes, data=data, repeats=[Repeat(value=v) for v in values])

    bench = Benchmark(name="rn50", kind="pytorch_train", unit="img/sec", points=[
        point(1, "files", [90.0]), point(1, "synthetic", [100.0]), point(2, "files", [150.0]),
        point(2, "synthetic", [200.0, 190.0, 210.0])])
    comparison = compare(Results(environment="vm", benchmarks=[bench]))
    by_label = {p.label: p for p in comparison.benchmarks[0].points}
    assert list(by_label) == ["1 node, files", "2 nodes, files", "1 node, synthetic", "2 nodes, synthetic"]
    assert by_label["2 nodes, files"].data_overhead == pytest.approx(0.25)
    assert by_label["2 nodes, files"].speedup == pytest.approx(150 / 90)  # within the files points
    assert by_label["2 nodes, synthetic"].data_overhead is None
    assert notes(comparison)[0] == ("rn50: data path overhead (files against synthetic data): 1 node 10.0%, "
                                    "2 nodes 25.0%.")  # then each point's interval (bench/stats.py)


def test_a_long_write_says_how_long_it_has_been_going(tmp_path, monkeypatch):
    """Issue 22, item 6: writing a dataset (minutes for 100,000 files) is not silent."""
    import gpuvm.ticker

    monkeypatch.setattr(gpuvm.ticker, "EVERY", 0.05)
    monkeypatch.setattr(sys.modules[__name__], "WRITER", "import time; time.sleep(0.3)\n" + WRITER)
    data = tmp_path / "data"
    lines = write(tmp_path, data, targets=("vm1",))
    assert any(re.fullmatch(rf"dataset {re.escape(str(data))}: checking or writing on vm1: \d+ s", line)
               for line in lines[:-1]), lines
    assert lines[-1] == f"dataset {data}: written on vm1"


def test_results_keep_the_dataset_a_benchmark_read(tmp_path):
    """`gpuvm size --results` reads its file size (tests/unit/test_sizing.py)."""
    from datetime import UTC, datetime

    from gpuvm.bench.recording import Outcome, Recorder

    runbook = book(tmp_path, one_run(**TRAIN))
    points = plan_campaign(runbook)
    recorder = Recorder(runbook, points, local=False)
    recorder.record(points[0], Outcome(100.0, None, "img/sec"), "logs/x.log")
    [bench] = recorder.results(datetime.now(UTC), datetime.now(UTC), {}, None).benchmarks
    assert (bench.dataset.files, bench.dataset.file_kb) == (48, 20)
