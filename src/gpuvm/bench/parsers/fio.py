"""fio `--output-format=json`: the read bandwidth (decimal GB/s, as `gpuvm size` states the rate
storage must deliver), with IOPS and latencies as metrics.

fio prints its report as one JSON object; warnings (`fio: ...`) may come before it in a log that
holds stdout and stderr. `jobs` has one entry per job, or one for all with `--group_reporting`:
bandwidth and IOPS are summed over the entries, the mean latency weighted by their I/O counts, and
each completion-latency percentile is the worst entry's. A job with a non-zero `error` fails the run.
A job that took no latency samples (`gtod_reduce=1`, `disable_lat=1`: fio reports N 0 and a mean of 0)
has no latency: the metrics leave it out (unknown), never 0 ms.
"""

from __future__ import annotations

import json
import re
from typing import Any

from gpuvm.bench.parsers.common import Figure
from gpuvm.errors import BenchmarkError

PERCENTILES = {"50.000000": "clat_p50_ms", "99.000000": "clat_p99_ms", "99.900000": "clat_p99_9_ms"}


def _report(text: str, log: str) -> dict[str, Any]:
    """The JSON object fio printed (the first `{` at the start of a line, to its closing brace)."""
    decoder = json.JSONDecoder()
    for start in (m.start() for m in re.finditer(r"^\{", text, re.MULTILINE)):
        try:
            report, _ = decoder.raw_decode(text, start)
        except json.JSONDecodeError:
            continue
        if isinstance(report, dict) and "jobs" in report:
            return report
    last = next((line for line in reversed(text.splitlines()) if line.strip()), "")
    raise BenchmarkError(f"{log}: no fio JSON report found (run fio with --output-format=json)"
                         + (f": {last.strip()[:200]}" if last else ""))


def parse_fio(text: str, log: str = "<output>") -> Figure:
    report = _report(text, log)
    try:
        return _figure(report, log)
    except (KeyError, TypeError, ValueError) as e:
        raise BenchmarkError(f"{log}: fio's report lacks {e} (expected fio 3's JSON)") from None


def _figure(report: dict[str, Any], log: str) -> Figure:
    jobs = report["jobs"]
    failed = [f"{j.get('jobname', '?')}: error {j['error']}" for j in jobs if j.get("error")]
    if failed:
        raise BenchmarkError(f"{log}: fio job(s) failed ({'; '.join(failed)}); see the fio: lines above the report")
    reads = [j["read"] for j in jobs]
    ios = sum(r["total_ios"] for r in reads)
    if not jobs or ios == 0:
        raise BenchmarkError(f"{log}: fio read nothing (the storage benchmark measures reads: rw=randread)")
    bandwidth = sum(r["bw_bytes"] for r in reads)
    metrics = {
        "read_gb_s": bandwidth / 1e9,
        "read_iops": sum(r["iops"] for r in reads),
    }
    timed = [r for r in reads if _sampled(r["lat_ns"])]
    if timed_ios := sum(r["total_ios"] for r in timed):
        metrics["lat_mean_ms"] = sum(r["lat_ns"]["mean"] * r["total_ios"] for r in timed) / timed_ios / 1e6
    for key, name in PERCENTILES.items():
        found = [r["clat_ns"]["percentile"][key] for r in reads
                 if _sampled(r["clat_ns"]) and key in r["clat_ns"].get("percentile", {})]
        if found:
            metrics[name] = max(found) / 1e6
    options = jobs[0].get("job options", {})
    detail = {"fio": report.get("fio version"), "jobs": len(jobs),
              **{k: options[k] for k in ("rw", "bs", "numjobs", "iodepth", "direct", "ioengine") if k in options}}
    if not timed:
        detail["latency"] = "not measured (fio took no latency samples: gtod_reduce or disable_lat)"
    return Figure(value=metrics["read_gb_s"], unit="GB/s", detail=detail, metrics=metrics)


def _sampled(latency: dict[str, Any]) -> bool:
    """fio measured this latency: its sample count `N` is not 0 (fio 3 reports N; older ones did not)."""
    return latency.get("N", 1) != 0
