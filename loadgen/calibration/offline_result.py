"""``loadgen sim validate --measured ... --json`` as a typed result.

``MeasuredValidation`` (schema version ``MEASURED_VALIDATION_SCHEMA_VERSION``; the document carries no version
field, its schema's ``$id`` states it: ``loadgen schema validation-measured``) is ``offline.validate_measured``'s
document, with ``sensitivity`` and ``recorded`` when asked for. A figure's ``measured`` / ``predicted`` are in its
own unit: ms for the latency figures (``ttft_mean``, ``e2e_p99`` ...), requests/s for ``throughput_rps``.
"""

from __future__ import annotations

from pydantic import Field

from loadgen.rundir.engine_notes import WorksheetNotes
from loadgen.util.resultmodel import Number, ResultModel

__all__ = ["MEASURED_VALIDATION_SCHEMA_VERSION", "MeasuredValidation"]

#: The document's schema version (in the schema's ``$id``).
MEASURED_VALIDATION_SCHEMA_VERSION = 1

_UNIT = "in the figure's unit: ms for latencies, requests/s for throughput_rps"


class EngineRef(ResultModel):
    """The engine TOML replayed (its full config left out)."""

    name: str
    path: str | None
    sha256: str | None
    num_kv_blocks: int | None = Field(description="KV blocks of the engine's pool (a count)")
    calibration_label: str
    config: None = Field(description="always null here: the full config is in the TOML")


class AnchorRef(ResultModel):
    """How the replay's arrivals were anchored."""

    name: str = Field(description="workload or queued")
    means: str


class ErrorRow(ResultModel):
    """One figure: measured, predicted, the difference and the error % (null under the floor)."""

    figure: str
    measured: Number | None = Field(description=_UNIT)
    predicted: Number | None = Field(description=_UNIT)
    diff: Number | None = Field(description="predicted - measured, " + _UNIT)
    signed_pct: Number | None = Field(description="(predicted - measured) / measured, %")
    abs_pct: Number | None = Field(description="|signed_pct|, %")


class Worst(ResultModel):
    """The figure with the largest |error|."""

    figure: str
    signed_pct: Number = Field(description="its signed error, %")


class WorstRun(ResultModel):
    """The figure with the largest |error| over every run, and its run."""

    run: str
    run_dir: str
    figure: str
    signed_pct: Number = Field(description="its signed error, %")


class ReplaySettings(ResultModel):
    """The scheduler settings the measured engine ran with (those it recorded), replayed in place of the TOML's."""

    source: dict[str, str] = Field(description="setting -> where it came from (engine argument, logged by vLLM ...)")
    max_num_seqs: int | None = Field(None, description="sequences per step (a count)")
    max_num_batched_tokens: int | None = Field(None, description="tokens per step (a count)")
    data_parallel_size: int | None = Field(None, description="engines behind vLLM's balancer (a count)")
    num_kv_blocks: int | None = Field(None, description="KV blocks vLLM logged (a count)")
    enable_prefix_caching: bool | None = None
    max_model_len: int | None = Field(None, description="tokens per sequence (a count)")
    chunked_prefill: bool | None = None
    reserve_full_isl: bool | None = None
    cuda_graphs: bool | None = None
    num_kv_blocks_used: int | None = Field(None, description="KV blocks the replay used (a count)")


class Series(ResultModel):
    """A server metric at the measured run's ticks: its value there, and the replay's at the same ticks."""

    t_s: list[Number] = Field(description="tick, s on the run clock")
    measured: list[Number] = Field(description="requests (running, waiting), a share 0..1 (kv_use) or tokens")
    predicted: list[Number] = Field(description="as measured, from the replay")


class SensitivitySpread(ResultModel):
    """One perturbation's replays: each setting's worst figure and MAPE, and their range."""

    perturbation: str
    settings: list[int] = Field(description="the values it took (KV blocks, or ms)")
    worst_figures: list[str | None]
    worst_abs_pct: list[Number] = Field(description="each replay's worst |error|, %")
    mape_pct: list[Number]
    summary: str


class RunComparison(ResultModel):
    """One measured run beside its replay: the figures' errors, MPE / MAPE, the series, what was assumed."""

    name: str
    run_dir: str
    rows: list[ErrorRow]
    mpe_pct: Number | None
    mape_pct: Number | None
    worst: Worst | None
    settings: ReplaySettings
    series: dict[str, Series] = Field(description="running, waiting, kv_use, generated")
    published: dict[str, Number] = Field(description="figure -> the published simulator's own signed error, %")
    notes: list[str]
    engine_notes: WorksheetNotes = Field(description="the replay's engine notes: its scalars and its profile grid")
    mismatches: list[str] = Field(description="how the engine differs from the run's deployment")
    unchecked: str | None
    source: dict[str, str] = Field(description="the imported files' path and requests.jsonl's sha256")
    sensitivity: list[SensitivitySpread] | None = None


class MeasuredValidation(ResultModel):
    """An engine TOML's replay of imported real-vLLM runs, beside each run's measured figures."""

    engine: EngineRef
    engine_label: str
    definitions: str
    anchor: AnchorRef
    runs: list[RunComparison]
    worst: WorstRun | None
    not_recorded: str | None = Field(description="why no validated error is written into the TOML (null: it may)")
    recorded: str | None = Field(None, description="--record: the validated_error line written (null: none)")
