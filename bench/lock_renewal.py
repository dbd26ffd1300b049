"""Benchmark: one renewal round of the apply lock over 4,096 hosts, before and after the lease.

Before (gpuvm until issue 21): each host lock's value held its own expiry, so a round was one
CurrentTime and then one SetField per host, one after another. After: one lease per run, which host
locks name, so a round is CurrentTime, one read of the custom attribute definitions (the fence: are
the run's locks still there?) and one SetField, however many hosts. Both are measured here on one simulator, over the same
4,096 lock definitions (the "before" round replays the old calls on them). With `--latency` every
SetField takes that long in gpusim (a far vCenter), which is what made the old round outlast the
lease. Run: `.venv/bin/python bench/lock_renewal.py [--hosts 4096] [--rounds 3] [--latency 0ms]`.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import uuid
from datetime import timedelta
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))
sys.path.insert(0, str(REPO / "simulator"))

from gpusim import Simulator  # noqa: E402

from gpuvm.vsphere.lock import HostLocks  # noqa: E402
from gpuvm.vsphere.session import Session, Target  # noqa: E402


def old_round(locks: HostLocks) -> None:
    """The round gpuvm made before leases: a stamp from vCenter's clock, then a SetField per host."""
    session = locks.session
    now = session.si.CurrentTime()
    holder = json.dumps({"run": locks.run, "who": locks.who, "since": locks.since,
                         "expires": (now + timedelta(seconds=locks.ttl)).isoformat(timespec="seconds")})
    manager, root = session.content.customFieldsManager, session.content.rootFolder
    for key in list(locks.held.values()):
        manager.SetField(entity=root, key=key, value=holder)


def timed(fn, rounds: int) -> float:
    seconds = []
    for _ in range(rounds):
        start = time.perf_counter()
        fn()
        seconds.append(time.perf_counter() - start)
    return statistics.median(seconds)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, default=4096)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--latency", default="0ms", help="gpusim -latency for SetField, e.g. 5ms")
    args = parser.parse_args()
    latency = {"SetField": args.latency} if args.latency not in ("0", "0ms", "0s") else {}
    with Simulator(hosts=1, vms_per_host=1, latency=latency) as sim:
        target = Target(host=sim.host, port=sim.port, path="/sdk", user=sim.username, password=sim.password,
                        insecure=False, ca_file=sim.cert_file)
        with Session(target) as session:
            start = time.perf_counter()
            with HostLocks(session, [f"esx-{i:05d}" for i in range(args.hosts)], uuid.uuid4().hex[:12]) as locks:
                taken = time.perf_counter() - start
                locks._stop.set()  # no renewals of its own while rounds are timed
                before = timed(lambda: old_round(locks), args.rounds)
                after = timed(locks._renew_once, args.rounds)
            calls = session.counter.calls
    print(f"{args.hosts:,} host locks on gpusim (SetField latency {args.latency}); medians of {args.rounds} round(s)")
    print(f"taking them (a lease; {args.hosts:,} AddCustomFieldDef one by one, {args.hosts:,} SetField "
          f"naming the run, 8 at once): {taken:.2f} s")
    print(f"renewal round before (a SetField per host): {before:8.3f} s")
    print(f"renewal round after (one lease SetField):   {after:8.3f} s   ({before / after:,.0f}x faster)")
    print(f"lease: {locks.ttl:.0f} s; before, a round takes {before / locks.ttl:.1%} of it, after {after / locks.ttl:.2%}")
    print(f"requests on the connection: {dict(calls.most_common(6))}")
    print(f"hosts={args.hosts} take_s={taken:.2f} round_before_s={before:.3f} round_after_s={after:.3f} "
          f"speedup={before / after:.0f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
