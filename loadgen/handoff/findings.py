"""A handoff bundle's findings as typed models: ``failure.json`` (``FailureFile``: what failed in the source run)
and ``experiment.json`` (``Experiment``: the one-variable change proposed from the first failure).

The builder writes both through these models; ``handoff rerun`` reads both back through them, so a bundle whose
files were edited (and re-summed) is one line naming the file, the field and its value, never a traceback. The
``--json`` documents of ``handoff``/``handoff rerun`` (``result.py``) reuse the same checks and experiment.
Published JSON Schemas: ``loadgen schema handoff-failure`` and ``loadgen schema handoff-experiment``.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from loadgen.util.resultmodel import Figure, Number, ResultModel

__all__ = [
    "HANDOFF_EXPERIMENT_SCHEMA_VERSION",
    "HANDOFF_FAILURE_SCHEMA_VERSION",
    "AppliedChange",
    "Experiment",
    "FailedCheck",
    "FailureFile",
    "MemorySignal",
    "RerunCheck",
]

#: failure.json's schema version (the file carries none; the bundle's identity.json has the bundle's).
HANDOFF_FAILURE_SCHEMA_VERSION = 1
#: experiment.json's schema version (the file carries none).
HANDOFF_EXPERIMENT_SCHEMA_VERSION = 1

_IN_METRIC_UNIT = "in the metric's unit (ms for *_ms, a share 0..1 for error_share and kv_cache_saturated, a count "
_IN_METRIC_UNIT += "for preemptions)"
#: An engine setting's value (a number in the setting's own unit, or a phrase such as "the run's").
SettingValue = Number | str | None


class FailedCheck(ResultModel):
    """A failed hard budget or memory signal of the source run (``failure.json``'s ``failures``)."""

    class_name: str | None = Field(alias="class", description="the request class, or overall")
    metric: str | None = Field(description="ttft_ms, itl_ms, e2e_ms, error_share, ... or a memory signal")
    percentile: str | None = Field(description="p50 / p95 / p99; null: not a quantile")
    limit: Figure = Field(description="the budget's limit, " + _IN_METRIC_UNIT)
    observed: Figure = Field(description="the run's figure, " + _IN_METRIC_UNIT + '; "inf": failures counted as inf')
    samples: int | None = Field(description="requests (or metric samples) the figure is over")
    failures_as_inf: int | None = Field(None, description="failed requests counted as infinite latency (a count)")
    hard: bool | None
    reason: str | None


class RerunCheck(FailedCheck):
    """An originally failing check, re-measured on the rerun (null: the rerun had no such check)."""

    rerun_observed: Figure = Field(description="the rerun's figure, " + _IN_METRIC_UNIT)
    rerun_passed: bool | None
    rerun_samples: int | None = Field(description="requests the rerun's figure is over")
    rerun_reason: str | None = None


class TargetCheck(ResultModel):
    """The check the proposed experiment aims at."""

    class_name: str | None = Field(alias="class")
    metric: str | None
    percentile: str | None
    limit: Figure = Field(description="the budget's limit, " + _IN_METRIC_UNIT)


class AppliedChange(ResultModel):
    """One engine setting changed: its dotted name, its value before and after (in the setting's own unit)."""

    variable: str | None
    from_value: SettingValue = Field(alias="from", description="the value in the run, in the setting's own unit")
    to: SettingValue = Field(description="the value to try, in the setting's own unit")


class Experiment(AppliedChange):
    """The one-variable experiment proposed from the first failure (``experiment.json``): not measured."""

    hypothesis: str
    status: str
    target_check: TargetCheck | None
    keep_fixed: list[str]
    measure: str


class MemorySignal(ResultModel):
    """Memory evidence the run holds: KV cache saturation, preemptions (from /metrics), an OOM the engine noted."""

    signal: Literal["kv_cache_saturated", "preemptions", "engine_oom"]
    metric: str | None = Field(None, description="the /metrics series read (absent: engine_oom, from its notes)")
    observed: Number | None = Field(description="kv_cache_saturated: peak usage, a share 0..1; preemptions: a count")
    limit: Number | None = Field(description="in the unit of observed")
    samples: int | None = Field(description="metric samples the figure is over")
    reason: str


class FailureFile(ResultModel):
    """What failed in the source run (``failure.json``): hard budgets and memory signals (TTFT and memory first),
    soft budgets, and the run's verdict and error share."""

    verdict: str = Field(description="the analysis verdict: pass, fail, inconclusive, no budgets or no data")
    passed: bool | None
    failures: list[FailedCheck]
    soft_failures: list[FailedCheck]
    memory_signals: list[MemorySignal]
    error_share: Number | None = Field(description="failed requests, a share 0..1 of those in the window")
    note: str | None
