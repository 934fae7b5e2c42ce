"""A handoff bundle's ``workload.json`` as a typed model (``WorkloadFile``): which scenario and trace the source run
replayed, how each was obtained for the bundle, and how to regenerate the trace. The builder writes it through the
model. Published JSON Schema: ``loadgen schema handoff-workload``. The trace's own metadata stays open: it is the
trace file's, as its generator or importer wrote it (as ``loadgen schema trace-stats`` leaves it).
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from loadgen.util.resultmodel import ResultModel

__all__ = ["HANDOFF_WORKLOAD_SCHEMA_VERSION", "WorkloadFile"]

#: workload.json's schema version (the file carries none).
HANDOFF_WORKLOAD_SCHEMA_VERSION = 1


class WorkloadScenario(ResultModel):
    """The scenario the run replayed, and how the bundle's copy was obtained."""

    name: str | None
    sha256: str | None = Field(description="sha256 of the scenario TOML the run read")
    file: str = Field(description="the bundle's copy (scenario.toml)")
    note: str = Field(description="original file, rebuilt from the manifest, or not recorded")


class WorkloadTrace(ResultModel):
    """The trace the run replayed, and how the bundle's copy was obtained."""

    name: str | None = Field(description="the scenario's named trace (null: not a generated one)")
    seed: int | None
    sha256: str | None = Field(description="sha256 of the trace file the run read")
    file: str | None = Field(description="the bundle's copy (trace.parquet; null: not available)")
    note: str = Field(description="copied, regenerated (and whether it matches), or not available")
    metadata: dict[str, Any] | None = Field(  # open: the trace file's own metadata, as its generator wrote it
        description="the trace's own metadata as the run's manifest recorded it"
    )


class WorkloadFile(ResultModel):
    """The source run's workload (``workload.json``): scenario, trace, how to regenerate it; prompts not included."""

    scenario: WorkloadScenario
    trace: WorkloadTrace
    regenerate: str | None = Field(description="the loadgen trace generate command (null: not a generated trace)")
    prompts: str = Field(description="why no prompt text is included")
