"""Benchmark: `gpuvm plan`, `plan --json` and `inventory` as a user runs them (one process each),
against the simulator at 128 and 512 hosts with 8 VMs each.

Next to them, measured in the same run on the same simulator: the floor (one RetrievePropertiesEx
with gpuvm's property lists, decoded by pyVmomi, in-process), gpuvm's own read of it (its pages read
by vsphere/inventory_xml.py, as read_inventory reads them) and the naive per-object pyVmomi walk
most scripts do. Requests are counted on the wire by gpusim itself (`Simulator.requests`), logins
included. Commands alternate, and each figure is the median of `--runs` runs (the naive walk runs
once per size: it is the slow baseline). Run: `.venv/bin/python bench/plan_scaling.py
[--sizes 128,512] [--vms-per-host 8] [--runs 3]`.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))
sys.path.insert(0, str(REPO / "simulator"))

from gpusim import Simulator  # noqa: E402

from gpuvm.runbook.loader import load_runbook  # noqa: E402
from gpuvm.vsphere import inventory_xml, retrieve  # noqa: E402
from gpuvm.vsphere.session import Session, resolve_target  # noqa: E402

GPUVM = str(Path(sys.executable).parent / "gpuvm")
COMMANDS = {"plan": ["plan"], "plan --json": ["plan", "--json"], "inventory": ["inventory"]}


def write_runbook(path: Path, hosts: int, vms_per_host: int) -> None:
    lines = ["vcenter: {password_env: GPUVM_VCENTER_PASSWORD}", "hosts:"]
    for h in range(1, hosts + 1):
        lines.append(f"  - {{name: esx-{h:02d}, passthrough: [{{model: A100}}], allow_maintenance: true, allow_reboot: true}}")
    lines.append("vms:")
    for h in range(1, hosts + 1):
        for v in range(1, vms_per_host + 1):
            gpus = ", gpus: {mode: passthrough, count: 1}" if v <= 4 else ""
            lines.append(f"  - {{name: esx-{h:02d}-vm{v}, host: esx-{h:02d}, cpus: 16, memory_gb: 64{gpus}}}")
    path.write_text("\n".join(lines) + "\n")


def naive_walk(session: Session) -> int:
    """Read the same facts object by object, like a typical pyvmomi script."""
    from pyVmomi import vim

    content = session.content
    view = content.viewManager.CreateContainerView(content.rootFolder, [vim.HostSystem], True)
    seen = 0
    try:
        for host in view.view:
            _ = (host.name, host.hardware.pciDevice, host.config.pciPassthruInfo, host.config.graphicsConfig,
                 host.runtime.connectionState)
            for vm in host.vm:
                _ = (vm.name, vm.runtime.powerState, vm.config.hardware.device, vm.config.extraConfig)
                seen += 1
    finally:
        view.DestroyView()
    return seen


def pyvmomi_read(session: Session) -> list:
    """The floor: gpuvm's one inventory read, decoded by pyVmomi (the stub's own call)."""
    session.call = lambda mo, method, *args: getattr(mo, method)(*args)  # type: ignore[method-assign]
    session.send = lambda mo, method, *args: lambda parse=None: getattr(mo, method)(*args)  # type: ignore[method-assign]
    return retrieve.retrieve(session)


def gpuvm_read(session: Session) -> list:
    """gpuvm's read as read_inventory makes it: the pages read by inventory_xml."""
    return retrieve.retrieve(session, parse=inventory_xml.parse_page)


def timed_in_process(sim: Simulator, target, read) -> tuple[float, int]:
    """Seconds of `read(session)` after login, and the requests it made on the wire."""
    with Session(target) as session:
        sim.requests(reset=True)
        start = time.perf_counter()
        read(session)
        seconds = time.perf_counter() - start
        return seconds, sum(sim.requests().values())


def timed_cli(sim: Simulator, args: list[str], runbook: Path, env: dict[str, str]) -> tuple[float, int]:
    sim.requests(reset=True)
    start = time.perf_counter()
    subprocess.run([GPUVM, *args, str(runbook)], check=True, stdout=subprocess.DEVNULL, env=env)
    return time.perf_counter() - start, sum(sim.requests().values())


def measure(hosts: int, vms_per_host: int, runs: int, work: Path) -> dict[str, object]:
    runbook = work / f"rb-{hosts}.yaml"
    write_runbook(runbook, hosts, vms_per_host)
    started = time.perf_counter()
    with Simulator(hosts=hosts, vms_per_host=vms_per_host) as sim:
        print(f"{hosts} hosts: simulator up in {time.perf_counter() - started:.0f} s", file=sys.stderr, flush=True)
        env = {**os.environ, "GOVC_URL": sim.url, "GOVC_TLS_CA_CERTS": str(sim.cert_file),
               "GOVC_USERNAME": sim.username, "GPUVM_VCENTER_PASSWORD": sim.password,
               "GPUVM_STATE_DIR": str(work / "state"), "COLUMNS": "160"}
        os.environ.update(env)
        target = resolve_target(load_runbook(runbook).vcenter)
        samples: dict[str, list[float]] = {name: [] for name in [*COMMANDS, "floor", "gpuvm read"]}
        requests: dict[str, int] = {}
        for _ in range(runs):
            for name, args in COMMANDS.items():
                seconds, requests[name] = timed_cli(sim, args, runbook, env)
                samples[name].append(seconds)
            seconds, requests["floor"] = timed_in_process(sim, target, pyvmomi_read)
            samples["floor"].append(seconds)
            seconds, requests["gpuvm read"] = timed_in_process(sim, target, gpuvm_read)
            samples["gpuvm read"].append(seconds)
        naive_s, requests["naive walk"] = timed_in_process(sim, target, naive_walk)
    medians = {name: statistics.median(values) for name, values in samples.items()}
    medians["naive walk"] = naive_s
    return {"hosts": hosts, "vms": hosts * vms_per_host, "seconds": medians, "requests": requests}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sizes", default="128,512")
    parser.add_argument("--vms-per-host", type=int, default=8)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for size in (int(s) for s in args.sizes.split(",")):
            rows.append(measure(size, args.vms_per_host, args.runs, Path(tmp)))
    names = [*COMMANDS, "gpuvm read", "floor", "naive walk"]
    print(f"medians of {args.runs} run(s) (naive walk: 1); x floor = seconds / the floor's seconds in the same run")
    print(f"{'reader':<12}" + "".join(f"{str(r['hosts']) + ' hosts: s':>15} {'x floor':>8} {'requests':>9}" for r in rows))
    for name in names:
        cells = "".join(f"{r['seconds'][name]:>15.2f} {r['seconds'][name] / r['seconds']['floor']:>8.2f} "
                        f"{r['requests'][name]:>9}" for r in rows)
        print(f"{name:<12}{cells}")
    print("(CLI rows: the whole process, login and logout included; floor and gpuvm read: in-process, after login)")
    last, first = rows[-1], rows[0]
    growth = {name: last["seconds"][name] / first["seconds"][name] for name in COMMANDS}
    span = f"{first['hosts']}_to_{last['hosts']}"
    print(f"growth {first['hosts']} → {last['hosts']} hosts: "
          + ", ".join(f"{name} {g:.2f}x" for name, g in growth.items()))
    print(f"plan_x_floor_{last['hosts']}={last['seconds']['plan'] / last['seconds']['floor']:.2f} "
          f"json_x_floor_{last['hosts']}={last['seconds']['plan --json'] / last['seconds']['floor']:.2f} "
          f"inventory_x_floor_{last['hosts']}={last['seconds']['inventory'] / last['seconds']['floor']:.2f} "
          f"plan_growth_{span}={growth['plan']:.2f} json_growth_{span}={growth['plan --json']:.2f} "
          f"inventory_growth_{span}={growth['inventory']:.2f} "
          f"plan_requests_{last['hosts']}={last['requests']['plan']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
