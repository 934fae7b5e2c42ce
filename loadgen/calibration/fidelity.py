"""The fidelity table (``loadgen sim validate``'s ``fidelity.json``) as a typed result.

``FidelityRow`` is one class of one trace, measured against the worksheet; ``FidelityTable`` the whole
document, schema version ``FIDELITY_SCHEMA_VERSION`` (the file carries none: its schema's ``$id`` states
it; ``loadgen schema fidelity``). Errors are (worksheet − measured) / measured in %, attainment in points.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from loadgen.util.resultmodel import Number, ResultModel

from .calibrate_result import EngineLimitsResult

__all__ = ["FIDELITY_SCHEMA_VERSION", "FidelityRow", "FidelitySummary", "FidelityTable", "GoalCheck"]

#: The fidelity table's schema version.
FIDELITY_SCHEMA_VERSION = 2


#: What the figures of ``measured`` and ``simulated`` count (the quantities are ``validate.QUANTITIES`` and attainment).
_QUANTITY_UNITS = (
    "quantity -> figure: ttft/itl/e2e _p50/_p99 in ms, completed_rps in requests per second, attainment a share 0..1"
)


class FidelityRow(ResultModel):
    """One class of one trace: the measured and simulated figures and the errors between them."""

    trace: str
    request_class: str
    n_measured: int
    n_simulated: int
    errors_pct: dict[str, Number | None] = Field(default_factory=dict, description="quantity -> error %")
    measured: dict[str, Number | None] = Field(default_factory=dict, description=_QUANTITY_UNITS)
    simulated: dict[str, Number | None] = Field(default_factory=dict, description=_QUANTITY_UNITS)
    attainment_diff_points: Number | None = None
    send_lag_p99_ms: Number | None = None
    client_lagged: bool = Field(False, description="the client fell behind: its timing, not the engine's")

    def to_dict(self) -> dict[str, Any]:
        """Every field, set or not (``document()`` keeps only those set)."""
        return self.model_dump()


class FidelitySummary(ResultModel):
    """Worst absolute error % per quantity over the rows the client kept up with, and the worst attainment gap."""

    rows: int
    rows_flagged_send_lag: int
    max_abs_ttft_p50_error_pct: Number | None
    max_abs_ttft_p99_error_pct: Number | None
    max_abs_itl_p50_error_pct: Number | None
    max_abs_itl_p99_error_pct: Number | None
    max_abs_e2e_p50_error_pct: Number | None
    max_abs_e2e_p99_error_pct: Number | None
    max_abs_completed_rps_error_pct: Number | None
    max_abs_attainment_diff_points: Number | None


class GoalCheck(ResultModel):
    """Every goal figure sorted: within the goal, within the engine's own repeat difference, or missed."""

    goal_pct: Number
    goal_points: Number
    within: int
    within_engine_spread: int
    missed: list[tuple[str, str, str, Number, Number | None]] = Field(
        description="(trace, class, quantity, error, the engine's own difference or null)"
    )
    figures: int


class AnchoredFit(ResultModel):
    """The worksheet anchored to this launch's measured speed."""

    rows: list[FidelityRow]
    summary: FidelitySummary
    goal: GoalCheck


class ShapeWarmup(ResultModel):
    """The engine's step sizes swept before anything was measured (``vllm.warmup.ShapeWarmup``)."""

    skipped: str | None = Field(None, description="why nothing was swept (present only then)")
    lengths: int = Field(description="prompt lengths sent (a count)")
    largest_tokens: int
    seconds: Number = Field(description="the sweep's wall time, s")
    dense_up_to: int = Field(description="every prompt length up to this many tokens was sent")
    stride_tokens: int = Field(description="above dense_up_to, every this many tokens")
    budget_tokens: int | None = Field(
        None, description="the largest length the sweep would have sent; above largest_tokens where it stopped early"
    )
    stop_request_s: Number | None = Field(
        None, description="the sweep stops after two requests in a row took this long or longer, s"
    )


class Anchor(ResultModel):
    """This launch's measured speed against the calibration's (``anchor.Anchor``): factors are ratios."""

    step_factor: Number = Field(description="measured / calibrated decode step time (a ratio)")
    prefill_factor: Number = Field(description="measured / calibrated prefill time (a ratio)")
    step_terms: list[str]
    prefill_terms: list[str]
    observations: int = Field(description="observations the factors were fitted to (a count)")
    run_dirs: list[str]


class MemoryCheck(ResultModel):
    """The engine's measured peak memory against the ledger's total."""

    ledger_total_bytes: int
    measured_peak_bytes: int
    peak_basis: str | None = Field(description="what the peak was read from")
    runtime_gib: Number | None = Field(description="the ledger's runtime line, GiB, as the calibration measured it")
    runtime_source: str = Field(description="calibration or ledger default")
    error_pct: Number | None = Field(description="(ledger - measured) / measured, %")
    samples: int | None = Field(description="memory samples the peak is of (a count)")


class BoundaryLine(ResultModel):
    """One class x state x concurrency line of the plan: the boundary measured and predicted, steps apart."""

    request_class: str
    state: str
    concurrency: int
    measured_index: int = Field(description="index into rate_steps of the highest inside step (-1: none)")
    measured_rate_step: Number | None = Field(description="in the unit of the plan's rate_steps")
    measured_limiting: str | None
    measured_line_status: str | None
    predicted_index: int = Field(description="index into rate_steps of the highest inside step (-1: none)")
    predicted_rate_step: Number | None = Field(description="in the unit of the plan's rate_steps")
    predicted_limiting: str | None
    steps_apart: int = Field(description="rate steps between the two boundaries (a count)")
    within: bool


class PlanBoundary(ResultModel):
    """``--plan``: the same plan on the live engine and on the worksheet, boundary against boundary."""

    plan: str
    rate_steps: list[Number] | None = Field(description="the plan's rate steps (requests/s or trace-rate multiples)")
    measured_dir: str
    worksheet_dir: str
    measured_status: str | None
    lines: list[BoundaryLine]
    max_steps_apart: int | None = Field(description="the widest gap over the lines, rate steps (null: no line)")
    criterion_steps: int = Field(description="the most rate steps apart a line may be")
    all_within: bool


class FidelityTable(ResultModel):
    """The held-out check of an engine TOML against a target (``fidelity.json``)."""

    engine_toml: str
    engine_label: str
    target: str
    runs: dict[str, dict[str, str]] = Field(description="trace -> measured / worksheet run directories")
    target_limits: EngineLimitsResult = Field(description="the target's scheduler limits, read from the engine")
    warmup: str | None
    shape_warmup: ShapeWarmup
    rows: list[FidelityRow]
    summary: FidelitySummary
    repeatability: list[FidelityRow] | None
    repeatability_summary: FidelitySummary | None
    goal: GoalCheck
    anchor: Anchor | None
    anchored: AnchoredFit | None
    max_send_lag_ms: Number
    memory: MemoryCheck | None
    plan_boundary: PlanBoundary | None
