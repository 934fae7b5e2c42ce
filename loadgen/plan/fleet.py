"""Fleet sizing: the smallest replica count whose region holds each rate step.

A plan with ``[fleet] replicas = [1, 2, 4]`` is walked once per replica count on the simulated engine's
worksheet (each walk in ``replicas-N/``, a whole plan directory: resumable, with its own region). This
module reads those regions: for each class, state, client concurrency and rate step, the smallest replica
count whose boundary (its highest inside rate step) is at or above the step, i.e. the fewest engines
meeting every hard budget there. A step no count reaches says so ("none of 1, 2, 4").
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from loadgen.util.outputfile import write_output_text

from .files import write_json_atomic
from .results import FLEET_SCHEMA_VERSION, FleetResult

__all__ = ["FLEET_FILE", "FLEET_MD", "build_fleet", "format_fleet", "write_fleet"]

FLEET_FILE = "fleet.json"
FLEET_MD = "fleet.md"


def _max_inside(region: dict[str, Any], cls: str, state: str, concurrency: int) -> int | None:
    rows = region["classes"].get(cls, {}).get(state, {}).get("boundary", [])
    return next((b["max_inside_rate_index"] for b in rows if b["concurrency"] == concurrency), None)


def _reaches(max_inside: int | None, step_index: int) -> bool:
    """Whether a region whose highest inside rate step is ``max_inside`` (None: none inside) holds ``step_index``
    (step 0 inside counts: 0 is an index, not an absence)."""
    return max_inside is not None and max_inside >= step_index


def build_fleet(regions: dict[int, dict[str, Any]], route_policy: str) -> dict[str, Any]:
    """The fleet section from the region of each replica count (``regions``: count → region)."""
    counts = sorted(regions)
    first = regions[counts[0]]
    steps = first["rate_steps"]
    lines = []
    for cls, per_state in first["classes"].items():
        for state in per_state:
            for conc in first["concurrency"]:
                inside = {n: _max_inside(regions[n], cls, state, conc) for n in counts}
                smallest = [next((n for n in counts if _reaches(inside[n], i)), None) for i in range(len(steps))]
                lines.append(
                    {
                        "class": cls,
                        "state": state,
                        "concurrency": conc,
                        "max_inside_rate_index": {str(n): inside[n] for n in counts},
                        "smallest_replicas": smallest,
                    }
                )
    return {
        "kind": "loadgen.fleet",
        "version": FLEET_SCHEMA_VERSION,
        "plan": first["plan"],
        "route_policy": route_policy,
        "replicas": counts,
        "rate_kind": first["rate_kind"],
        "rate_steps": steps,
        "status": "complete" if all(r.get("status") == "complete" for r in regions.values()) else "incomplete",
        "cells_used": {str(n): regions[n].get("cells_used") for n in counts},
        "runs_used": {str(n): regions[n].get("runs_used") for n in counts},
        "lines": lines,
        "rule": "the smallest replica count whose region's highest inside rate step (every hard budget met "
        "conclusively, no stop fired) is at or above the step; each count was walked as its own plan "
        "(replicas-N/) on the worksheet: N simulated engines behind the routing policy, in virtual time (an "
        "expert-parallel engine's N are N / ep servers of ep data-parallel ranks stepping in lockstep, each server's "
        "own balancer picking the rank)",
    }


def format_fleet(fleet: dict[str, Any]) -> str:
    """Markdown: per line, the rate steps and the smallest replica count at each."""
    unit = "×" if fleet["rate_kind"] == "scale" else " rps"
    counts = ", ".join(str(n) for n in fleet["replicas"])
    out = [
        f"# Fleet sizing: plan {fleet['plan']} ({fleet['status']}), replicas {counts}, {fleet['route_policy']}",
        "",
        f"Rule: {fleet['rule']}.",
        "",
        "Cells used per replica count: " + ", ".join(f"{n}: {c}" for n, c in fleet["cells_used"].items()) + ".",
        "",
    ]
    steps = fleet["rate_steps"]
    for line in fleet["lines"]:
        out += [
            f"## {line['class']} / {line['state']} / concurrency {line['concurrency']}",
            "",
            "| rate step | smallest replica count |",
            "|---|---|",
        ]
        for step, n in zip(steps, line["smallest_replicas"], strict=True):
            out.append(f"| {step:g}{unit} | {n if n is not None else f'none of {counts}'} |")
        out.append("")
    return "\n".join(out)


def write_fleet(plan_dir: Path, fleet: dict[str, Any]) -> dict[str, Path]:
    """``fleet.json`` and ``fleet.md`` in the plan directory."""
    plan_dir = Path(plan_dir)
    write_json_atomic(plan_dir / FLEET_FILE, FleetResult.from_document(fleet).document())  # the published schema
    write_output_text(plan_dir / FLEET_MD, format_fleet(fleet) + "\n")
    return {"json": plan_dir / FLEET_FILE, "md": plan_dir / FLEET_MD}
