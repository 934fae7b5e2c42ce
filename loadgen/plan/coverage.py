"""How much of a plan on a profiled engine was priced past its profile's measured points: its runs' ``profile_grid``
engine notes (``loadgen.sim.profile_grid``), merged over every run of every cell (and every replica count)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from loadgen.rundir.manifest import read_manifest
from loadgen.sim.profile_grid import GridCoverage
from loadgen.util.errors import RunDirError

from .files import cell_run_manifests

__all__ = ["plan_profile_grid"]


def plan_profile_grid(plan_dir: Path | str) -> tuple[int, dict[str, Any] | None]:
    """(runs read, their merged ``profile_grid`` note); None when no run priced a step from a profile."""
    notes = []
    plans = [Path(plan_dir), *sorted(Path(plan_dir).glob("replicas-*"))]  # a fleet plan: one per replica count
    for path in (manifest for plan in plans for manifest in cell_run_manifests(plan)):
        try:
            grid = read_manifest(path.parent).engine_notes.profile_grid
        except RunDirError:
            continue  # a damaged run is the region's to report, not this line's
        if grid is not None:
            notes.append(grid.model_dump(mode="json"))
    return len(notes), (GridCoverage.merge(notes) if notes else None)
