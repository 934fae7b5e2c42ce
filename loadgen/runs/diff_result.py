"""The diff document (``loadgen diff --json``) as a typed result.

``DiffResult.result()`` gives ``DiffDocument`` (schema version ``DIFF_SCHEMA_VERSION``, the document's
``version``); the CLI writes ``DiffDocument.document()``, so the file has exactly the keys the published
schema names (``loadgen schema diff``). Latencies and their changes are in ms, ``±inf`` written ``"inf"``.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from loadgen.util.resultmodel import Inf, Number, ResultModel

__all__ = ["DIFF_SCHEMA_VERSION", "DiffCdf", "DiffDocument", "DiffRowResult"]

#: The diff document's ``version``.
DIFF_SCHEMA_VERSION = 1

DiffVerdict = Literal["regressed", "improved", "no change", "inconclusive"]


class DiffRowResult(ResultModel):
    """One class × metric × quantile; ``n_base`` / ``n_candidate`` count the requests (pooled over repeats)."""

    request_class: str
    metric: str = Field(description="ttft_ms, tpot_ms, e2e_ms (with an interval and a verdict) or itl_ms (point only)")
    quantile: Literal["p50", "p95", "p99"]
    base: Number | None = Field(description="the base side's quantile, ms (null: no sample)")
    candidate: Number | None = Field(description="the candidate side's quantile, ms (null: no sample)")
    change: Number | None = Field(description="candidate - base, ms")
    change_pct: Number | None = Field(description="change / base x 100, percent")
    interval: list[Number | Inf] | None = Field(
        description='the interval of the change, ms: [low, high]; "inf" / "-inf" where a side is unbounded'
    )
    threshold_pct: Number | None = Field(description="the practical threshold, percent of the base value")
    verdict: DiffVerdict | None = Field(description="null: a point change only (itl_ms)")
    n_base: int
    n_candidate: int
    design_effect: list[Number] | None = Field(
        description="[base, candidate]: variance inflation (>= 1, a ratio) from dependent neighbouring requests"
    )


class DiffCdf(ResultModel):
    """One side's CDF for plotting: exact order statistics at evenly spaced ranks (at most 200 points)."""

    x: list[Number] = Field(description="latency, ms")
    y: list[Number] = Field(description="share of the side's requests at or below x, 0..1")


class DiffDocument(ResultModel):
    """Did the candidate regress? Per class, metric and quantile, the change with its interval, and the verdict."""

    kind: Literal["loadgen.diff"]
    version: int = Field(description=f"the schema version ({DIFF_SCHEMA_VERSION})")
    base: list[str] = Field(description="the base run directories (repeats pooled)")
    candidate: list[str] = Field(description="the candidate run directories (repeats pooled)")
    variable: str = Field(description="the one manifest key allowed to differ")
    differs_in: list[str] = Field(description="identity keys that differ, all covered by the variable")
    level: Number = Field(
        description="the diff's confidence level, a share 0..1: any row falsely flagged at most 1 - level"
    )
    row_level: Number = Field(description="each row's interval level, a share 0..1 (Bonferroni over the rows)")
    rule: str
    rows: list[DiffRowResult]
    verdict: DiffVerdict
    notes: list[str]
    cdfs: dict[str, dict[str, dict[str, DiffCdf | None]]] = Field(
        description="class -> metric -> base / candidate -> its CDF (null: no sample)"
    )
