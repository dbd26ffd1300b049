"""The uncertainty of a point's figure: a 95 % confidence interval, outliers, drift, and how many
repeats would settle a verdict. Pure functions over lists of repeat figures.

Method: the **percentile bootstrap** (Efron & Tibshirani, *An Introduction to the Bootstrap*, 1993,
ch. 13; the method criterion.rs uses for its intervals). The repeats are resampled with replacement
`RESAMPLES` times, the statistic (a median, or a ratio of two medians, each side resampled on its
own) is computed on every resample, and the 2.5th and 97.5th percentiles of those statistics bound
the interval. It assumes nothing about the figures' distribution, which for benchmark repeats is
often skewed (a slow straggler, never a fast one). The generator is seeded with a constant, so the
same figures always give the same interval (a report can be regenerated and checked).

With fewer than `MIN_REPEATS` repeats there is no interval: two values cannot say how wide the
noise is, and a bootstrap over them would pretend to. Callers say "no interval" instead.

Outliers: the modified z-score of Iglewicz & Hoaglin (*How to Detect and Handle Outliers*, 1993):
0.6745·|x − median| / MAD above 3.5 flags a repeat (flagged, never dropped: the interval uses every
repeat). Drift: the first and the last half of the repeats, in the order they ran, do not overlap
and their medians differ by more than `DRIFT` (the machine warmed up, throttled, or another job
came or went during the campaign).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from statistics import median

LEVEL = 0.95
RESAMPLES = 2000
SEED = 20250  # any constant: the same figures give the same interval on every run
MIN_REPEATS = 3
OUTLIER_Z = 3.5
DRIFT = 0.01  # 1 %: first and last halves further apart than this (and not overlapping) is drift
SETTLE_CAP = 1000  # repeats beyond this are reported as "more than"

Interval = tuple[float, float]


def _percentiles(samples: list[float]) -> Interval:
    samples.sort()
    tail = (1 - LEVEL) / 2
    last = len(samples) - 1
    return samples[round(tail * last)], samples[round((1 - tail) * last)]


def _resampled_medians(values: Sequence[float], rng: random.Random) -> list[float]:
    n = len(values)
    return [median(rng.choices(values, k=n)) for _ in range(RESAMPLES)]


def median_ci(values: Sequence[float]) -> Interval | None:
    """The 95 % interval of the median of `values`, or None with fewer than MIN_REPEATS."""
    if len(values) < MIN_REPEATS:
        return None
    return _percentiles(_resampled_medians(list(values), random.Random(SEED)))


def ratio_ci(values: Sequence[float], against: Sequence[float],
             ratio: Callable[[float, float], float | None]) -> Interval | None:
    """The 95 % interval of `ratio(median(values), median(against))`, both sides resampled on their
    own (they are independent campaigns); None when either side has fewer than MIN_REPEATS or a
    resample has no ratio (a zero median)."""
    if len(values) < MIN_REPEATS or len(against) < MIN_REPEATS:
        return None
    rng = random.Random(SEED)
    ratios = [ratio(a, b) for a, b in zip(_resampled_medians(list(values), rng),
                                         _resampled_medians(list(against), rng), strict=True)]
    if any(r is None or not math.isfinite(r) for r in ratios):
        return None
    return _percentiles(ratios)  # type: ignore[arg-type]


def outliers(values: Sequence[float]) -> list[int]:
    """1-based positions of the repeats whose modified z-score is above OUTLIER_Z."""
    if len(values) < MIN_REPEATS:
        return []
    middle = median(values)
    mad = median(abs(v - middle) for v in values)
    if mad == 0:
        return []  # most repeats are identical: no scale to measure an outlier against
    return [i for i, v in enumerate(values, 1) if 0.6745 * abs(v - middle) / mad > OUTLIER_Z]


def drift(values: Sequence[float]) -> float | None:
    """The last half's median relative to the first half's, minus 1, when the halves (in the order
    the repeats ran) do not overlap and differ by more than DRIFT; else None. Needs 4 repeats."""
    if len(values) < 4:
        return None
    half = len(values) // 2
    first, last = values[:half], values[-half:]
    if not (max(first) < min(last) or max(last) < min(first)):
        return None
    base = median(first)
    if base == 0:
        return None
    change = median(last) / base - 1
    return change if abs(change) > DRIFT else None


def half_width(interval: Interval | None, centre: float) -> float | None:
    """The interval's half-width relative to `centre` (0.01: ±1 %), or None."""
    if interval is None or not centre:
        return None
    return (interval[1] - interval[0]) / 2 / abs(centre)


def repeats_to_settle(repeats: int, interval: Interval | None, estimate: float, limit: float) -> int | None:
    """About how many repeats each side would narrow `interval` (around `estimate`) enough to fall
    wholly on one side of `limit`: a bootstrap interval narrows like 1/√n. MIN_REPEATS when there is
    no interval yet; None when the estimate sits on the limit (no number of repeats settles it)."""
    if interval is None:
        return max(MIN_REPEATS, repeats + 1)
    distance = abs(estimate - limit)
    # the side of the interval that reaches across the limit is the one that must shrink
    width = interval[1] - estimate if estimate < limit else estimate - interval[0]
    if distance < 1e-9:  # a float's last bits: the estimate is the limit
        return None
    if width == 0:
        return repeats
    needed = math.ceil(repeats * (width / distance) ** 2)
    return min(max(needed, repeats + 1), SETTLE_CAP + 1)
