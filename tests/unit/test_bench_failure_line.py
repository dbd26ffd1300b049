"""A failed benchmark run's error names what went wrong, not a launcher's banner (issue 34: a crashed
torchrun under mpirun was "exited 1: ------")."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuvm.bench.parsers.failure import failure_line
from gpuvm.bench.results import load_results
from gpuvm.executors.base import CommandResult
from tests.unit.test_bench_run import Script, campaign, fake, horovod_output, ok, one_run

FIXTURES = Path(__file__).parents[1] / "fixtures" / "bench"
CRASH = (FIXTURES / "torchrun_crash_mpirun.log").read_text()
OOM = ("[1,0]<stderr>:torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 3.06 GiB. GPU 0 has a total "
       "capacity of 79.15 GiB of which 1.20 GiB is free.")


@pytest.mark.parametrize("text, said", [
    (CRASH, OOM),  # the first rank's exception, not mpirun's banner nor rank 1's consequence
    ("[1,0]<stderr>:CUDA error: out of memory\n", "[1,0]<stderr>:CUDA error: out of memory"),
    ((FIXTURES / "tf_cnn_oom.log").read_text(),
     "tensorflow.python.framework.errors_impl.ResourceExhaustedError: OOM when allocating tensor with "
     "shape[1024,64,112,112] and type float on /job:localhost/replica:0/task:0/device:GPU:0 by allocator GPU_0_bfc"),
    ("step 10\nerror: disk full\n==========\ntrain.py FAILED\n----------\nexitcode: 1\n==========\n", "error: disk full"),
    ("----------\nmpirun was unable to launch the specified application\n\nExecutable: /work/train.py\n----------\n",
     "Executable: /work/train.py"),  # nothing but a banner: its last line
    ("", ""),
])
def test_the_line_that_says_what_went_wrong(text, said):
    assert failure_line(text) == said


def test_a_crashed_run_is_recorded_with_its_exception(tmp_path):
    vm1 = fake("vm1", Script(CommandResult("", 1, CRASH, ""), ok(horovod_output(100.0))))
    done, _ = campaign(tmp_path, one_run(kind="horovod_synthetic", repeats=2), {"vm1": vm1})
    repeats = load_results(done.results_file).benchmarks[0].points[0].repeats
    assert repeats[0].error == f"exited 1: {OOM}"
