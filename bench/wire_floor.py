"""Benchmark: one vCenter's `gpuvm plan` against its wire floor, as whole processes, in one run.

The wire floor is a minimal Python process (stdlib http.client and ssl only) that logs in, creates
the ContainerView, sends the very RetrievePropertiesEx gpuvm's inventory read sends (its bytes
serialized here by pyVmomi from `retrieve.filter_spec`, the view's moid filled in by the child),
follows ContinueRetrievePropertiesEx pages, reads the answers' bytes without decoding them, destroys
the view and logs out. Next to it `gpuvm plan` of a runbook naming every host and VM of the same
simulator (bench/plan_scaling.py's). Runs alternate; each figure is the median of `--runs`.
Run: `.venv/bin/python bench/wire_floor.py [--hosts 512] [--vms-per-host 8] [--runs 3]`; it
prints `plan_x_wire_floor=R` last.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))
sys.path.insert(0, str(REPO / "simulator"))
sys.path.insert(0, str(REPO / "bench"))

from gpusim import Simulator  # noqa: E402
from plan_scaling import write_runbook  # noqa: E402

from gpuvm.runbook.loader import load_runbook  # noqa: E402
from gpuvm.vsphere import retrieve as inventory  # noqa: E402
from gpuvm.vsphere.session import Session, resolve_target  # noqa: E402

GPUVM = str(Path(sys.executable).parent / "gpuvm")
VIEW = "@@VIEW@@"  # where the child puts its own view's moid
TOKEN = "@@TOKEN@@"

# The child: stdlib only, started afresh (python -S -I: no site, no venv packages) like a tiny client.
FLOOR = r'''
import http.client, json, os, re, ssl, sys, time
start = time.perf_counter()
t = json.load(open(sys.argv[1]))
ctx = ssl.create_default_context(cafile=t["ca"])
conn = http.client.HTTPSConnection(t["host"], t["port"], context=ctx)
headers = {"SOAPAction": t["action"], "Content-Type": "text/xml; charset=UTF-8"}
def post(body):
    conn.request("POST", t["path"], body.encode(), headers)
    answer = conn.getresponse()
    data = answer.read()
    if answer.status != 200:
        sys.exit(f"{answer.status}: {data[:300]!r}")
    return answer, data
answer, _ = post(t["login"].replace("@@PASSWORD@@", os.environ["FLOOR_PASSWORD"]))
headers["Cookie"] = answer.getheader("Set-Cookie").split(";")[0]
_, data = post(t["create_view"])
view = re.search(rb"<returnval[^>]*>([^<]+)</returnval>", data).group(1).decode()
total, pages = 0, 0
_, data = post(t["retrieve"].replace("@@VIEW@@", view))
while True:
    total, pages = total + len(data), pages + 1
    token = re.search(rb"<token>([^<]+)</token>", data[-400:])  # the token closes the answer
    if not token:
        break
    _, data = post(t["continue"].replace("@@TOKEN@@", token.group(1).decode()))
post(t["destroy"].replace("@@VIEW@@", view))
post(t["logout"])
print(json.dumps({"bytes": total, "pages": pages, "seconds": time.perf_counter() - start}))
'''


def templates(sim: Simulator, target, work: Path) -> Path:
    """The requests the floor sends, serialized by pyVmomi exactly as gpuvm's stub serializes them."""
    from pyVmomi import vim, vmodl

    with Session(target) as session:
        stub, content = session.si._stub, session.content
        view = content.viewManager.CreateContainerView(content.rootFolder,
                                                       [getattr(vim, t) for t in inventory.VIEW_TYPES], True)
        try:
            collector = content.propertyCollector
            options = vmodl.query.PropertyCollector.RetrieveOptions(maxObjects=inventory.PAGE_SIZE)

            def request(mo, method, *args) -> str:
                return stub.SerializeRequest(mo, mo._GetMethodInfo(method), list(args)).decode()

            spec = {
                "host": target.host, "port": target.port, "path": target.path, "ca": str(sim.cert_file),
                "action": stub.versionId,
                "login": request(content.sessionManager, "Login", target.user, "@@PASSWORD@@", None),
                "create_view": request(content.viewManager, "CreateContainerView", content.rootFolder,
                                       [getattr(vim, t) for t in inventory.VIEW_TYPES], True),
                "retrieve": request(collector, "RetrievePropertiesEx", [inventory.filter_spec(view)],
                                    options).replace(view._moId, VIEW),
                "continue": request(collector, "ContinueRetrievePropertiesEx", TOKEN),
                "destroy": request(vim.view.ContainerView(VIEW, stub), "Destroy"),
                "logout": request(content.sessionManager, "Logout"),
            }
        finally:
            view.DestroyView()
    path = work / "floor-requests.json"
    path.write_text(json.dumps(spec))
    return path


def children_cpu() -> float:
    """CPU seconds (user + system) of the finished child processes: steadier than wall time on a
    busy machine, and the client's own cost (the floor's wall time is mostly the server's)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def timed_floor(script: Path, requests: Path, env: dict[str, str], cpu: list[float]) -> tuple[float, dict]:
    start, start_cpu = time.perf_counter(), children_cpu()
    out = subprocess.run([sys.executable, "-I", "-S", str(script), str(requests)], check=True,
                         capture_output=True, text=True, env=env)
    cpu.append(children_cpu() - start_cpu)
    return time.perf_counter() - start, json.loads(out.stdout)


def timed_plan(runbook: Path, env: dict[str, str], cpu: list[float]) -> float:
    start, start_cpu = time.perf_counter(), children_cpu()
    subprocess.run([GPUVM, "plan", str(runbook)], check=True, stdout=subprocess.DEVNULL, env=env)
    cpu.append(children_cpu() - start_cpu)
    return time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--hosts", type=int, default=512)
    parser.add_argument("--vms-per-host", type=int, default=8)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--baseline-src", type=Path, help="also time `gpuvm plan` with this src/ first on "
                        "PYTHONPATH (an older gpuvm, e.g. `git archive <commit> src | tar -x -C DIR`)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        runbook = work / "runbook.yaml"
        write_runbook(runbook, args.hosts, args.vms_per_host)
        script = work / "floor.py"
        script.write_text(FLOOR)
        with Simulator(hosts=args.hosts, vms_per_host=args.vms_per_host) as sim:
            env = {**os.environ, "GOVC_URL": sim.url, "GOVC_TLS_CA_CERTS": str(sim.cert_file),
                   "GOVC_USERNAME": sim.username, "GPUVM_VCENTER_PASSWORD": sim.password,
                   "FLOOR_PASSWORD": sim.password, "GPUVM_STATE_DIR": str(work / "state"), "COLUMNS": "160"}
            os.environ.update(env)
            target = resolve_target(load_runbook(runbook).vcenter)
            requests = templates(sim, target, work)
            floor, inside, plan, baseline, wire = [], [], [], [], {}
            cpu: dict[str, list[float]] = {"floor": [], "plan": [], "baseline": []}
            for _ in range(args.runs):
                seconds, wire = timed_floor(script, requests, env, cpu["floor"])
                floor.append(seconds)
                inside.append(wire["seconds"])
                plan.append(timed_plan(runbook, {**env, "PYTHONPATH": str(REPO / "src")}, cpu["plan"]))
                if args.baseline_src:
                    baseline.append(timed_plan(runbook, {**env, "PYTHONPATH": str(args.baseline_src)},
                                               cpu["baseline"]))
    floor_s, plan_s = statistics.median(floor), statistics.median(plan)
    cpu_s = {name: statistics.median(values) for name, values in cpu.items() if values}
    print(f"{args.hosts} hosts x {args.vms_per_host} VMs, medians of {args.runs} run(s), alternating:")
    print(f"  wire floor (whole process): {floor_s:.2f} s  ({wire['bytes'] / 1e6:.1f} MB in {wire['pages']} page(s), "
          f"{statistics.median(inside):.2f} s from its start to its logout; {cpu_s['floor']:.2f} s CPU)")
    print(f"  gpuvm plan (whole process): {plan_s:.2f} s ({cpu_s['plan']:.2f} s CPU)")
    if baseline:
        print(f"  gpuvm plan, {args.baseline_src} (whole process): {statistics.median(baseline):.2f} s "
              f"({cpu_s['baseline']:.2f} s CPU), x wire floor {statistics.median(baseline) / floor_s:.2f}")
    print(f"plan_x_wire_floor={plan_s / floor_s:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
