"""The comparison decision (``loadgen compare``, practice's ``comparison``) and the plan region (``region.json``)
as typed results.

``Comparison.result()`` gives ``ComparisonResult`` (schema version ``COMPARISON_SCHEMA_VERSION``, the
document's ``version``); ``region.write_region`` writes a ``RegionResult`` (``REGION_SCHEMA_VERSION``, the
document's ``version``). A candidate judged from a run directory
and one judged from a plan directory share one model: keys the other kind has not are absent, not null.
Published JSON Schemas: ``loadgen schema decision`` and ``loadgen schema region``.
"""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field

from loadgen.targets.base import WarmStateResult
from loadgen.targets.identity import TargetIdentity
from loadgen.util.resultmodel import Figure, Number, ResultModel

from .spec import SearchDimension, SearchMode, StartMode

__all__ = [
    "COMPARISON_SCHEMA_VERSION",
    "FLEET_SCHEMA_VERSION",
    "REGION_SCHEMA_VERSION",
    "BudgetItem",
    "CandidateJudgement",
    "ComparisonResult",
    "Decision",
    "FleetLine",
    "FleetResult",
    "RegionResult",
]

#: The comparison document's ``version``.
COMPARISON_SCHEMA_VERSION = 1
#: The region document's ``version``.
REGION_SCHEMA_VERSION = 1
#: The fleet document's ``version`` (``fleet.json``; ``loadgen plan --json`` of a plan with ``[fleet]``).
FLEET_SCHEMA_VERSION = 1


class BudgetItem(ResultModel):
    """A hard check as the comparison shows it (a plan candidate's ``region`` items lack ``ci``)."""

    class_name: str = Field(alias="class")
    metric: str = Field(description="a budget metric (ttft_ms, itl_ms, e2e_ms) or 'region' for a plan")
    percentile: str | None
    observed: Figure = Field(
        description='the observed figure, in the metric\'s unit (ms for a latency; a share 0..1 for error_share); "inf": failures reach the percentile'
    )
    ci: list[Figure] | None = None
    limit: Number | None = Field(description="the budget, in the unit of observed")
    n: int
    outcome: str | None = None
    more_requests: int | None = None
    needed: str | None = None
    reason: str


class JudgementStep(ResultModel):
    """One step of the judgement order and its result (passed, rejected, inconclusive, unmeasured ...)."""

    step: str
    result: str
    why: list[str]


class Cost(ResultModel):
    """Step 3's cost at the candidate's headline rate; ``matched`` None with a ``note`` when no price applies."""

    matched: str | None
    note: str | None = None
    example_prices: bool | None = None
    currency: str | None = None
    throughput_basis: str | None = None
    per_million_output_tokens: Number | None = None
    per_million_tokens: Number | None = None
    basis: str | None = None


class Throughput(ResultModel):
    """A candidate's rates (a run: over the analysis window and the whole run; a plan: its best inside cell)."""

    output_tok_s: Number | None
    prompt_tok_s: Number | None
    completed_rps: Number | None
    offered_rps: Number | None
    send_rps: Number | None = None
    goodput_rps: Number | None
    attainment: Number | None = Field(None, description="share 0..1 of counted requests that met every hard budget")
    peak_output_tok_s: Number | None = Field(description="the highest of the analysis' time-series bins (peak_bin_s)")
    peak_completed_rps: Number | None = None
    peak_bin_s: Number | None = Field(None, description="the width of the time-series bin the peaks are over (s)")
    window_s: Number | None = None
    rates_unmeasured: str | None = Field(None, description="why the analysis window measures no rate (rates null)")
    output_tok_s_whole_run: Number | None = None
    completed_rps_whole_run: Number | None = None
    whole_run_s: Number | None = None
    output_tok_per_engine_busy_s: Number | None = None
    basis: str | None = None


class ContextWorkload(ResultModel):
    """The workload the candidate ran: scenario and trace (name, sha256), the trace's seed and its request count."""

    scenario: str | None
    scenario_sha256: str | None
    trace: str | None
    trace_sha256: str | None
    seed: int | None
    requests: Number | None


class ContextPackage(ResultModel):
    harness_version: str | None
    git_sha: str | None
    python: str | None


class GpuInfo(ResultModel):
    """One GPU of the host, as ``nvidia-smi --query-gpu=name,memory.total,driver_version`` printed it."""

    name: str
    memory_total: str = Field(description="as nvidia-smi prints it, with its unit (e.g. '81559 MiB')")
    driver: str = Field(description="the driver version")


#: An imported run's own hardware record (another tool's keys, e.g. device_name, device_total_memory_bytes);
#: a nested value is kept as its JSON text.
ImportedGpu = dict[str, str | int | float | bool | None]


class ContextHardware(ResultModel):
    """The host of the candidate's first run (null figures: its manifest does not say)."""

    cpu_model: str | None
    cpu_count: int | None = Field(description="logical CPUs (a count)")
    gpus: list[GpuInfo | ImportedGpu] | None = Field(
        description="per GPU: nvidia-smi's name, memory and driver, or an imported run's own hardware record "
        "(an open mapping of that tool's keys to scalar values); null: the manifest has no host"
    )
    os: str | None


class ContextRuntime(ResultModel):
    target_kind: str | None
    model: str | None
    engine: str | None
    engine_version: str | None
    engine_config: str = Field(description="the candidate's label")
    run_kind: str | None
    model_executed: bool | None = Field(alias="modelExecuted")
    benchmark_executed: bool | None = Field(alias="benchmarkExecuted")


class ContextMeasurement(ResultModel):
    send_lag_p99_ms: Number | None
    warnings: list[str]
    state: str | None


class CandidateContext(ResultModel):
    """What the candidate ran: workload, package, hardware, runtime, warm state and measurement, from its manifest."""

    workload: ContextWorkload
    package: ContextPackage
    hardware: ContextHardware
    runtime: ContextRuntime
    warm_state: WarmStateResult | None = Field(description="the manifest's warm state (null: none recorded)")
    measurement: ContextMeasurement
    order_index: int | None
    started_utc: str | None


class TailQuantiles(ResultModel):
    """One latency metric of one class (ms): its percentiles and sample count (null: the class has none)."""

    p50: Number | None
    p95: Number | None
    p99: Number | None
    n: int | None


class ClassTails(ResultModel):
    """A run candidate's class: its latency tails (ms), the budget limits (ms) and each evaluated check."""

    ttft_ms: TailQuantiles
    itl_ms: TailQuantiles
    e2e_ms: TailQuantiles
    p99_low_sample: bool = Field(description="fewer than 100 TTFT samples")
    limits: dict[str, dict[str, Number]] = Field(description="metric -> percentile -> the budget's limit, ms")
    checks: dict[str, BudgetItem] = Field(description="metric.percentile -> the check")


class CapacityCell(ResultModel):
    """A plan candidate's class: its top inside cell (highest offered rate)."""

    max_inside_offered_rps: Number | None
    cell: str = Field(description="the cell's id")
    completed_rps: Number | None
    output_tok_s: Number | None


class ContractFailure(ResultModel):
    """One failed check of a behaviour case."""

    case_id: str
    kind: str
    expected: str
    got: str


class ContractStatus(ResultModel):
    """The candidate's behaviour contract (its contract.json, read by ``contract_hook.contract_status_from_file``)."""

    status: Literal["passed", "failed", "not_evaluated", "not_configured"]
    summary: str
    failures: list[ContractFailure] | None = Field(None, description="the first 20 failed checks")
    n_cases: int | None = Field(None, description="cases replayed (a count)")
    n_passed: int | None = Field(None, description="cases passed (a count)")
    path: str | None = Field(None, description="the contract.json read")


class CandidateJudgement(ResultModel):
    """One candidate through the judgement order: steps, verdict, contract, cost, figures and context."""

    index: int
    label: str
    path: str
    kind: Literal["run", "plan"]
    verdict: Literal["eligible", "rejected", "unmeasured"]
    budgets: str = Field(description="the hard-budget step's result")
    rejected_at: str | None
    steps: list[JudgementStep]
    contract: ContractStatus = Field(description="the behaviour contract's result")
    cost: Cost | None
    stop: str | None = Field(None, description="a run: how it ended when not normally")
    route_classes: list[str]
    breaches: list[BudgetItem]
    inconclusive: list[BudgetItem]
    capacity: dict[str, CapacityCell] | None = Field(None, description="a plan: the top inside cell per class")
    tails: dict[str, ClassTails] = Field(description="a run: per class, p50/p95/p99/n, limits and checks")
    status_counts: dict[str, int]
    error_kinds: dict[str, int]
    error_share: Number | None
    throughput: Throughput
    context: CandidateContext
    status_line: str


class Rejection(ResultModel):
    label: str
    step: str
    why: list[str]


class Unsure(ResultModel):
    label: str
    why: list[str]


class HeadlineThroughput(ResultModel):
    """The candidate with the highest throughput, eligible or not."""

    label: str
    value: Number | None = Field(description="the throughput, in the unit basis names")
    basis: str = Field(description="what value counts, e.g. output tokens per second of engine busy time")


class Decision(ResultModel):
    """The choice among eligible candidates and why, rejections included."""

    route: str
    chosen: str | None
    chosen_path: str | None
    rejected: list[Rejection]
    inconclusive: list[Unsure]
    unmeasured: list[Unsure]
    headline_throughput: HeadlineThroughput
    why: list[str]


class Identity(ResultModel):
    """What differs between the candidates: the declared variable, and what else."""

    variable: str
    varies: list[str]
    also_differs: list[str]
    held_fixed: list[str]


class PriceInfo(ResultModel):
    path: str | None
    example: bool
    currency: str
    description: str | None


class ComparisonResult(ResultModel):
    """The candidate decision (``loadgen compare --json``)."""

    kind: Literal["loadgen.comparison"]
    version: int = Field(description=f"the schema version ({COMPARISON_SCHEMA_VERSION})")
    route: str
    variable: str
    judgement_order: list[str]
    identity: Identity
    candidates: list[CandidateJudgement]
    decision: Decision
    prices: PriceInfo | None
    notes: list[str]


class CellClass(ResultModel):
    status: str
    limiting: str | None


class RegionCell(ResultModel):
    """One cell (concurrency × rate step): its status, the constraint that limits it, mean figures of its runs."""

    cell_id: str
    concurrency: int
    rate_index: int
    rate_step: Number = Field(
        description="requests per second (rate_kind rps) or a multiple of the trace's rate (scale)"
    )
    status: str = Field(description="inside, outside, stopped, inconclusive, not_run or not_achievable")
    limiting: str | None
    repeats: int
    passes: int
    requests_sent: int
    extensions: int
    offered_rps: Number | None
    send_rps: Number | None
    completed_rps: Number | None
    output_tok_s: Number | None
    goodput_rps: Number | None
    send_lag_p99_ms: Number | None
    ttft_p99_ms: dict[str, list[Figure]] = Field(description="per class, one p99 TTFT (ms) per run")
    warm_state: list[WarmStateResult] = Field(description="the first run's warm state (empty: none ran)")
    skip_reason: str | None
    run_dirs: list[str]
    per_class: dict[str, CellClass] = Field(description="a mixed-class cell: each class's own status")


class BoundaryRow(ResultModel):
    """One concurrency line: its highest inside rate step and the first outside step above it."""

    concurrency: int
    max_inside_rate_index: int | None
    max_inside_rate_step: Number | None = Field(description="in the unit of rate_steps")
    max_inside_offered_rps: Number | None
    max_inside_completed_rps: Number | None
    max_inside_output_tok_s: Number | None
    first_outside_rate_index: int | None
    limiting: str | None
    line_status: str | None


class StateRegion(ResultModel):
    cells: list[RegionCell]
    boundary: list[BoundaryRow]


class PlanScenario(ResultModel):
    """The scenario whose budgets judge every cell (a resume refuses a scenario whose sha256 changed)."""

    name: str
    path: str = Field(description="the scenario TOML read")
    sha256: str = Field(description="sha256 of the scenario TOML's bytes")


class PlanBudgetUse(ResultModel):
    """What the whole plan may spend (``[budget]``, ``--time-budget-s``) and has spent, across resumes."""

    time_s: Number = Field(description="the time budget, s")
    requests: int = Field(description="the request budget, requests")
    consumed_time_s: Number = Field(description="wall time of every recorded run and of discarded ones, s")
    consumed_requests: int = Field(description="requests sent by every recorded run")


class StartLine(ResultModel):
    """One rate line's predicted start: the highest rate step a worksheet passed and the step it starts at."""

    predicted_last_pass: int = Field(description="index into rate_steps (-1: the worksheet passed none)")
    start_index: int = Field(description="index into rate_steps the walk starts at")


class PlanStart(ResultModel):
    """Where each line's walk starts (``[start]``) and why; ``engine`` and ``lines`` filled only when a
    worksheet predicted the capacity."""

    mode: StartMode
    steps_below: int = Field(description="rate steps below the predicted boundary to start at (a count)")
    lines: dict[str, StartLine] = Field(
        description="open mapping: '<class>.c<concurrency>' of each rate line (one per plan class and "
        "concurrency) -> its prediction; empty when nothing was predicted"
    )
    engine: str | None = Field(None, description="the simulated engine the prediction ran on (absent: none)")
    note: str


class PlanLedgerClass(ResultModel):
    """One class's KV-limited concurrency (the memory ledger's ``LedgerClass``, these two figures)."""

    max_seqs_p99: int = Field(description="sequences that fit in the KV pool at p99 lengths")
    limit_p99: int = Field(description="sequences: min(KV-limited at p99, the engine limit)")


class PlanLedger(ResultModel):
    """The memory ledger of the plan's ``start.model_config`` at default engine settings, to read the
    concurrency steps against (absent from a plan without a model config: null)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True, protected_namespaces=())

    model_config_path: str = Field(alias="model_config", description="the HF config.json read")
    kv_cache_tokens: int | None = Field(
        description="token slots in the KV pool (null: the engine settings give no KV budget)"
    )
    classes: dict[str, PlanLedgerClass] = Field(description="open mapping: scenario class name -> its figures")
    note: str


class PlanSearch(ResultModel):
    """How each line was searched for its boundary (the plan's ``[search]``)."""

    mode: SearchMode
    dimension: SearchDimension
    precision: Number | None = Field(
        description="relative spacing of the geometric rate ladder, e.g. 0.05 (null: the declared rate steps)"
    )


class Probe(ResultModel):
    """One run the walk of the last invocation asked for, in order, with why it was chosen (a resumed plan's
    walk asks for its earlier runs again, and loads them)."""

    cell_id: str
    repeat: int = Field(description="the cell's repeat number, from 1")
    why: str
    result: str | None = Field(
        None,
        description="pass, fail, inconclusive, not achievable or 'stop <kinds>' (absent: the plan stopped "
        "before the run, budget spent or run limit reached)",
    )


class RegionResult(ResultModel):
    """The capacity region of a plan (``region.json``; ``loadgen plan --json`` adds ``engine_calibration``)."""

    kind: Literal["loadgen.region"]
    version: int = Field(description=f"the schema version ({REGION_SCHEMA_VERSION})")
    plan: str
    plan_sha256: str | None
    status: str | None
    ended: str | None
    target: TargetIdentity = Field(description="the target the plan ran against, told apart by kind")
    scenario: PlanScenario
    rate_kind: Literal["scale", "rps"]
    rate_steps: list[Number] = Field(
        description="requests per second (rate_kind rps) or multiples of the trace's rate (scale)"
    )
    concurrency: list[int]
    repeats: int
    budget: PlanBudgetUse | None
    start: PlanStart | None
    ledger: PlanLedger | None
    search: PlanSearch
    cells_used: int
    runs_used: int
    probes: list[Probe]
    classes: dict[str, dict[str, StateRegion]] = Field(description="class -> state (warm/cold) -> cells and boundary")
    rule: str
    engine_calibration: str | None = None


class FleetLine(ResultModel):
    """One class × state × client concurrency: per rate step, the fewest engines meeting every hard budget."""

    class_name: str = Field(alias="class")
    state: str
    concurrency: int
    max_inside_rate_index: dict[str, int | None] = Field(
        description="replica count -> index into rate_steps of its highest inside step (null: none inside)"
    )
    smallest_replicas: list[int | None] = Field(
        description="per rate step, the smallest replica count whose region holds it (null: no count does)"
    )


class FleetResult(ResultModel):
    """Fleet sizing of a plan with ``[fleet]`` (``fleet.json``; ``loadgen plan --json`` prints it)."""

    kind: Literal["loadgen.fleet"]
    version: int = Field(description=f"the schema version ({FLEET_SCHEMA_VERSION})")
    plan: str
    route_policy: str
    replicas: list[int] = Field(description="the replica counts walked, one plan directory each (replicas-N/)")
    rate_kind: Literal["scale", "rps"]
    rate_steps: list[Number] = Field(
        description="requests per second (rate_kind rps) or multiples of the trace's rate (scale)"
    )
    status: Literal["complete", "incomplete"]
    cells_used: dict[str, int | None] = Field(description="replica count -> cells its plan ran")
    runs_used: dict[str, int | None] = Field(description="replica count -> runs its plan ran")
    lines: list[FleetLine]
    rule: str
