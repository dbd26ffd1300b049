"""The environment recorded with every repeat: `nvidia-smi -q` read as real drivers print it, the
probe script's answer read part by part (missing parts absent), results files that keep it, and
`bench compare --baseline` warning when the two sides ran in different environments."""

from __future__ import annotations

import json
import re
import threading
import subprocess
from pathlib import Path

import pytest

from gpuvm.bench.compare import compare
from gpuvm.bench.environment import SCRIPT, capture, differences, parse_probe
from gpuvm.bench.results import (Benchmark, Environment, GpuState, Point, Repeat, Results, load_results,
                                 save_results)
from gpuvm.executors.base import CommandResult
from gpuvm.executors.fake import FakeExecutor
from gpuvm.parsers.nvidia_smi_q import parse_nvidia_smi_q

TOOLS = Path(__file__).parent.parent / "fixtures" / "tools"
STUDY = Path(__file__).parents[2] / "playbooks" / "results"


def smi(name: str) -> str:
    return (TOOLS / name).read_text()


def test_nvidia_smi_q_of_a_recent_driver_two_h100s_one_power_capped():
    report = parse_nvidia_smi_q(smi("nvidia_smi_q_h100_550.txt"))
    assert (report.driver, report.cuda) == ("550.90.07", "12.4")
    first, second = report.gpus
    assert first.bus_id == "00000000:1B:00.0" and first.performance_state == "P0"
    assert first.clocks_mhz == {"graphics": 1755, "sm": 1755, "memory": 2619, "video": 1590}
    assert first.max_clocks_mhz["sm"] == 1980 and first.applications_clocks_mhz == {"graphics": 1980, "memory": 2619}
    assert (first.temperature_c, first.power_w, first.power_limit_w) == (61, 684.21, 700)  # Average, not N/A
    assert first.throttle_reasons == ["SW Power Cap"]  # "Clocks Event Reasons"; the counters are not reasons
    assert second.throttle_reasons == [] and second.clocks_mhz["sm"] == 1980


def test_nvidia_smi_q_of_an_older_driver_with_a_nested_thermal_slowdown():
    report = parse_nvidia_smi_q(smi("nvidia_smi_q_a100_470.txt"))
    assert (report.driver, report.cuda) == ("470.82.01", "11.4")
    (gpu,) = report.gpus
    assert gpu.throttle_reasons == ["HW Thermal Slowdown"]  # "Clocks Throttle Reasons", nested under HW Slowdown
    assert (gpu.temperature_c, gpu.power_w, gpu.power_limit_w) == (86, 388.72, 400)  # "Power Readings"
    assert gpu.applications_clocks_mhz["graphics"] == 1095 and gpu.clocks_mhz["sm"] == 1275


def probe_answer(smi_text: str = "", governor: str = "performance\n") -> str:
    return (f"@@load\n0.52 0.40 0.31 1/812 40211\n@@governor\n{governor}@@frameworks\ntorch 2.3.1+cu121\n"
            f"horovod 0.28.1\n@@nvidia-smi\n{smi_text}")


def test_probe_answer_read_part_by_part_and_missing_parts_left_out():
    env = parse_probe(probe_answer(smi("nvidia_smi_q_h100_550.txt"), governor="ondemand\nperformance\n"))
    assert env.load == [0.52, 0.40, 0.31] and env.governor == "ondemand, performance"
    assert env.frameworks == {"torch": "2.3.1+cu121", "horovod": "0.28.1"}
    assert (env.driver, env.cuda, len(env.gpus)) == ("550.90.07", "12.4", 2)
    bare = parse_probe("@@load\n@@governor\n@@frameworks\n@@nvidia-smi\n")  # no GPU, no cpufreq, no python
    assert bare == Environment()


def test_the_probe_script_runs_in_a_plain_shell_without_gpu_tools():
    done = subprocess.run(["sh", "-c", SCRIPT], capture_output=True, text=True, timeout=30,
                          env={"PATH": "/usr/bin:/bin"})
    assert done.returncode == 0
    env = parse_probe(done.stdout)
    assert env.load is not None and len(env.load) == 3  # Linux: /proc/loadavg


def test_capture_runs_one_script_per_machine_and_skips_those_that_cannot_answer():
    answer = probe_answer(smi("nvidia_smi_q_a100_470.txt"))
    vm1 = FakeExecutor("vm1", {re.compile("@@load"): CommandResult("", 0, answer, "")})
    vm2 = FakeExecutor("vm2", {})  # unmatched: exits 127 with nothing printed
    found = capture({"vm1": vm1, "vm2": vm2}, ["vm1", "vm2"])
    assert list(found) == ["vm1"] and found["vm1"].gpus[0].throttle_reasons == ["HW Thermal Slowdown"]
    assert len(vm1.calls) == 1 and len(vm2.calls) == 1


def gpu(sm: float = 1980, reasons: list[str] | None = None, app: float = 1980, state: str = "P0") -> GpuState:
    return GpuState(bus_id="00000000:1B:00.0", performance_state=state, clocks_mhz={"sm": sm},
                    applications_clocks_mhz={"graphics": app}, throttle_reasons=reasons or [])


def results(envs: list[Environment | None], environment: str = "vm") -> Results:
    return Results(environment=environment, benchmarks=[Benchmark(name="b", kind="command", unit="u", points=[
        Point(nodes=1, repeats=[Repeat(value=100.0 + i, environment={"m": e} if e else None)
                                for i, e in enumerate(envs)])])])


SAME = dict(driver="550.90.07", cuda="12.4", frameworks={"torch": "2.3.1"}, governor="performance")


def test_same_environments_give_no_warning():
    vm = results([Environment(**SAME, gpus=[gpu(1980)]), Environment(**SAME, gpus=[gpu(1960)])])
    bm = results([Environment(**SAME, gpus=[gpu(1975)])] * 3, "bare-metal")
    assert differences(vm, bm) == []
    assert compare(vm, bm).environment_warnings == []


@pytest.mark.parametrize("vm_env, expected", [
    (Environment(**{**SAME, "driver": "535.183.01"}, gpus=[gpu()]), "driver differs: 535.183.01 here, 550.90.07"),
    (Environment(**{**SAME, "cuda": "12.2"}, gpus=[gpu()]), "CUDA differs: 12.2 here, 12.4"),
    (Environment(**{**SAME, "frameworks": {"torch": "2.1.0"}}, gpus=[gpu()]), "torch differs: 2.1.0 here, 2.3.1"),
    (Environment(**{**SAME, "governor": "powersave"}, gpus=[gpu()]), "CPU governor differs: powersave here"),
    (Environment(**SAME, gpus=[gpu(reasons=["SW Power Cap"])]), "throttle reasons active: SW Power Cap here, none"),
    (Environment(**SAME, gpus=[gpu(sm=1755)]), "GPU sm clocks under load differ by more than 3%: 1755 MHz here"),
    (Environment(**SAME, gpus=[gpu(app=1410)]), "GPU graphics application clocks differ"),
])
def test_each_difference_is_warned(vm_env, expected):
    bm = results([Environment(**SAME, gpus=[gpu()])] * 3, "bare-metal")
    (warning,) = differences(results([vm_env] * 3), bm)
    assert expected in warning


def test_idle_gpus_and_small_clock_differences_are_not_warned():
    bm = results([Environment(**SAME, gpus=[gpu()])], "bare-metal")
    idle = Environment(**SAME, gpus=[gpu(sm=210, reasons=["Idle"], state="P8")])  # read between runs
    close = Environment(**SAME, gpus=[gpu(sm=1950)])  # 1.5 %
    assert differences(results([idle, close]), bm) == []


def test_no_warning_when_a_side_recorded_no_environment():
    """The bundled study (gpuvm-results/1, published means) has none: nothing to compare."""
    study = load_results(STUDY / "study-vm")
    assert study.format == "gpuvm-results/1"
    assert compare(results([Environment(driver="1")]), study).environment_warnings == []


def test_results_keep_the_environment_and_compare_warns_in_text_and_json(tmp_path):
    from typer.testing import CliRunner

    from gpuvm.cli.main import app
    from tests.schema_check import check

    save_results(tmp_path / "vm", results([Environment(**{**SAME, "driver": "535.183.01"}, gpus=[gpu()])] * 3))
    save_results(tmp_path / "bm", results([Environment(**SAME, gpus=[gpu()])] * 3, "bare-metal"))
    saved = json.loads((tmp_path / "vm" / "results.json").read_text())
    assert saved["format"] == "gpuvm-results/2"
    assert saved["benchmarks"][0]["points"][0]["repeats"][0]["environment"]["m"]["driver"] == "535.183.01"
    assert load_results(tmp_path / "vm").benchmarks[0].points[0].repeats[0].environment["m"].gpus[0].clocks_mhz

    runner = CliRunner()
    text = runner.invoke(app, ["bench", "compare", str(tmp_path / "vm"), "--baseline", str(tmp_path / "bm")])
    assert text.exit_code == 0, text.output
    assert "Warning: environments differ: driver differs: 535.183.01 here, 550.90.07 in the baseline" in \
        " ".join(text.output.split())
    out = runner.invoke(app, ["bench", "compare", str(tmp_path / "vm"), "--baseline", str(tmp_path / "bm"), "--json"])
    document = json.loads(out.stdout[:out.stdout.rindex("}") + 1])
    assert check(document) == "bench-compare"
    assert document["environment_warnings"] == ["driver differs: 535.183.01 here, 550.90.07 in the baseline"]


def test_a_campaign_records_each_machines_environment_with_every_repeat(tmp_path):
    from tests.unit.test_bench_run import campaign, fake, one_run

    answers = iter([probe_answer(smi("nvidia_smi_q_a100_470.txt")), probe_answer(), probe_answer(), probe_answer()])
    machines = {vm: fake(vm) for vm in ("vm1", "vm2")}
    for executor in machines.values():
        executor.responses = {re.compile("@@load"): lambda call: CommandResult("", 0, next(answers), ""),
                              **executor.responses}
    done, _ = campaign(tmp_path, one_run(kind="horovod_synthetic", nodes=[1, 2], repeats=1), machines)
    [bench] = load_results(done.results_file).benchmarks
    one, two = (p.repeats[0].environment for p in bench.points)
    assert list(one) == ["vm1"] and one["vm1"].gpus[0].throttle_reasons == ["HW Thermal Slowdown"]
    assert sorted(two) == ["vm1", "vm2"] and two["vm2"].frameworks["torch"] == "2.3.1+cu121"
    probes = [c for ex in machines.values() for c in ex.calls if "@@load" in c.command]
    assert len(probes) == 3  # one script per machine per repeat


def test_capture_talks_to_every_guest_of_a_large_campaign_at_once():
    # 16 guests answer only once all 16 have been asked: eight at a time would wait out the barrier
    everyone = threading.Barrier(16, timeout=5)

    def answer(call):
        everyone.wait()
        return CommandResult("", 0, probe_answer(""), "")

    executors = {f"vm{i}": FakeExecutor(f"vm{i}", {re.compile("@@load"): answer}) for i in range(16)}
    assert sorted(capture(executors, list(executors))) == sorted(executors)
