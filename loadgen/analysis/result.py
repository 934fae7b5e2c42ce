"""The analysis JSON (``loadgen analyze --json``) as a typed result: ``AnalysisResult`` and its parts.

``Analysis.result()`` builds it from the in-memory analysis (where a failure counted as +inf stays
``math.inf``); in the document an infinity is the string ``"inf"``. Its schema version is
``ANALYSIS_SCHEMA_VERSION``; the published JSON Schema is ``loadgen schema analysis``. Sections whose
layout follows the run (stability, warm/cold, server metrics, replicas, time series) stay JSON objects.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from loadgen.util.resultmodel import Figure, Number, ResultModel

__all__ = [
    "AnalysisResult",
    "CheckResult",
    "GroupResult",
    "InconclusiveCheck",
    "MetricSummary",
    "ReasoningTokens",
    "RunInfo",
    "RunState",
    "Stability",
    "Timeseries",
    "Tokens",
    "Verdict",
    "Window",
]


class NoRow(ResultModel):
    """A killed run: requests with no row at its last flush."""

    in_flight_at_last_flush: int | None = None
    not_due_at_last_flush: int | None = None
    without_row: int | None = Field(
        None, description="scheduled requests with no row: in flight, not yet due or never recorded (scheduled - rows)"
    )


class RunState(ResultModel):
    """How the run ended (``state`` in the document; ``run.stop`` without ``summary``)."""

    state: str | None = Field(description="complete, interrupted, failed, killed, running ...")
    stopped_by: str | None = None
    stopped_at_s: Number | None = Field(None, description="the stop on the run clock (s)")
    covered_until_s: Number | None = Field(None, description="the analysis covers the run up to here (s)")
    cut_by_stop: int = 0
    not_due: int = 0
    last_flush_utc: str | None = None
    last_flush_s: Number | None = None
    recovery: dict[str, Any] | None = None  # open: the run reader's recovered view (rundir.io), as the manifest's
    no_row: NoRow | None = None
    summary: str | None = Field(None, description="one line on how a run that did not complete normally ended")


class RunTarget(ResultModel):
    """What was measured: kind, where (no credentials), which model, and the target's GET /version body."""

    kind: str
    base_url: str | None
    model: str | None
    version: Any  # open: the target's own GET /version body, whatever the server answered


class RunInfo(ResultModel):
    """What ran: from the manifest, and the row counts the analysis read."""

    run_kind: str
    state: str
    stop: RunState
    scenario: str | None
    trace: str | None
    target: RunTarget
    engine: str | None
    started_utc: str | None
    duration_s: Number | None
    harness_version: str | None
    model_executed: bool | None = Field(alias="modelExecuted")
    benchmark_executed: bool | None = Field(alias="benchmarkExecuted")
    # open: an imported run's manifest sections, each importer's own (which instants it synthesized; its files)
    synthesized: dict[str, Any] | None
    source: dict[str, Any] | None
    requests: int
    chunk_rows: int
    send_lag_p99_ms: Number | None
    client_fell_behind: str | None
    prompt_tokens_differ: str | None = Field(
        None, description="the prompts sent differ from the trace's lengths by the server's count (one line)"
    )


class Window(ResultModel):
    """The measurement window on the run clock (s)."""

    start_s: Number
    end_s: Number
    duration_s: Number
    default: bool = Field(description="the default window (first scheduled to one mean gap after the last)")
    rates_unmeasured: str | None = Field(
        None, description="why every rate is null: the window does not measure one (too short, or set by one request)"
    )


class TokenTotals(ResultModel):
    """Token totals of one kind (prompt or output) by who counted them, and where the counts disagree."""

    target: Number | None
    client: Number | None
    server: Number | None
    server_minus_client: Number | None
    server_minus_target: Number | None
    client_minus_target: Number | None
    n_server_missing: int
    n_client_missing: int
    n_server_client_mismatch: int
    n_server_target_mismatch: int


class ReasoningTokens(ResultModel):
    """Output tokens split into reasoning and answer (client-counted), and the server's reasoning count."""

    client_reasoning: Number | None
    client_answer: Number | None
    server_reasoning: Number | None
    n_requests_with_reasoning: int


class Tokens(ResultModel):
    """Token counts of a group's ok requests in the window."""

    n_requests: int
    prompt: TokenTotals
    output: TokenTotals
    reasoning: ReasoningTokens | None = Field(None, description="absent for a run recorded before schema 3")


class Stability(ResultModel):
    """The steady-interval test, and Little's Law (L = λW) only where it was applied."""

    applied: bool
    reason: str | None = Field(description="why Little's Law was not applied")
    interval_s: list[Number] | None
    warmup_s: Number | None = None
    arrivals: int | None = None
    completions: int | None = None
    arrival_rps: Number | None = None
    completion_rps: Number | None = None
    in_flight_mean: Number | None = None
    in_flight_start: Number | None = None
    in_flight_end: Number | None = None
    in_flight_slope_per_s: Number | None = None
    little_l: Number | None = Field(None, alias="L", description="time-average requests in the system")
    lambda_rps: Number | None = None
    little_w_s: Number | None = Field(None, alias="W_s", description="mean time in the system (s)")
    lambda_w: Number | None = Field(None, alias="lambda_W", description="arrival rate × mean time in the system")
    relative_difference: Number | None = Field(None, description="|L - lambda_W| / lambda_W (a fraction)")


class Timeseries(ResultModel):
    """Rates per time bin over the whole run (empty for a run with no request)."""

    bin_s: Number | None = None
    t_s: list[Number] = Field(default_factory=list, description="each bin's start on the run clock")
    offered_rps: list[Number] = Field(default_factory=list)
    send_rps: list[Number] = Field(default_factory=list)
    completed_rps: list[Number] = Field(default_factory=list)
    failed_rps: list[Number] = Field(default_factory=list)
    output_tok_s: list[Number] = Field(default_factory=list)
    in_flight: list[Number] = Field(default_factory=list)


class InconclusiveCheck(ResultModel):
    """A check whose 95% interval straddles its limit, and about how many more requests would decide it."""

    class_name: str = Field(alias="class")
    metric: str
    percentile: str | None
    hard: bool
    more_requests: int | None
    reason: str


class Verdict(ResultModel):
    """The run's verdict: pass / fail / inconclusive / no budgets / no data, and why."""

    status: str
    passed: bool | None
    errored: bool
    error_share: Number | None
    error_share_ci: list[Number] | None
    error_rate_limit: Number = Field(description="the highest error share allowed (a share 0..1)")
    hard_failures: list[str]
    soft_failures: list[str]
    inconclusive: list[InconclusiveCheck]


class CheckResult(ResultModel):
    """One budget check (``analysis.budgets.Check``): observed +inf when failures reach the percentile."""

    class_name: str = Field(alias="class")
    metric: str
    percentile: str | None
    observed: Figure = Field(
        description='the observed figure, in the metric\'s unit (ms for a latency; a share 0..1 for error_share); "inf": failures reach the percentile'
    )
    limit: Number = Field(description="the budget, in the unit of observed")
    n: int
    hard: bool
    passed: bool
    reason: str
    evaluated: bool
    failures_as_inf: int = Field(description="failed requests counted as +inf in the sample")
    outcome: str = Field(description="pass | fail | inconclusive")
    ci: list[Figure] | None
    ci_level: Number = Field(description="the interval's confidence level (0.95)")
    more_requests: int | None = Field(description="an inconclusive check: about how many more requests would decide it")


class MetricSummary(ResultModel):
    """One latency metric of one group (ms): percentiles with 95% intervals, mean, max and sample count."""

    p50: Number | None
    p95: Number | None
    p99: Number | None
    mean: Number | None
    max: Number | None
    n: int
    p99_low_sample: bool = Field(description="fewer than 100 samples")
    ci: dict[str, list[Figure] | None] = Field(description="percentile -> [low, high] (empty: not estimable)")
    ci_level: Number


class SessionsResult(ResultModel):
    """A group's agent sessions (conversations sharing a root id): how many, and their makespans."""

    n_sessions: int
    n_incomplete: int = Field(description="sessions with a request that did not finish ok (no makespan)")
    makespan_ms: MetricSummary = Field(description="last step done - first step scheduled, complete sessions")


class GroupResult(ResultModel):
    """One workload class (or ``overall``) over the measurement window."""

    name: str
    n_scheduled: int
    status_counts: dict[str, int]
    error_kinds: dict[str, int]
    abandoned: int = Field(description="requests the client abandoned as planned (cancel after N tokens)")
    metrics: dict[str, MetricSummary]
    offered_rps: Number | None
    send_rps: Number | None
    completed_rps: Number | None
    prompt_tok_s: Number | None
    output_tok_s: Number | None
    goodput_rps: Number | None = None
    attainment: Number | None = Field(None, description="share 0..1 of counted requests that met every hard budget")
    attainment_ci: list[Number] | None = None
    n_good: int | None = None
    n_eligible: int | None = None
    n_good_completed: int | None = None
    tokens: Tokens | None = None
    ttft_by_turn: dict[str, MetricSummary] = Field(default_factory=dict)
    sessions: SessionsResult | None = None


class AnalysisResult(ResultModel):
    """Every number of one analysed run (``loadgen analyze --json``)."""

    schema_version: str
    state: RunState
    run_dir: str
    run: RunInfo
    window: Window
    verdict: Verdict
    checks: list[CheckResult]
    overall: GroupResult
    classes: dict[str, GroupResult]
    rates_meaningful: bool
    stability: Stability
    # open (docs/results.md): their layout depends on the run: the engine's /metrics families, its replicas
    warm_cold: dict[str, Any]
    server: dict[str, Any] | None
    replicas: dict[str, Any] | None
    timeseries: Timeseries
    definitions: dict[str, str]
    notes: list[str]
