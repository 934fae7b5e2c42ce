"""The Pareto front of runs: completed throughput against a latency tail, labelled by what differs.

``pareto_points`` analyses each run (``analyze_run``: the same window and rules as ``loadgen analyze``) and takes,
for one class (or ``overall``), its completed throughput (req/s) and the p99 of a latency metric (TTFT or ITL,
ms). A run is on the front when no other run has at least its throughput and at most its latency, one of them
strictly. Each point is labelled by the identity keys whose values differ across the runs (``compare``'s
``identity_differences``), so the variable that was changed names the points.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loadgen.analysis import analyze_run
from loadgen.analysis.interactive import plotly_html
from loadgen.analysis.metrics import UNMEASURED_RATE_RULE
from loadgen.plan.compare import identity_differences, identity_of
from loadgen.rundir.io import read_run_manifest
from loadgen.rundir.manifest import Manifest
from loadgen.util.errors import RunDirError
from loadgen.util.outputfile import write_output_text

__all__ = ["ParetoPoint", "format_pareto", "pareto_points", "write_pareto_html"]


@dataclass
class ParetoPoint:
    run_dir: str
    label: str
    completed_rps: float | None
    latency_p99_ms: float | None
    on_front: bool = False


def _short(key: str) -> str:
    """A key as its label shows it: its last two parts."""
    return ".".join(key.split(".")[-2:])


def _label_keys(idents: list[dict[str, Any]], keys: list[str]) -> list[str]:
    """The differing keys worth a label: short values only; keys every run has before keys some lack (a run
    of another kind, a worksheet beside a measured run, lacks whole sections: that is no setting that differs),
    then names, plan cells and options first; one key per way the runs split and per shown name; at most three."""
    short = [k for k in keys if all(len(str(i.get(k, ""))) <= 32 for i in idents)]

    def rank(key: str) -> tuple[int, int, str]:
        leaf = key.rsplit(".", 1)[-1]
        kind = 0 if leaf == "name" else 1 if key.startswith(("plan_cell", "options")) else 2
        return (0 if all(key in i for i in idents) else 1, kind, key)

    chosen: list[str] = []
    for key in sorted(short, key=rank):
        values = [i.get(key) for i in idents]
        if _short(key) in {_short(c) for c in chosen}:  # two labels reading "config.name=..." say nothing apart
            continue
        if all(values != [i.get(c) for i in idents] for c in chosen):  # one key per way the runs split
            chosen.append(key)
    return chosen[:3]


#: A plan cell's keys that name it for a label (its id and rate index repeat them; its plan's hash says nothing).
_PLAN_CELL_LABEL_KEYS = ("request_class", "state", "concurrency", "rate_step", "plan")


def _label_identity(manifest: Manifest) -> dict[str, Any]:
    """The identity keys, and the plan cell a run belongs to: runs of one plan differ in their cell (rate step,
    concurrency), which the identity leaves out (it holds a cell's runs to one configuration)."""
    cell = manifest.plan_cell or {}
    return identity_of(manifest) | {f"plan_cell.{k}": cell[k] for k in _PLAN_CELL_LABEL_KEYS if k in cell}


def _label(identity: dict[str, Any], keys: list[str], run_dir: Path) -> str:
    if not keys:
        return run_dir.name
    return ", ".join(f"{_short(k)}={identity.get(k, '-')}" for k in keys)


def pareto_points(
    runs: Sequence[Path | str], *, metric: str = "ttft_ms", request_class: str = "overall"
) -> list[ParetoPoint]:
    """One point per run, with ``on_front`` set (see the module docstring)."""
    if metric not in ("ttft_ms", "itl_ms", "e2e_ms", "tpot_ms"):
        raise RunDirError(f"--metric {metric!r}: expected one of ttft_ms, itl_ms, e2e_ms, tpot_ms")
    dirs = [Path(r) for r in runs]
    idents = [_label_identity(read_run_manifest(d)) for d in dirs]
    covered, other = identity_differences(idents, "")
    keys = _label_keys(idents, [k for k in covered + other if not k.startswith(("harness.", "host."))])
    points = []
    for d, ident in zip(dirs, idents):
        a = analyze_run(d)
        if request_class != "overall" and request_class not in a.classes:
            raise RunDirError(f"{d}: no class {request_class!r}: expected one of {', '.join(a.classes)} or overall")
        g = a.group(request_class)
        points.append(ParetoPoint(str(d), _label(ident, keys, d), g.completed_rps, g.metrics[metric]["p99"]))
    for p in points:
        p.on_front = (
            p.completed_rps is not None
            and p.latency_p99_ms is not None
            and not any(
                q is not p
                and q.completed_rps is not None
                and q.latency_p99_ms is not None
                and q.completed_rps >= p.completed_rps
                and q.latency_p99_ms <= p.latency_p99_ms
                and (q.completed_rps > p.completed_rps or q.latency_p99_ms < p.latency_p99_ms)
                for q in points
            )
        )
    return points


def format_pareto(points: list[ParetoPoint], metric: str, request_class: str) -> str:
    lines = [f"Pareto front ({request_class}): completed req/s against {metric} p99; * = on the front"]
    for p in sorted(points, key=lambda p: -(p.completed_rps or 0.0)):
        rps = "-" if p.completed_rps is None else f"{p.completed_rps:.2f}"
        lat = "-" if p.latency_p99_ms is None else f"{p.latency_p99_ms:.1f}"
        lines.append(f"  {'*' if p.on_front else ' '} {rps:>9} req/s  {lat:>9} ms  {p.label}  ({p.run_dir})")
    if any(p.completed_rps is None for p in points):
        lines.append(f"  - req/s: not on the front, not ranked: {UNMEASURED_RATE_RULE} (loadgen analyze says which)")
    return "\n".join(lines)


def write_pareto_html(points: list[ParetoPoint], metric: str, request_class: str, path: Path) -> Path:
    import plotly.graph_objects as go  # deferred: only the HTML page needs Plotly

    fig = go.Figure()
    front = sorted((p for p in points if p.on_front), key=lambda p: p.completed_rps or 0.0)
    rest = [p for p in points if not p.on_front]
    for group, name, style in ((rest, "dominated", {"color": "#999"}), (front, "Pareto front", {"color": "#d62728"})):
        fig.add_trace(
            go.Scatter(
                x=[p.completed_rps for p in group],
                y=[p.latency_p99_ms for p in group],
                mode="markers+text+lines" if group is front else "markers+text",
                name=name,
                text=[p.label for p in group],
                textposition="top center",
                marker={"size": 10, **style},
                line=style,
                hovertext=[p.run_dir for p in group],
            )
        )
    fig.update_layout(
        xaxis_title="completed throughput (req/s)", yaxis_title=f"{request_class} {metric} p99 (ms)", height=520
    )
    write_output_text(path, plotly_html(f"loadgen runs pareto: {request_class} {metric}", [("Pareto front", fig)]))
    return path
