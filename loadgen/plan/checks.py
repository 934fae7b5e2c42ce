"""Judging one run of a cell: hard budgets, the error-rate limit and the declared stop conditions.

Every failure is kept as a reason a person can read and a program can sort: a failed budget is
(class, metric, percentile, observed, limit, n); a stop is (kind, detail). Stop kinds, in the order
they are looked for:

- ``server_failure``: the server died or connect/5xx/reset errors exceed ``stops.server_failure_rate``
  (out-of-memory shows up here: an engine that runs out of memory errors or exits);
- ``invalid_output``: malformed SSE, empty output or truncated streams exceed ``stops.invalid_output_rate``;
- ``behaviour_drift``: the frozen behaviour cases failed against the target after the cell;
- ``timeout_budget``: timed-out requests exceed ``stops.timeout_rate`` or the cell hit its wall deadline;
- ``measurement_corruption``: send-lag p99 above ``stops.send_lag_p99_ms``, records missing or
  unaccounted, or impossible timestamps (clock problems);
- ``unstable_tail`` is judged across repeats (``unstable_tail``), not per run.
"""

from __future__ import annotations

import math
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any, cast

import numpy as np

from loadgen.rundir.io import RunData
from loadgen.rundir.manifest import Manifest

from ..analysis import Analysis
from ..analysis.budgets import error_share_check
from .spec import StopLimits

__all__ = [
    "STOP_KINDS",
    "FATAL_STOPS",
    "FailedCheck",
    "Stop",
    "RunJudgement",
    "judge_run",
    "unstable_tail",
    "SERVER_FAILURE_KINDS",
    "INVALID_OUTPUT_KINDS",
]

STOP_KINDS = (
    "server_failure",
    "invalid_output",
    "behaviour_drift",
    "timeout_budget",
    "measurement_corruption",
    "unstable_tail",
)
#: Stops that say the target itself is broken at this load: raising any dimension further is pointless.
FATAL_STOPS = ("server_failure", "invalid_output", "behaviour_drift")
SERVER_FAILURE_KINDS = ("connect", "http_5xx", "reset_mid_stream")
INVALID_OUTPUT_KINDS = ("malformed_head", "malformed_sse", "empty_output", "truncated")


@dataclass(frozen=True)
class FailedCheck:
    """A hard check that failed (``outcome`` "fail": its 95% interval lies above the limit) or is
    inconclusive (the interval straddles it; ``more_requests`` of the class would likely decide it):
    what, where, how much, against what, over how many samples."""

    request_class: str
    metric: str
    percentile: str | None
    observed: float | None
    limit: float
    n: int
    reason: str
    outcome: str = "fail"
    ci: tuple[float, float] | None = None
    more_requests: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "class": self.request_class,
            "metric": self.metric,
            "percentile": self.percentile,
            "observed": _finite(self.observed),
            "limit": self.limit,
            "n": self.n,
            "reason": self.reason,
            "outcome": self.outcome,
            "ci": [_finite(v) for v in self.ci] if self.ci else None,
            "more_requests": self.more_requests,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> FailedCheck:
        def num(v: Any) -> Any:
            return {"inf": math.inf, "-inf": -math.inf}.get(v, v) if isinstance(v, str) else v

        ci = d.get("ci")
        return cls(
            d["class"],
            d["metric"],
            d.get("percentile"),
            num(d.get("observed")),
            d["limit"],
            d["n"],
            d["reason"],
            d.get("outcome", "fail"),
            (num(ci[0]), num(ci[1])) if ci else None,
            d.get("more_requests"),
        )


@dataclass(frozen=True)
class Stop:
    kind: str
    detail: str

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "detail": self.detail}


@dataclass
class RunJudgement:
    """One run of a cell, judged."""

    failed: list[FailedCheck] = field(default_factory=list)
    stops: list[Stop] = field(default_factory=list)
    per_class_failed: dict[str, list[FailedCheck]] = field(default_factory=dict)
    figures: dict[str, Any] = field(default_factory=dict)
    inconclusive: list[FailedCheck] = field(default_factory=list)  # hard checks whose interval straddles the limit
    per_class_inconclusive: dict[str, list[FailedCheck]] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        """Every hard check passed conclusively and no stop fired."""
        return not self.failed and not self.stops and not self.inconclusive

    @property
    def conclusive_failure(self) -> bool:
        return bool(self.failed or self.stops)


def _share(count: int, total: int) -> float:
    return count / total if total else 0.0


def _check_record(check: Any) -> FailedCheck:
    return FailedCheck(
        check.class_name,
        check.metric,
        check.percentile,
        check.observed,
        check.limit,
        check.n,
        check.reason,
        check.outcome,
        tuple(check.ci) if check.ci else None,
        check.more_requests,
    )


def _measurement_problems(run: RunData, manifest: Manifest, limits: StopLimits) -> list[str]:
    """Send lag over its bound, missing/unaccounted records, impossible timestamps."""
    problems: list[str] = []
    lag = manifest.send_lag_ns or {}
    p99 = lag.get("p99")
    if p99 is not None and p99 / 1e6 > limits.send_lag_p99_ms:
        problems.append(
            f"send-lag p99 {p99 / 1e6:.2f} ms > bound {limits.send_lag_p99_ms:g} ms (n={lag.get('n')}): "
            "the client could not keep the schedule"
        )
    requests = run.requests
    n_rows = requests.num_rows
    trace_rows = manifest.trace.metadata.get("requests") if manifest.trace else None
    scheduled = manifest.scheduled_requests if manifest.scheduled_requests is not None else trace_rows
    if scheduled is not None and int(scheduled) != n_rows:
        problems.append(f"records missing: {n_rows} request rows for {scheduled} scheduled requests")
    counts = manifest.status_counts
    if counts and sum(counts.values()) != n_rows:
        problems.append(f"status counts sum to {sum(counts.values())} but {n_rows} rows were recorded")
    cols = {
        name: requests.column(name).to_numpy(zero_copy_only=False)
        for name in (
            "scheduled_ns",
            "sent_ns",
            "first_token_ns",
            "done_ns",
            "status",
            "client_output_tokens",
            "request_id",
        )
    }

    def as_float(values: np.ndarray) -> np.ndarray:
        return (
            np.array([np.nan if v is None else float(v) for v in values], dtype=float)
            if values.dtype == object
            else values.astype(float)
        )

    sched, sent, first, done = (as_float(cols[k]) for k in ("scheduled_ns", "sent_ns", "first_token_ns", "done_ns"))
    with np.errstate(invalid="ignore"):
        bad = int(np.sum(sent < sched) + np.sum(first < sent) + np.sum(done < first))
    if bad:
        problems.append(
            f"clock: {bad} impossible timestamp orderings (sent < scheduled, first token < sent or done < first token)"
        )
    if run.chunks is not None and run.chunks.num_rows:
        grouped = run.chunks.group_by("request_id").aggregate([("tokens", "sum")])
        by_id = dict(zip(grouped.column("request_id").to_pylist(), grouped.column("tokens_sum").to_pylist()))
        mismatched = 0
        for rid, status, counted in zip(cols["request_id"], cols["status"], cols["client_output_tokens"]):
            if status == "ok" and counted is not None and not (isinstance(counted, float) and math.isnan(counted)):
                if int(by_id.get(rid, 0)) != int(counted):
                    mismatched += 1
        if mismatched:
            problems.append(
                f"accounting: {mismatched} ok requests whose chunk tokens do not sum to their counted output"
            )
    return problems


def judge_run(
    analysis: Any,
    run: Any,
    limits: StopLimits,
    *,
    deadline_hit: bool = False,
    alive_problem: str | None = None,
    contract: dict[str, Any] | None = None,
    expected_classes: Collection[str] = (),
) -> RunJudgement:
    """Judge one analysed run (``loadgen.analysis.Analysis`` + ``loadgen.rundir.io.RunData``).

    ``expected_classes``: the classes the run's trace schedules; a hard budget of one of them with no sample
    (no request of the class in the window) is inconclusive, never met: a cell does not meet a budget it never
    measured."""
    manifest = run.manifest
    out = RunJudgement()
    for check in analysis.hard_failures:
        record = _check_record(check)
        out.failed.append(record)
        out.per_class_failed.setdefault(check.class_name, []).append(record)
    for check in analysis.hard_inconclusive:
        record = _check_record(check)
        out.inconclusive.append(record)
        out.per_class_inconclusive.setdefault(check.class_name, []).append(record)
    for record in _unmeasured(analysis, expected_classes):
        out.inconclusive.append(record)
        out.per_class_inconclusive.setdefault(record.request_class, []).append(record)
    overall = analysis.overall
    n = int(overall.n_scheduled or 0)
    kinds: dict[str, int] = dict(overall.error_kinds or {})
    statuses: dict[str, int] = dict(overall.status_counts or {})
    _error_rate(out, analysis, limits, statuses, n)
    server_n = sum(kinds.get(k, 0) for k in SERVER_FAILURE_KINDS)
    if alive_problem:
        out.stops.append(Stop("server_failure", alive_problem))
    elif _share(server_n, n) > limits.server_failure_rate:
        detail = ", ".join(f"{k} {kinds[k]}" for k in SERVER_FAILURE_KINDS if kinds.get(k))
        out.stops.append(
            Stop(
                "server_failure",
                f"{server_n} of {n} requests failed at the server ({detail}) > {limits.server_failure_rate:.0%}",
            )
        )
    invalid_n = sum(kinds.get(k, 0) for k in INVALID_OUTPUT_KINDS)
    if _share(invalid_n, n) > limits.invalid_output_rate:
        detail = ", ".join(f"{k} {kinds[k]}" for k in INVALID_OUTPUT_KINDS if kinds.get(k))
        out.stops.append(
            Stop(
                "invalid_output", f"{invalid_n} of {n} responses invalid ({detail}) > {limits.invalid_output_rate:.0%}"
            )
        )
    if contract and contract.get("status") == "failed":
        out.stops.append(Stop("behaviour_drift", contract.get("summary") or "behaviour cases failed after the cell"))
    timeouts = int(statuses.get("timeout", 0))
    if _share(timeouts, n) > limits.timeout_rate:
        out.stops.append(Stop("timeout_budget", f"{timeouts} of {n} requests timed out > {limits.timeout_rate:.0%}"))
    elif deadline_hit:
        out.stops.append(Stop("timeout_budget", "the cell hit its wall deadline before every request finished"))
    problems = _measurement_problems(run, manifest, limits)
    if problems:
        out.stops.append(Stop("measurement_corruption", "; ".join(problems)))
    out.figures = run_figures(analysis, manifest)
    return out


def _unmeasured(analysis: Any, expected_classes: Collection[str]) -> list[FailedCheck]:
    """Hard budgets of the expected classes that had no request in the window (not evaluated), as inconclusive
    checks (a budget not evaluated for another reason, e.g. ITL of a class that streams no tokens, is left as it is)."""
    return [
        FailedCheck(
            check.class_name,
            check.metric,
            check.percentile,
            None,
            check.limit,
            0,
            f"{check.class_name} {check.metric} {check.percentile}: no request of the class in the analysis window "
            "(hard; not evaluated, so not shown to be met)",
            "inconclusive",
        )
        for check in analysis.checks
        if check.hard
        and not check.evaluated
        and check.class_name in expected_classes
        and not getattr(analysis.classes.get(check.class_name), "n_scheduled", 0)
    ]


def _error_rate(out: RunJudgement, analysis: Any, limits: StopLimits, statuses: dict[str, int], n: int) -> None:
    """The plan's error-rate limit (error, timeout, not sent), three-way by its Wilson interval. An
    inconclusive one is recorded only under a plan-specific limit (else the analysis's error-share check says it)."""
    error_limit = limits.error_rate_limit if limits.error_rate_limit is not None else analysis.error_rate_limit
    failed_n = sum(v for k, v in statuses.items() if k in ("error", "timeout", "not_sent"))
    check = error_share_check(failed_n, n, error_limit)
    if check.outcome not in ("fail", "inconclusive"):
        return
    if check.outcome == "inconclusive" and limits.error_rate_limit is None:
        return
    record = FailedCheck(
        "overall",
        "error_rate",
        None,
        check.observed,
        error_limit,
        n,
        "overall " + check.reason.replace("error share", "error rate", 1),
        check.outcome,
        cast("tuple[float, float]", tuple(check.ci)) if check.ci else None,  # a Wilson interval: [low, high]
        check.more_requests,
    )
    (out.failed if check.outcome == "fail" else out.inconclusive).append(record)
    target = out.per_class_failed if check.outcome == "fail" else out.per_class_inconclusive
    for name in analysis.classes:
        target.setdefault(name, []).append(record)


def run_figures(analysis: Analysis, manifest: Manifest) -> dict[str, Any]:
    """Numbers a region table shows per run: offered vs completed, tails with counts."""
    overall = analysis.overall
    lag = manifest.send_lag_ns or {}
    lag_p99 = lag.get("p99")
    per_class = {}
    for name, group in analysis.classes.items():
        ttft = group.metrics.get("ttft_ms") or {}
        per_class[name] = {
            "ttft_p99_ms": _finite(ttft.get("p99")),
            "ttft_n": ttft.get("n"),
            "n_scheduled": group.n_scheduled,
            "completed_rps": group.completed_rps,
            "output_tok_s": group.output_tok_s,
        }
    return {
        "n_scheduled": overall.n_scheduled,
        "status_counts": dict(overall.status_counts or {}),
        "offered_rps": overall.offered_rps,
        "send_rps": overall.send_rps,
        "completed_rps": overall.completed_rps,
        "prompt_tok_s": overall.prompt_tok_s,
        "output_tok_s": overall.output_tok_s,
        "goodput_rps": overall.goodput_rps,
        "send_lag_p99_ms": (lag_p99 / 1e6) if lag_p99 is not None else None,
        "classes": per_class,
    }


def _finite(value: Any) -> Any:
    if isinstance(value, float) and math.isinf(value):
        return "inf"
    return value


def unstable_tail(per_repeat_p99: list[dict[str, Any]], limit: float, floor_ms: float = 0.0) -> Stop | None:
    """p99 TTFT not converging across repeats: (max − min) / median > ``limit`` for any class, with
    max − min above ``floor_ms`` (a few ms of scheduler jitter on a tiny p99 is not an unstable tail)."""
    if len(per_repeat_p99) < 2:
        return None
    classes = sorted({c for r in per_repeat_p99 for c in r})
    for name in classes:
        values = [r.get(name) for r in per_repeat_p99]
        if any(v is None or v == "inf" for v in values):
            continue
        arr = np.array(values, dtype=float)
        median = float(np.median(arr))
        if median <= 0:
            continue
        spread = float(arr.max() - arr.min()) / median
        if spread > limit and float(arr.max() - arr.min()) > floor_ms:
            shown = ", ".join(f"{v:.0f}" for v in arr)
            return Stop(
                "unstable_tail",
                f"{name} p99 TTFT across {len(arr)} repeats [{shown}] ms spreads "
                f"{spread:.0%} of its median > {limit:.0%} (and > {floor_ms:g} ms)",
            )
    return None
