"""A plan's latency-throughput curves, interactive (``region.html``): per class, TTFT p99 against completed
throughput, one line per warm/cold state and client concurrency, each cell marked inside or outside the
region, with the class's hard TTFT p99 budget as a line and each line's boundary (the highest rate inside).

Read from ``region.json`` alone (the cells' repeats are shown as their mean, with every repeat as a hover
value); the budget comes from the scenario recorded in the first measured run's manifest.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from loadgen.analysis.interactive import plotly_html
from loadgen.rundir.manifest import read_manifest
from loadgen.util.errors import LoadgenError
from loadgen.util.outputfile import write_output_text
from loadgen.workload.scenario import scenario_from_manifest

from .files import REGION_HTML_FILE

__all__ = ["write_curves"]

_STATUS_SYMBOL = {"inside": "circle", "outside": "x", "inconclusive": "diamond-open"}


def _ttft_limit(plan_dir: Path, region: dict[str, Any], cls: str) -> float | None:
    for states in region["classes"].values():
        for line in states.values():
            for cell in line["cells"]:
                for run in cell.get("run_dirs") or []:
                    try:
                        scenario = scenario_from_manifest(read_manifest(plan_dir / run))
                    except LoadgenError:
                        continue
                    spec = scenario.classes.get(cls) if scenario is not None else None
                    budget = spec.budgets.ttft_ms if spec is not None else None
                    return budget.p99 if budget is not None and budget.hard else None
    return None


def _figure(plan_dir: Path, region: dict[str, Any], cls: str) -> Any:
    import plotly.graph_objects as go  # deferred: only the HTML page needs Plotly

    fig = go.Figure()
    for state, line in region["classes"][cls].items():
        by_conc: dict[int, list[dict[str, Any]]] = {}
        for cell in line["cells"]:
            if cell.get("completed_rps") is not None:
                by_conc.setdefault(int(cell["concurrency"]), []).append(cell)
        for conc, cells in sorted(by_conc.items()):
            cells.sort(key=lambda c: c["completed_rps"])
            p99s = [[v for v in c["ttft_p99_ms"].get(cls) or [] if v is not None] for c in cells]
            fig.add_trace(
                go.Scatter(
                    x=[c["completed_rps"] for c in cells],
                    y=[sum(v) / len(v) if v else None for v in p99s],
                    mode="lines+markers",
                    name=f"{state}, concurrency {conc}",
                    marker={"symbol": [_STATUS_SYMBOL.get(c["status"], "circle-open") for c in cells], "size": 9},
                    text=[
                        f"{c['cell_id']}: {c['status']}; offered {c['offered_rps']:.2f}/s; p99 per repeat "
                        f"{[round(v, 1) for v in p]}"
                        for c, p in zip(cells, p99s)
                    ],
                    hoverinfo="text+x+y",
                )
            )
        for b in line.get("boundary") or []:
            if b.get("max_inside_completed_rps") is not None:
                fig.add_vline(
                    x=b["max_inside_completed_rps"],
                    line_dash="dot",
                    line_color="#888",
                    annotation_text=f"{state} c{b['concurrency']} boundary",
                    annotation_font_size=9,
                )
    limit = _ttft_limit(plan_dir, region, cls)
    if limit is not None:
        fig.add_hline(y=limit, line_color="#d62728", annotation_text=f"hard TTFT p99 budget {limit:g} ms")
    fig.update_layout(
        xaxis_title="completed throughput (req/s)",
        yaxis_title=f"{cls} TTFT p99 (ms)",
        height=460,
        legend={"font": {"size": 10}},
    )
    return fig


def write_curves(plan_dir: Path, region: dict[str, Any]) -> Path:
    """Write ``region.html`` beside ``region.json``; returns its path."""
    figures = [
        (f"class {cls}: latency against throughput", _figure(plan_dir, region, cls)) for cls in region["classes"]
    ]
    path = Path(plan_dir) / REGION_HTML_FILE
    write_output_text(path, plotly_html(f"loadgen plan {region['plan']}: latency-throughput", figures))
    return path
