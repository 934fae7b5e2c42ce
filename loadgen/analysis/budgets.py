"""Budget verdicts: each hard/soft percentile budget as a check with observed value, limit and n.

How requests count against a class's budgets (also printed in every report):

* ``ok`` requests count with their measured values.
* **Failures** (status ``error``, ``timeout``, ``not_sent``, and ``cancelled`` that was not a
  planned abandonment) enter the TTFT and E2E budget samples as **+inf**: they move the
  interval's ranks, not the verdict directly (a p99 at n = 300 fails on failures alone from 11 of them,
  passes only with none, is inconclusive between: docs/budgets.md). Their inter-token gaps
  that were observed before the failure stay in the ITL sample (those stalls were real). A failure
  is never good (goodput) and counts in the error share.
* **Planned abandonments** (status ``cancelled`` with the trace's ``cancel_after_tokens`` set and a
  first token received: a user leaving, by design) count in the TTFT and ITL samples with their
  measured values, are left out of the E2E sample (their end is the client's choice, neither a
  sample nor a violation) and are left out of goodput and attainment (neither good nor bad).
  A planned abandonment that never got its first token is a failure.

Every verdict is three-way (``Check.outcome``): **pass** when the 95% interval of the percentile
(order statistics, ``loadgen.stats.confidence``) lies at or below the limit, **fail** when it lies
above, **inconclusive** when it straddles the limit; an inconclusive check says about how many more
requests of its class would make it conclusive (``more_requests``). ``passed`` is the point
estimate alone (observed <= limit). The error share gets a Wilson interval the same way.

A run whose client fell behind its own schedule (send-lag p99 above ``SEND_LAG_BOUND_MS``) did not apply
the load it was meant to, and every latency counted from the scheduled instant carries the client's
error: ``client_lag_line`` says so, the report shows it beside the verdict, and a comparison judges no
budget of such a run.

Goodput counts ``ok`` requests meeting every *hard* budget: TTFT and E2E at or below the limit of
the highest percentile the budget sets (p99 if set, else p95, else p50); for ITL at most the
budget's tail share (1 − q) of the request's own gaps above that limit. Soft budgets only warn.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from loadgen.stats.confidence import (
    CONFIDENCE_LEVEL,
    outcome,
    samples_needed_quantile,
    samples_needed_share,
    wilson_interval,
)
from loadgen.stats.percentiles import LOW_SAMPLE_P99, QUANTILES, SortedParts

__all__ = [
    "BUDGET_METRICS",
    "FAILURE_POLICY",
    "OUTCOMES",
    "PROMPT_TOKEN_BOUND",
    "SEND_LAG_BOUND_MS",
    "Check",
    "budget_checks",
    "client_lag_line",
    "prompt_tokens_line",
    "error_share_check",
    "request_limit",
]

#: The three verdicts of an evaluated check (and "not evaluated" without data).
OUTCOMES = ("pass", "fail", "inconclusive")

#: Budgeted metrics (scenario ``budgets`` fields) in report order.
BUDGET_METRICS = ("ttft_ms", "ttfat_ms", "itl_ms", "e2e_ms")

#: Above this client send-lag p99 (ms) a run did not apply its schedule (the plan's default stop, too).
SEND_LAG_BOUND_MS = 50.0


def client_lag_line(lag_p99_ms: float | None, bound_ms: float = SEND_LAG_BOUND_MS) -> str | None:
    """Why a run is no evidence about its target (the client fell behind its schedule), or None when it kept it."""
    if lag_p99_ms is None or lag_p99_ms <= bound_ms:
        return None
    return (
        f"the client fell behind its schedule (send-lag p99 {lag_p99_ms:.{1 if lag_p99_ms >= 1 else 3}f} ms > "
        f"{bound_ms:g} ms): the load was not applied as scheduled and every latency counted from the scheduled "
        "instant carries the client's error; rerun on a quieter host"
    )


#: Above this relative difference between the server's and the trace's prompt tokens, a run measured another workload.
PROMPT_TOKEN_BOUND = 0.05


def prompt_tokens_line(target_tokens: float, server_tokens: float, n: int, tokenizer: str | None) -> str | None:
    """Why a run is not evidence about its trace's workload (the server counted other prompt lengths than the
    trace asked for: prompts sized with another tokenizer), or None within ``PROMPT_TOKEN_BOUND``.
    ``target_tokens`` / ``server_tokens``: sums over the ``n`` requests where the server reported a count."""
    if n == 0 or target_tokens <= 0 or abs(server_tokens / target_tokens - 1.0) <= PROMPT_TOKEN_BOUND:
        return None
    ratio = server_tokens / target_tokens
    how = f"sized with {tokenizer}" if tokenizer else "sized with another tokenizer"
    return (
        f"the server counted {ratio:.2f}x the prompt tokens the trace asked for ({server_tokens / n:,.0f} vs "
        f"{target_tokens / n:,.0f} per request over {n:,} requests; prompts {how}): the run measured another "
        "workload than the trace describes; rerun with --tokenizer server or hf:PATH/tokenizer.json (the target's)"
    )


FAILURE_POLICY = (
    "failed, timed-out, not-sent and unplanned-cancelled requests enter the TTFT and E2E budget samples "
    "as +inf and are never good; planned abandonments (cancel_after_tokens, first token received) count "
    "for TTFT and ITL with their values and are left out of E2E, goodput and attainment"
)


@dataclass
class Check:
    """One budget check; ``observed`` is +inf when failures reach the percentile, None when n is 0.

    ``passed`` is the point estimate (observed <= limit); ``outcome`` the verdict with its 95%
    interval ``ci`` = [low, high]: pass, fail or inconclusive. ``more_requests``: about how many more
    requests of ``class_name`` would make an inconclusive check conclusive (None: not estimable).
    """

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
    outcome: str = "pass"
    ci: list[float] | None = None
    ci_level: float = CONFIDENCE_LEVEL
    more_requests: int | None = None

    @property
    def failed(self) -> bool:
        """A conclusive failure (the whole interval above the limit)."""
        return self.evaluated and self.outcome == "fail"

    @property
    def inconclusive(self) -> bool:
        return self.evaluated and self.outcome == "inconclusive"

    def needed_text(self) -> str:
        """ "about N more requests of class C are needed" (or why no number can be given)."""
        unit = "sessions" if self.metric == "makespan_ms" else "requests"  # a makespan's sample is sessions
        who = unit if self.class_name == "overall" else f"{unit} of class {self.class_name}"
        if self.more_requests is None:
            return f"no number of more {who} is estimable (the sample sits on the limit)"
        return f"about {self.more_requests:,} more {who} are needed"

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
        return "inf" if value > 0 else "-inf"  # an interval not bounded below is [-inf, ...], never [inf, ...]
    return f"{value:.1f}"


def _more_requests(total: int | None, n: int, requests: int | None) -> int | None:
    """Extra samples (``total − n``) as requests of the class, at the sample's samples-per-request ratio."""
    if total is None:
        return None
    per_request = n / requests if requests else 1.0
    return max(0, math.ceil((total - n) / max(per_request, 1e-12)))


def _interval_text(ci: tuple[float, float]) -> str:
    return f"95% CI [{_fmt(ci[0])}, {_fmt(ci[1])}]"


def budget_checks(
    class_name: str,
    metric: str,
    budget: Any,
    sorted_sample: np.ndarray | SortedParts,
    n_inf: int,
    requests: int | None = None,
) -> list[Check]:
    """Checks for one budget over an ascending sample (``n_inf`` of its values are failures as +inf).

    ``requests``: how many requests of the class the sample came from (converts the extra samples an
    inconclusive check needs into requests; default one sample per request).
    """
    checks: list[Check] = []
    sample = sorted_sample if isinstance(sorted_sample, SortedParts) else SortedParts([sorted_sample])
    n = sample.n
    for pname, limit in budget.limits().items():
        q = QUANTILES[pname]
        observed = sample.percentile(q)
        kind = "hard" if budget.hard else "soft"
        if observed is None:
            checks.append(
                Check(
                    class_name,
                    metric,
                    pname,
                    None,
                    float(limit),
                    0,
                    budget.hard,
                    True,
                    f"{class_name} {metric} {pname}: no samples; not evaluated ({kind})",
                    evaluated=False,
                    outcome="not evaluated",
                )
            )
            continue
        ci = sample.interval(q)
        assert ci is not None, "a non-empty sample has an interval"
        verdict = outcome(observed, ci, float(limit))
        more = None
        if verdict == "inconclusive":
            total = samples_needed_quantile(n, sample.count_at_most(float(limit)), q)
            more = _more_requests(total, n, requests)
        detail = f"n={n}, {_interval_text(ci)}"
        if n_inf:
            detail += f", {n_inf} failure(s) as +inf"
        if pname == "p99" and n < LOW_SAMPLE_P99:
            detail += f", p99 from <{LOW_SAMPLE_P99} samples"
        op = "<=" if observed <= limit else ">"
        check = Check(
            class_name,
            metric,
            pname,
            observed,
            float(limit),
            n,
            budget.hard,
            observed <= limit,
            "",
            failures_as_inf=n_inf,
            outcome=verdict,
            ci=list(ci),
            more_requests=more,
        )
        tail = f"; inconclusive: {check.needed_text()}" if verdict == "inconclusive" else ""
        check.reason = f"{class_name} {metric} {pname} {_fmt(observed)} {op} {limit:g} ({kind}; {detail}){tail}"
        checks.append(check)
    return checks


def error_share_check(n_failed: int, n: int, limit: float) -> Check:
    """The run's error share against its limit (hard), with a Wilson interval and a three-way verdict."""
    share = n_failed / n if n else None
    ci = wilson_interval(n_failed, n)
    verdict = outcome(share, ci, limit)
    more = _more_requests(samples_needed_share(n, n_failed, limit), n, n) if verdict == "inconclusive" else None
    shown = share if share is not None else 0.0
    check = Check(
        "overall",
        "error_share",
        None,
        share,
        limit,
        n,
        True,
        share is None or share <= limit,
        "",
        evaluated=share is not None,
        outcome=verdict,
        ci=list(ci) if ci else None,
        more_requests=more,
    )
    interval = f", 95% CI [{ci[0]:.2%}, {ci[1]:.2%}]" if ci else ""
    tail = f"; inconclusive: {check.needed_text()}" if verdict == "inconclusive" else ""
    check.reason = (
        f"error share {shown:.2%} {'>' if share is not None and share > limit else '<='} {limit:.2%} "
        f"({n_failed} of {n} failed{interval}){tail}"
    )
    return check
