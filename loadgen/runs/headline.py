"""The headline figures of one run, per class, as the run catalog holds them.

They are ``loadgen analyze``'s own figures (``loadgen.analysis.analyze.request_summaries``: its default window,
cold-start rule, samples and percentile rule), read from the requests table alone (never the chunks), so
indexing stays cheap: per class the requests scheduled in the window (cold-start ones apart), those ok, those
failed (neither ok nor a planned abandonment), TTFT, TPOT and E2E p50/p99 (ms) and the completed rate (ok
requests done in the window per second of it). They are a summary for finding runs, not the analysis:
``loadgen analyze`` adds ITL, intervals and budget verdicts.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from loadgen.analysis.analyze import request_summaries
from loadgen.analysis.model import GroupSummary

__all__ = ["HEADLINE_COLUMNS", "HEADLINE_VERSION", "ClassHeadline", "headline_figures"]


@dataclass(frozen=True)
class ClassHeadline:
    """One class of one run (``overall``: every class)."""

    request_class: str
    scheduled: int
    ok: int
    failed: int
    ttft_p50_ms: float | None
    ttft_p99_ms: float | None
    tpot_p50_ms: float | None
    tpot_p99_ms: float | None
    e2e_p50_ms: float | None
    e2e_p99_ms: float | None
    completed_rps: float | None


#: The catalog's ``classes`` columns, in order (the dataclass fields).
HEADLINE_COLUMNS = tuple(ClassHeadline.__dataclass_fields__)
#: Raised when a figure's definition changes, so that what holds figures of an earlier one (the catalog, an
#: MLflow store) reads them again. 2: analyze's own figures (1: ok requests over the scheduled span).
HEADLINE_VERSION = 2


def _headline(g: GroupSummary) -> ClassHeadline:
    ok = g.status_counts.get("ok", 0)
    return ClassHeadline(
        request_class=g.name,
        scheduled=g.n_scheduled,
        ok=ok,
        failed=g.n_scheduled - ok - g.abandoned,
        ttft_p50_ms=g.metrics["ttft_ms"]["p50"],
        ttft_p99_ms=g.metrics["ttft_ms"]["p99"],
        tpot_p50_ms=g.metrics["tpot_ms"]["p50"],
        tpot_p99_ms=g.metrics["tpot_ms"]["p99"],
        e2e_p50_ms=g.metrics["e2e_ms"]["p50"],
        e2e_p99_ms=g.metrics["e2e_ms"]["p99"],
        completed_rps=g.completed_rps,
    )


def headline_figures(run_dir: Path) -> list[ClassHeadline]:
    """Per class (sorted by name), then ``overall``; empty when the run has no requests."""
    return [_headline(g) for g in request_summaries(run_dir)]
