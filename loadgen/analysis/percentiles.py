"""Every percentile loadgen computes: one rule, linear interpolation, and one named alternative.

The rule is numpy's default ``method="linear"`` (Hyndman & Fan type 7): for ``n`` sorted values
and quantile ``q`` the virtual index is ``h = q·(n−1)`` and the result interpolates between the
values at ``floor(h)`` and ``ceil(h)``. For 1..100 ms the p99 is 99.01 ms (nearest rank would say
99). We use it because LLMPerf and vLLM's ``bench serve`` publish numpy-linear quantiles, so
imported runs reproduce their published numbers exactly. ``+inf`` (a failed request counted against
a budget) sorts last and makes any quantile that touches it ``+inf``; an empty sample is ``None``.
Reports, trace statistics, the ledger's workload lengths and token-distribution quantiles all use it.

Every summary carries, beside each of p50/p95/p99, its 95% distribution-free confidence interval
(``ci``: ``[low, high]`` from order statistics, see ``loadgen.analysis.confidence``).

The alternative, ``percentile_nearest_rank`` (``NEAREST_RANK_RULE``, numpy ``inverted_cdf``), always
returns an observed value. Only the driver's self-checks use it: the send-lag summary in the
manifest (whole nanoseconds) and the live progress line; neither is a reported latency percentile.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from .confidence import CONFIDENCE_LEVEL, quantile_ci_ranks, quantile_ci_sorted

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


_SIGN_FLIP = 0x7FFFFFFFFFFFFFFF


def _key(x: float) -> int:
    """Order-preserving int for a float64 (negative floats' magnitude bits flipped)."""
    b = int(np.float64(x).view(np.int64))
    return b ^ _SIGN_FLIP if b < 0 else b


def _unkeys(k: np.ndarray) -> np.ndarray:
    """The float64 of every key in ``k`` (``_key`` undone)."""
    return np.where(k < 0, k ^ _SIGN_FLIP, k).view(np.float64)


def _midpoints(lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """floor((lo + hi) / 2) of int64 arrays without overflow (keys span the whole int64 range)."""
    return (lo >> 1) + (hi >> 1) + (lo & hi & 1)


class SortedParts:
    """Several ascending arrays treated as one sorted sample without merging them (no copy).

    Order statistics of the union come from a binary search over the value space (≤ 64 rounds of
    one ``searchsorted`` per part), so per-class arrays of 10^8 gaps give the overall quantiles
    exactly, by the same linear rule, without a second sort. ``scale`` multiplies every value
    read (e.g. 1e-6 for int64 ns parts reported in ms). A part is an ascending array or anything
    with its ``len``, ``dtype``, indexing and ``searchsorted`` (``spill.RunFile``: a run on disk).
    """

    def __init__(self, parts: Sequence[np.ndarray], scale: float = 1.0, sums: Sequence[float] | None = None) -> None:
        # ``sums``: each part's sum when known (parts memory-mapped from disk are then never read whole)
        kept = [i for i, p in enumerate(parts) if len(p)]
        self.parts = [parts[i] for i in kept]
        self.sums = [sums[i] for i in kept] if sums is not None else None
        self.n = int(sum(len(p) for p in self.parts))
        self.scale = scale
        self.integer = bool(self.parts) and np.issubdtype(self.parts[0].dtype, np.integer)
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
        return self._count_le(x / self.scale)

    def kth(self, r: int) -> float:
        """The value of 0-based rank ``r`` in the union (unscaled)."""
        if r in self._known:
            return self._known[r]
        return self.kth_many(np.array([r]))[0].item()

    def kth_many(self, ranks: np.ndarray) -> np.ndarray:
        """The values of the 0-based ranks in ``ranks`` (unscaled, in the parts' dtype), by one binary search for all
        of them: each round is one vectorised ``searchsorted`` per part, so a part on disk reads each block a
        round needs once, not once per rank (a CDF of 1,000 points over spilled runs)."""
        ranks = np.asarray(ranks, dtype=np.int64)
        if len(self.parts) == 1:
            return np.array([self.parts[0][int(r)] for r in ranks], dtype=self.parts[0].dtype)
        if self.integer:
            lo = np.full(len(ranks), min(int(p[0]) for p in self.parts), dtype=np.int64)
            hi = np.full(len(ranks), max(int(p[-1]) for p in self.parts), dtype=np.int64)
            value = lambda k: k  # integers are their own keys
        else:
            lo = np.full(len(ranks), min(_key(p[0]) for p in self.parts), dtype=np.int64)
            hi = np.full(len(ranks), max(_key(p[-1]) for p in self.parts), dtype=np.int64)
            value = _unkeys
        while True:
            open_ = np.flatnonzero(lo < hi)
            if not len(open_):
                return value(lo)
            mid = _midpoints(lo[open_], hi[open_])
            x = value(mid)
            count = sum(np.asarray(p.searchsorted(x, side="right"), dtype=np.int64) for p in self.parts)
            enough = count >= ranks[open_] + 1
            hi[open_] = np.where(enough, mid, hi[open_])
            lo[open_] = np.where(enough, lo[open_], mid + 1)

    def percentile(self, q: float) -> float | None:
        if self.n == 0:
            return None
        h = q * (self.n - 1)
        lo = math.floor(h)
        hi = min(lo + 1, self.n - 1)
        a = float(self.kth(lo)) * self.scale
        b = a if hi == lo else float(self.kth(hi)) * self.scale
        return float(_lerp(a, b, h - lo))

    def interval(self, q: float) -> tuple[float, float] | None:
        """The 95% order-statistic interval of quantile ``q`` (scaled; −inf / +inf where unbounded)."""
        if self.n == 0:
            return None
        low, up = quantile_ci_ranks(self.n, float(q), CONFIDENCE_LEVEL)
        return (
            -math.inf if low is None else float(self.kth(low)) * self.scale,
            math.inf if up is None else float(self.kth(up)) * self.scale,
        )

    def total(self) -> float:
        if self.sums is not None:
            return float(sum(self.sums)) * self.scale
        return float(sum(float(np.sum(p, dtype=np.float64)) for p in self.parts)) * self.scale

    def max(self) -> float | None:
        return max(float(p[-1]) for p in self.parts) * self.scale if self.parts else None


def _summary_ranks(n: int) -> list[int]:
    """The ranks a summary of ``n`` values reads: each quantile's two neighbours and its interval's ends."""
    ranks: list[int] = []
    for q in QUANTILES.values():
        h = q * (n - 1)
        ranks += [math.floor(h), min(math.floor(h) + 1, n - 1)]
        ranks += [r for r in quantile_ci_ranks(n, float(q), CONFIDENCE_LEVEL) if r is not None]
    return ranks


def summarize_parts(parts: SortedParts | Sequence[np.ndarray], scale: float = 1.0) -> dict[str, Any]:
    """``summarize_sorted`` of the union of ascending arrays (see ``SortedParts``)."""
    sp = parts if isinstance(parts, SortedParts) else SortedParts(parts, scale)
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
