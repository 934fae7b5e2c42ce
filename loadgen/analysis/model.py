"""The result of analysing one run: plain dataclasses the plan/compare layer reads directly.

``Analysis.result()`` is the ``--json`` document as a typed result (``result.AnalysisResult``, schema version
``ANALYSIS_SCHEMA_VERSION``) and ``to_dict()`` its dict; in it a non-finite number (a failure counted as +inf)
is written as the string ``"inf"`` so the file is strict JSON. In the Python objects it stays ``math.inf``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .budgets import Check
from .result import AnalysisResult

__all__ = ["ANALYSIS_SCHEMA_VERSION", "METRICS", "Analysis", "GroupSummary", "json_ready", "stop_sentence"]

ANALYSIS_SCHEMA_VERSION = "1"

#: Latency metrics of every group, in report order (all in ms).
METRICS = ("ttft_ms", "ttfat_ms", "client_queue_ms", "server_ttft_ms", "itl_ms", "inter_chunk_ms", "tpot_ms", "e2e_ms")


def json_ready(value: Any) -> Any:
    """Recursively turn numpy scalars, Paths and non-finite floats into strict-JSON values."""
    if isinstance(value, dict):
        return {str(k): json_ready(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_ready(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None if math.isnan(value) else ("inf" if value > 0 else "-inf")
    return value


def stop_sentence(stop: dict[str, Any]) -> str | None:
    """One line on how a run that did not complete normally ended (None for a normal complete run)."""
    state: Any  # a manifest's stop state: a string when the run did not complete
    state, by, at, covered = (
        stop.get("state"),
        stop.get("stopped_by"),
        stop.get("stopped_at_s"),
        stop.get("covered_until_s"),
    )
    if state == "complete" and not by:
        return None
    text = f"run {state.upper() if state != 'complete' else 'stopped'}" + (f" by {by}" if by else "")
    if state == "killed":
        flushed = stop.get("last_flush_s")
        text += f"; last flush {stop.get('last_flush_utc') or 'unknown'}" + (
            f" ({flushed:.3f} s on the run clock)" if flushed is not None else ""
        )
    elif at is not None:
        text += f" at {at:.3f} s on the run clock"
    if covered is not None:
        text += f"; analysed up to {covered:.3f} s"
    if stop.get("cut_by_stop"):
        text += f"; {stop['cut_by_stop']} request(s) cut short by the stop (outcome unknown) left out"
    if stop.get("not_due"):
        text += f"; {stop['not_due']} request(s) not yet due (neither offered nor failed)"
    if state == "killed":
        no_row = stop.get("no_row") or {}
        if no_row.get("in_flight_at_last_flush") is not None:
            text += (
                f"; no row for {no_row['in_flight_at_last_flush']} request(s) in flight and "
                f"{no_row['not_due_at_last_flush']} not yet due at that flush"
            )
        elif no_row.get("without_row"):
            text += f"; no row for {no_row['without_row']} scheduled request(s) (in flight, not yet due or unrecorded)"
    if state == "running":
        text += " (its writer is still running: figures up to the last flush)"
    return text


@dataclass
class GroupSummary:
    """One workload class (or ``overall``) over the measurement window."""

    name: str
    n_scheduled: int
    status_counts: dict[str, int]
    error_kinds: dict[str, int]
    abandoned: int
    metrics: dict[str, dict[str, Any]]
    offered_rps: float | None
    send_rps: float | None
    completed_rps: float | None
    prompt_tok_s: float | None
    output_tok_s: float | None
    goodput_rps: float | None = None
    attainment: float | None = None
    attainment_ci: list[float] | None = None  # 95% Wilson interval of the attainment
    n_good: int | None = None  # scheduled in the window, ok, every hard budget met (attainment's numerator)
    n_eligible: int | None = None  # scheduled in the window and counting (attainment's denominator)
    n_good_completed: int | None = None  # completed in the window and every hard budget met (goodput's count)
    tokens: dict[str, Any] = field(default_factory=dict)
    ttft_by_turn: dict[str, dict[str, Any]] = field(default_factory=dict)  # turn index -> TTFT summary (conversations)
    sessions: dict[str, Any] | None = None  # sessions and their makespan summary (loadgen.analysis.sessions)

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass
class Analysis:
    """Every number of one analysed run; see ``to_dict`` for the JSON layout."""

    run_dir: Path
    run: dict[str, Any]
    window: dict[str, Any]
    classes: dict[str, GroupSummary]
    overall: GroupSummary
    checks: list[Check]
    verdict: str  # "pass" | "fail" | "inconclusive" | "no budgets" | "no data"
    errored: bool
    error_share: float | None
    error_rate_limit: float
    rates_meaningful: bool
    stability: dict[str, Any]
    warm_cold: dict[str, Any]
    server: dict[str, Any] | None
    timeseries: dict[str, Any]
    definitions: dict[str, str]
    notes: list[str] = field(default_factory=list)
    plot_data: dict[str, Any] = field(default_factory=dict, repr=False)  # CDF points etc., not in JSON
    error_share_ci: list[float] | None = None  # 95% Wilson interval of the error share
    replicas: dict[str, Any] | None = None  # several target URLs: per replica (loadgen.analysis.replicas)
    schema_version: str = ANALYSIS_SCHEMA_VERSION

    @property
    def failed_checks(self) -> list[Check]:
        """Checks that failed conclusively (the whole 95% interval above the limit)."""
        return [c for c in self.checks if c.failed]

    @property
    def inconclusive_checks(self) -> list[Check]:
        """Checks whose 95% interval straddles the limit."""
        return [c for c in self.checks if c.inconclusive]

    @property
    def hard_inconclusive(self) -> list[Check]:
        return [c for c in self.inconclusive_checks if c.hard]

    @property
    def hard_failures(self) -> list[Check]:
        return [c for c in self.failed_checks if c.hard]

    @property
    def soft_failures(self) -> list[Check]:
        return [c for c in self.failed_checks if not c.hard]

    @property
    def passed(self) -> bool | None:
        """True when every hard check passed conclusively, False when one failed conclusively; None when
        inconclusive, or with no budgets or no requests to check."""
        if self.verdict in ("no budgets", "no data", "inconclusive"):
            return None
        return not self.hard_failures

    def group(self, name: str) -> GroupSummary:
        """A class summary by name, or ``overall``."""
        return self.overall if name == "overall" else self.classes[name]

    def to_dict(self) -> dict[str, Any]:
        """The JSON document (strict JSON), with ``schema_version``."""
        return self.result().document()

    def result(self) -> AnalysisResult:
        """The typed JSON document (``loadgen schema analysis``)."""
        stop = self.run.get("stop") or {}
        doc = json_ready(
            {
                "schema_version": self.schema_version,
                "state": {**stop, "summary": stop_sentence(stop)},
                "run_dir": str(self.run_dir),
                "run": self.run,
                "window": self.window,
                "verdict": {
                    "status": self.verdict,
                    "passed": self.passed,
                    "errored": self.errored,
                    "error_share": self.error_share,
                    "error_share_ci": self.error_share_ci,
                    "error_rate_limit": self.error_rate_limit,
                    "hard_failures": [c.reason for c in self.hard_failures],
                    "soft_failures": [c.reason for c in self.soft_failures],
                    "inconclusive": [
                        {
                            "class": c.class_name,
                            "metric": c.metric,
                            "percentile": c.percentile,
                            "hard": c.hard,
                            "more_requests": c.more_requests,
                            "reason": c.reason,
                        }
                        for c in self.inconclusive_checks
                    ],
                },
                "checks": [c.to_dict() for c in self.checks],
                "overall": self.overall.to_dict(),
                "classes": {name: g.to_dict() for name, g in self.classes.items()},
                "rates_meaningful": self.rates_meaningful,
                "stability": self.stability,
                "warm_cold": self.warm_cold,
                "server": self.server,
                "replicas": self.replicas,
                "timeseries": self.timeseries,
                "definitions": self.definitions,
                "notes": self.notes,
            }
        )
        return AnalysisResult.model_validate(doc)
