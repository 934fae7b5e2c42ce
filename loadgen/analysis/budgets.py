"""Budget verdicts: each hard/soft percentile budget as a check with observed value, limit and n.

How requests count against a class's budgets (also printed in every report):

* ``ok`` requests count with their measured values.
* **Failures** (status ``error``, ``timeout``, ``not_sent``, and ``cancelled`` that was not a
  planned abandonment) enter the TTFT and E2E budget samples as **+inf**: a p99 budget over a run
  with more than 1% failures fails, whatever the successful requests did. Their inter-token gaps
  that were observed before the failure stay in the ITL sample (those stalls were real). A failure
  is never good (goodput) and counts in the error share.
* **Planned abandonments** (status ``cancelled`` with the trace's ``cancel_after_tokens`` set and a
  first token received: a user leaving, by design) count in the TTFT and ITL samples with their
  measured values, are left out of the E2E sample (their end is the client's choice, neither a
  sample nor a violation) and are left out of goodput and attainment (neither good nor bad).
  A planned abandonment that never got its first token is a failure.

Goodput counts ``ok`` requests meeting every *hard* budget: TTFT and E2E at or below the limit of
the highest percentile the budget sets (p99 if set, else p95, else p50); for ITL at most the
budget's tail share (1 − q) of the request's own gaps above that limit. Soft budgets only warn.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from .percentiles import LOW_SAMPLE_P99, QUANTILES, SortedParts

__all__ = ["BUDGET_METRICS", "Check", "budget_checks", "request_limit", "FAILURE_POLICY"]

#: Budgeted metrics (scenario ``budgets`` fields) in report order.
BUDGET_METRICS = ("ttft_ms", "itl_ms", "e2e_ms")

FAILURE_POLICY = (
    "failed, timed-out, not-sent and unplanned-cancelled requests enter the TTFT and E2E budget samples "
    "as +inf and are never good; planned abandonments (cancel_after_tokens, first token received) count "
    "for TTFT and ITL with their values and are left out of E2E, goodput and attainment"
)


@dataclass
class Check:
    """One budget check; ``observed`` is +inf when failures reach the percentile, None when n is 0."""

    class_name: str
    metric: str
    percentile: str | None
    observed: float | None
    limit: float
    n: int
    hard: bool
    passed: bool
    reason: str
    evaluated: bool = True
    failures_as_inf: int = 0

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["class"] = d.pop("class_name")
        return d


def request_limit(budget: Any) -> tuple[float, float] | None:
    """(q, limit) of the highest percentile a budget sets, for per-request goodput; None if none."""
    limits = budget.limits() if budget is not None else {}
    for name in ("p99", "p95", "p50"):
        if name in limits:
            return QUANTILES[name], float(limits[name])
    return None


def _fmt(value: float | None) -> str:
    if value is None:
        return "n/a"
    if math.isinf(value):
        return "inf"
    return f"{value:.1f}"


def budget_checks(class_name: str, metric: str, budget: Any, sorted_sample: np.ndarray | SortedParts,
                  n_inf: int) -> list[Check]:
    """Checks for one budget over an ascending sample (``n_inf`` of its values are failures as +inf)."""
    checks: list[Check] = []
    sample = sorted_sample if isinstance(sorted_sample, SortedParts) else SortedParts([sorted_sample])
    n = sample.n
    for pname, limit in budget.limits().items():
        observed = sample.percentile(QUANTILES[pname])
        kind = "hard" if budget.hard else "soft"
        if observed is None:
            checks.append(Check(class_name, metric, pname, None, float(limit), 0, budget.hard, True,
                                f"{class_name} {metric} {pname}: no samples; not evaluated ({kind})",
                                evaluated=False))
            continue
        passed = observed <= limit
        detail = f"n={n}"
        if n_inf:
            detail += f", {n_inf} failure(s) as +inf"
        if pname == "p99" and n < LOW_SAMPLE_P99:
            detail += f", p99 from <{LOW_SAMPLE_P99} samples"
        op = "<=" if passed else ">"
        reason = f"{class_name} {metric} {pname} {_fmt(observed)} {op} {limit:g} ({kind}; {detail})"
        checks.append(Check(class_name, metric, pname, observed, float(limit), n, budget.hard, passed, reason,
                            failures_as_inf=n_inf))
    return checks
