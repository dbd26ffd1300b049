"""Launch files rendered from the runbook's guests: the Open MPI hostfile and horovodrun's -H list."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuvm.errors import InputError
from gpuvm.launch import guests_of, horovod_hosts, horovodrun_args, hostfile, total_slots, write_launch_files
from gpuvm.runbook.loader import load_runbook

HEADER = ""


def runbook(tmp_path: Path, slots: list[int | None]):
    names = [f"gpu-vm-{i:02d}" for i in range(1, len(slots) + 1)]
    lines = ["hosts: [{name: esx-01}]", "vms:" + (" []" if not slots else "")] + [f"  - {{name: {n}, host: esx-01}}" for n in names]
    lines += ["guests:", "  hosts:" + (" []" if not slots else "")]
    for i, (name, s) in enumerate(zip(names, slots)):
        extra = f", slots: {s}" if s is not None else ""
        lines.append(f"    - {{vm: {name}, ssh: {{address: 10.0.0.{11 + i}}}{extra}}}")
    (tmp_path / "rb.yaml").write_text("\n".join(lines) + "\n")
    return load_runbook(tmp_path / "rb.yaml")


@pytest.mark.parametrize("slots, host_lines, h_list, np", [
    ([None], ["10.0.0.11 slots=1"], "10.0.0.11:1", 1),
    ([1, 1, 1, 1], [f"10.0.0.{a} slots=1" for a in (11, 12, 13, 14)], "10.0.0.11:1,10.0.0.12:1,10.0.0.13:1,10.0.0.14:1", 4),
    ([2, 4], ["10.0.0.11 slots=2", "10.0.0.12 slots=4"], "10.0.0.11:2,10.0.0.12:4", 6),
])
def test_hostfile_and_horovodrun(tmp_path, slots, host_lines, h_list, np):
    guests = guests_of(runbook(tmp_path, slots))
    assert hostfile(guests) == HEADER + "".join(line + "\n" for line in host_lines)
    assert horovod_hosts(guests) == h_list
    assert total_slots(guests) == np
    assert horovodrun_args(guests) == ["-np", str(np), "-H", h_list]


def test_hostfile_parses_as_open_mpi_reads_it(tmp_path):
    text = hostfile(guests_of(runbook(tmp_path, [2, 1])))
    entries = [line.split() for line in text.splitlines() if line and not line.startswith("#")]
    assert [(host, int(slots.split("=")[1])) for host, slots in entries] == [("10.0.0.11", 2), ("10.0.0.12", 1)]


def test_write_launch_files(tmp_path):
    files = write_launch_files(runbook(tmp_path, [1, 2]), tmp_path / "out")
    assert files["hostfile"].read_text().endswith("10.0.0.11 slots=1\n10.0.0.12 slots=2\n")
    assert files["horovodrun_hosts"].read_text() == "10.0.0.11:1,10.0.0.12:2\n"


def test_no_guests_is_an_input_error(tmp_path):
    with pytest.raises(InputError, match="guests.hosts: no guests to launch on"):
        guests_of(runbook(tmp_path, []))


def test_a_guest_without_slots_takes_its_vms_gpu_count(tmp_path):
    (tmp_path / "rb.yaml").write_text(
        "hosts: [{name: esx-01}]\nvms:\n  - {name: vm1, host: esx-01, gpus: {mode: passthrough, count: 2}}\n"
        "  - {name: vm2, host: esx-01, gpus: {mode: vgpu, profile: grid_a100-4c, count: 3}, }\n"
        "guests:\n  hosts:\n    - {vm: vm1, ssh: {address: 10.0.0.11}}\n    - {vm: vm2, ssh: {address: 10.0.0.12}, slots: 1}\n")
    assert hostfile(guests_of(load_runbook(tmp_path / "rb.yaml"))) == "10.0.0.11 slots=2\n10.0.0.12 slots=1\n"
