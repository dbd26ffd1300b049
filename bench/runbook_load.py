"""Benchmark: loading a runbook of 512 hosts x 8 VMs (4,096 VMs), next to ruamel.yaml's round-trip
loader reading the same text (what the loader used for every runbook before fast_yaml) in the same
run. The same 4,096 VMs are also loaded written as VM groups (8 groups, one per VM slot, spread over
every host: the group path, `runbook/groups.py`), and as the plain list plus one small group (every
plain entry then goes through the group expansion too). Wall and CPU seconds, median of `--runs`.
Run: `.venv/bin/python bench/runbook_load.py [--hosts 512] [--runs 5]`."""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))
sys.path.insert(0, str(REPO / "bench"))

from plan_scaling import write_runbook  # noqa: E402

from gpuvm.runbook.loader import load_runbook  # noqa: E402


def write_grouped_runbook(path: Path, hosts: int, vms_per_host: int) -> None:
    """`write_runbook`'s VMs as VM groups: group v holds every host's v-th VM (round robin over the
    hosts, one each), the first 4 with a passthrough GPU."""
    names = [f"esx-{h:02d}" for h in range(1, hosts + 1)]
    lines = ["vcenter: {password_env: GPUVM_VCENTER_PASSWORD}", "hosts:"]
    for name in names:
        lines.append(f"  - {{name: {name}, passthrough: [{{model: A100}}], allow_maintenance: true, allow_reboot: true}}")
    lines.append("vms:")
    for v in range(1, vms_per_host + 1):
        gpus = ", gpus: {mode: passthrough, count: 1}" if v <= 4 else ""
        lines.append(f"  - {{name: 'vm{v}-{{n:04d}}', hosts: [{', '.join(names)}], cpus: 16, memory_gb: 64{gpus}}}")
    path.write_text("\n".join(lines) + "\n")


def write_mixed_runbook(path: Path, hosts: int, vms_per_host: int) -> None:
    """`write_runbook`'s plain list and one group of 2 VMs after it."""
    write_runbook(path, hosts, vms_per_host)
    path.write_text(path.read_text() + "  - {name: 'extra-{n}', count: 2, hosts: [esx-01], cpus: 2, memory_gb: 4}\n")


def timed(fn, runs: int) -> tuple[float, float]:
    wall, cpu = [], []
    for _ in range(runs):
        start, start_cpu = time.perf_counter(), time.process_time()
        fn()
        wall.append(time.perf_counter() - start)
        cpu.append(time.process_time() - start_cpu)
    return statistics.median(wall), statistics.median(cpu)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--hosts", type=int, default=512)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    from ruamel.yaml import YAML

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "rb.yaml"
        write_runbook(path, args.hosts, 8)
        vms = len(load_runbook(path).vms)
        load_s, load_cpu = timed(lambda: load_runbook(path), args.runs)
        grouped = Path(tmp) / "grouped.yaml"
        write_grouped_runbook(grouped, args.hosts, 8)
        group_vms = len(load_runbook(grouped).vms)
        group_s, group_cpu = timed(lambda: load_runbook(grouped), args.runs)
        mixed = Path(tmp) / "mixed.yaml"
        write_mixed_runbook(mixed, args.hosts, 8)
        mixed_vms = len(load_runbook(mixed).vms)
        mixed_s, mixed_cpu = timed(lambda: load_runbook(mixed), args.runs)
        text = path.read_text()
        ruamel_s, ruamel_cpu = timed(lambda: YAML(typ="rt").load(text), max(1, args.runs // 2))
    print(f"{'reader':<34} {'wall s':>7} {'CPU s':>7}")
    print(f"{'load_runbook (validated)':<34} {load_s:>7.3f} {load_cpu:>7.3f}   {vms} VMs, plain list")
    print(f"{'load_runbook, as VM groups':<34} {group_s:>7.3f} {group_cpu:>7.3f}   {group_vms} VMs, 8 groups")
    print(f"{'load_runbook, plain + one group':<34} {mixed_s:>7.3f} {mixed_cpu:>7.3f}   {mixed_vms} VMs")
    print(f"{'ruamel round-trip parse alone':<34} {ruamel_s:>7.3f} {ruamel_cpu:>7.3f}")
    print(f"vms={vms} load_s={load_s:.3f} load_cpu_s={load_cpu:.3f} group_load_s={group_s:.3f} "
          f"mixed_load_s={mixed_s:.3f} ruamel_ratio={ruamel_s / load_s:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
