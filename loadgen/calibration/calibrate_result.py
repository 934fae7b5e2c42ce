"""``loadgen sim calibrate --json`` as a typed result, and the engine limits it (and ``sim validate``) read.

``calibration_result`` gives ``CalibrationResult`` (schema version ``CALIBRATION_SCHEMA_VERSION``, the
document's ``version``; ``loadgen schema calibration``); the CLI prints its ``document()``. The fit's terms
are ms (``calibrate.TERMS``); ``EngineLimitsResult`` is ``calibrate.EngineLimits`` as a document, also the
fidelity table's ``target_limits``.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Literal

from pydantic import Field

from loadgen.util.resultmodel import Number, ResultModel

if TYPE_CHECKING:  # calibrate loads numpy and httpx: `loadgen schema` needs only the models
    from .calibrate import EngineLimits, Fit

__all__ = [
    "CALIBRATION_SCHEMA_VERSION",
    "CalibrationResult",
    "EngineIdentity",
    "EngineLimitsResult",
    "FitResult",
    "calibration_result",
]

#: ``sim calibrate --json``'s ``version``.
CALIBRATION_SCHEMA_VERSION = 1


class EngineIdentity(ResultModel):
    """Which engine reported the limits."""

    engine: str = Field(description="vllm or loadgen-sim")
    version: str | None = Field(description="the engine's version, as its /version reports it")
    config: str | None = Field(None, description="loadgen-sim: the engine config's name")


class EngineLimitsResult(ResultModel):
    """The engine's scheduler limits as it reported them, and where each came from."""

    max_num_seqs: int = Field(description="sequences per step (a count)")
    max_num_batched_tokens: int = Field(description="tokens per step (a count)")
    max_model_len: int = Field(description="tokens per sequence (a count)")
    block_size: int | None = Field(description="tokens per KV block (null: not reported)")
    num_kv_blocks: int | None = Field(description="KV cache blocks (a count; null: not reported)")
    sources: dict[str, str] = Field(description="limit -> where it was read (an endpoint, the startup log, a default)")
    identity: EngineIdentity


class FitResult(ResultModel):
    """The fitted cost terms, their residuals and the fit's quality."""

    terms: dict[str, Number] = Field(description="term -> its cost, ms (per token, sequence or step as named)")
    noise_sigma: Number = Field(description="robust spread of log(observed / predicted) gaps (a ratio; 0: jitter)")
    residual_pct: dict[str, Number] = Field(description="<kind>_median_pct / _p90_pct -> absolute relative error, %")
    observations: int = Field(description="observations fitted (a count)")
    dropped_terms: list[str] = Field(description="terms that fitted negative, fixed at 0")
    iterations: int = Field(description="Huber reweighting iterations of the last fit (a count)")
    step_jitter_ms: list[Number] = Field(
        description="measured - predicted decode step, ms, at quantiles 0.01 .. 0.99 (sim JITTER_PROBABILITIES)"
    )


class CalibrationResult(ResultModel):
    """A calibrated engine TOML: where it is written, the fit, the limits and the measured runtime memory."""

    kind: Literal["loadgen.calibration"]
    version: int = Field(description=f"the schema version ({CALIBRATION_SCHEMA_VERSION})")
    engine_toml: str = Field(description="the engine TOML written")
    fit: FitResult
    limits: EngineLimitsResult
    runtime_gib: Number | None = Field(description="GiB measured beyond the ledger's model memory (null: none)")


def calibration_result(
    engine_toml: Path, fit: Fit, limits: EngineLimits, runtime_gib: float | None
) -> CalibrationResult:
    """The typed ``sim calibrate --json`` document of the TOML written, its fit and the engine's limits."""
    head = {"kind": "loadgen.calibration", "version": CALIBRATION_SCHEMA_VERSION}
    body = {"engine_toml": engine_toml, "fit": fit.to_dict(), "limits": limits.to_dict(), "runtime_gib": runtime_gib}
    return CalibrationResult.from_document(head | body)
