"""Benchmark: issue 27's fleet figures side by side in one run, each next to its goal.

Runs, one after another (each alone on the machine's cores) with this Python, streaming their
output prefixed by their name:
- bench/plan_vcenters.py: `gpuvm plan` over V vCenters × H hosts × M VMs against the plan of one;
- bench/wire_floor.py: one vCenter's plan (H × M) against its wire floor;
- bench/image_fanout.py: the image fanned out over the mesh to 4, 16 and N guests (root, docker.io);
- bench/campaign_scale.py: gpuvm's campaign overhead at 4, 16 and N guests (root).
Each one's figures are read from its last line. A part that fails (exit code, or a last line
without its figures) does not stop the others: its keys print as NA, the reason is named, and the
exit code is 1. Goals not met are printed as such; they do not change the exit code.

Goals (issue 27, ratios in one run on the 2-core machine): V vCenters' plan ≤ 2.5× one's; one
vCenter's plan ≤ 3× its wire floor; the image to N guests in ≤ ⌈log2 N⌉ + 1 rounds, in ≤ that many
× one guest-to-guest hop, with 0 image bytes through gpuvm's machine; overhead at N guests ≤ 2× at 4.
The last line, with the defaults (4 vCenters × 512 hosts × 8 VMs, 64 guests):
`multi_vcenter_x_single=R plan_x_wire_floor=R image_rounds_64=N operator_image_bytes=B overhead_64_over_4=R`
(with `--guests N`, the keys name N).
Run: `.venv/bin/python bench/fleet.py [--vcenters 4] [--hosts 512] [--vms-per-host 8] [--runs 3]
[--guests 64] [--mb 24] [--mbit 40] [--star-up-to 16] [--parts plan_vcenters.py,...]` (as root).
"""

from __future__ import annotations

import argparse
import math
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

BENCH = Path(__file__).resolve().parent
SRC = BENCH.parent / "src"
NA = "NA"


@dataclass(frozen=True)
class Part:
    """One benchmark script: its arguments and the figures read from its last line."""

    script: str
    args: tuple[str, ...]
    keys: tuple[str, ...]  # every key its last line must carry


@dataclass(frozen=True)
class Outcome:
    part: Part
    figures: dict[str, str]  # key -> value as the script printed it
    failure: str | None = None


@dataclass(frozen=True)
class Goal:
    text: str
    key: str
    met: Callable[[float], bool]


def guest_sizes(guests: int) -> str:
    """The fan-out's and the campaign's sizes: 4 (the campaign's baseline), 16, up to `guests`."""
    return ",".join(str(n) for n in sorted({n for n in (4, 16) if n < guests} | {guests}))


def parts_for(args: argparse.Namespace) -> list[Part]:
    """The parts `--parts` names (default: all four), in their order."""
    return [part for part in all_parts(args) if args.parts is None or part.script in args.parts]


def all_parts(args: argparse.Namespace) -> list[Part]:
    n, sizes = args.guests, guest_sizes(args.guests)
    return [
        Part("plan_vcenters.py", ("--vcenters", str(args.vcenters), "--hosts", str(args.hosts),
                                  "--vms-per-host", str(args.vms_per_host), "--runs", str(args.runs)),
             ("multi_vcenter_x_single",)),
        Part("wire_floor.py", ("--hosts", str(args.hosts), "--vms-per-host", str(args.vms_per_host),
                               "--runs", str(args.runs)),
             ("plan_x_wire_floor",)),
        Part("image_fanout.py", ("--sizes", sizes, "--mb", str(args.mb), "--mbit", str(args.mbit),
                                 "--star-up-to", str(args.star_up_to)),
             (f"image_rounds_{n}", f"tree_x_hop_{n}", "operator_image_bytes")),
        Part("campaign_scale.py", ("--sizes", sizes), (f"overhead_{n}_over_4",)),
    ]


def summary_keys(guests: int) -> list[str]:
    """The last line's keys, in the issue's order."""
    return ["multi_vcenter_x_single", "plan_x_wire_floor", f"image_rounds_{guests}", "operator_image_bytes",
            f"overhead_{guests}_over_4"]


def goals_for(args: argparse.Namespace) -> list[Goal]:
    n, bound = args.guests, math.ceil(math.log2(args.guests)) + 1
    return [
        Goal(f"plan of {args.vcenters} vCenters × {args.hosts} hosts ≤ 2.5× the plan of one",
             "multi_vcenter_x_single", lambda r: r <= 2.5),
        Goal("one vCenter's plan ≤ 3× its wire floor", "plan_x_wire_floor", lambda r: r <= 3),
        Goal(f"image to {n} guests in ≤ ⌈log2 {n}⌉ + 1 = {bound} rounds", f"image_rounds_{n}",
             lambda r: r <= bound),
        Goal(f"image to {n} guests in ≤ {bound}× one guest-to-guest hop (time)", f"tree_x_hop_{n}",
             lambda r: r <= bound),
        Goal("0 image bytes through gpuvm's machine (counted)", "operator_image_bytes", lambda b: b == 0),
        Goal(f"campaign overhead at {n} guests ≤ 2× at 4", f"overhead_{n}_over_4", lambda r: r <= 2),
    ]


def last_line_figures(lines: list[str]) -> dict[str, str]:
    """The `key=value` pairs of the last non-empty line."""
    last = next((line for line in reversed(lines) if line.strip()), "")
    return dict(word.split("=", 1) for word in last.split() if "=" in word)


def outcome(part: Part, code: int, out: list[str], err: list[str]) -> Outcome:
    """What one finished script gave: its figures, or why it gave none."""
    if code != 0:
        said = next((line.strip() for line in reversed(out + err) if line.strip()), "no output")  # stderr first
        return Outcome(part, {}, f"exit {code}: {said[:300]}")
    figures = last_line_figures(out)
    missing = [key for key in part.keys if key not in figures]
    if missing:
        last = next((line.strip() for line in reversed(out) if line.strip()), "")
        return Outcome(part, {}, f"its last line has no {', '.join(missing)} ({last[:200]!r})")
    figures = {key: figures[key] for key in part.keys}
    bad = [key for key, value in figures.items() if not is_number(value)]
    if bad:
        return Outcome(part, {}, f"not a number: {', '.join(f'{k}={figures[k]}' for k in bad)}")
    return Outcome(part, figures)


def is_number(value: str) -> bool:
    try:
        float(value)
    except ValueError:
        return False
    return True


def part_env(environ) -> dict[str, str]:
    """This checkout's gpuvm first on the path (the parts' `gpuvm plan` processes too), output unbuffered."""
    path = os.pathsep.join(p for p in (str(SRC), environ.get("PYTHONPATH", "")) if p)
    return {**environ, "PYTHONPATH": path, "PYTHONUNBUFFERED": "1"}


def run_script(part: Part) -> tuple[int, list[str], list[str]]:
    """The script run with this Python, stdout and stderr passed through line by line as they
    come, prefixed by its name: (exit code, stdout lines, stderr lines)."""
    prefix = f"[{part.script.removesuffix('.py')}] "
    process = subprocess.Popen([sys.executable, str(BENCH / part.script), *part.args], text=True, bufsize=1,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               env=part_env(os.environ))

    def pump(stream, sink, kept: list[str]) -> None:
        for line in stream:
            kept.append(line)
            sink.write(prefix + line)
            sink.flush()

    out: list[str] = []
    err: list[str] = []
    errors = threading.Thread(target=pump, args=(process.stderr, sys.stderr, err), daemon=True)
    errors.start()
    pump(process.stdout, sys.stdout, out)
    code = process.wait()
    errors.join()
    return code, out, err


def report(args: argparse.Namespace, outcomes: list[Outcome]) -> list[str]:
    """The lines printed after the parts: failures, each goal against its figure, the summary last."""
    figures = {key: value for o in outcomes for key, value in o.figures.items()}
    ran = {key for o in outcomes for key in o.part.keys}
    lines = [f"part failed: {o.part.script}: {o.failure}" for o in outcomes if o.failure]
    lines.append("goals (issue 27), figures of this run:")
    for goal in goals_for(args):
        value = figures.get(goal.key)
        missing = "NA (part failed)" if goal.key in ran else "NA (not run: --parts)"
        verdict = missing if value is None else ("met" if goal.met(float(value)) else "NOT met")
        lines.append(f"  {goal.text:<62} {goal.key}={value or NA}  {verdict}")
    lines.append(" ".join(f"{key}={figures.get(key, NA)}" for key in summary_keys(args.guests)))
    return lines


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--vcenters", type=int, default=4)
    parser.add_argument("--hosts", type=int, default=512, help="hosts per vCenter")
    parser.add_argument("--vms-per-host", type=int, default=8)
    parser.add_argument("--runs", type=int, default=3, help="runs of each plan (median, best)")
    parser.add_argument("--guests", type=int, default=64, help="the largest fan-out and campaign (more than 4)")
    parser.add_argument("--mb", type=int, default=24, help="the fan-out's image size in MiB")
    parser.add_argument("--mbit", type=int, default=40, help="each bed machine's link, Mbit/s (0: unshaped)")
    parser.add_argument("--star-up-to", type=int, default=16, help="the fan-out's star for contrast up to this size")
    parser.add_argument("--parts", type=lambda text: text.split(","), help="only these parts, e.g. "
                        "plan_vcenters.py,wire_floor.py (default: all four)")
    args = parser.parse_args(argv)
    if args.guests <= 4:
        parser.error("--guests must be more than 4 (the campaign's overhead is against 4 guests)")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    outcomes = []
    for part in parts_for(args):
        print(f"== {part.script} {' '.join(part.args)}", flush=True)
        start = time.perf_counter()
        result = outcome(part, *run_script(part))
        print(f"== {part.script}: {'failed' if result.failure else 'done'} in {time.perf_counter() - start:.0f} s",
              flush=True)
        outcomes.append(result)
    print("\n".join(report(args, outcomes)))
    return 1 if any(o.failure for o in outcomes) else 0


if __name__ == "__main__":
    sys.exit(main())
