"""Percentiles with one named rule: linear interpolation between order statistics.

The rule is numpy's default ``method="linear"`` (Hyndman & Fan type 7): for ``n`` sorted values
and quantile ``q`` the virtual index is ``h = q·(n−1)`` and the result interpolates between the
values at ``floor(h)`` and ``ceil(h)``. For 1..100 ms the p99 is 99.01 ms (nearest rank would say
99). We use it because LLMPerf and vLLM's ``bench serve`` publish numpy-linear quantiles, so
imported runs reproduce their published numbers exactly. ``+inf`` (a failed request counted against
a budget) sorts last and makes any quantile that touches it ``+inf``; an empty sample is ``None``.
"""

from __future__ import annotations

import math
from typing import Any, Iterable, Sequence

import numpy as np

__all__ = [
    "PERCENTILE_RULE",
    "QUANTILES",
    "LOW_SAMPLE_P99",
    "percentile_sorted",
    "percentile",
    "summarize",
    "summarize_sorted",
    "empty_summary",
]

#: Name of the rule, printed in every report.
PERCENTILE_RULE = "linear interpolation between order statistics (numpy 'linear', Hyndman-Fan type 7)"
#: The quantiles every summary reports.
QUANTILES = {"p50": 0.50, "p95": 0.95, "p99": 0.99}
#: A p99 from fewer samples than this is flagged ``p99_low_sample``.
LOW_SAMPLE_P99 = 100


def _lerp(a: float, b: float, t: float) -> float:
    """numpy's ``_lerp`` (same rounding), made safe for ``b = +inf``."""
    if t == 0.0 or a == b:
        return a
    if math.isinf(b) or math.isinf(a):
        return b if t > 0 else a
    diff = b - a
    if t >= 0.5:
        return b - diff * (1.0 - t)
    return a + diff * t


def percentile_sorted(sorted_values: np.ndarray, q: float) -> float | None:
    """Quantile ``q`` (0..1) of an ascending array by the linear rule; None when empty."""
    n = len(sorted_values)
    if n == 0:
        return None
    h = q * (n - 1)
    lo = int(math.floor(h))
    hi = min(lo + 1, n - 1)
    return float(_lerp(float(sorted_values[lo]), float(sorted_values[hi]), h - lo))


def percentile(values: Iterable[float] | np.ndarray, q: float) -> float | None:
    """Quantile ``q`` (0..1) of unsorted values by the linear rule; None when empty; NaN ignored."""
    arr = np.asarray(values if isinstance(values, np.ndarray) else list(values), dtype=np.float64)
    arr = arr[~np.isnan(arr)]
    return percentile_sorted(np.sort(arr), q)


def empty_summary() -> dict[str, Any]:
    """The summary of an empty sample: every statistic None, n 0 (never 0 ms)."""
    return {"p50": None, "p95": None, "p99": None, "mean": None, "max": None, "n": 0, "p99_low_sample": True}


def summarize_sorted(sorted_values: np.ndarray, total: float | None = None) -> dict[str, Any]:
    """p50/p95/p99, mean, max and n of an ascending array (``total``: its sum, when known)."""
    n = int(len(sorted_values))
    if n == 0:
        return empty_summary()
    out: dict[str, Any] = {name: percentile_sorted(sorted_values, q) for name, q in QUANTILES.items()}
    if total is None:
        total = float(np.sum(sorted_values, dtype=np.float64))
    out["mean"] = float(total / n)
    out["max"] = float(sorted_values[-1])
    out["n"] = n
    out["p99_low_sample"] = n < LOW_SAMPLE_P99
    return out


def summarize(values: Sequence[float] | np.ndarray) -> dict[str, Any]:
    """Summary dict ``{p50, p95, p99, mean, max, n, p99_low_sample}`` of values (NaN dropped)."""
    arr = np.asarray(values, dtype=np.float64)
    arr = arr[~np.isnan(arr)]
    return summarize_sorted(np.sort(arr))
