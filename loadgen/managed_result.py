"""The managed comparison (``loadgen managed compare --json``) as a typed result.

``ManagedComparison.result()`` gives ``ManagedComparisonResult`` (schema version
``MANAGED_COMPARISON_SCHEMA_VERSION``, the document's ``version``); the CLI writes its ``document()``, so the
file has exactly the keys the published schema names (``loadgen schema managed``). Latencies are in ms, rates
in requests or tokens per second, times in seconds, costs in the price table's currency.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from loadgen.util.resultmodel import Figure, Number, ResultModel

__all__ = ["MANAGED_COMPARISON_SCHEMA_VERSION", "ManagedComparisonResult", "ManagedSide"]

#: The managed comparison document's ``version``.
MANAGED_COMPARISON_SCHEMA_VERSION = 1


class SideTarget(ResultModel):
    """The endpoint the run was driven against."""

    kind: str | None
    base_url: str | None
    model: str | None
    engine: str | None = Field(description="the engine config name (null: none declared)")


class SideTrace(ResultModel):
    """The trace the run replayed."""

    name: str | None
    sha256: str | None
    seed: int | None


class LatencySummary(ResultModel):
    """One metric's percentiles over the requests served, ms; ``n`` counts the requests behind them."""

    p50: Figure = Field(description='ms; "inf": failures reach the percentile')
    p95: Figure = Field(description='ms; "inf": failures reach the percentile')
    p99: Figure = Field(description='ms; "inf": failures reach the percentile')
    n: int | None
    p99_low_sample: bool | None = Field(description="too few requests for a p99 with an interval")


class SideThroughput(ResultModel):
    """The run's rates over the analysis window (null: not measured)."""

    offered_rps: Number | None
    send_rps: Number | None
    completed_rps: Number | None
    prompt_tok_s: Number | None
    output_tok_s: Number | None
    goodput_rps: Number | None
    attainment: Number | None = Field(description="share of requests within their budgets, 0..1")


class SideErrors(ResultModel):
    """Outcomes other than success, as request counts per status and per error kind."""

    status_counts: dict[str, int] = Field(description="status -> requests")
    error_kinds: dict[str, int] = Field(description="error kind -> requests")
    content_filtered: int = Field(description="requests finished or refused by a content filter")
    error_share: Number | None = Field(description="share of requests that failed, 0..1")


class OutputTokens(ResultModel):
    """Where the completed requests' output token counts come from."""

    source: str
    with_usage: int = Field(description="completed requests with server-reported usage")
    completed: int = Field(description="completed requests")


class RetryAfter(ResultModel):
    """The Retry-After values of the 429 answers, seconds; ``n`` counts the answers that carried one."""

    n: int
    missing: int = Field(description="429 answers without a Retry-After")
    min: Number | None = Field(description="s")
    p50: Number | None = Field(description="s")
    max: Number | None = Field(description="s")
    mean: Number | None = Field(description="s")


class Quotas(ResultModel):
    """429 answers and the client-side rate cap the run declared."""

    http_429: int = Field(description="requests answered 429")
    http_429_share: Number | None = Field(description="share of the requests due that were answered 429, 0..1")
    retry_after_s: RetryAfter
    client_rate_limit_rps: Number | None
    retries: str


class ModelCost(ResultModel):
    """One response model's billed requests and tokens, and their cost in the table's currency."""

    requests: int = Field(description="billed requests")
    input_tokens: int = Field(description="billed input tokens")
    output_tokens: int = Field(description="billed output tokens")
    price_entry: str | None
    cost: Number | None = Field(description="in the price table's currency (null: no per-token price applies)")


class SideCost(ResultModel):
    """The run's cost from the price table: per token (billed requests) or per hour (wall time)."""

    currency: str | None
    example_prices: bool
    price_table: str | None
    total: Number | None = Field(description="in the price table's currency (null: incomplete)")
    complete: bool
    price_entry: str | None = None
    basis: str | None = None
    unpriced_models: list[str] | None = None
    per_model: dict[str, ModelCost] | None = None
    billed_requests: int | None = Field(None, description="requests billed")
    requests_with_estimated_tokens: int | None = Field(None, description="billed requests priced by client counts")
    per_1k_completed: Number | None = Field(None, description="cost per 1000 completed requests, in the currency")
    token_source: str | None = None


class SeenValue(ResultModel):
    """One distinct value and when it was seen, seconds on the run's clock."""

    value: str
    count: int = Field(description="requests answered with this value")
    first_seen_s: Number
    last_seen_s: Number


class ValueChange(ResultModel):
    """The value changed at ``at_s`` (seconds on the run's clock), first seen on ``request_id``."""

    at_s: Number
    request_id: str
    from_: str = Field(alias="from")
    to: str


class ValueTrack(ResultModel):
    """One response field over the run: its distinct values and each change."""

    distinct: int = Field(description="distinct values seen")
    values: list[SeenValue]
    changes: list[ValueChange]
    missing: int = Field(description="requests without the field")


class ChangeControls(ResultModel):
    """The response model id and system fingerprint over the run, and the signals they raise."""

    response_model: ValueTrack
    system_fingerprint: ValueTrack
    requested_model: str | None
    model_differs_from_requested: list[str]
    signals: list[str]


class ServerMetrics(ResultModel):
    """The local engine's /metrics summaries (per-scrape series stay in the run directory)."""

    server_metrics: dict[str, Any]  # open: one summary per metric family the engine exported, engine-defined


class ManagedSide(ResultModel):
    """Everything the comparison shows for one run."""

    label: Literal["local", "managed"]
    run_dir: str
    target: SideTarget
    trace: SideTrace
    duration_s: Number | None
    verdict: str = Field(description="the budget verdict: pass, fail, inconclusive, no budgets or no data")
    hard_failures: list[str]
    latency_ms: dict[str, dict[str, LatencySummary]] = Field(description="overall or class -> metric -> percentiles")
    throughput: SideThroughput
    errors: SideErrors
    output_tokens: OutputTokens
    quotas: Quotas
    cost: SideCost | None
    change_controls: ChangeControls
    internals: str | ServerMetrics = Field(description="what is known of the engine's internals")


class ManagedComparisonResult(ResultModel):
    """A local engine run and a managed endpoint run of the same trace, side by side."""

    kind: Literal["loadgen.managed_comparison"]
    version: int = Field(description=f"the schema version ({MANAGED_COMPARISON_SCHEMA_VERSION})")
    local: ManagedSide
    managed: ManagedSide
    warnings: list[str]
    unknown_for_managed: str
