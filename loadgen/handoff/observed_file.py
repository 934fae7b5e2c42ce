"""A handoff bundle's ``observed.json`` as a typed model (``ObservedAnalysis``): the source run's analysis
(``loadgen analyze --json``, ``AnalysisResult``) without its per-second series, which a rerun derives again. The
builder writes it through the model. Published JSON Schema: ``loadgen schema handoff-observed``; the analysis's
open places (its manifest's sections, warm/cold, server metrics, replicas) stay open here as there.
"""

from __future__ import annotations

from typing import Any

from pydantic import create_model

from loadgen.analysis.result import AnalysisResult
from loadgen.util.resultmodel import ResultModel

__all__ = ["HANDOFF_OBSERVED_SCHEMA_VERSION", "ObservedAnalysis"]

#: observed.json's schema version (the file carries the analysis's ``schema_version``, not this one).
HANDOFF_OBSERVED_SCHEMA_VERSION = 1

#: Every field of the analysis, in its order, but ``timeseries``.
_FIELDS: dict[str, Any] = {
    name: (field.annotation, field) for name, field in AnalysisResult.model_fields.items() if name != "timeseries"
}
ObservedAnalysis = create_model(
    "ObservedAnalysis",
    __base__=ResultModel,
    __doc__="The source run's analysis (analyze --json) without its per-second series.",
    **_FIELDS,
)
