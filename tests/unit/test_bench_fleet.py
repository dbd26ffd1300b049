"""bench/fleet.py: the four parts' last lines read, combined and held against issue 27's goals
(the benchmarks themselves are not run: their output is made up here)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "fleet.py"


@pytest.fixture(scope="module")
def fleet():
    spec = importlib.util.spec_from_file_location("bench_fleet", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the file runs
    spec.loader.exec_module(module)
    yield module
    del sys.modules[spec.name]


def fake_outputs(guests: int = 64, *, multi="2.10", floor="2.40", rounds="6", hop="5.10", operator="0",
                 overhead="1.70") -> dict[str, tuple[int, list[str], list[str]]]:
    """Each script's (exit code, stdout lines, stderr lines), shaped as it prints them."""
    return {
        "plan_vcenters.py": (0, ["ratio of medians 2.3; of the best runs 2.1\n",
                                 f"multi_vcenter_x_single={multi}\n"], ["4 simulators up in 40 s\n"]),
        "wire_floor.py": (0, ["  gpuvm plan (whole process): 3.60 s\n", f"plan_x_wire_floor={floor}\n", "\n"], []),
        "image_fanout.py": (0, [f"{guests:>6}   30.00      6     7     5.10          0       -               -\n",
                                f"image_rounds_{guests}={rounds} tree_x_hop_{guests}={hop} bound_{guests}=7 "
                                f"operator_image_bytes={operator}\n"], ["  one hop: 5.88 s\n"]),
        "campaign_scale.py": (0, [f"overhead_4=10.00 overhead_{guests}=17.00 gpuvm_cpu_{guests}_over_4=3.00 "
                                  f"overhead_{guests}_over_4={overhead}\n"], []),
    }


def run_fleet(fleet, mocker, capsys, outputs, argv=()):
    mocker.patch.object(fleet, "run_script", side_effect=lambda part: outputs[part.script])
    code = fleet.main(list(argv))
    return code, capsys.readouterr().out.splitlines()


def test_all_parts_combine_into_the_issues_last_line(fleet, mocker, capsys):
    code, lines = run_fleet(fleet, mocker, capsys, fake_outputs())
    assert code == 0
    assert lines[-1] == ("multi_vcenter_x_single=2.10 plan_x_wire_floor=2.40 image_rounds_64=6 "
                         "operator_image_bytes=0 overhead_64_over_4=1.70")
    goals = [line for line in lines if line.startswith("  ")]
    assert len(goals) == 6 and all(line.endswith("  met") for line in goals)


def test_each_goal_beyond_its_bound_is_not_met_but_the_run_succeeds(fleet, mocker, capsys):
    outputs = fake_outputs(multi="2.51", floor="3.20", rounds="8", hop="7.50", operator="1048576", overhead="2.30")
    code, lines = run_fleet(fleet, mocker, capsys, outputs)
    assert code == 0
    goals = [line for line in lines if line.startswith("  ")]
    assert len(goals) == 6 and all(line.endswith("NOT met") for line in goals)
    assert "image_rounds_64=8" in lines[-1] and "operator_image_bytes=1048576" in lines[-1]


def test_a_failed_part_prints_na_names_itself_and_exits_non_zero(fleet, mocker, capsys):
    outputs = fake_outputs()
    outputs["image_fanout.py"] = (1, ["image distribution on the test bed\n"],
                                  ["Traceback (most recent call last):\n",
                                   "SystemExit: mesh failed on 3 guest(s); the first: gpu-vm-07 refused\n"])
    code, lines = run_fleet(fleet, mocker, capsys, outputs)
    assert code == 1
    assert ("part failed: image_fanout.py: exit 1: SystemExit: mesh failed on 3 guest(s); the first: "
            "gpu-vm-07 refused") in lines
    assert lines[-1] == ("multi_vcenter_x_single=2.10 plan_x_wire_floor=2.40 image_rounds_64=NA "
                         "operator_image_bytes=NA overhead_64_over_4=1.70")
    assert any("image_rounds_64=NA  NA (part failed)" in line for line in lines)


def test_a_part_whose_last_line_lacks_its_figures_fails(fleet, mocker, capsys):
    outputs = fake_outputs()
    outputs["campaign_scale.py"] = (0, ["guests plan_s apply_s\n", "     4    0.20    0.30\n"], [])
    code, lines = run_fleet(fleet, mocker, capsys, outputs)
    assert code == 1
    assert any(line.startswith("part failed: campaign_scale.py: its last line has no overhead_64_over_4")
               for line in lines)
    assert lines[-1].endswith("overhead_64_over_4=NA")


def test_a_figure_that_is_not_a_number_fails_its_part(fleet, mocker, capsys):
    code, lines = run_fleet(fleet, mocker, capsys, fake_outputs(floor="nan%"))
    assert code == 1
    assert "part failed: wire_floor.py: not a number: plan_x_wire_floor=nan%" in lines
    assert "plan_x_wire_floor=NA" in lines[-1]


def test_sizes_pass_through_and_keys_name_the_guest_count(fleet, mocker, capsys):
    outputs = fake_outputs(guests=8, rounds="4", hop="3.90")
    code, lines = run_fleet(fleet, mocker, capsys, outputs,
                            ["--vcenters", "2", "--hosts", "64", "--guests", "8", "--runs", "1"])
    assert code == 0
    assert lines[-1] == ("multi_vcenter_x_single=2.10 plan_x_wire_floor=2.40 image_rounds_8=4 "
                         "operator_image_bytes=0 overhead_8_over_4=1.70")
    parts = {call.args[0].script: call.args[0].args for call in fleet.run_script.call_args_list}
    assert list(parts) == ["plan_vcenters.py", "wire_floor.py", "image_fanout.py", "campaign_scale.py"]
    assert parts["plan_vcenters.py"] == ("--vcenters", "2", "--hosts", "64", "--vms-per-host", "8", "--runs", "1")
    assert parts["wire_floor.py"] == ("--hosts", "64", "--vms-per-host", "8", "--runs", "1")
    assert parts["image_fanout.py"][:2] == ("--sizes", "4,8")
    assert parts["campaign_scale.py"] == ("--sizes", "4,8")
    assert any("≤ ⌈log2 8⌉ + 1 = 4 rounds" in line and line.endswith("  met") for line in lines)


def test_default_sizes_are_the_issues(fleet):
    args = fleet.parse_args([])
    by_script = {part.script: part.args for part in fleet.parts_for(args)}
    assert by_script["plan_vcenters.py"][:6] == ("--vcenters", "4", "--hosts", "512", "--vms-per-host", "8")
    assert by_script["campaign_scale.py"] == ("--sizes", "4,16,64")
    assert by_script["image_fanout.py"][:2] == ("--sizes", "4,16,64")


def test_four_guests_or_fewer_is_refused(fleet, capsys):
    with pytest.raises(SystemExit) as exit_:
        fleet.parse_args(["--guests", "4"])
    assert exit_.value.code == 2
    assert "--guests must be more than 4" in capsys.readouterr().err


def test_a_scripts_output_is_passed_through_prefixed_and_kept(fleet, mocker, tmp_path, capsys):
    """run_script with a tiny stand-in script (not a benchmark): both streams pass through as they
    come, each line named by its part, and come back for parsing."""
    (tmp_path / "stand_in.py").write_text("import sys\nprint('up', file=sys.stderr)\nprint('x=1')\nsys.exit(3)\n")
    mocker.patch.object(fleet, "BENCH", tmp_path)
    code, out, err = fleet.run_script(fleet.Part("stand_in.py", (), ("x",)))
    assert (code, out, err) == (3, ["x=1\n"], ["up\n"])
    shown = capsys.readouterr()
    assert (shown.out, shown.err) == ("[stand_in] x=1\n", "[stand_in] up\n")


def test_parts_run_this_checkouts_gpuvm_first(fleet):
    env = fleet.part_env({"PYTHONPATH": "/elsewhere/src", "HOME": "/root"})
    assert env["PYTHONPATH"].split(":") == [str(SCRIPT.parents[1] / "src"), "/elsewhere/src"]
    assert env["HOME"] == "/root" and env["PYTHONUNBUFFERED"] == "1"
    assert fleet.part_env({})["PYTHONPATH"] == str(SCRIPT.parents[1] / "src")


def test_parts_runs_only_the_parts_named_and_says_the_rest_were_not_run(fleet, mocker, capsys):
    outputs = fake_outputs()
    code, lines = run_fleet(fleet, mocker, capsys, outputs, ["--parts", "wire_floor.py"])
    assert code == 0
    assert [call.args[0].script for call in fleet.run_script.call_args_list] == ["wire_floor.py"]
    goals = [line for line in lines if line.startswith("  ")]
    assert [line.rsplit("  ", 1)[1] for line in goals] == ["NA (not run: --parts)", "met", *["NA (not run: --parts)"] * 4]
    assert lines[-1] == ("multi_vcenter_x_single=NA plan_x_wire_floor=2.40 image_rounds_64=NA "
                         "operator_image_bytes=NA overhead_64_over_4=NA")
