"""The diff document (``loadgen diff --json``) as a typed result.

``DiffResult.result()`` gives ``DiffDocument`` (schema version ``DIFF_SCHEMA_VERSION``, the document's
``version``); the CLI writes ``DiffDocument.document()``, so the file has exactly the keys the published
schema names (``loadgen schema diff``). Latencies and their changes are in ms, ``±inf`` written ``"inf"``; the
``error_share`` rows (one per class) hold shares 0..1 of the requests that failed and their change.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from loadgen.util.resultmodel import Inf, Number, ResultModel

__all__ = ["DIFF_SCHEMA_VERSION", "DiffCdf", "DiffDocument", "DiffRowResult"]

#: The diff document's ``version``.
DIFF_SCHEMA_VERSION = 2  # 2: error_share rows (quantile "share", threshold_pp, failed)

DiffVerdict = Literal["regressed", "improved", "no change", "inconclusive"]


class DiffRowResult(ResultModel):
    """One class × metric × quantile, or one class's error share (metric ``error_share``, quantile ``share``);
    ``n_base`` / ``n_candidate`` count the samples (requests; error_share: requests counted, failed or not),
    pooled over repeats."""

    request_class: str
    metric: str = Field(
        description="ttft_ms, tpot_ms, e2e_ms (with an interval and a verdict), itl_ms (point only) or error_share "
        "(the share of the class's requests that failed, as the analysis' error share; with an interval and a verdict)"
    )
    quantile: Literal["p50", "p95", "p99", "share"] = Field(description="share: the error_share row")
    base: Number | None = Field(
        description="the base side's quantile, ms; error_share: its failed share, 0..1 (null: no sample)"
    )
    candidate: Number | None = Field(
        description="the candidate side's quantile, ms; error_share: its failed share, 0..1 (null: no sample)"
    )
    change: Number | None = Field(description="candidate - base, ms; error_share: a share difference, -1..1")
    change_pct: Number | None = Field(description="change / base x 100, percent (null for error_share)")
    interval: list[Number | Inf] | None = Field(
        description='the interval of the change, ms: [low, high]; "inf" / "-inf" where a side is unbounded; '
        "error_share: Newcombe's hybrid score interval of the share difference, -1..1"
    )
    threshold_pct: Number | None = Field(
        description="the practical threshold, percent of the base value (null for error_share: see threshold_pp)"
    )
    verdict: DiffVerdict | None = Field(description="null: a point change only (itl_ms)")
    n_base: int
    n_candidate: int
    design_effect: list[Number] | None = Field(
        description="[base, candidate]: variance inflation (>= 1, a ratio) from dependent neighbouring requests"
    )
    threshold_pp: Number | None = Field(
        default=None, description="error_share only: the practical threshold, percentage points (absolute)"
    )
    failed: list[int] | None = Field(
        default=None, description="error_share only: [base, candidate] counts of failed requests"
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
