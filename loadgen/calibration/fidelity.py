"""The fidelity table (``loadgen sim validate``'s ``fidelity.json``) as a typed result.

``FidelityRow`` is one class of one trace, measured against the worksheet; ``FidelityTable`` the whole
document, schema version ``FIDELITY_SCHEMA_VERSION`` (the file carries none: its schema's ``$id`` states
it; ``loadgen schema fidelity``). Errors are (worksheet − measured) / measured in %, attainment in points.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from loadgen.util.resultmodel import Number, ResultModel

__all__ = ["FIDELITY_SCHEMA_VERSION", "FidelityRow", "FidelitySummary", "FidelityTable", "GoalCheck"]

#: The fidelity table's schema version.
FIDELITY_SCHEMA_VERSION = 1


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


class FidelityTable(ResultModel):
    """The held-out check of an engine TOML against a target (``fidelity.json``)."""

    engine_toml: str
    engine_label: str
    target: str
    runs: dict[str, dict[str, str]] = Field(description="trace -> measured / worksheet run directories")
    target_limits: dict[str, Any] = Field(description="the target's scheduler limits, read from the engine")
    warmup: str | None
    shape_warmup: dict[str, Any]
    rows: list[FidelityRow]
    summary: FidelitySummary
    repeatability: list[FidelityRow] | None
    repeatability_summary: FidelitySummary | None
    goal: GoalCheck
    anchor: dict[str, Any] | None
    anchored: AnchoredFit | None
    max_send_lag_ms: Number
    memory: dict[str, Any] | None
    plan_boundary: dict[str, Any] | None
