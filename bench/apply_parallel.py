"""Benchmark: applying 64 VM reconfigurations with 1 s of simulated task latency, in parallel vs one by one.

Each VM's reconfigure task stays running for the latency (gpusim -latency ReconfigVM_Task=1s), as
vCenter tasks do. Run: `.venv/bin/python bench/apply_parallel.py [--vms 64] [--latency 1s]`.
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

from gpuvm.engine import apply_plan, make_plan  # noqa: E402
from gpuvm.journal import Journal  # noqa: E402
from gpuvm.runbook.loader import load_runbook  # noqa: E402
from gpuvm.steps.base import Context  # noqa: E402
from gpuvm.vsphere.inventory import read_inventory  # noqa: E402
from gpuvm.vsphere.session import Session, resolve_target  # noqa: E402

HOSTS = 8


def runbook(path: Path, vms: int) -> Path:
    per_host = vms // HOSTS
    lines = ["vcenter: {password_env: GPUVM_VCENTER_PASSWORD}", "hosts:"]
    lines += [f"  - {{name: esx-{h:02d}}}" for h in range(1, HOSTS + 1)]
    lines.append("vms:")
    lines += [f"  - {{name: esx-{h:02d}-vm{v}, host: esx-{h:02d}, cpus: 16, memory_gb: 32, firmware: bios, power: off}}"
              for h in range(1, HOSTS + 1) for v in range(1, per_host + 1)]
    path.write_text("\n".join(lines) + "\n")
    return path


def timed_apply(vms: int, latency: str, parallel: int, work: Path) -> tuple[float, int]:
    with Simulator(hosts=HOSTS, vms_per_host=vms // HOSTS, latency={"ReconfigVM_Task": latency}) as sim:
        os.environ.update(GOVC_URL=sim.url, GOVC_TLS_CA_CERTS=str(sim.cert_file), GOVC_USERNAME=sim.username,
                          GPUVM_VCENTER_PASSWORD=sim.password)
        book = load_runbook(runbook(work / "rb.yaml", vms))
        with Session(resolve_target(book.vcenter)) as session:
            facts = read_inventory(session)
            plan, desired = make_plan(book, facts)
            start = time.perf_counter()
            outcome = apply_plan(plan, desired, Context(session, facts), Journal(work), parallel)
            seconds = time.perf_counter() - start
        assert not outcome.failed, outcome.failed
        return seconds, len(outcome.done)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--vms", type=int, default=64)
    parser.add_argument("--latency", default="1s")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        parallel_s, targets = timed_apply(args.vms, args.latency, 64, Path(tmp))
        serial_s, _ = timed_apply(args.vms, args.latency, 1, Path(tmp))
    print(f"{'mode':<12} {'VMs':>4} {'seconds':>8}")
    print(f"{'parallel 64':<12} {targets:>4} {parallel_s:>8.2f}")
    print(f"{'one by one':<12} {targets:>4} {serial_s:>8.2f}")
    print(f"apply_s_parallel={parallel_s:.2f} apply_s_serial={serial_s:.2f} speedup={serial_s / parallel_s:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
