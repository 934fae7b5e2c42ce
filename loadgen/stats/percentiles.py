"""Every percentile loadgen computes: one rule, linear interpolation, and one named alternative.

The rule is numpy's default ``method="linear"`` (Hyndman & Fan type 7): for ``n`` sorted values
and quantile ``q`` the virtual index is ``h = q·(n−1)`` and the result interpolates between the
values at ``floor(h)`` and ``ceil(h)``. For 1..100 ms the p99 is 99.01 ms (nearest rank would say
99). We use it because LLMPerf and vLLM's ``bench serve`` publish numpy-linear quantiles, so
imported runs reproduce their published numbers exactly. ``+inf`` (a failed request counted against
a budget) sorts last and makes any quantile that touches it ``+inf``; an empty sample is ``None``.
Reports, trace statistics, the ledger's workload lengths and token-distribution quantiles all use it.

Every summary carries, beside each of p50/p95/p99, its 95% distribution-free confidence interval
(``ci``: ``[low, high]`` from order statistics, see ``loadgen.stats.confidence``).

The alternative, ``percentile_nearest_rank`` (``NEAREST_RANK_RULE``, numpy ``inverted_cdf``), always
returns an observed value. Only the driver's self-checks use it: the send-lag summary in the
manifest (whole nanoseconds) and the live progress line; neither is a reported latency percentile.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any, Literal

import numpy as np

from loadgen.stats.confidence import CONFIDENCE_LEVEL, quantile_ci_ranks, quantile_ci_sorted

__all__ = [
    "LOW_SAMPLE_P99",
    "NEAREST_RANK_RULE",
    "PERCENTILE_RULE",
    "QUANTILES",
    "SortedParts",
    "empty_summary",
    "percentile",
    "percentile_nearest_rank",
    "percentile_sorted",
    "summarize",
    "summarize_parts",
    "summarize_sorted",
]

#: Name of the rule, printed in every report.
PERCENTILE_RULE = "linear interpolation between order statistics (numpy 'linear', Hyndman-Fan type 7)"
#: Name of the alternative rule (driver self-checks only: send lag, live progress).
NEAREST_RANK_RULE = "nearest rank: the value at 0-based rank ceil(q·n) − 1 (numpy 'inverted_cdf', Hyndman-Fan type 1)"
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
    lo = math.floor(h)
    hi = min(lo + 1, n - 1)
    return float(_lerp(float(sorted_values[lo]), float(sorted_values[hi]), h - lo))


def percentile(values: Iterable[float] | np.ndarray, q: float) -> float | None:
    """Quantile ``q`` (0..1) of unsorted values by the linear rule; None when empty; NaN ignored."""
    arr = np.asarray(values if isinstance(values, np.ndarray) else list(values), dtype=np.float64)
    arr = arr[~np.isnan(arr)]
    return percentile_sorted(np.sort(arr), q)


def percentile_nearest_rank(sorted_values: np.ndarray, q: float) -> float | None:
    """Quantile ``q`` (0..1) of an ascending array by nearest rank; None when empty.

    The value at 0-based rank ``ceil(q·n) − 1`` (0 for q = 0), so always an observed value: a Python
    int for an integer array. For 1..100 the p99 is 99.
    """
    n = len(sorted_values)
    if n == 0:
        return None
    return sorted_values[max(0, math.ceil(q * n) - 1)].item()


def empty_summary() -> dict[str, Any]:
    """The summary of an empty sample: every statistic None, n 0 (never 0 ms)."""
    return {
        "p50": None,
        "p95": None,
        "p99": None,
        "mean": None,
        "max": None,
        "n": 0,
        "p99_low_sample": True,
        "ci": {name: None for name in QUANTILES},
        "ci_level": CONFIDENCE_LEVEL,
    }


def summarize_sorted(sorted_values: np.ndarray, total: float | None = None) -> dict[str, Any]:
    """p50/p95/p99 (each with its 95% interval in ``ci``), mean, max and n of an ascending array
    (``total``: its sum, when known)."""
    n = len(sorted_values)
    if n == 0:
        return empty_summary()
    out: dict[str, Any] = {name: percentile_sorted(sorted_values, q) for name, q in QUANTILES.items()}
    if total is None:
        total = float(np.sum(sorted_values, dtype=np.float64))
    out["mean"] = float(total / n)
    out["max"] = float(sorted_values[-1])
    out["n"] = n
    out["p99_low_sample"] = n < LOW_SAMPLE_P99
    out["ci"] = {name: list(quantile_ci_sorted(sorted_values, q) or ()) for name, q in QUANTILES.items()}
    out["ci_level"] = CONFIDENCE_LEVEL
    return out


def summarize(values: Sequence[float] | np.ndarray) -> dict[str, Any]:
    """Summary dict ``{p50, p95, p99, mean, max, n, p99_low_sample}`` of values (NaN dropped)."""
    arr = np.asarray(values, dtype=np.float64)
    arr = arr[~np.isnan(arr)]
    return summarize_sorted(np.sort(arr))


#: An in-memory part is sampled every this many values, as a spilled run is (``spill.RunFile``).
SAMPLE_STRIDE = 1024


Side = Literal["left", "right"]


class _InMemory:
    """An ascending array with what ``_select`` reads of a run on disk (``spill.RunFile``): ``n``, ``dtype``,
    every stride-th value (``sample``), vectorised ``searchsorted`` and ``read(start, count)``."""

    def __init__(self, values: np.ndarray) -> None:
        self.values, self.dtype, self.n = values, values.dtype, len(values)
        self.stride = SAMPLE_STRIDE
        self.sample = values[:: self.stride]

    def searchsorted(self, x: np.ndarray, side: Side = "left") -> np.ndarray:
        return np.searchsorted(self.values, x, side=side)

    def read(self, start: int, count: int) -> np.ndarray:
        return self.values[start : start + count]


def _count(parts: list[Any], x: np.ndarray, side: Side) -> np.ndarray:
    """Per part (rows), how many of its values are below ``x`` (side "left") or at most ``x`` ("right")."""
    return np.stack([np.asarray(p.searchsorted(x, side=side), dtype=np.int64) for p in parts])


def _select(parts: list[Any], ranks: np.ndarray) -> np.ndarray:
    """The values of the 0-based ``ranks`` in the union of ascending ``parts``, exactly (the element of each rank,
    as one sorted array would give it), without merging them.

    Every part keeps every stride-th value in memory. Over the sorted union of those samples, the samples alone
    bound each sample value's count (values at most it): a few rounds of exact counts (one vectorised
    ``searchsorted`` per part, one block read per part on disk) then find, for every rank, the two neighbouring
    sample values ``a < b`` with count(a) ≤ rank < count(b). No sample lies strictly between them, so each part
    holds at most one stride of values there: those few are read, and the rank is among them or is ``b``.
    """
    union = np.unique(np.concatenate([p.sample for p in parts]))
    lower = np.zeros(len(union), dtype=np.int64)  # count(union[m]) is at least this
    upper = np.zeros(len(union), dtype=np.int64)  # and at most this
    for p in parts:  # one part at a time: memory stays one union's worth
        j = np.searchsorted(p.sample, union, side="right")  # samples of the part <= union[m]
        lower += np.where(j > 0, (j - 1) * p.stride + 1, 0)
        upper += np.minimum(j * p.stride, p.n)
    n = np.array([p.n for p in parts], dtype=np.int64)[:, None]
    need = ranks + 1
    lo = np.searchsorted(upper, need, side="left") - 1  # count(union[lo]) <= rank (-1: below every value)
    hi = np.searchsorted(lower, need, side="left")  # count(union[hi]) > rank (len(union): above every sample)
    while (open_ := np.flatnonzero(hi - lo > 1)).size:
        mid = (lo[open_] + hi[open_]) // 2
        enough = _count(parts, union[mid], "right").sum(axis=0) >= need[open_]
        hi[open_] = np.where(enough, mid, hi[open_])
        lo[open_] = np.where(enough, lo[open_], mid)
    m = len(union)
    start = np.where(lo >= 0, _count(parts, union[np.maximum(lo, 0)], "right"), 0)  # per part: values <= a
    stop = np.where(hi < m, _count(parts, union[np.minimum(hi, m - 1)], "left"), n)  # per part: values < b
    out = np.empty(len(ranks), dtype=parts[0].dtype)
    for i in range(len(ranks)):
        k = int(ranks[i] - start[:, i].sum())
        between = [
            p.read(a, b - a) for p, a, b in zip(parts, start[:, i].tolist(), stop[:, i].tolist(), strict=True) if b > a
        ]
        values = np.concatenate(between) if between else out[:0]
        out[i] = np.partition(values, k)[k] if k < len(values) else union[hi[i]]
    return out


class SortedParts:
    """Several ascending arrays treated as one sorted sample without merging them (no copy).

    Order statistics of the union come from ``_select`` (a search over the parts' in-memory samples,
    then a few values read per part), so per-class arrays of 10^8 gaps give the overall quantiles
    exactly, by the same linear rule, without a second sort. ``unit`` divides every value
    read (e.g. 1e6 for int64 ns parts reported in ms: ``ns / 1e6``, the correctly rounded ms that
    ``metrics.ms_between`` gives, where ``ns * 1e-6`` is off by an ulp for some values). A part is an ascending array or a run on disk
    (``spill.RunFile``: ``len``, ``dtype``, indexing, ``searchsorted``, ``sample``, ``stride``, ``read``).
    """

    def __init__(self, parts: Sequence[np.ndarray], unit: float = 1.0, sums: Sequence[float] | None = None) -> None:
        # ``sums``: each part's sum when known (parts memory-mapped from disk are then never read whole)
        kept = [i for i, p in enumerate(parts) if len(p)]
        self.parts = [parts[i] for i in kept]
        self.sums = [sums[i] for i in kept] if sums is not None else None
        self.n = int(sum(len(p) for p in self.parts))
        self.unit = unit
        self._known: dict[int, Any] = {}  # rank -> value, found ahead by ``prefetch``

    def prefetch(self, ranks: Sequence[int]) -> None:
        """Find the values of ``ranks`` in one ``kth_many``; ``kth`` then answers them without a search."""
        todo = sorted({int(r) for r in ranks if 0 <= r < self.n} - self._known.keys())
        if todo and len(self.parts) > 1:
            self._known.update(zip(todo, self.kth_many(np.array(todo)).tolist(), strict=True))

    def __len__(self) -> int:
        return self.n

    def _count_le(self, x: float) -> int:
        return int(sum(int(p.searchsorted(x, side="right")) for p in self.parts))

    def count_at_most(self, x: float) -> int:
        """How many values (scaled) are at most ``x``."""
        return self._count_le(x * self.unit)

    def kth(self, r: int) -> float:
        """The value of 0-based rank ``r`` in the union (unscaled)."""
        if r in self._known:
            return self._known[r]
        return self.kth_many(np.array([r]))[0].item()

    def kth_many(self, ranks: np.ndarray) -> np.ndarray:
        """The values of the 0-based ranks in ``ranks`` (unscaled, in the parts' dtype); see ``_select``."""
        ranks = np.asarray(ranks, dtype=np.int64)
        if len(self.parts) == 1:
            return np.array([self.parts[0][int(r)] for r in ranks], dtype=self.parts[0].dtype)
        return _select([_InMemory(p) if isinstance(p, np.ndarray) else p for p in self.parts], ranks)

    def percentile(self, q: float) -> float | None:
        if self.n == 0:
            return None
        h = q * (self.n - 1)
        lo = math.floor(h)
        hi = min(lo + 1, self.n - 1)
        a = float(self.kth(lo)) / self.unit
        b = a if hi == lo else float(self.kth(hi)) / self.unit
        return float(_lerp(a, b, h - lo))

    def interval(self, q: float) -> tuple[float, float] | None:
        """The 95% order-statistic interval of quantile ``q`` (scaled; −inf / +inf where unbounded)."""
        if self.n == 0:
            return None
        low, up = quantile_ci_ranks(self.n, float(q), CONFIDENCE_LEVEL)
        return (
            -math.inf if low is None else float(self.kth(low)) / self.unit,
            math.inf if up is None else float(self.kth(up)) / self.unit,
        )

    def total(self) -> float:
        if self.sums is not None:
            return float(sum(self.sums)) / self.unit
        return float(sum(float(np.sum(p, dtype=np.float64)) for p in self.parts)) / self.unit

    def max(self) -> float | None:
        return max(float(p[-1]) for p in self.parts) / self.unit if self.parts else None


def _summary_ranks(n: int) -> list[int]:
    """The ranks a summary of ``n`` values reads: each quantile's two neighbours and its interval's ends."""
    ranks: list[int] = []
    for q in QUANTILES.values():
        h = q * (n - 1)
        ranks += [math.floor(h), min(math.floor(h) + 1, n - 1)]
        ranks += [r for r in quantile_ci_ranks(n, float(q), CONFIDENCE_LEVEL) if r is not None]
    return ranks


def summarize_parts(parts: SortedParts | Sequence[np.ndarray], unit: float = 1.0) -> dict[str, Any]:
    """``summarize_sorted`` of the union of ascending arrays (see ``SortedParts``)."""
    sp = parts if isinstance(parts, SortedParts) else SortedParts(parts, unit)
    if sp.n == 0:
        return empty_summary()
    sp.prefetch(_summary_ranks(sp.n))
    out: dict[str, Any] = {name: sp.percentile(q) for name, q in QUANTILES.items()}
    out["mean"] = sp.total() / sp.n
    out["max"] = sp.max()
    out["n"] = sp.n
    out["p99_low_sample"] = sp.n < LOW_SAMPLE_P99
    out["ci"] = {name: list(sp.interval(q) or ()) for name, q in QUANTILES.items()}
    out["ci_level"] = CONFIDENCE_LEVEL
    return out
