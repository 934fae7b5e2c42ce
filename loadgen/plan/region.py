"""The capacity region of a plan: per class and state, which (rate × concurrency) cells are inside.

A cell is inside only if it ran and every one of its runs satisfied every hard budget and no stop
condition fired (the boundary cells ran ``repeats`` times; across repeats the p99 had to converge).
Each outside cell carries its limiting constraint: the first failed check as (class, metric,
percentile, observed, limit, n) or the stop that ended the direction. Written as ``region.json``,
``region.md`` (tables) and ``region-<class>.png`` (a plot of rate × concurrency with pass/fail cells).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loadgen.util.outputfile import write_output_text

from ..trace.io import read_trace
from .curves import write_curves
from .files import REGION_FILE, REGION_MD_FILE, RESULT_FILE, read_cell_result, read_region, region_plot_file
from .results import REGION_SCHEMA_VERSION, RegionResult

__all__ = ["build_region", "format_region", "load_region", "plot_region", "write_region"]

INSIDE, OUTSIDE, STOPPED, NOT_RUN, NOT_ACHIEVABLE = "inside", "outside", "stopped", "not_run", "not_achievable"
#: A cell whose hard checks stayed inconclusive (95% interval straddling a limit) when its request budget ran out.
INCONCLUSIVE = "inconclusive"


def _mean(values: list[Any]) -> float | None:
    vals = [float(v) for v in values if isinstance(v, (int, float)) and math.isfinite(float(v))]
    return sum(vals) / len(vals) if vals else None


def _limiting(runs: list[dict[str, Any]], extra_stops: list[dict[str, Any]], judged_class: str | None) -> str | None:
    for run in runs:
        for stop in run.get("stops", []):
            return f"stop {stop['kind']}: {stop['detail']}"
    for stop in extra_stops:
        return f"stop {stop['kind']}: {stop['detail']}"
    for run in runs:
        failed = run.get("failed", [])
        if judged_class is not None:
            failed = run.get("per_class_failed", {}).get(judged_class, [])
        if failed:
            worst = failed[0]
            return worst["reason"]
    for run in runs:
        unsure = run.get("inconclusive") or []
        if judged_class is not None:
            unsure = (run.get("per_class_inconclusive") or {}).get(judged_class, [])
        if unsure:
            note = run.get("extension_note")
            return f"inconclusive after {run.get('requests_sent')} requests: {unsure[0]['reason']}" + (
                f" ({note})" if note else ""
            )
    return None


def _cell_status(runs: list[dict[str, Any]], extra_stops: list[dict[str, Any]], judged_class: str | None) -> str:
    if not runs:
        return NOT_RUN
    if any(r.get("skipped") for r in runs):
        return NOT_ACHIEVABLE
    if extra_stops or any(r.get("stops") for r in runs):
        return STOPPED
    for run in runs:
        failed = (
            run.get("failed", []) if judged_class is None else run.get("per_class_failed", {}).get(judged_class, [])
        )
        if failed:
            return OUTSIDE
    for run in runs:
        unsure = (
            (run.get("inconclusive") or [])
            if judged_class is None
            else (run.get("per_class_inconclusive") or {}).get(judged_class, [])
        )
        if unsure:
            return INCONCLUSIVE
    return INSIDE


@dataclass
class _Recorded:
    """What a plan directory holds for the region: results per cell, cross-repeat stops, offered rates, line notes."""

    results: dict[str, list[dict[str, Any]]]
    extra_stops: dict[str, list[dict[str, Any]]]
    offered: dict[str, float | None]
    line_notes: dict[tuple[str, str, int], dict[str, Any]]
    lines: list[dict[str, Any]]


def _results_by_cell(plan_dir: Path) -> dict[str, list[dict[str, Any]]]:
    """Every ``cell_result.json`` on disk, per cell, in repeat order."""
    results: dict[str, list[dict[str, Any]]] = {}
    for marker in sorted((plan_dir / "cells").glob(f"*/rep*/{RESULT_FILE}")):
        data = read_cell_result(marker)
        results.setdefault(data["cell_id"], []).append(data)
    for runs in results.values():
        runs.sort(key=lambda d: d["repeat"])
    return results


def _offered_by_cell(plan_dir: Path) -> dict[str, float | None]:
    """The offered rate each cell's trace was generated for (a cell that never ran may still have its trace)."""
    offered: dict[str, float | None] = {}
    for trace in sorted((plan_dir / "traces").glob("*.parquet")):
        if trace.name.endswith(".warmup.parquet"):
            continue
        try:
            _, meta = read_trace(trace)
            offered[trace.stem] = meta.get("offered_rate_rps")
        except Exception:
            continue
    return offered


def _cell_entry(cell_id: str, cls: str, conc: int, i: int, step: float, rec: _Recorded) -> dict[str, Any]:
    """One cell of the region: its status, limiting constraint, repeats and mean figures over its runs."""
    runs = rec.results.get(cell_id, [])
    stops = rec.extra_stops.get(cell_id, [])
    status = _cell_status(runs, stops, None)
    limiting = _limiting(runs, stops, None) if status in (OUTSIDE, STOPPED, INCONCLUSIVE) else None
    figures = [r.get("figures") or {} for r in runs]
    per_class = {}
    if cls == "mixed" and runs:
        names = sorted({n for r in runs for n in (r.get("figures") or {}).get("classes", {})})
        for name in names:
            per_class[name] = {"status": _cell_status(runs, stops, name), "limiting": _limiting(runs, stops, name)}
    return {
        "cell_id": cell_id,
        "concurrency": conc,
        "rate_index": i,
        "rate_step": step,
        "status": status,
        "limiting": limiting,
        "repeats": len(runs),
        "passes": sum(
            1
            for r in runs
            if not r.get("failed") and not r.get("stops") and not r.get("skipped") and not r.get("inconclusive")
        ),
        "requests_sent": sum(int(r.get("requests_sent") or 0) for r in runs),
        "extensions": sum(len(r.get("extensions") or []) for r in runs),
        "offered_rps": _mean([f.get("offered_rps") for f in figures]) or rec.offered.get(cell_id),
        "send_rps": _mean([f.get("send_rps") for f in figures]),
        "completed_rps": _mean([f.get("completed_rps") for f in figures]),
        "output_tok_s": _mean([f.get("output_tok_s") for f in figures]),
        "goodput_rps": _mean([f.get("goodput_rps") for f in figures]),
        "send_lag_p99_ms": max([f.get("send_lag_p99_ms") or 0.0 for f in figures], default=None),
        "ttft_p99_ms": {
            name: [(f.get("classes", {}).get(name) or {}).get("ttft_p99_ms") for f in figures]
            for name in sorted({n for f in figures for n in f.get("classes", {})})
        },
        "warm_state": [r.get("warm_state") for r in runs][:1],
        "skip_reason": next((r.get("skip_reason") for r in runs if r.get("skipped")), None),
        "run_dirs": [r["run_dir"] for r in runs],
        "per_class": per_class,
    }


#: The limiting text of a line whose search the plan stopped before finishing (paused, budget spent).
_UNFINISHED = (
    "search not finished (the plan stopped before this line's boundary was found and repeated; rerun to resume): "
    "the highest step passed so far is a lower bound, not the boundary"
)


def _boundary_row(
    conc: int, row: list[dict[str, Any]], steps: list[float], note: dict[str, Any], fewest: dict[int, int | None]
) -> dict[str, Any]:
    """The boundary of one concurrency row: its highest inside step, and the first outside step above it
    with the constraint that limits it (or why the line did not run). ``fewest``: a concurrency search's answer per
    rate step (the fewest client slots meeting every hard budget, None: no step did); the row holds every rate
    step whose answer is at most its concurrency, as that search assumes more slots never hurt."""
    measured = [c["rate_index"] for c in row if c["status"] == INSIDE]
    implied = [i for i, slots in fewest.items() if slots is not None and slots <= conc]
    row_inside = max(measured + implied, default=None)
    above = (lambda i: True) if row_inside is None else (lambda i: i > row_inside)
    limit_cell = next(
        (c for c in row if c["status"] in (OUTSIDE, STOPPED, INCONCLUSIVE) and above(c["rate_index"])), None
    )
    row_limit = limit_cell["limiting"] if limit_cell else None
    row_limit_index = limit_cell["rate_index"] if limit_cell else None
    if limit_cell is None:
        j = next((i for i in sorted(fewest) if above(i) and i not in implied), None)
        if j is not None:
            slots = fewest[j]
            row_limit_index = j
            row_limit = f"rate step {steps[j]:g}: " + (
                f"the fewest client slots meeting every hard budget there is {slots}"
                if slots is not None
                else "no concurrency step met every hard budget there"
            )
    inside_cell = next((c for c in row if c["rate_index"] == row_inside), None)
    unfinished = not note and any(c["repeats"] for c in row)  # cells ran, but the walk never finished the line
    return {
        "concurrency": conc,
        "max_inside_rate_index": row_inside,
        "max_inside_rate_step": steps[row_inside] if row_inside is not None else None,
        "max_inside_offered_rps": inside_cell["offered_rps"] if inside_cell else None,
        "max_inside_completed_rps": inside_cell["completed_rps"] if inside_cell else None,
        "max_inside_output_tok_s": inside_cell["output_tok_s"] if inside_cell else None,
        "first_outside_rate_index": row_limit_index,
        "limiting": row_limit
        or (note.get("reason") if note.get("status") in ("not_run", "not_achievable") else None)
        or (_UNFINISHED if unfinished else None)
        or ("every rate step inside (no limit reached within the plan)" if row_inside == len(steps) - 1 else None),
        "line_status": "unfinished" if unfinished else note.get("status"),
    }


def _state_region(cls: str, st: str, concurrency: list[int], steps: list[float], rec: _Recorded) -> dict[str, Any]:
    """The cells (every concurrency × rate step) and the boundary per concurrency of one class and state."""
    cells: list[dict[str, Any]] = []
    boundary: list[dict[str, Any]] = []
    for conc in concurrency:
        row = [_cell_entry(f"{cls}.{st}.c{conc}.r{i}", cls, conc, i, step, rec) for i, step in enumerate(steps)]
        cells.extend(row)
        fewest = {
            int(ln["rate_index"]): ln.get("last_pass_concurrency")
            for ln in rec.lines
            if ln.get("dimension") == "concurrency"
            and ln["class"] == cls
            and ln["state"] == st
            and ln.get("status") == "done"
        }
        boundary.append(_boundary_row(conc, row, steps, rec.line_notes.get((cls, st, conc), {}), fewest))
    return {"cells": cells, "boundary": boundary}


def _line_notes(lines: list[dict[str, Any]], concurrency: list[int]) -> dict[tuple[str, str, int], dict[str, Any]]:
    """The walk's line entries per (class, state, concurrency) row. A rate line is one row; a concurrency line
    (``search.dimension = "concurrency"``, one per rate step) speaks for every row of its class and state, one
    that did not run or was not achievable first (its reason is the row's)."""
    notes = {(ln["class"], ln["state"], ln["concurrency"]): ln for ln in lines if "concurrency" in ln}
    across = [ln for ln in lines if "concurrency" not in ln]
    across.sort(key=lambda ln: ln.get("status") not in ("not_run", "not_achievable"))
    for ln in across:
        for conc in concurrency:
            notes.setdefault((ln["class"], ln["state"], conc), ln)
    return notes


def build_region(plan_dir: Path, state: dict[str, Any]) -> dict[str, Any]:
    """Assemble the region from ``plan.json`` state and every ``cell_result.json`` on disk."""
    plan_dir = Path(plan_dir)
    plan = state["plan"]
    steps = state.get("rate_steps") or plan.get("rate_scales") or plan.get("rates_rps") or []
    rate_kind = "scale" if plan.get("rate_scales") else "rps"
    rec = _Recorded(
        results=_results_by_cell(plan_dir),
        extra_stops={cid: c.get("extra_stops", []) for cid, c in (state.get("cells") or {}).items()},
        offered=_offered_by_cell(plan_dir),
        line_notes=_line_notes(state.get("lines", []), plan["concurrency"]),
        lines=state.get("lines", []),
    )
    classes = {
        cls: {st: _state_region(cls, st, plan["concurrency"], steps, rec) for st in plan["states"]}
        for cls in plan["classes"]
    }
    return {
        "kind": "loadgen.region",
        "version": REGION_SCHEMA_VERSION,
        "plan": plan["name"],
        "plan_sha256": state.get("plan_sha256"),
        "status": state.get("status"),
        "ended": state.get("ended"),
        "target": state.get("target"),
        "scenario": state.get("scenario"),
        "rate_kind": rate_kind,
        "rate_steps": steps,
        "concurrency": plan["concurrency"],
        "repeats": plan["repeats"],
        "budget": state.get("budget"),
        "start": state.get("start"),
        "ledger": state.get("ledger"),
        "search": plan.get("search") or {"mode": "grid", "dimension": "rate", "precision": None},
        "cells_used": len(rec.results),
        "runs_used": sum(len(v) for v in rec.results.values()),
        "probes": state.get("probes") or [],
        "classes": classes,
        "rule": "a cell is inside only if every run of it satisfied every hard budget conclusively (95% interval within "
        "the limit) and no stop condition fired; an inconclusive run was extended (more requests) until conclusive "
        "or its budget was spent; boundary cells ran `repeats` times and their p99 TTFT had to converge",
    }


_MARK = {INSIDE: "✓", OUTSIDE: "✗", STOPPED: "■", INCONCLUSIVE: "?", NOT_RUN: "·", NOT_ACHIEVABLE: "n/a"}


def _fmt(value: Any, digits: int = 2) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def _grid_table(region: dict[str, Any], data: dict[str, Any], steps: list[float], unit: str) -> list[str]:
    """The pass/fail grid (concurrency × rate step); a searched ladder shows only the rate steps some cell used."""
    shown = list(range(len(steps)))
    if (region.get("search") or {}).get("mode") == "bisect":
        shown = sorted({c["rate_index"] for c in data["cells"] if c["repeats"]}) or shown
    out = [
        "| concurrency | " + " | ".join(f"{steps[i]:g}{unit}" for i in shown) + " |",
        "|" + "---|" * (len(shown) + 1),
    ]
    for conc in region["concurrency"]:
        row = {c["rate_index"]: c for c in data["cells"] if c["concurrency"] == conc}
        marks = []
        for i in shown:
            c = row[i]
            mark = _MARK[c["status"]]
            if c["repeats"] and c["status"] != NOT_ACHIEVABLE:
                mark += f" {c['passes']}/{c['repeats']}"
            marks.append(mark)
        out.append(f"| {conc} | " + " | ".join(marks) + " |")
    return out


def _search_section(region: dict[str, Any]) -> list[str]:
    """How the boundary was searched, how many cells and runs it used, and every run in order with why."""
    search = region.get("search") or {}
    out = [
        "## Cells used, and why",
        "",
        (
            f"Search: {search.get('mode', 'grid')} along {search.get('dimension', 'rate')}"
            + (
                f", precision {search['precision']:g} (rate ladder of {len(region['rate_steps'])} steps)"
                if search.get("precision")
                else ""
            )
            + f"; {region.get('cells_used', 0)} cells, {region.get('runs_used', 0)} runs."
        ),
        "",
    ]
    probes = region.get("probes") or []
    if probes:
        out += ["| # | cell | repeat | result | why |", "|---|---|---|---|---|"]
        out += [
            f"| {k} | {p['cell_id']} | {p['repeat']} | {p.get('result', '–')} | {p['why']} |"
            for k, p in enumerate(probes, 1)
        ]
    return out + [""]


def format_region(region: dict[str, Any]) -> str:
    """Markdown tables: the grid per class/state, the boundary with its limit, offered vs completed."""
    steps = region["rate_steps"]
    unit = "×" if region["rate_kind"] == "scale" else " rps"
    out = [f"# Capacity region: plan {region['plan']} ({region['status']})", ""]
    if region.get("ended") and region["ended"] != "complete":
        out += [f"Plan ended early: {region['ended']}", ""]
    budget = region.get("budget") or {}
    if budget:
        out += [
            (
                f"Budget consumed: {_fmt(budget.get('consumed_time_s'), 1)} s of {_fmt(budget.get('time_s'), 0)} s, "
                f"{budget.get('consumed_requests')} of {budget.get('requests')} requests."
            ),
            "",
        ]
    if (region.get("start") or {}).get("note"):
        out += [f"Start: {region['start']['note']}", ""]
    if (region.get("ledger") or {}).get("note"):
        out += [f"Ledger: {region['ledger']['note']}", ""]
    out += [
        f"Rule: {region['rule']}.",
        "",
        (
            "Marks: ✓ inside (passes/runs), ✗ outside (budget), ■ stopped (declared limit), "
            "? inconclusive (budget spent), · not run, n/a state not achievable."
        ),
        "",
    ]
    for cls, per_state in region["classes"].items():
        for st, data in per_state.items():
            out += [f"## {cls} / {st}", ""]
            out += _grid_table(region, data, steps, unit)
            out += [
                "",
                "| concurrency | max inside step | offered rps | completed rps | output tok/s | limiting constraint |",
                "|---|---|---|---|---|---|",
            ]
            for b in data["boundary"]:
                step = f"{b['max_inside_rate_step']:g}{unit}" if b["max_inside_rate_step"] is not None else "none"
                out.append(
                    f"| {b['concurrency']} | {step} | {_fmt(b['max_inside_offered_rps'])} | "
                    f"{_fmt(b['max_inside_completed_rps'])} | {_fmt(b['max_inside_output_tok_s'], 1)} | {b['limiting'] or '–'} |"
                )
            ran = [c for c in data["cells"] if c["repeats"] and c["status"] != NOT_ACHIEVABLE]
            if ran:
                out += [
                    "",
                    "| cell | runs | extensions | requests | offered rps | sent rps | completed rps | output tok/s | "
                    "send-lag p99 ms | status |",
                    "|---|---|---|---|---|---|---|---|---|---|",
                ]
                for c in ran:
                    out.append(
                        f"| {c['cell_id']} | {c['repeats']} | {c.get('extensions', 0)} | {c.get('requests_sent', '–')} | "
                        f"{_fmt(c['offered_rps'])} | {_fmt(c['send_rps'])} | "
                        f"{_fmt(c['completed_rps'])} | {_fmt(c['output_tok_s'], 1)} | {_fmt(c['send_lag_p99_ms'], 3)} | {c['status']} |"
                    )
            skipped = [c for c in data["cells"] if c["status"] == NOT_ACHIEVABLE]
            if skipped:
                out += ["", f"Not achievable ({len(skipped)} cells): {skipped[0]['skip_reason']}"]
            out.append("")
    return "\n".join(out + _search_section(region))


def plot_region(region: dict[str, Any], cls: str, path: Path) -> Path:
    """PNG: rate step (x) × concurrency (y) per state, pass/fail marks, the limiting constraint annotated."""
    import matplotlib  # heavy: deferred on purpose until a plot is drawn (and Agg set before pyplot loads)

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # deferred: heavy dependency, loaded only when used

    per_state = region["classes"][cls]
    steps = region["rate_steps"]
    concs = region["concurrency"]
    unit = "×" if region["rate_kind"] == "scale" else " rps"
    fig, axes = plt.subplots(1, len(per_state), figsize=(6.5 * len(per_state), 1.6 + 0.9 * len(concs)), squeeze=False)
    style = {
        INSIDE: ("o", "#2a9d3a"),
        OUTSIDE: ("X", "#d62828"),
        STOPPED: ("s", "#f08c00"),
        INCONCLUSIVE: ("d", "#e9c46a"),
        NOT_RUN: (".", "#aaaaaa"),
        NOT_ACHIEVABLE: ("x", "#777777"),
    }
    for ax, (st, data) in zip(axes[0], per_state.items()):
        for c in data["cells"]:
            marker, color = style[c["status"]]
            ax.scatter(
                c["rate_index"],
                concs.index(c["concurrency"]),
                marker=marker,
                s=160 if c["status"] != NOT_RUN else 40,
                color=color,
                zorder=3,
            )
            if c["repeats"] and c["status"] != NOT_ACHIEVABLE:
                ax.annotate(
                    f"{c['passes']}/{c['repeats']}",
                    (c["rate_index"], concs.index(c["concurrency"])),
                    textcoords="offset points",
                    xytext=(0, 10),
                    ha="center",
                    fontsize=7,
                )
        for b in data["boundary"]:
            if b["first_outside_rate_index"] is not None and b["limiting"]:
                text = b["limiting"]
                text = text if len(text) <= 60 else text[:57] + "…"
                ax.annotate(
                    text,
                    (b["first_outside_rate_index"], concs.index(b["concurrency"])),
                    textcoords="offset points",
                    xytext=(0, -16),
                    ha="center",
                    fontsize=6,
                    color="#7a1010",
                )
        labels = []
        for i, s in enumerate(steps):
            offered = next((c["offered_rps"] for c in data["cells"] if c["rate_index"] == i and c["offered_rps"]), None)
            labels.append(f"{s:g}{unit}" + (f"\n{offered:.2f} rps" if offered is not None and unit != " rps" else ""))
        ax.set_xticks(range(len(steps)), labels, fontsize=8)
        ax.set_yticks(range(len(concs)), [str(c) for c in concs])
        ax.set_xlim(-0.6, len(steps) - 0.4)
        ax.set_ylim(-0.7, len(concs) - 0.4)
        ax.set_xlabel("offered rate step (low → burst)")
        ax.set_ylabel("client concurrency (max in flight)")
        ax.set_title(f"{cls} / {st}", fontsize=10)
        ax.grid(True, alpha=0.3)
    handles = [
        plt.Line2D([], [], marker=m, color=c, linestyle="", markersize=8, label=k.replace("_", " "))
        for k, (m, c) in style.items()
    ]
    fig.legend(handles=handles, loc="lower center", fontsize=7, ncol=5, frameon=False)
    fig.suptitle(f"Capacity region — plan {region['plan']} (inside = every run met every hard budget)", fontsize=10)
    fig.tight_layout(rect=(0, 0.07, 1, 0.95))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return Path(path)


def write_region(plan_dir: Path, region: dict[str, Any]) -> dict[str, Path]:
    """Write region.json, region.md, one PNG per class and region.html (interactive curves); returns their paths."""
    plan_dir = Path(plan_dir)
    paths = {"json": plan_dir / REGION_FILE, "markdown": plan_dir / REGION_MD_FILE}
    document = RegionResult.from_document(region).document()  # every key named by the published schema
    write_output_text(paths["json"], json.dumps(document, indent=2, sort_keys=True, default=str) + "\n")
    write_output_text(paths["markdown"], format_region(region) + "\n")
    for cls in region["classes"]:
        paths[f"plot:{cls}"] = plot_region(region, cls, plan_dir / region_plot_file(cls))
    paths["html"] = write_curves(plan_dir, region)
    return paths


def load_region(plan_dir: Path) -> dict[str, Any]:
    """region.json of a plan directory (one PlanError line when it is damaged)."""
    return read_region(plan_dir)
