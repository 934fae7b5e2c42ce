"""An engine TOML's ``[calibration]`` table, checked when the engine is loaded.

``loadgen sim calibrate`` writes it (whether the costs were fitted, against which engine on which hardware, when,
the fit's terms and residuals, the runtime memory it measured) and ``loadgen sim validate`` adds the validated
error and the runs validated against. Every output built on the engine states its label from it, so the keys
the label and the ledger read are typed here: a hand edit that breaks one (``validated_error = 5``,
``runtime_gib = "x"``, ``mpe_pct = nan``) is refused in one line when the engine loads, not printed as
"calibrated against ? on ?" or met later by the one command that reads it. The rest of the fit's record is kept
as written (``extra = "allow"``). ``EngineConfig`` keeps the table as the mapping it read.
"""

from __future__ import annotations

from typing import Any

from pydantic import ConfigDict, Field

from loadgen.util.limits import InputModel

__all__ = ["CalibrationSection"]


class _Record(InputModel):
    """A table of the record: its typed keys checked, the others kept; no NaN or infinity in a number."""

    model_config = ConfigDict(extra="allow", allow_inf_nan=False)


class CalibrationMemory(_Record):
    """``[calibration.memory]``: what a launched engine needed beyond the ledger's model memory."""

    runtime_gib: float | None = Field(None, ge=0, le=1024, description="runtime memory measured, GiB")


class MeasuredValidationRecord(_Record):
    """One run under ``[calibration.measured_validations]`` (``loadgen sim validate --measured``)."""

    run_dir: str
    anchor: str
    mpe_pct: float = Field(description="mean signed error over the run's figures, %")
    mape_pct: float = Field(description="mean absolute error over the run's figures, %")
    worst_figure: str | None = None
    worst_signed_pct: float | None = Field(None, description="the worst figure's signed error, %")


class CalibrationSection(_Record):
    """``[calibration]``: the keys every output's label and the ledger read, typed; the fit's record kept."""

    calibrated: bool = False
    engine: str | None = Field(None, description="the engine the costs were fitted against")
    hardware: str | None = Field(None, description="the hardware it ran on")
    fitted_utc: str | None = None
    validated_error: str | None = Field(None, description="the worst validated error, as one line")
    memory: CalibrationMemory | None = None
    validations: dict[str, dict[str, Any]] | None = None
    measured_validations: dict[str, MeasuredValidationRecord] | None = None
