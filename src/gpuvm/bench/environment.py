"""The environment of every repeat, and what differs between two campaigns' environments.

`capture` runs one script per machine right after each repeat (all machines at once): load
average, CPU frequency governor(s), framework versions (package metadata: nothing imported) and
`nvidia-smi -q -d CLOCK,TEMPERATURE,POWER,PERFORMANCE` (driver, CUDA, clocks, temperature,
power, throttle reasons). Every part is optional: a missing tool or file leaves it out, and a
machine that cannot answer at all gets no entry; a benchmark's figure never depends on it.

`differences` is what `bench compare --baseline` warns about: versions, governors, throttle
reasons active on one side only, configured (application, max) clocks, and the clocks read
while the GPUs were busy, differing by more than CLOCK_TOLERANCE.
"""

from __future__ import annotations

import socket
from collections.abc import Iterable, Mapping, Sequence

from gpuvm.bench.results import Environment, GpuState, Results
from gpuvm.errors import GpuvmError
from gpuvm.executors.base import Executor
from gpuvm.executors.group import at_once, run_group
from gpuvm.parsers.nvidia_smi_q import parse_nvidia_smi_q

FRAMEWORKS = ("torch", "tensorflow", "horovod", "jax")
CLOCK_TOLERANCE = 0.03  # clocks that differ by more than 3 % are a difference worth a warning
IDLE_REASONS = {"Idle"}  # a GPU between runs is idle: not a throttle

# One script: each part after a marker line, every error silenced (the part is then empty).
SCRIPT = f"""echo '@@load'; cat /proc/loadavg 2>/dev/null
echo '@@governor'; cat /sys/devices/system/cpu/cpu*/cpufreq/scaling_governor 2>/dev/null | sort -u
echo '@@frameworks'; python3 -c 'from importlib import metadata
for name in "{' '.join(FRAMEWORKS)}".split():
    try: print(name, metadata.version(name))
    except Exception: pass' 2>/dev/null
echo '@@nvidia-smi'; nvidia-smi -q -d CLOCK,TEMPERATURE,POWER,PERFORMANCE 2>/dev/null
exit 0"""


def capture(executors: Mapping[str, Executor], targets: Sequence[str], local: bool = False
            ) -> dict[str, Environment]:
    """Each target's environment now (`local`: under the host's name); targets that fail are left out."""

    def one(target: str) -> Environment | None:
        try:
            result = executors[target].run_script(SCRIPT, timeout=30, check=False)
        except (GpuvmError, OSError):
            return None
        return parse_probe(result.stdout) if "@@load" in result.stdout else None

    found = run_group({t: t for t in targets}, one, at_once(targets), name="env").raise_first()
    name = (lambda t: socket.gethostname()) if local else (lambda t: t)
    return {name(t): env for t, env in found.items() if env is not None}


def parse_probe(text: str) -> Environment:
    """What SCRIPT printed, as an Environment (parts that are empty or unreadable: absent)."""
    parts: dict[str, list[str]] = {}
    current = None
    for line in text.splitlines():
        if line.startswith("@@"):
            current = parts.setdefault(line[2:].strip(), [])
        elif current is not None:
            current.append(line)
    env = Environment()
    load = " ".join(parts.get("load", [])).split()[:3]
    try:
        env.load = [float(x) for x in load] if len(load) == 3 else None
    except ValueError:
        pass
    governors = [g.strip() for g in parts.get("governor", []) if g.strip()]
    env.governor = ", ".join(governors)[:200] or None
    for line in parts.get("frameworks", []):
        name, _, version = line.strip().partition(" ")
        if name in FRAMEWORKS and version:
            env.frameworks[name] = version[:100]
    smi = "\n".join(parts.get("nvidia-smi", []))
    if "NVSMI LOG" in smi:
        try:
            report = parse_nvidia_smi_q(smi)
        except GpuvmError:
            return env
        env.driver, env.cuda = report.driver, report.cuda
        env.gpus = [GpuState(bus_id=g.bus_id, performance_state=g.performance_state, clocks_mhz=g.clocks_mhz,
                             applications_clocks_mhz=g.applications_clocks_mhz, max_clocks_mhz=g.max_clocks_mhz,
                             temperature_c=g.temperature_c, power_w=g.power_w, power_limit_w=g.power_limit_w,
                             throttle_reasons=g.throttle_reasons) for g in report.gpus]
    return env


def environments(results: Results) -> list[Environment]:
    """Every environment recorded with a repeat of the results (any machine, any point)."""
    return [env for bench in results.benchmarks for point in bench.points for repeat in point.repeats
            for env in (repeat.environment or {}).values()]


def differences(results: Results, baseline: Results) -> list[str]:
    """How the environments of two campaigns differ, one line each (none when either side recorded none)."""
    ours, theirs = environments(results), environments(baseline)
    if not ours or not theirs:
        return []
    lines = []
    for what, read in (("driver", lambda e: [e.driver]), ("CUDA", lambda e: [e.cuda]),
                       ("CPU governor", lambda e: [e.governor])):
        a, b = _values(ours, read), _values(theirs, read)
        if a and b and a != b:
            lines.append(f"{what} differs: {', '.join(a)} here, {', '.join(b)} in the baseline")
    for name in sorted({n for e in ours + theirs for n in e.frameworks}):
        a, b = _values(ours, lambda e: [e.frameworks.get(name)]), _values(theirs, lambda e: [e.frameworks.get(name)])
        if a and b and a != b:
            lines.append(f"{name} differs: {', '.join(a)} here, {', '.join(b)} in the baseline")
    a, b = _throttled(ours), _throttled(theirs)
    if a != b:
        lines.append(f"GPU throttle reasons active: {', '.join(sorted(a)) or 'none'} here, "
                     f"{', '.join(sorted(b)) or 'none'} in the baseline")
    for label, read in (("application clocks", lambda g: g.applications_clocks_mhz),
                        ("max clocks", lambda g: g.max_clocks_mhz),
                        ("clocks under load", lambda g: g.clocks_mhz if not set(g.throttle_reasons) & IDLE_REASONS
                         and g.performance_state == "P0" else {})):
        for clock in ("graphics", "sm", "memory"):
            a_mhz, b_mhz = _median(_clock(ours, read, clock)), _median(_clock(theirs, read, clock))
            if a_mhz and b_mhz and abs(a_mhz - b_mhz) > CLOCK_TOLERANCE * max(a_mhz, b_mhz):
                lines.append(f"GPU {clock} {label} differ by more than {CLOCK_TOLERANCE:.0%}: "
                             f"{a_mhz:g} MHz here, {b_mhz:g} MHz in the baseline (medians)")
    return lines


def _values(envs: Iterable[Environment], read) -> list[str]:
    return sorted({v for e in envs for v in read(e) if v})


def _throttled(envs: Iterable[Environment]) -> set[str]:
    return {r for e in envs for g in e.gpus for r in g.throttle_reasons if r not in IDLE_REASONS}


def _clock(envs: Iterable[Environment], read, clock: str) -> list[float]:
    return [read(g)[clock] for e in envs for g in e.gpus if clock in read(g)]


def _median(values: list[float]) -> float | None:
    from statistics import median

    return median(values) if values else None
