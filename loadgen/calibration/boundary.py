"""The plan-boundary check: does the worksheet on an engine TOML put a plan's capacity boundary where the real
engine has it?

The same plan (classes, warm states, concurrency lines, rate steps, budgets, repeats) runs twice: against
the real engine, and on the worksheet with the engine TOML (the engine's own scheduler limits applied). For
every line (class × state × concurrency) both regions give the highest rate step that repeatedly met every
budget (``max_inside_rate_index``; -1 when not even the first step did). The check is how many rate steps
apart the two are; the issue's criterion is at most one.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from loadgen.workload.presets import resolve

from ..plan import load_plan, run_plan
from ..sim.config import EngineConfig
from ..targets import Target
from ..targets.sim import WorksheetTarget

__all__ = ["MAX_STEPS_APART", "boundary_lines", "compare_boundaries", "plan_boundary_check", "boundary_line"]

#: The criterion: the predicted boundary is at most this many rate steps from the measured one.
MAX_STEPS_APART = 1


def boundary_lines(region: dict[str, Any]) -> dict[tuple[str, str, int], dict[str, Any]]:
    """(class, state, concurrency) → that line's boundary entry of a plan's region.json."""
    out = {}
    for cls, states in (region.get("classes") or {}).items():
        for state, entry in states.items():
            for b in entry.get("boundary") or []:
                out[(cls, state, int(b["concurrency"]))] = b
    return out


def _index(b: dict[str, Any]) -> int:
    i = b.get("max_inside_rate_index")
    return -1 if i is None else int(i)


def compare_boundaries(measured: dict[str, Any], predicted: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per line both regions have: the measured and predicted boundary and how many steps apart."""
    m, p = boundary_lines(measured), boundary_lines(predicted)
    rows = []
    for key in sorted(set(m) & set(p)):
        mb, pb = m[key], p[key]
        apart = abs(_index(mb) - _index(pb))
        rows.append(
            {
                "request_class": key[0],
                "state": key[1],
                "concurrency": key[2],
                "measured_index": _index(mb),
                "measured_rate_step": mb.get("max_inside_rate_step"),
                "measured_limiting": mb.get("limiting"),
                "measured_line_status": mb.get("line_status"),
                "predicted_index": _index(pb),
                "predicted_rate_step": pb.get("max_inside_rate_step"),
                "predicted_limiting": pb.get("limiting"),
                "steps_apart": apart,
                "within": apart <= MAX_STEPS_APART,
            }
        )
    return rows


def plan_boundary_check(
    plan: str | Path,
    target: Target,
    cfg: EngineConfig,
    out_dir: Path,
    *,
    log: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Run ``plan`` against ``target`` and on the worksheet with ``cfg``; compare their boundaries line by line.

    Rerunning with the same ``out_dir`` resumes both plans (``loadgen plan`` semantics)."""
    path = resolve("plans", plan) or Path(plan)
    spec = load_plan(path)
    measured = run_plan(spec, target, out_dir / "plan-measured", log=log)
    predicted = run_plan(spec, WorksheetTarget(cfg), out_dir / "plan-worksheet")
    rows = compare_boundaries(measured.region, predicted.region)
    return {
        "plan": str(path),
        "rate_steps": measured.region.get("rate_steps"),
        "measured_dir": str(measured.plan_dir),
        "worksheet_dir": str(predicted.plan_dir),
        "measured_status": measured.state.get("status"),
        "lines": rows,
        "max_steps_apart": max((r["steps_apart"] for r in rows), default=None),
        "criterion_steps": MAX_STEPS_APART,
        "all_within": bool(rows) and all(r["within"] for r in rows),
    }


def _step(rate: Any, index: int) -> str:
    return "none inside" if index < 0 else f"{rate:g} (step {index})"


def boundary_line(check: dict[str, Any]) -> list[str]:
    """The check for the console: one line per plan line, then the verdict."""
    lines = [f"plan boundary ({Path(check['plan']).name}): highest rate step inside, measured vs worksheet"]
    for r in check["lines"]:
        lines.append(
            f"  {r['request_class']} {r['state']} concurrency {r['concurrency']}: measured "
            f"{_step(r['measured_rate_step'], r['measured_index'])}, worksheet "
            f"{_step(r['predicted_rate_step'], r['predicted_index'])}: {r['steps_apart']} step(s) apart"
            f" {'ok' if r['within'] else 'MISS'}"
        )
    verdict = "within" if check["all_within"] else "NOT within"
    lines.append(f"  {verdict} {check['criterion_steps']} rate step on every line (worst {check['max_steps_apart']})")
    return lines
