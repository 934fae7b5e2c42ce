"""File names of a plan directory (a run directory's own files are named in ``loadgen.records``).

A plan directory holds ``plan.json`` (the plan state), ``region.json`` / ``region.md`` /
``region-<class>.png`` (the capacity region), and one run directory per cell repeat under
``cells/<cell_id>/rep<n>/``, which beside the run's own files holds ``analysis.json`` and, written
last, ``cell_result.json``. Its JSON state files are written atomically (``write_json_atomic``).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

__all__ = [
    "ANALYSIS_FILE",
    "PLAN_FILE",
    "REGION_FILE",
    "REGION_MD_FILE",
    "RESULT_FILE",
    "region_plot_file",
    "write_json_atomic",
]

#: The plan state: the plan, its target, invocations, walk lines and cells.
PLAN_FILE = "plan.json"
#: One run of a cell, judged; its presence marks the run finished (a resume skips it).
RESULT_FILE = "cell_result.json"
#: The analysis of one run of a cell, beside its records.
ANALYSIS_FILE = "analysis.json"
#: The capacity region, as JSON and as Markdown tables.
REGION_FILE = "region.json"
REGION_MD_FILE = "region.md"


def region_plot_file(cls: str) -> str:
    """The region plot of one class."""
    return f"region-{cls}.png"


def write_json_atomic(path: Path, data: dict[str, Any]) -> None:
    """Write ``data`` as indented, key-sorted JSON through a temporary file, so a reader never sees half of it."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True, default=str) + "\n")
    os.replace(tmp, path)
