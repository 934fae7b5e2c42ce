"""The practice's ``decision.json`` (and ``loadgen practice --json``) as a typed result.

``PracticeDecision`` (schema version ``PRACTICE_SCHEMA_VERSION``, the document's ``version``; ``loadgen schema
practice``) reuses the published parts: the comparison and its decision (``loadgen schema decision``), each
candidate's ledger (``loadgen schema ledger``, with the config it was computed from) and, for ``--engine vllm``,
the engine limits of ``loadgen schema calibration``. ``practice.run_practice`` writes its ``document()``.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from loadgen.calibration.calibrate_result import EngineLimitsResult
from loadgen.ledger.result import LedgerResult
from loadgen.plan.results import ComparisonResult, Decision
from loadgen.util.resultmodel import Number, ResultModel
from loadgen.workload.scenario import TraceSettings

__all__ = ["PRACTICE_SCHEMA_VERSION", "PracticeDecision"]

#: decision.json's ``version``.
PRACTICE_SCHEMA_VERSION = 1

_FIGURES = "figure -> value: ttft/itl/e2e _p50/_p99 in ms, completed_rps in requests per second, attainment a share"


class DerivedFrom(ResultModel):
    """The trace the practice's trace was cut from."""

    path: str
    sha256: str
    window_s: list[Number] = Field(description="[start, end] of the kept window, s")
    how: str


class Budget(ResultModel):
    """A latency budget: limits in ms at p50 / p95 / p99 (those set), hard (rejects) or soft (warns)."""

    p50: Number | None = Field(None, description="ms")
    p95: Number | None = Field(None, description="ms")
    p99: Number | None = Field(None, description="ms")
    hard: bool


class Workload(ResultModel):
    """The scenario and the trace the candidates were measured on."""

    scenario: str
    scenario_path: str | None
    scenario_sha256: str | None
    trace: str
    trace_sha256: str
    trace_name: str | None
    seed: int | None
    requests: int = Field(description="requests in the trace")
    duration_s: Number | None
    derived_from: DerivedFrom | None
    settings: TraceSettings | None = Field(
        description="the trace generator's arrival setting, as the trace's metadata recorded it (keys an older "
        "generator did not write are absent; null: the trace records none, e.g. an imported one)"
    )
    requests_per_class: dict[str, int] = Field(description="class -> requests in the trace")
    budgets: dict[str, dict[str, Budget]] = Field(description="class -> metric (ttft_ms, itl_ms, ...) -> budget")
    behavior_cases: list[str]


class PracticeLedger(LedgerResult):
    """One candidate's memory ledger (``loadgen schema ledger``), the model config it was computed from and, for a
    simulated candidate, its KV budget and the engine's own pool beside the ledger's."""

    config_path: str = Field(alias="model_config", description="the model's config.json")
    engine_label: str | None = Field(None, description="the simulated engine's calibration label")
    kv_budget_source: str | None = Field(None, description="where the KV budget came from")
    gpu: str | None = Field(None, description="the device the budget is of (null: the engine's pool)")
    device_memory_bytes: int | None = Field(None, description="the device's memory (null: unknown device)")
    engine_kv_blocks: int | None = Field(None, description="the engine's own KV pool, blocks (a count)")
    engine_pool: str | None = Field(None, description="the engine's pool beside the ledger's, as a line")
    kv_cache_gib: Number | None = Field(None, description="the ledger's KV pool, GiB")


class LedgerNotComputed(ResultModel):
    """Real engines: no ledger (they report their own KV cache)."""

    note: str


class Discarded(ResultModel):
    """A measured run set aside (the client fell behind its schedule) and measured again."""

    run_dir: str
    why: str


class Ownership(ResultModel):
    """Who owns what follows from the decision."""

    llm_engineering: str
    platform_sre: str
    kernel_specialists: str


class ClassPrediction(ResultModel):
    """One class: the worksheet's prediction beside the measured run."""

    n_measured: int
    n_predicted: int
    predicted: dict[str, Number | None] = Field(description=_FIGURES)
    measured: dict[str, Number | None] = Field(description=_FIGURES)
    error_pct: dict[str, Number | None] = Field(description="figure -> (predicted - measured) / measured, %")
    attainment_diff_points: Number | None
    send_lag_p99_ms: Number | None
    client_lagged: bool


class Prediction(ResultModel):
    """``--engine vllm``: a candidate predicted with the worksheet (the predictor's cost terms, its own limits)."""

    engine: str
    engine_path: str | None
    engine_sha256: str | None
    calibrated: bool
    label: str
    skipped: str | None = Field(None, description="why it was not predicted (its limits were not read)")
    limits: EngineLimitsResult | None = None
    worksheet: str | None = Field(None, description="the worksheet run directory")
    classes: dict[str, ClassPrediction] | None = None


class PracticeDecision(ResultModel):
    """Which of two engines serves the workload: the question, the workload, the ledgers, the comparison and its
    decision, and who owns what follows."""

    kind: Literal["loadgen.practice"]
    version: int = Field(description=f"the schema version ({PRACTICE_SCHEMA_VERSION})")
    question: str
    out_dir: str
    wall_s: Number = Field(description="the practice's wall time, s")
    engine: str = Field(description="sim or vllm")
    workload: Workload
    ledger: dict[str, PracticeLedger] | LedgerNotComputed = Field(description="candidate -> its ledger")
    candidates: dict[str, str] = Field(description="candidate -> its run directory")
    discarded_runs: dict[str, list[Discarded]] = Field(description="candidate -> runs measured again")
    comparison: ComparisonResult
    decision: Decision
    ownership: Ownership
    next_steps: list[str]
    model_executed: bool = Field(alias="modelExecuted", description="a real model ran (not a simulated engine)")
    engine_calibration: dict[str, str] = Field(description="engine -> what its figures are (calibrated or not)")
    prediction: dict[str, Prediction] | None = None
