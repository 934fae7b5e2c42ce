"""A plan directory's internal state files as typed models: ``plan.json`` (``PlanState``, what ``loadgen plan``
resumes from) and each run's ``cell_result.json`` (``CellResult``, one run of a cell judged).

Both are written by ``loadgen plan`` and read back by its next invocation (and by ``compare`` of a plan
directory). The writers validate what they write through these models (a key no model declares is a bug,
caught before the file is written); the readers (``files.read_plan_state``, ``files.read_cell_result``)
validate what they read, so a hand-edited or damaged file is one line naming the file, the field, its value and
what was expected, never a traceback deep in the walk. Published JSON Schemas: ``loadgen schema plan-state``
and ``loadgen schema cell-result``.

Keys a state written by an older loadgen lacks are optional (absent, not null): ``rate_steps`` (the region then
reads the plan's own ladder), a warm state's ``method``, a record's ``extensions`` and ``contract``.
"""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field

from loadgen.targets.base import WarmStateResult
from loadgen.targets.identity import TargetIdentity
from loadgen.util.resultmodel import Number, ResultModel

from .results import BudgetItem, ContractFailure, PlanBudgetUse, PlanLedger, PlanScenario, PlanStart, Probe
from .spec import PlanSpec

__all__ = [
    "CELL_RESULT_SCHEMA_VERSION",
    "PLAN_STATE_SCHEMA_VERSION",
    "CellResult",
    "PlanState",
]

#: plan.json's ``version``.
PLAN_STATE_SCHEMA_VERSION = 1
#: The cell result's schema version (the file itself carries none: it is read only by the plan that wrote it).
CELL_RESULT_SCHEMA_VERSION = 1

_RATE_STEP = "requests per second (rate_kind rps) or a multiple of the trace's rate (scale)"


class CellCoordRecord(ResultModel):
    """Where a cell sits: class, warm/cold state, client concurrency and rate step (``cells.CellCoord``)."""

    request_class: str
    state: Literal["warm", "cold"]
    concurrency: int = Field(description="client slots (a count)")
    rate_index: int = Field(description="index into rate_steps")
    rate_step: Number = Field(description=_RATE_STEP)
    rate_kind: Literal["scale", "rps"]
    cell_id: str


class StopRecord(ResultModel):
    """A stop condition that fired (``checks.Stop``): its kind (server_failure, send_lag, unstable_tail, ...)."""

    kind: str
    detail: str


class ClassFigures(ResultModel):
    """One class of a run: its p99 TTFT and the counts and rates behind it."""

    ttft_p99_ms: Number | Literal["inf"] | None = Field(description='"inf": failures reach the p99')
    ttft_n: int | None = Field(description="TTFT samples (a count)")
    n_scheduled: int = Field(description="requests of the class in the trace")
    completed_rps: Number | None
    output_tok_s: Number | None


class RunFigures(ResultModel):
    """The numbers a region table shows per run (``checks.run_figures``): offered against completed, tails."""

    n_scheduled: int = Field(description="requests in the trace")
    status_counts: dict[str, int] = Field(description="status (ok, error, timeout, ...) -> requests")
    offered_rps: Number | None
    send_rps: Number | None
    completed_rps: Number | None
    prompt_tok_s: Number | None
    output_tok_s: Number | None
    goodput_rps: Number | None
    send_lag_p99_ms: Number | None
    classes: dict[str, ClassFigures] = Field(description="class -> its figures")


class CellContract(ResultModel):
    """The behaviour contract replayed after the run (``contract_hook.replay_contract``; ``{}`` when not asked)."""

    status: Literal["passed", "failed", "skipped", "not_configured", "not_evaluated"]
    summary: str
    failures: list[ContractFailure] = Field(description="the first 20 failed checks")
    n_cases: int | None = Field(None, description="cases replayed (a count)")
    n_passed: int | None = Field(None, description="cases passed (a count)")
    regressions: list[str] | None = Field(None, description="behaviours changed against the reference")
    path: str | None = Field(None, description="the contract.json written")


class Empty(ResultModel):
    """An empty object: no contract asked for this run (``stops.contract_every_cell`` off, or no cases), or no
    figures (a skipped run)."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={"maxProperties": 0})


class Extension(ResultModel):
    """An earlier, shorter run of the cell that was inconclusive and extended (each a count of checks)."""

    run_dir: str = Field(description="relative to the plan directory")
    trace: str = Field(description="relative to the plan directory")
    requests_sent: int
    wall_s: Number
    inconclusive: int
    failed: int
    stops: int


class CellResult(ResultModel):
    """One run of a cell, judged (``cell_result.json``, written last: its presence marks the run finished)."""

    coord: CellCoordRecord
    cell_id: str
    repeat: int = Field(description="the cell's repeat number, from 1")
    order_index: int | None = Field(None, description="the run's place in the plan's order of runs, from 1")
    run_dir: str = Field(description="the run judged (the last, when extended), relative to the plan directory")
    warm_state: WarmStateResult
    invocation: int = Field(description="the plan invocation that ran it, from 1")
    trace: str = Field(description="relative to the plan directory")
    skipped: bool
    skip_reason: str | None = Field(None, description="why the cell's state was not achievable (skipped runs)")
    passed: bool | None = Field(None, description="absent: skipped")
    failed: list[BudgetItem]
    per_class_failed: dict[str, list[BudgetItem]] = Field(default_factory=dict)
    inconclusive: list[BudgetItem]
    per_class_inconclusive: dict[str, list[BudgetItem]] = Field(default_factory=dict)
    stops: list[StopRecord]
    figures: RunFigures | Empty = Field(description="the run's figures ({} when skipped)")
    contract: CellContract | Empty = Field(Empty(), description="{}: no contract replayed")
    recovery: list[str] = Field(default_factory=list, description="what was done to bring a failed server back")
    requests_sent: int
    requests_scheduled: int | None = Field(None, description="requests in the trace")
    run_kind: str | None = None
    base_run_dir: str | None = Field(None, description="the first run of the cell (extended runs)")
    extensions: list[Extension] = Field(default_factory=list)
    extension_note: str | None = None
    wall_s: Number = Field(description="wall time of every run of the record, s")


class Invocation(ResultModel):
    """One ``loadgen plan`` invocation on the directory."""

    started_utc: str
    pid: int
    ended_utc: str | None = None
    wall_s: Number | None = None
    new_runs: int | None = Field(None, description="runs it started (a count)")
    ended: str | None = None


class PlanLine(ResultModel):
    """One searched line: (class, state, concurrency) along the rate ladder, or (class, state, rate step) along
    the concurrency ladder; ``last_pass``/``first_fail`` are indices into the searched ladder."""

    class_name: str = Field(alias="class")
    state: Literal["warm", "cold"]
    concurrency: int | None = None
    rate_index: int | None = None
    dimension: Literal["rate", "concurrency"] | None = None
    start_index: int | None = None
    status: Literal["done", "not_achievable", "not_run"]
    reason: str | None = None
    last_pass: int | None = None
    first_fail: int | None = None
    last_pass_concurrency: int | None = None
    first_fail_concurrency: int | None = None
    fatal: StopRecord | None = None


class CellState(ResultModel):
    """One cell of the last walk: its coordinate, its runs and the stops judged across its repeats."""

    coord: CellCoordRecord
    runs: list[str] = Field(description="its run directories, relative to the plan directory")
    extra_stops: list[StopRecord]
    skipped_reason: str | None


class DiscardedRun(ResultModel):
    """A run interrupted before its result: its time counted, its data removed."""

    run_dir: str
    duration_s: Number
    reason: str


class PlanHarness(ResultModel):
    """The loadgen that created the plan directory (a run manifest's ``harness``)."""

    name: str
    version: str | None
    git_sha: str | None
    python: str | None
    python_implementation: str | None
    packages: dict[str, str | None] = Field(description="package -> version (null: not installed)")
    pid: int | None
    monotonic_clock: str | None


class PlanState(ResultModel):
    """A plan directory's state (``plan.json``): the plan and target it was started with, every invocation,
    and, once an invocation ends, the budget spent and the last walk's lines, probes and cells."""

    kind: Literal["loadgen.plan"]
    version: int = Field(description=f"the schema version ({PLAN_STATE_SCHEMA_VERSION})")
    plan: PlanSpec = Field(description="the plan as first run (a resume refuses another)")
    plan_path: str | None
    plan_sha256: str | None
    scenario: PlanScenario
    target: TargetIdentity = Field(description="the target the plan runs against, told apart by kind")
    rate_steps: list[Number] | None = Field(None, description=_RATE_STEP)
    harness: PlanHarness | None = None
    created_utc: str
    invocations: list[Invocation]
    status: Literal["running", "complete", "incomplete", "interrupted"] | None = None
    ended: str | None = None
    start: PlanStart | None = None
    ledger: PlanLedger | None = None
    budget: PlanBudgetUse | None = None
    lines: list[PlanLine] = Field(default_factory=list)
    probes: list[Probe] = Field(default_factory=list)
    cells: dict[str, CellState] = Field(default_factory=dict, description="cell id -> its cell")
    discarded_wall_s: Number | None = Field(None, description="wall time of runs interrupted before their result, s")
    discarded_runs: list[DiscardedRun] = Field(default_factory=list)
