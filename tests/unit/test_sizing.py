"""gpuvm size: the formulas as tables of cases, the GPU names vSphere prints, measured throughput
from results.json, and the command's table, JSON and errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpuvm.bench.results import Benchmark, Point, Repeat, Results, save_results
from gpuvm.cli.main import app
from gpuvm.errors import InputError
from gpuvm.sizing.estimate import GIB, model_memory, size, smallest_sharded
from gpuvm.sizing.measured import measured_throughput
from gpuvm.sizing.spec import SizingSpec
from gpuvm.sizing.tables import find_gpu


def gpuvm(*args: object):
    return CliRunner().invoke(app, ["size", *map(str, args)])


@pytest.mark.parametrize(("precision", "optimizer", "weights", "gradients", "state"), [
    ("fp32", "sgd", 4, 4, 0),
    ("fp32", "sgd-momentum", 4, 4, 4),
    ("fp32", "adam", 4, 4, 8),
    ("fp16", "adam", 2, 2, 12),  # ZeRO §3.1: 2 + 2 + 12 = 16 bytes per parameter
    ("bf16", "adamw", 2, 2, 12),
    ("bf16", "sgd-momentum", 2, 2, 8),
])
def test_bytes_per_parameter(precision, optimizer, weights, gradients, state):
    memory = model_memory(GIB, precision, optimizer, activation_bytes=0)
    assert (memory.weights, memory.gradients, memory.optimizer_state) == (weights, gradients, state)


def test_sharding_divides_only_the_optimizer_state():
    plain = model_memory(GIB, "fp16", "adam", activation_bytes=GIB)
    sharded = model_memory(GIB, "fp16", "adam", activation_bytes=GIB, shards=4)
    assert (sharded.weights, sharded.gradients, sharded.activations) == (plain.weights, plain.gradients, 1)
    assert sharded.optimizer_state == 3 and plain.total == 17


@pytest.mark.parametrize(("state", "usable", "expected"), [
    (12, 20, 1),  # 15 GiB of room hold all 12
    (12, 6, 12),  # 1 GiB of room: 12 shards
    (12, 5.5, 24),
    (12, 5, None),  # no room at all
    (0, 6, 1),
])
def test_smallest_sharded_count(state, usable, expected):
    full = model_memory(GIB, "fp16", "adam", activation_bytes=GIB)  # 2 + 2 + 1 = 5 GiB that never shard
    full = type(full)(full.weights, full.gradients, state, full.activations)
    assert smallest_sharded(full, usable) == expected


def test_seven_billion_parameters_with_adam_need_sharding_on_80gb():
    s = size(SizingSpec(parameters=7_000_000_000, forward_gflops=14_000, precision="bf16", optimizer="adam",
                        batch_per_gpu=1, gpus=8))
    assert s.memory.total > 80 and s.min_gpus is None  # 16 bytes x 7e9 = 104 GiB
    assert s.min_gpus_sharded == 2  # 26 GiB of weights and gradients stay; 78 GiB of state over 2 GPUs
    assert s.memory_sharded.optimizer_state == pytest.approx(s.memory.optimizer_state / 8)


def test_data_rate_reads_in_flight_and_epoch():
    """The issue's example: 4 VMs at 10,675 img/s need ~1.2 GB/s from storage at 110 KB per image."""
    spec = SizingSpec(model="resnet50", gpus=4, jobs=2, sample_kb=110, storage_latency_ms=2, io_kb=64,
                      dataset_samples=1_281_167, checkpoint_minutes=10)
    s = size(spec, measured=(10_675, "measured"))
    assert s.storage_gb_per_s == pytest.approx(10_675 * 110e3 * 2 / 1e9)  # x 2 jobs
    assert s.reads_per_s == pytest.approx(10_675 * 2 * 2)  # 110 KB in 64 KB reads: 2 each
    assert s.reads_in_flight == pytest.approx(s.reads_per_s * 0.002)  # Little's law
    assert s.epoch_minutes == pytest.approx(1_281_167 / 10_675 / 60)
    assert s.checkpoint_gb == pytest.approx(25_557_032 * 8 / 1e9)  # fp32 weights + momentum
    assert s.checkpoint_mb_per_s == pytest.approx(25_557_032 * 8 * 2 / 600 / 1e6)
    assert s.throughput_source == "measured"


def test_throughput_estimate_from_peak_and_forward_flops():
    s = size(SizingSpec(model="resnet50", precision="fp16", gpus=4, utilization=0.25))
    assert s.samples_per_s == pytest.approx(4 * 0.25 * 312e12 / (3 * 2 * 4.09e9))


def test_activation_assumption_is_printed_and_halved_for_mixed_precision():
    fp32 = size(SizingSpec(model="resnet50", batch_per_gpu=10))
    fp16 = size(SizingSpec(model="resnet50", batch_per_gpu=10, precision="fp16"))
    assert fp16.memory.activations == pytest.approx(fp32.memory.activations / 2)
    assert any("half of fp32" in note for note in fp16.assumptions)
    assert any("85.3 MB" in note for note in fp32.assumptions)


def test_a_model_by_parameter_count_needs_flops_for_an_estimate():
    with pytest.raises(InputError, match="forward_gflops"):
        size(SizingSpec(parameters=1_000_000))
    assert size(SizingSpec(parameters=1_000_000), measured=(100, "m")).samples_per_s == 100


@pytest.mark.parametrize(("name", "expected"), [
    ("GA100 [A100 PCIe 80GB]", "a100-80gb"),  # the simulator's and vSphere's PCI device name
    ("NVIDIA A100-SXM4-40GB", "a100-40gb"),  # nvidia-smi
    ("GH100 [H100 PCIe]", "h100-pcie"),
    ("Tesla V100-SXM2-32GB", "v100-32gb"),
    ("NVIDIA L40S", "l40s"),
    ("NVIDIA H200", "h200"),  # nvidia-smi on the SXM part
    ("NVIDIA H200 NVL", "h200-nvl"),
    ("GH100 [H200 NVL]", "h200-nvl"),  # the product in vSphere's brackets, not the die before them
    ("NVIDIA H100 NVL", "h100-nvl"),
    ("NVIDIA B200", "b200"),
    ("NVIDIA RTX PRO 6000 Blackwell Server Edition", "rtx-pro-6000"),
    ("NVIDIA RTX 6000 Ada Generation", None),  # another RTX 6000
    ("h100-sxm", "h100-sxm"),
    ("NVIDIA A100", None),  # which memory size: ambiguous
    ("NVIDIA H100 80GB HBM3", "h100-sxm"),  # nvidia-smi on SXM5 (the PCIe card says "H100 PCIe")
    ("NVIDIA H100", None),  # SXM or PCIe: ambiguous
    ("Radeon", None),
])
def test_gpu_names(name, expected):
    found = find_gpu(name)
    assert (found.name if found else None) == expected


def _results(tmp_path, values=(2700.0, 2757.0, 2800.0), unit="img/sec"):
    bench = Benchmark(name="rn50", kind="pytorch_train", unit=unit, points=[
        Point(nodes=1, repeats=[Repeat(value=1000.0)]),
        Point(nodes=4, repeats=[Repeat(value=v) for v in values] + [Repeat(error="timed out")]),
    ])
    return save_results(tmp_path / "run", Results(environment="vm", benchmarks=[bench])).parent


def test_measured_throughput_is_the_median_of_the_largest_point(tmp_path):
    assert measured_throughput(_results(tmp_path)) == (2757.0, 4, "measured: rn50, 4 GPU(s), median of 3 run(s)")
    assert measured_throughput(_results(tmp_path), gpus=1)[:2] == (1000.0, 1)


def test_measured_throughput_errors(tmp_path):
    with pytest.raises(InputError, match="no benchmark 'x'"):
        measured_throughput(_results(tmp_path), "x")
    with pytest.raises(InputError, match="no successful run at 2 GPU"):
        measured_throughput(_results(tmp_path), gpus=2)
    with pytest.raises(InputError, match="give --benchmark: .*: none"):
        measured_throughput(_results(tmp_path, unit="GB/s"))


def test_command_prints_tables_and_assumptions():
    result = gpuvm("--model", "resnet50", "--precision", "fp16", "--batch-per-gpu", 1024, "--gpus", 4,
                   "--gpu", "GA100 [A100 PCIe 80GB]")
    assert result.exit_code == 0, result.output
    assert "resnet50, fp16, sgd-momentum, batch 1024 per GPU, 4 x a100-80gb" in result.output
    for text in ("Memory per GPU", "smallest GPU count", "storage must deliver", "Little's law", "Assumptions:"):
        assert text in result.output


def test_command_json_with_measured_results(tmp_path):
    result = gpuvm("--model", "resnet50", "--results", _results(tmp_path), "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["schema"] == "gpuvm.size/1" and data["inputs"]["gpus"] == 4
    assert data["samples_per_s"] == 2757.0
    assert data["storage_gb_per_s"] == pytest.approx(2757 * 110e3 / 1e9, abs=1e-4)
    assert data["throughput_source"].startswith("measured: rn50")


def test_command_reads_the_runbook_section_and_flags_override(tmp_path):
    book = tmp_path / "book.yaml"
    book.write_text("sizing:\n  model: resnet18\n  gpus: 2\n  sample_kb: 50\n")
    data = json.loads(gpuvm(book, "--gpus", 3, "--json").stdout)
    assert (data["inputs"]["model"], data["inputs"]["gpus"], data["inputs"]["sample_kb"]) == ("resnet18", 3, 50)


@pytest.mark.parametrize(("args", "message"), [
    (["--model", "resnet5"], "--model: 'resnet5' is not in gpuvm's table"),
    (["--model", "resnet50", "--gpu", "radeon"], "--gpu: 'radeon' is not a GPU of gpuvm's table"),
    (["--model", "resnet50", "--gpus", 0], "--gpus: Input should be greater than or equal to 1"),
    ([], "give model (resnet18"),
])
def test_command_errors_name_the_flag(args, message):
    result = gpuvm(*args)
    assert result.exit_code == 2 and message in result.stderr and "Traceback" not in result.output


def test_runbook_errors_name_file_line_and_field(tmp_path):
    book = tmp_path / "book.yaml"
    book.write_text("sizing:\n  model: resnet50\n  gpu: radeon\n")
    result = gpuvm(book)
    assert result.exit_code == 2 and f"{book}:3" in result.stderr and "sizing.gpu" in result.stderr
    book.write_text("hosts: []\n")
    assert "no `sizing` section" in gpuvm(book).stderr


def test_json_output_matches_its_schema_file():
    from pathlib import Path

    import gpuvm as package

    schema = json.loads((Path(package.__file__).parent / "schemas" / "size.json").read_text())
    data = json.loads(gpuvm("--model", "resnet18", "--json").stdout)
    assert set(data) == set(schema["required"]) == set(schema["properties"])
    assert set(data["memory_gib_per_gpu"]["data_parallel"]) == set(schema["$defs"]["memory"]["required"])


# --inventory: the GPU model and count from a saved inventory. lab.json is what `gpuvm inventory
# --save` wrote from the simulator (2 hosts x 4 A100 80GB); the mixed one changes esx-02's GPUs to
# what `gpusim -gpu h100-80` gives (10de:2331, "GH100 [H100 PCIe]") and adds a GPU not in the table.
LAB = Path(__file__).parents[1] / "fixtures" / "inventory" / "lab.json"


def _mixed_inventory(tmp_path) -> Path:
    from gpuvm.vsphere.facts import Inventory, PciDevice

    inventory = Inventory.load(LAB)
    for device in inventory.hosts["esx-02"].gpus:
        device.device_id, device.device_name = 0x2331, "GH100 [H100 PCIe]"
    host = inventory.hosts["esx-01"]
    host.pci.append(PciDevice(id="0000:e3:00.0", vendor_id=0x10DE, device_id=0x2235, class_id=0x0302,
                              device_name="GA102GL [A40]", passthru_capable=True))
    host.gpu_memory_mb["0000:e3:00.0"] = 48 * 1024
    path = tmp_path / "mixed.json"
    inventory.save(path)
    return path


def test_inventory_gpus_by_model(tmp_path):
    from gpuvm.sizing.inventory import gpus_by_model

    lab = gpus_by_model(LAB)
    assert list(lab) == ["a100-80gb"] and lab["a100-80gb"].hosts == {"esx-01": 4, "esx-02": 4}
    mixed = gpus_by_model(_mixed_inventory(tmp_path))
    assert {name: (m.known, m.hosts) for name, m in mixed.items()} == {
        "a100-80gb": (True, {"esx-01": 4}), "h100-pcie": (True, {"esx-02": 4}),
        "GA102GL [A40]": (False, {"esx-01": 1})}


def test_command_takes_the_gpu_model_and_count_from_the_inventory():
    data = json.loads(gpuvm("--model", "resnet50", "--inventory", LAB, "--json").stdout)
    assert (data["inputs"]["gpu"], data["inputs"]["gpus"], data["gpu"]["memory_gib"]) == ("a100-80gb", 8, 80)
    # one A100's TF32 rate (nearest DLE's 938 and Lambda's 1,066) x 8 x DLE's measured 8-GPU scaling (7.72 of 8)
    assert data["samples_per_s"] == pytest.approx(2 / (1 / 938 + 1 / 1066) * 7.72, rel=0.01)
    assert data["assumptions"][0] == (f"GPU: a100-80gb from the inventory {LAB} (8 on 2 host(s): esx-01, esx-02); "
                                      "the job uses all of them (--gpus for fewer)")
    table = gpuvm("--model", "resnet50", "--inventory", LAB)
    assert table.exit_code == 0 and "8 x a100-80gb" in table.output and "from the inventory" in table.output


def test_inventory_count_gives_way_to_gpus_from_flags_section_or_results(tmp_path):
    assert json.loads(gpuvm("--model", "resnet50", "--inventory", LAB, "--gpus", 2, "--json").stdout)["inputs"]["gpus"] == 2
    many = json.loads(gpuvm("--model", "resnet50", "--inventory", LAB, "--gpus", 16, "--json").stdout)
    assert many["inputs"]["gpus"] == 16 and "the job's 16 GPUs are more than it holds" in many["assumptions"][0]
    book = tmp_path / "book.yaml"
    book.write_text("sizing:\n  model: resnet18\n  gpus: 3\n")
    assert json.loads(gpuvm(book, "--inventory", LAB, "--json").stdout)["inputs"]["gpus"] == 3
    measured = json.loads(gpuvm("--model", "resnet50", "--inventory", LAB, "--results", _results(tmp_path),
                                "--json").stdout)
    assert measured["inputs"]["gpus"] == 4 and measured["samples_per_s"] == 2757.0


def test_several_models_in_the_inventory_need_gpu_to_pick(tmp_path):
    mixed = _mixed_inventory(tmp_path)
    result = gpuvm("--model", "resnet50", "--inventory", mixed)
    message = " ".join(result.stderr.split())
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert "holds several GPU models: a100-80gb (4 on 1 host(s): esx-01); h100-pcie (4 on 1 host(s): esx-02); " \
           "'GA102GL [A40]' (1 on 1 host(s): esx-01; not in gpuvm's table); pick one with --gpu" in message, message
    for pick in ("h100-pcie", "GH100 [H100 PCIe]"):  # the table's name or vSphere's
        data = json.loads(gpuvm("--model", "resnet50", "--inventory", mixed, "--gpu", pick, "--json").stdout)
        assert (data["inputs"]["gpu"], data["inputs"]["gpus"]) == ("h100-pcie", 4)
    book = tmp_path / "book.yaml"
    book.write_text("sizing:\n  model: resnet50\n  gpu: a100-80gb\n")
    data = json.loads(gpuvm(book, "--inventory", mixed, "--json").stdout)
    assert (data["inputs"]["gpu"], data["inputs"]["gpus"]) == ("a100-80gb", 4)


@pytest.mark.parametrize("pick", ["t4", "radeon", "a100-40gb"])
def test_a_gpu_not_in_the_inventory_names_those_it_holds(tmp_path, pick):
    result = gpuvm("--model", "resnet50", "--inventory", _mixed_inventory(tmp_path), "--gpu", pick)
    message = " ".join(result.stderr.split())
    assert result.exit_code == 2 and f"--gpu '{pick}'" in message and "not in the inventory" in message
    assert all(name in message for name in ("a100-80gb (4", "h100-pcie (4", "'GA102GL [A40]'")), message


def test_inventory_errors(tmp_path):
    from gpuvm.vsphere.facts import Inventory

    only_unknown = Inventory.load(LAB)
    only_unknown.hosts = {"esx-01": only_unknown.hosts["esx-01"]}
    for device in only_unknown.hosts["esx-01"].gpus:
        device.device_id, device.device_name = 0x2235, "GA102GL [A40]"
    only_unknown.hosts["esx-01"].gpu_memory_mb = {}
    none = Inventory.load(LAB)
    none.hosts = {}
    cases = [(only_unknown, "is not a GPU of gpuvm's table (a100-80gb, "), (none, "holds no NVIDIA GPU")]
    for i, (inventory, message) in enumerate(cases):
        inventory.save(tmp_path / f"{i}.json")
        result = gpuvm("--model", "resnet50", "--inventory", tmp_path / f"{i}.json")
        assert result.exit_code == 2 and message in " ".join(result.stderr.split()), result.stderr
    (tmp_path / "junk.json").write_text('{"format": "gpuvm-inventory/9"}')
    result = gpuvm("--model", "resnet50", "--inventory", tmp_path / "junk.json")
    assert result.exit_code == 2 and "junk.json: not a gpuvm inventory snapshot (format:" in result.stderr
    result = gpuvm("--model", "resnet50", "--inventory", tmp_path / "missing.json")
    assert result.exit_code == 2 and "missing.json: cannot read snapshot" in result.stderr


def test_results_whose_benchmark_read_a_dataset_size_its_samples_by_its_files(tmp_path):
    """`size --results` takes the dataset's file_kb as sample_kb (not the default 110 KB); a flag still wins."""
    from gpuvm.runbook.benchmarks import Dataset

    bench = Benchmark(name="rn18", kind="pytorch_train", unit="img/sec", dataset=Dataset(files=256, file_kb=40),
                      points=[Point(nodes=1, repeats=[Repeat(value=1000.0)])])
    results = save_results(tmp_path / "run", Results(environment="vm", benchmarks=[bench])).parent
    data = json.loads(gpuvm("--model", "resnet18", "--results", results, "--json").stdout)
    assert data["inputs"]["sample_kb"] == 40
    assert data["storage_gb_per_s"] == pytest.approx(1000 * 40e3 / 1e9, abs=1e-4)
    assert "sample_kb: 40 KB, the files of rn18's dataset (--results)" in data["assumptions"]
    given = json.loads(gpuvm("--model", "resnet18", "--results", results, "--sample-kb", 90, "--json").stdout)
    assert given["inputs"]["sample_kb"] == 90
    book = tmp_path / "book.yaml"
    book.write_text("sizing:\n  model: resnet18\n  sample_kb: 70\n")
    assert json.loads(gpuvm(book, "--results", results, "--json").stdout)["inputs"]["sample_kb"] == 70
