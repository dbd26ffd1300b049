"""Benchmark: SOAP requests and wall time of `gpuvm plan` against the simulator, by inventory size.

Side by side with a naive per-object pyvmomi walk measured in the same run (the way most scripts
read vSphere: attribute by attribute, one round trip each). Run: `make bench` or
`.venv/bin/python bench/plan_scaling.py [--sizes 4,32,128] [--vms-per-host 8]`.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))
sys.path.insert(0, str(REPO / "simulator"))

from gpusim import Simulator  # noqa: E402

from gpuvm.engine import make_plan  # noqa: E402
from gpuvm.runbook.loader import load_runbook  # noqa: E402
from gpuvm.vsphere.inventory import read_inventory  # noqa: E402
from gpuvm.vsphere.session import RequestCounter, Session, resolve_target  # noqa: E402


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


def measure(hosts: int, vms_per_host: int, work: Path) -> dict[str, float]:
    runbook_path = work / f"rb-{hosts}.yaml"
    write_runbook(runbook_path, hosts, vms_per_host)
    with Simulator(hosts=hosts, vms_per_host=vms_per_host) as sim:
        os.environ.update(GOVC_URL=sim.url, GOVC_TLS_CA_CERTS=str(sim.cert_file), GOVC_USERNAME=sim.username,
                          GPUVM_VCENTER_PASSWORD=sim.password)
        book = load_runbook(runbook_path)
        target = resolve_target(book.vcenter)
        start = time.perf_counter()
        with Session(target) as session:
            plan, _ = make_plan(book, read_inventory(session))
            requests = session.counter.total
        plan_s = time.perf_counter() - start
        start = time.perf_counter()
        with Session(target, RequestCounter()) as session:
            naive_walk(session)
            naive_requests = session.counter.total
        naive_s = time.perf_counter() - start
    return {"hosts": hosts, "vms": hosts * vms_per_host, "changes": len(plan.changes), "requests": requests,
            "plan_s": plan_s, "naive_requests": naive_requests, "naive_s": naive_s}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sizes", default="4,32,128")
    parser.add_argument("--vms-per-host", type=int, default=8)
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for size in (int(s) for s in args.sizes.split(",")):
            rows.append(measure(size, args.vms_per_host, Path(tmp)))
    print(f"{'hosts':>5} {'VMs':>5} {'changes':>7} {'requests':>8} {'plan s':>7} {'naive req':>9} {'naive s':>7} {'req ratio':>9}")
    for r in rows:
        print(f"{r['hosts']:>5} {r['vms']:>5} {r['changes']:>7} {r['requests']:>8} {r['plan_s']:>7.2f} "
              f"{r['naive_requests']:>9} {r['naive_s']:>7.2f} {r['naive_requests'] / r['requests']:>9.1f}")
    last = rows[-1]
    print("(requests exclude login/logout; plan s = connect + one inventory read + planning every step)")
    print(f"requests_{last['hosts']}={last['requests']} plan_s_{last['hosts']}={last['plan_s']:.2f} "
          f"naive_ratio={last['naive_s'] / last['plan_s']:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
