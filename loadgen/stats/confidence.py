"""How sure a reported percentile or share is: 95% intervals, three-way verdicts, and how many more requests.

**Percentiles** get a distribution-free interval from order statistics (no assumption on the latency
distribution, only that the n samples are independent draws from it). If ``B`` counts the samples
below the true quantile ``ξ_q``, then ``B ~ Binomial(n, q)``, and for 0-based ranks ``l < u`` of the
sorted sample ``P(x[l] ≤ ξ_q ≤ x[u]) ≥ F(u) − F(l)``, F the binomial CDF. Of the rank pairs whose
exact coverage is at least 95% and that bound both ends when any can, loadgen takes the one with the
least coverage (the binomial is discrete, so a pair rarely hits 95% exactly; equal tails would cover
up to 98%), preferring balanced tails among near-ties (within half a point) when both ends are bounded; with
one end unbounded, the least coverage alone (its other tail is 0, so balancing would only loosen it): coverage stays between 95% and about 97%
whenever both ends are bounded, and each one-sided error is at most 5%. Where no sample can bound an end it is unbounded (−inf /
+inf): a p99 needs at least 299 samples before its upper bound exists (0.99^n ≤ 5%), so a p99
from fewer samples can fail conclusively but never pass. The binomial CDF is summed exactly (in
log space) over the mean ± 12 standard deviations.

**Shares** (attainment, error share) get the Wilson score interval; the **difference of two shares**
``p₂ − p₁`` gets Newcombe's hybrid score interval (Newcombe 1998, method 10) built from the two Wilson
intervals ``[l₁, u₁]``, ``[l₂, u₂]`` at the same level: ``[d − √((p₂ − l₂)² + (u₁ − p₁)²),
d + √((u₂ − p₂)² + (p₁ − l₁)²)]``, ``d = p₂ − p₁``. Deterministic, within [−1, 1], and close to its nominal
coverage even for shares near 0 or 1 (where the Wald interval collapses).

**Verdicts** are three-way for a limit a value must not exceed: *pass* when the whole interval is at
or below the limit, *fail* when it is wholly above, *inconclusive* when it straddles the limit.

**How many more requests** (``samples_needed_quantile`` / ``samples_needed_share``): a plug-in
estimate. Take the sample as the truth — the share ``p̂`` of values at or below the limit (for a
share: the observed share) stays what it is — and find the smallest total sample size ``m ≥ n`` at
which the interval computed from ``m`` such samples excludes the limit (pass side when the point
estimate passes, fail side otherwise). For a percentile that search is a scan, not a bisection:
conclusiveness is not monotone in ``m`` (the rank pair jumps; at n = 299 a p99 interval becomes
two-sided), so "conclusive at m" says nothing about m − 1. The scan skips a block ``[a, b]`` of sizes
only where a proven bound rules every size in it out: a pass needs ``F_m(u) ≥ 95% + F_m(l)`` at the
upper rank ``u ≤ p̂·m − 1``, and ``F_m(k)`` falls as ``m`` grows, so ``F_a(⌊p̂·b⌋ − 1) < 95% + t`` excludes
the block, ``t`` a proven lower bound on the pair's lower tail ``F_m(l)`` (0, or about 2.25% once the
binomial is fine-grained: ``_tail_bounds``); a fail needs ``F_m(l) ≤ t'`` at ``l ≥ ⌈p̂·m⌉``, ``t'`` the
upper bound (5%, or about 2.5%), so ``F_b(⌈p̂·a⌉) > t'`` excludes it. Every other size is evaluated. Within ``SCAN_EVALUATIONS`` steps the result is the least sufficient size; past that
(a share within a hair of the quantile, millions of samples) it is the first sufficient size found by
doubling then bisection, which suffices but may not be the least. The extra requests are
``(m − n)`` samples converted to requests of the class at the run's samples-per-request ratio
(1 for TTFT; tokens per request for ITL). When ``p̂`` sits exactly on the quantile no size suffices
(None). It is an estimate: more data moves ``p̂``.

ITL samples are per-token gaps, which are correlated within a request; their intervals assume
independence and are narrower than the truth.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import lru_cache
from statistics import NormalDist

import numpy as np

__all__ = [
    "CONFIDENCE_LEVEL",
    "ESTIMATOR_RULE",
    "INTERVAL_RULE",
    "MAX_SAMPLES",
    "SCAN_EVALUATIONS",
    "SHARE_RULE",
    "binomial_cdf",
    "outcome",
    "quantile_ci_ranks",
    "quantile_ci_sorted",
    "samples_needed_quantile",
    "samples_needed_share",
    "newcombe_interval",
    "wilson_interval",
]

#: The confidence level of every interval loadgen reports.
CONFIDENCE_LEVEL = 0.95
#: Beyond this total sample size the estimator gives up (None: "not reachable").
MAX_SAMPLES = 10**9
#: At most this many steps (a block bound or a size evaluated) in the exact scan of ``samples_needed_quantile``.
SCAN_EVALUATIONS = 10_000
INTERVAL_RULE = (
    "95% distribution-free interval from order statistics: [x(l), x(u)], the rank pair bounding both ends "
    "(when n allows) with the least exact binomial(n, q) coverage at or above 95% (when both ends are bounded, "
    "the most balanced tails among pairs within half a point of it); unbounded (-inf/inf) where n is too small (a p99 needs n >= 299 for an upper bound)"
)
SHARE_RULE = "95% Wilson score interval"
ESTIMATOR_RULE = (
    "more requests needed: plug-in estimate; the observed share of samples within the limit is taken "
    "as the truth and the smallest total n whose 95% interval excludes the limit is found (for a "
    "percentile by an exact scan: conclusiveness is not monotone in n)"
)

_WINDOW_SD = 12.0


def _z(level: float) -> float:
    return NormalDist().inv_cdf(0.5 + level / 2.0)


def binomial_cdf(n: int, p: float) -> tuple[int, np.ndarray]:
    """``(lo, cdf)`` with ``cdf[i] = P(B ≤ lo + i)`` for ``B ~ Binomial(n, p)``, over mean ± 12 sd.

    Below ``lo`` the mass is under 1e-30 (taken as 0); above the window's end it is 1. Exact terms
    in log space: the pmf at ``lo`` from log-gamma, then the ratio recurrence.
    """
    if n < 0 or not 0.0 < p < 1.0:
        raise ValueError(f"binomial_cdf: n={n}, p={p}: expected n >= 0 and 0 < p < 1")
    mean, sd = n * p, math.sqrt(n * p * (1.0 - p))
    lo = max(0, math.floor(mean - _WINDOW_SD * sd - _WINDOW_SD))
    hi = min(n, math.ceil(mean + _WINDOW_SD * sd + _WINDOW_SD))
    log_lo = (
        math.lgamma(n + 1)
        - math.lgamma(lo + 1)
        - math.lgamma(n - lo + 1)
        + lo * math.log(p)
        + (n - lo) * math.log1p(-p)
    )
    k = np.arange(lo, hi, dtype=np.float64)  # ratio pmf(k+1)/pmf(k) for k in [lo, hi)
    steps = np.log(n - k) - np.log(k + 1.0) + (math.log(p) - math.log1p(-p))
    log_pmf = log_lo + np.concatenate(([0.0], np.cumsum(steps)))
    cdf = np.cumsum(np.exp(log_pmf))
    if hi == n:
        cdf = np.minimum(cdf, 1.0)
    return lo, cdf


#: Coverage this close to the level counts as reaching it: the summed CDF is exact only to its last bits.
_TIE = 1e-12
#: Among the rank pairs whose coverage is within this of the least, the most balanced is taken.
_BALANCE_SLACK = 0.005


@lru_cache(maxsize=4096)
def quantile_ci_ranks(n: int, q: float, level: float = CONFIDENCE_LEVEL) -> tuple[int | None, int | None]:
    """0-based ranks ``(l, u)`` of the interval for quantile ``q`` from ``n`` sorted samples; None = unbounded.

    Of every pair with exact coverage ``F(u) − F(l) ≥ level`` (``l = −1`` / ``u = n`` are the
    unbounded ends, ``F(−1) = 0``, ``F(n) = 1``), those with the fewest unbounded ends; of them the
    one with the least coverage; when both ends are bounded, among those within half a point of it, the
    one whose two tail probabilities ``F(l)`` and ``1 − F(u)`` are closest (then the least coverage, then
    the lower pair). With an end unbounded, the least coverage alone (its tail is 0: nothing to balance).
    """
    if n <= 0:
        return None, None
    if q <= 0.0:
        return None, 0
    if q >= 1.0:
        return n - 1, None
    lo, cdf = binomial_cdf(n, q)
    if lo + len(cdf) - 1 == n:
        cdf[-1] = 1.0
    excess = 1.0 - level
    # candidate lower ranks: lo − 1 (F ≈ 0: the window starts 12 sd below the mean), then each F(l) ≤ 1 − level;
    # both comparisons allow _TIE, so a pair covering exactly the level is not refused for the CDF's last bits
    # (one sample's p95: F(0) = 0.05 exactly, summed as 0.05000000000000005, one ulp above 1 − 0.95)
    n_low = int(np.searchsorted(cdf, excess + _TIE, side="right"))
    f_low = np.concatenate(([0.0], cdf[:n_low]))
    low_rank = np.arange(lo - 1, lo + n_low)
    up_idx = np.searchsorted(cdf, f_low + level - _TIE, side="left").clip(max=len(cdf) - 1)
    coverage = cdf[up_idx] - f_low
    up_rank = lo + up_idx
    unbounded = (low_rank < 0).astype(int) + (up_rank > n - 1).astype(int)
    coverage = np.where(unbounded == unbounded.min(), coverage, np.inf)  # bound both ends whenever some pair can
    # balancing is for two bounded ends; with one end unbounded its tail is 0, and "balancing" would only
    # take the loosest bound within the slack (a p99 of 10 samples bounded below by the smallest one)
    slack = _BALANCE_SLACK if unbounded.min() == 0 else 0.0
    near = coverage <= coverage.min() + slack
    balance = np.where(near, np.abs(f_low - (1.0 - cdf[up_idx])), np.inf)
    # exact ties (q = 0.5 is symmetric) go to the lower pair; rounding keeps float noise from deciding them
    best = int(np.lexsort((low_rank, np.round(coverage, 9), np.round(balance, 9)))[0])
    low, up = int(low_rank[best]), int(up_rank[best])
    return (low if low >= 0 else None), (up if up <= n - 1 else None)


def quantile_ci_sorted(
    sorted_values: np.ndarray, q: float, level: float = CONFIDENCE_LEVEL
) -> tuple[float, float] | None:
    """``(low, high)`` bounds of quantile ``q`` of an ascending array (−inf / +inf where unbounded); None if empty."""
    n = len(sorted_values)
    if n == 0:
        return None
    low, up = quantile_ci_ranks(n, float(q), level)
    return (
        -math.inf if low is None else float(sorted_values[low]),
        math.inf if up is None else float(sorted_values[up]),
    )


def wilson_interval(k: float, n: float, level: float = CONFIDENCE_LEVEL) -> tuple[float, float] | None:
    """Wilson score interval of the share ``k / n``; None when ``n`` is 0."""
    if n <= 0:
        return None
    z = _z(level)
    p = k / n
    denom = 1.0 + z * z / n
    center = (p + z * z / (2.0 * n)) / denom
    half = z / denom * math.sqrt(max(p * (1.0 - p) / n + z * z / (4.0 * n * n), 0.0))
    low = 0.0 if k <= 0 else max(0.0, center - half)
    high = 1.0 if k >= n else min(1.0, center + half)
    return low, high


def newcombe_interval(
    k1: float, n1: float, k2: float, n2: float, level: float = CONFIDENCE_LEVEL
) -> tuple[float, float] | None:
    """Newcombe's hybrid score interval of ``k2/n2 − k1/n1`` from the two Wilson intervals at ``level``;
    None when either ``n`` is 0."""
    w1, w2 = wilson_interval(k1, n1, level), wilson_interval(k2, n2, level)
    if w1 is None or w2 is None:
        return None
    p1, p2 = k1 / n1, k2 / n2
    d = p2 - p1
    low = d - math.sqrt((p2 - w2[0]) ** 2 + (w1[1] - p1) ** 2)
    high = d + math.sqrt((w2[1] - p2) ** 2 + (p1 - w1[0]) ** 2)
    return max(-1.0, low), min(1.0, high)


def outcome(observed: float | None, interval: tuple[float, float] | None, limit: float) -> str:
    """``pass`` / ``fail`` / ``inconclusive`` for "at most ``limit``"; ``not evaluated`` without data.

    Pass needs the interval's upper bound (and the point estimate) at or below the limit; fail needs
    its lower bound (and the point estimate) above it.
    """
    if observed is None or interval is None:
        return "not evaluated"
    low, high = interval
    if high <= limit and observed <= limit:
        return "pass"
    if low > limit and observed > limit:
        return "fail"
    return "inconclusive"


def _smallest(conclusive: Callable[[int], bool], n: int) -> int | None:
    """The smallest m >= n with ``conclusive(m)``, by doubling then bisection (None beyond MAX_SAMPLES)."""
    if conclusive(n):
        return n
    lo, hi = n, max(2 * n, n + 1)
    while not conclusive(hi):
        lo, hi = hi, 2 * hi
        if hi > MAX_SAMPLES:
            return None
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if conclusive(mid):
            hi = mid
        else:
            lo = mid
    return hi


def samples_needed_quantile(n: int, n_within: int, q: float, level: float = CONFIDENCE_LEVEL) -> int | None:
    """Least total samples at which quantile ``q`` is conclusive, if the share within the limit stays ``n_within / n``.

    The side follows that share: above ``q`` the quantile ends within the limit (a conclusive pass),
    below ``q`` above it (a conclusive fail); exactly ``q``: None. An exact scan (module docstring).
    """
    if n <= 0:
        return None
    share = n_within / n
    if share == q:
        return None
    passes = share > q

    def conclusive(m: int) -> bool:
        low, up = quantile_ci_ranks(m, q, level)
        if passes:  # x[u] within the limit: at least u + 1 samples within it
            return up is not None and share * m >= up + 1
        return low is not None and share * m <= low  # x[l] above the limit: at most l samples within it

    if not 0.0 < q < 1.0:
        return _smallest(conclusive, n)

    def ruled_out(a: int, b: int) -> bool:
        """True only if no size in [a, b] can be conclusive (the proven bounds of ``_tail_bounds``)."""
        low_tail_min, low_tail_max = _tail_bounds(a, q, level)
        if passes:
            return _cdf_at(a, q, math.floor(share * b) - 1) < level + low_tail_min - _CDF_SLACK
        return _cdf_at(b, q, math.ceil(share * a)) > low_tail_max + _CDF_SLACK

    return _scan(conclusive, ruled_out, n)


#: Float noise allowed in a bound before it rules a block out (the binomial sums are exact to ~1e-15).
_CDF_SLACK = 1e-9


def _tail_bounds(a: int, q: float, level: float) -> tuple[float, float]:
    """Bounds on ``F(l)``, the lower tail of the pair ``quantile_ci_ranks(m, q)`` picks, for every m >= a.

    Always ``0 <= F(l) <= 1 − level``. Tighter once the binomial is fine-grained: with ``P`` the largest
    pmf of Binomial(a, q) (no larger for any m >= a: each pmf of m + 1 is a mix of two of m) at most the
    balance slack, and ``q^a <= e/2`` (``e = 1 − level``), the pair with ``F(l)`` the last step at or below
    ``e/2`` bounds both ends, covers less than ``level + P`` and has tails within ``2P`` of each other;
    so the pick (coverage within the slack of the least, tails at least as balanced) has
    ``(e − slack − 3P)/2 <= F(l) <= e/2 + P``.
    """
    excess = 1.0 - level
    mode = min(a, math.floor((a + 1) * q))
    log_pmax = (
        math.lgamma(a + 1)
        - math.lgamma(mode + 1)
        - math.lgamma(a - mode + 1)
        + mode * math.log(q)
        + (a - mode) * math.log1p(-q)
    )
    p_max = math.exp(log_pmax)
    if p_max > _BALANCE_SLACK or a * math.log(q) > math.log(excess / 2.0):
        return 0.0, excess
    return max(0.0, (excess - _BALANCE_SLACK - 3.0 * p_max) / 2.0), min(excess, excess / 2.0 + p_max)


def _cdf_at(m: int, q: float, k: int) -> float:
    """``P(B ≤ k)`` for ``B ~ Binomial(m, q)``, from ``binomial_cdf``'s window (0 below it, 1 above it)."""
    if k < 0:
        return 0.0
    if k >= m:
        return 1.0
    lo, cdf = binomial_cdf(m, q)
    if k < lo:
        return 0.0
    return float(cdf[k - lo]) if k - lo < len(cdf) else 1.0


def _scan(conclusive: Callable[[int], bool], ruled_out: Callable[[int, int], bool], n: int) -> int | None:
    """The least m >= n with ``conclusive(m)``: blocks ``ruled_out`` are skipped (growing while they are),
    every other size is evaluated; past ``SCAN_EVALUATIONS`` calls of either, ``_smallest`` from there on."""
    m, width, calls = n, 1, 0
    while m <= MAX_SAMPLES:
        calls += 1
        if calls > SCAN_EVALUATIONS:
            return _smallest(conclusive, m)
        if width > 1 and ruled_out(m, m + width - 1):
            m += width
            width *= 2
        elif width > 2:
            width //= 2
        elif ruled_out(m, m):
            m, width = m + 1, 2
        elif conclusive(m):
            return m
        else:
            m, width = m + 1, 2
    return None


def samples_needed_share(n: int, k: int, limit: float, level: float = CONFIDENCE_LEVEL) -> int | None:
    """Total requests at which the share ``k / n`` is conclusively at most / above ``limit`` (None: never)."""
    if n <= 0:
        return None
    share = k / n
    if share == limit:
        return None
    passes = share <= limit

    def conclusive(m: int) -> bool:
        interval = wilson_interval(share * m, m, level)
        assert interval is not None
        return interval[1] <= limit if passes else interval[0] > limit

    return _smallest(conclusive, n)
