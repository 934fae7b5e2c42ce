"""How much of a plan on a profiled engine was priced past its profile's measured points: its runs' ``profile_grid``
engine notes (``loadgen.sim.profile_grid``), merged over every run of every cell (and every replica count)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from loadgen.rundir.manifest import read_manifest
from loadgen.rundir.schema import MANIFEST_FILE
from loadgen.sim.profile_grid import GridCoverage
from loadgen.util.errors import RunDirError

__all__ = ["plan_profile_grid"]


def plan_profile_grid(plan_dir: Path | str) -> tuple[int, dict[str, Any] | None]:
    """(runs read, their merged ``profile_grid`` note); None when no run priced a step from a profile."""
    notes = []
    paths = sorted(Path(plan_dir).glob(f"cells/*/rep*/{MANIFEST_FILE}"))
    paths += sorted(Path(plan_dir).glob(f"replicas-*/cells/*/rep*/{MANIFEST_FILE}"))
    for path in paths:
        try:
            note = read_manifest(path.parent).engine_notes.get("profile_grid")
        except RunDirError:
            continue  # a damaged run is the region's to report, not this line's
        if note:
            notes.append(note)
    return len(notes), (GridCoverage.merge(notes) if notes else None)
