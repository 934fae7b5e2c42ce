"""Trace statistics (``loadgen trace stats --json``) as a typed result.

``trace_stats_result`` gives ``TraceStatsResult`` (schema version ``TRACE_STATS_SCHEMA_VERSION``, the document's
``version``); the CLI prints its ``document()``, so the output has exactly the keys the published schema names
(``loadgen schema trace-stats``). Definitions are ``loadgen.trace.stats``'s.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from loadgen.util.resultmodel import Number, ResultModel

from .stats import TraceStats

__all__ = ["TRACE_STATS_SCHEMA_VERSION", "TokenQuantiles", "TraceStatsResult", "trace_stats_result"]

#: The trace stats document's ``version``.
TRACE_STATS_SCHEMA_VERSION = 1


class TokenQuantiles(ResultModel):
    """Token counts per request, tokens: linear-interpolation quantiles, the mean and the largest (null: none)."""

    p50: Number | None
    p95: Number | None
    p99: Number | None
    mean: Number | None
    max: Number | None


class ClassStats(ResultModel):
    """One request class of the trace."""

    requests: int = Field(description="requests of the class")
    share: Number = Field(description="share of the trace's requests, 0..1")
    prompt_tokens: TokenQuantiles
    output_tokens: TokenQuantiles


class Stats(ResultModel):
    """Duration, rates, burstiness and token tails of a trace."""

    requests: int = Field(description="requests in the trace")
    duration_s: Number = Field(description="first to last scheduled arrival, s")
    mean_rate_rps: Number | None
    iat_cv: Number | None = Field(description="inter-arrival time CV: population std / mean of the gaps (a ratio)")
    iod: dict[str, Number | None] = Field(
        description="window (1s, 10s, 60s) -> index of dispersion: variance / mean of arrivals per window "
        "(a ratio; null: fewer than 2 windows)"
    )
    prompt_tokens: TokenQuantiles
    output_tokens: TokenQuantiles
    classes: dict[str, ClassStats]
    conversations: int = Field(description="distinct conversations")
    prefix_groups: int = Field(description="distinct shared-prefix groups")
    cancellations: int = Field(description="requests the client cancels after some tokens")


class TraceStatsResult(ResultModel):
    """A trace's metadata and statistics."""

    kind: Literal["loadgen.trace_stats"]
    version: int = Field(description=f"the schema version ({TRACE_STATS_SCHEMA_VERSION})")
    metadata: dict[str, Any] = Field(  # open: the trace's own metadata, as its generator or importer wrote it
        description="the trace file's own metadata (its generator, seed, source ...)"
    )
    stats: Stats


def trace_stats_result(stats: TraceStats, metadata: dict[str, Any]) -> TraceStatsResult:
    """The typed ``trace stats --json`` document of ``stats`` and the trace's ``metadata``."""
    head = {"kind": "loadgen.trace_stats", "version": TRACE_STATS_SCHEMA_VERSION}
    return TraceStatsResult.from_document(head | {"metadata": metadata, "stats": stats.to_dict()})
