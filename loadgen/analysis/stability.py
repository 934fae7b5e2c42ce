"""Stability and Little's Law: L = λ·W only over an interval shown to be steady.

The candidate interval is the measurement window minus a warm-up of one median time in system
(capped at a quarter of the window), since the system fills for about that long. It is steady when
(1) at least ``MIN_ARRIVALS`` requests arrive in it, (2) completions ≈ arrivals (relative difference
≤ max(10%, 2/√arrivals), Poisson noise allowed), (3) the number in system is not trending (its
least-squares growth over the interval ≤ 20% of its mean + 2·√mean + 1), and (4) every request that
arrived in it finished, so W is known. Only then are both sides reported: L, the time-average
number in system (scheduled → done), and λ·W, arrival rate × mean time in system of the requests
that arrived in the interval. Otherwise the reason is returned and the law is not applied.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .metrics import NS_PER_S, littles_law_rhs, time_average_in_system

__all__ = ["MIN_ARRIVALS", "assess_stability", "in_system_at"]

MIN_ARRIVALS = 20
_SAMPLES = 64


def in_system_at(scheduled_ns: np.ndarray, done_ns: np.ndarray, t_ns: np.ndarray) -> np.ndarray:
    """Number of requests with scheduled ≤ t < done (never done = still in) at each instant t."""
    sched = np.sort(scheduled_ns)
    done = np.sort(np.where(np.isnan(done_ns), np.inf, done_ns))
    return np.searchsorted(sched, t_ns, side="right") - np.searchsorted(done, t_ns, side="right")


def assess_stability(
    scheduled_ns: np.ndarray, done_ns: np.ndarray, lo_ns: float, hi_ns: float, *, refuse: str | None = None
) -> dict[str, Any]:
    """Steady-interval test and Little's Law sides over [lo, hi) on the run clock (ns, NaN = never done)."""
    out: dict[str, Any] = {"applied": False, "reason": None, "interval_s": None}
    if refuse:
        out["reason"] = refuse
        return out
    sched = np.asarray(scheduled_ns, dtype=np.float64)
    done = np.asarray(done_ns, dtype=np.float64)
    if hi_ns <= lo_ns:
        out["reason"] = "empty measurement window"
        return out
    in_win = (sched >= lo_ns) & (sched < hi_ns)
    tis = (done - sched)[in_win & ~np.isnan(done)]
    warmup = float(np.median(tis)) if len(tis) else 0.0
    warmup = min(warmup, 0.25 * (hi_ns - lo_ns))
    a, b = lo_ns + warmup, hi_ns
    out["interval_s"] = [a / NS_PER_S, b / NS_PER_S]
    out["warmup_s"] = warmup / NS_PER_S
    arrived = (sched >= a) & (sched < b)
    n_arr = int(arrived.sum())
    n_done = int(((done >= a) & (done < b)).sum())
    out["arrivals"] = n_arr
    out["completions"] = n_done
    if n_arr < MIN_ARRIVALS:
        out["reason"] = f"only {n_arr} arrivals in the interval (need {MIN_ARRIVALS})"
        return out
    span_s = (b - a) / NS_PER_S
    lam = n_arr / span_s
    out["arrival_rps"] = lam
    out["completion_rps"] = n_done / span_s
    tol = max(0.10, 2.0 / math.sqrt(n_arr))
    rel = abs(n_done - n_arr) / n_arr
    t = np.linspace(a, b, _SAMPLES, endpoint=False)
    n_t = in_system_at(sched, done, t).astype(np.float64)
    slope = float(np.polyfit((t - a) / NS_PER_S, n_t, 1)[0]) if _SAMPLES > 1 else 0.0
    mean_n = float(n_t.mean())
    growth = slope * span_s
    out["in_flight_mean"] = mean_n
    out["in_flight_start"] = float(n_t[0])
    out["in_flight_end"] = float(n_t[-1])
    out["in_flight_slope_per_s"] = slope
    unfinished = int((arrived & np.isnan(done)).sum())
    if rel > tol:
        out["reason"] = f"completions ({n_done}) differ from arrivals ({n_arr}) by {rel:.0%} (> {tol:.0%}): not steady"
        return out
    if growth > 0.2 * mean_n + 2 * math.sqrt(mean_n) + 1:
        out["reason"] = (
            f"in-flight grew by {growth:.1f} over {span_s:.1f} s "
            f"(mean {mean_n:.1f}, slope {slope:.3g}/s): queue building, not steady"
        )
        return out
    if unfinished:
        out["reason"] = f"{unfinished} request(s) that arrived in the interval never finished: W unknown"
        return out
    w_s = float(np.mean(done[arrived] - sched[arrived])) / NS_PER_S
    l_avg = time_average_in_system(sched, done, int(a), int(b))
    rhs = littles_law_rhs(lam, w_s)
    out.update(
        applied=True,
        L=l_avg,
        lambda_rps=lam,
        W_s=w_s,
        lambda_W=rhs,
        relative_difference=(abs(l_avg - rhs) / rhs) if rhs and l_avg is not None else None,
    )
    return out
