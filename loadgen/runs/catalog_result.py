"""The run catalog's rows (``loadgen runs list --json``, ``loadgen runs show RUN --json``) as typed results.

``CatalogRun`` is one row of the ``runs`` table (``catalog.RUN_COLUMNS`` plus the live ``current``) and
``CatalogClass`` one row of ``classes`` (``headline.HEADLINE_COLUMNS``). ``runs list --json`` prints a JSON
array of rows (``RunList``: it carries no version field, its schema's ``$id`` states it, as the array it has
always been); ``runs show --json`` prints ``RunShow`` with ``kind`` and ``version``. The CLI builds both through
these models, so a column the models do not name fails before anything is printed.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, RootModel, ValidationError

from loadgen.util.errors import RunDirError
from loadgen.util.resultmodel import Number, ResultModel

__all__ = [
    "RUN_LIST_SCHEMA_VERSION",
    "RUN_SHOW_SCHEMA_VERSION",
    "CatalogClass",
    "CatalogRun",
    "RunList",
    "RunShow",
    "run_list",
    "run_show",
]

#: The schema version of ``runs list --json`` (the array has no version field; its schema's ``$id`` gives it).
RUN_LIST_SCHEMA_VERSION = 1
#: The ``runs show --json`` document's ``version``.
RUN_SHOW_SCHEMA_VERSION = 1


class CatalogRun(ResultModel):
    """One catalogued run or plan directory: its identity, state and where it came from (null: not known, or
    not of its kind: plan_name, cells and region belong to plans)."""

    path: str = Field(description="the directory's absolute path")
    kind: Literal["run", "plan"]
    present: bool | None = Field(description="the directory is on disk now")
    signature: str | None
    indexed_utc: str | None
    state: str | None = Field(description="complete, interrupted, failed, killed, running ...")
    run_kind: str | None = Field(description="measured, simulated or imported (runs)")
    started_utc: str | None
    loadgen_version: str | None
    python: str | None
    packages: str | None = Field(description="JSON object: package name -> version")
    target_kind: str | None
    engine: str | None
    engine_version: str | None
    model: str | None
    gpu: str | None
    cpu_model: str | None
    scenario_name: str | None
    scenario_sha256: str | None
    trace_name: str | None
    trace_sha256: str | None
    trace_seed: int | None = Field(description="the trace generator's seed")
    settings_sha256: str | None
    requests_recorded: int | None = Field(description="requests the run recorded")
    plan_cell: str | None = Field(description="JSON: the plan cell of a run inside a plan")
    plan_name: str | None
    cells: int | None = Field(description="plans: cells recorded in plan.json")
    region: str | None = Field(description="plans: region.json's summary line")
    problem: str | None = Field(description="why the directory could not be read (it stays listed)")
    current: bool | None = Field(description="its files are as indexed, by this catalog's version")


class CatalogClass(ResultModel):
    """One class of one run (``overall``: every class): analyze's headline figures over its default window;
    ``scheduled``, ``ok`` and ``failed`` count requests."""

    path: str
    request_class: str
    scheduled: int
    ok: int
    failed: int
    ttft_p50_ms: Number | None
    ttft_p99_ms: Number | None
    tpot_p50_ms: Number | None
    tpot_p99_ms: Number | None
    e2e_p50_ms: Number | None
    e2e_p99_ms: Number | None
    completed_rps: Number | None = Field(description="ok requests done in the window per second of it")


class RunList(RootModel[list[CatalogRun]]):
    """The catalogued runs matching ``--where``, newest first."""

    def document(self) -> list[dict[str, Any]]:
        """The JSON array, every row's keys in column order."""
        return [row.document() for row in self.root]


class RunShow(ResultModel):
    """One catalogued run and its headline figures per class."""

    kind: Literal["loadgen.catalog_run"]
    version: int = Field(description=f"the schema version ({RUN_SHOW_SCHEMA_VERSION})")
    run: CatalogRun
    classes: list[CatalogClass]


def run_list(rows: list[dict[str, Any]], catalog: Path) -> RunList:
    """``runs list --json``: ``rows`` as the published array; a catalog whose columns are not the published ones
    (written by another loadgen) is one line naming it."""
    try:
        return RunList.model_validate(json.loads(json.dumps(rows, default=str)))
    except ValidationError as exc:
        raise _not_published(catalog, exc) from None


def run_show(row: dict[str, Any], classes: list[dict[str, Any]], catalog: Path) -> RunShow:
    """``runs show --json``: one row and its classes as the published document (see ``run_list``)."""
    head = {"kind": "loadgen.catalog_run", "version": RUN_SHOW_SCHEMA_VERSION}
    try:
        return RunShow.from_document(head | {"run": row, "classes": classes})
    except ValidationError as exc:
        raise _not_published(catalog, exc) from None


def _not_published(catalog: Path, exc: ValidationError) -> RunDirError:
    first = exc.errors()[0]
    where = ".".join(str(p) for p in first["loc"])
    return RunDirError(
        f"{catalog}: {where}: {first['msg']}: expected a catalog with the published columns (loadgen schema "
        "runs-list); index into a new catalog file, or delete this one and index again"
    )
