"""File names of a plan directory (a run directory's own files are named in ``loadgen.rundir.schema``).

A plan directory holds ``plan.json`` (the plan state), ``region.json`` / ``region.md`` /
``region-<class>.png`` (the capacity region), and one run directory per cell repeat under
``cells/<cell_id>/rep<n>/``, which beside the run's own files holds ``analysis.json`` and, written
last, ``cell_result.json``. Its JSON state files are written atomically (``write_json_atomic``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from loadgen.rundir.schema import MANIFEST_FILE, PLAN_FILE
from loadgen.util.errors import PlanError
from loadgen.util.jsonfile import read_json_object
from loadgen.util.outputfile import write_output_text
from loadgen.util.resultmodel import ResultModel
from loadgen.util.validation import format_validation_error

from .results import REGION_SCHEMA_VERSION, RegionResult
from .state import CellResult, PlanState

__all__ = [
    "ANALYSIS_FILE",
    "PLAN_FILE",
    "REGION_FILE",
    "REGION_HTML_FILE",
    "REGION_MD_FILE",
    "RESULT_FILE",
    "cell_run_manifests",
    "read_cell_result",
    "read_plan_state",
    "read_region",
    "region_plot_file",
    "write_cell_result",
    "write_json_atomic",
    "write_plan_state",
]

#: One run of a cell, judged; its presence marks the run finished (a resume skips it).
RESULT_FILE = "cell_result.json"
#: The analysis of one run of a cell, beside its records.
ANALYSIS_FILE = "analysis.json"
#: The capacity region, as JSON and as Markdown tables.
REGION_FILE = "region.json"
REGION_MD_FILE = "region.md"
#: Interactive latency-throughput curves per class (Plotly, self-contained).
REGION_HTML_FILE = "region.html"


def region_plot_file(cls: str) -> str:
    """The region plot of one class."""
    return f"region-{cls}.png"


def cell_run_manifests(plan_dir: Path) -> list[Path]:
    """The manifest.json of every run of a plan directory's cells (``cells/<cell>/rep<k>[-ext<n>]/``), sorted."""
    return sorted(Path(plan_dir).glob(f"cells/*/rep*/{MANIFEST_FILE}"))


def write_json_atomic(path: Path, data: dict[str, Any]) -> None:
    """Write ``data`` as indented, key-sorted JSON through a temporary file, so a reader never sees half of it."""
    write_output_text(path, json.dumps(data, indent=2, sort_keys=True, default=str) + "\n")


def read_plan_state(path: Path) -> dict[str, Any]:
    """plan.json of an earlier invocation, checked against its model (``PlanState``) before resuming from it: one
    PlanError line (file, field, value, what was expected) if damaged, hand-edited or of another kind."""
    state = read_json_object(path, "the plan state loadgen wrote (or a new --out)", PlanError)
    if state.get("kind") != "loadgen.plan":
        raise PlanError(
            f"{path}: kind = {state.get('kind')!r}: expected a plan state written by loadgen (or a new --out)"
        )
    _check(path, PlanState, state, "a plan state loadgen wrote (or a new --out)")
    return state


def read_cell_result(path: Path) -> dict[str, Any]:
    """A stored cell result, checked against its model (``CellResult``); one PlanError line when it is damaged
    (delete its rep directory to rerun it)."""
    data = read_json_object(path, "a cell result loadgen wrote (delete its directory to rerun the cell)", PlanError)
    _check(path, CellResult, data, f"a cell result loadgen wrote (delete {path.parent} to rerun the cell)")
    return data


def _check(path: Path, model: type[ResultModel], data: dict[str, Any], what: str) -> None:
    try:
        model.model_validate(data)
    except ValidationError as exc:
        raise PlanError(f"{format_validation_error(str(path), exc, model)} ({what})") from None


def write_plan_state(path: Path, state: dict[str, Any]) -> None:
    """Write plan.json through its model: a key ``PlanState`` does not declare, or a wrong type, is a bug."""
    write_json_atomic(path, PlanState.from_document(state).document())


def write_cell_result(path: Path, record: dict[str, Any]) -> None:
    """Write cell_result.json through its model (``CellResult``), as ``write_plan_state``."""
    write_json_atomic(path, CellResult.from_document(record).document())


def read_region(plan_dir: Path) -> dict[str, Any]:
    """region.json of a plan directory, checked against its published model (``RegionResult``); one PlanError
    line when it is damaged or of another region schema version (a region without its classes once judged the
    plan eligible, with no figure)."""
    path = Path(plan_dir) / REGION_FILE
    data = read_json_object(path, "the region loadgen plan wrote", PlanError)
    version = data.get("version")
    if version != REGION_SCHEMA_VERSION:
        raise PlanError(
            f"{path}: version = {version!r}: expected {REGION_SCHEMA_VERSION}, the region schema this loadgen reads "
            "(rerun the plan with it, or compare with the loadgen that wrote it)"
        )
    try:
        RegionResult.model_validate(data)
    except ValidationError as exc:
        raise PlanError(format_validation_error(str(path), exc) + " (the region loadgen plan writes)") from None
    return data
