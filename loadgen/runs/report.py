"""How the catalog and a diff are shown: console tables, and the diff's interactive HTML report (Plotly)."""

from __future__ import annotations

import html
import math
from pathlib import Path
from typing import Any

from loadgen.analysis.interactive import plotly_html
from loadgen.analysis.metrics import UNMEASURED_RATE_RULE
from loadgen.util.outputfile import write_output_text

from .diff import ERROR_SHARE, DiffResult, DiffRow

__all__ = ["format_diff", "format_run", "format_runs", "write_diff_html"]

_VERDICT_MARK = {"regressed": "REGRESSED", "improved": "improved", "no change": "no change", "inconclusive": "inconcl."}


def _ms(v: float | None) -> str:
    if v is None:
        return "-"
    if not math.isfinite(v):
        return "inf" if v > 0 else "-inf"
    return f"{v:.1f}"


def _share(v: float | None) -> str:
    return "-" if v is None else f"{v * 100:.1f}%"


def _points(v: float) -> str:
    return f"{v * 100:+.1f}pp"


def _row_cells(r: DiffRow) -> tuple[str, str, str, str]:
    """base, candidate, change and interval as shown: ms and percent, or for error_share percent and points."""
    if r.metric == ERROR_SHARE:
        change = "-" if r.change is None else _points(r.change)
        interval = "-" if r.interval is None else f"[{_points(r.interval[0])}, {_points(r.interval[1])}]"
        return _share(r.base), _share(r.candidate), change, interval
    pct = "-" if r.change_pct is None else f"{r.change_pct:+.1f}%"
    interval = "(point only)" if r.interval is None else f"[{_ms(r.interval[0])}, {_ms(r.interval[1])}]"
    return _ms(r.base), _ms(r.candidate), pct, interval


def _row_line(r: DiffRow) -> str:
    base, cand, change, interval = _row_cells(r)
    verdict = _VERDICT_MARK.get(r.verdict or "", "")
    failed = f" failed {r.failed[0]}/{r.failed[1]}" if r.failed is not None else ""
    return (
        f"  {r.request_class:<16} {r.metric:<11} {r.quantile:<5} {base:>9} {cand:>9} "
        f"{change:>8}  {interval:<22} {verdict:<10} n={r.n_base}/{r.n_candidate}{failed}"
    )


def format_diff(result: DiffResult) -> str:
    """The console report: every row, then the verdict and what was held fixed."""
    lines = [
        f"diff: base {', '.join(result.base)}",
        f"      candidate {', '.join(result.candidate)}",
        f"declared variable {result.variable}"
        + (f" (differs in {len(result.differs_in)} key(s))" if result.differs_in else ""),
        f"  {'class':<16} {'metric':<11} {'q':<5} {'base ms':>9} {'cand ms':>9} {'change':>8}  "
        f"{'interval of change (ms)':<22} {'verdict':<10} samples",
    ]
    lines += [_row_line(r) for r in result.rows]
    if any(r.metric == ERROR_SHARE for r in result.rows):
        lines.append(
            "error_share rows: the share of the class's requests that failed (as analyze's error share; planned "
            "abandonments are not failures), change and interval in percentage points"
        )
    lines.append(
        f"verdict: {result.verdict.upper()} ({len(result.regressions())} row(s) regressed); each interval at "
        f"{result.row_level:.4f}, so at most {1 - result.level:.0%} chance that any row is falsely flagged"
    )
    lines += [f"note: {n}" for n in result.notes]
    return "\n".join(lines)


_RUN_FIELDS = ("state", "run_kind", "engine", "model", "gpu", "scenario_name", "trace_name", "started_utc")


def _on_disk(row: dict[str, Any]) -> str:
    """What the disk says of a row now, when it is not what was indexed."""
    if not row.get("present", True):
        return "  [MISSING: moved or deleted since indexed]"
    if not row.get("current", True):
        return "  [CHANGED since indexed: figures stale until `loadgen runs index` again]"
    if row.get("problem"):
        return f"  [UNREADABLE: {row['problem']}]"
    return ""


def format_runs(rows: list[dict[str, Any]]) -> str:
    """One line per catalogued run or plan."""
    if not rows:
        return "no catalogued runs match"
    out = [f"{len(rows)} run(s)/plan(s):"]
    for r in rows:
        what = " ".join(f"{k}={r[k]}" for k in _RUN_FIELDS if r.get(k) is not None)
        out.append(f"  {r['kind']:<4} {r['path']}  {what}{_on_disk(r)}")
    return "\n".join(out)


def format_run(row: dict[str, Any], classes: list[dict[str, Any]]) -> str:
    """One run: every identity field, then its headline figures per class."""
    out = [f"{row['kind']} {row['path']}{_on_disk(row)}"]
    out += [f"  {k}: {v}" for k, v in row.items() if k not in ("path", "kind") and v is not None]
    if classes:
        out.append(
            "  headline per class, as `loadgen analyze` (its default window, cold-start requests apart; "
            "ms over ok requests; completed: ok requests done in the window per s):"
        )
        for c in classes:
            out.append(
                f"    {c['request_class']:<16} scheduled {c['scheduled']} ok {c['ok']} failed {c['failed']}  "
                f"TTFT p50/p99 {_ms(c['ttft_p50_ms'])}/{_ms(c['ttft_p99_ms'])}  "
                f"TPOT p50/p99 {_ms(c['tpot_p50_ms'])}/{_ms(c['tpot_p99_ms'])}  "
                f"E2E p50/p99 {_ms(c['e2e_p50_ms'])}/{_ms(c['e2e_p99_ms'])}  "
                f"completed {_ms(c['completed_rps'])}/s"
            )
        if any(c["completed_rps"] is None and c["scheduled"] for c in classes):
            out.append(f"  completed -/s: {UNMEASURED_RATE_RULE} (loadgen analyze says which)")
    return "\n".join(out)


def _diff_table(result: DiffResult) -> str:
    head = "<tr><th>class</th><th>metric</th><th>q</th><th>base ms</th><th>candidate ms</th><th>change</th><th>interval</th><th>verdict</th></tr>"
    cells = []
    for r in result.rows:
        base, cand, pct, interval = _row_cells(r)
        cls = html.escape(r.verdict or "")
        cells.append(
            f"<tr class='{cls.replace(' ', '-')}'><td>{html.escape(r.request_class)}</td><td>{r.metric}</td>"
            f"<td>{r.quantile}</td><td>{base}</td><td>{cand}</td><td>{pct}</td>"
            f"<td>{interval}</td><td>{cls}</td></tr>"
        )
    notes = "".join(f"<p>note: {html.escape(n)}</p>" for n in result.notes)
    return (
        f"<p>verdict: <b>{html.escape(result.verdict)}</b>; base {html.escape(', '.join(result.base))}; candidate "
        f"{html.escape(', '.join(result.candidate))}; {html.escape(result.rule)}</p>{notes}"
        f"<table>{head}{''.join(cells)}</table>"
    )


def write_diff_html(result: DiffResult, path: Path) -> Path:
    """The diff report: the table, then per class the CDFs of base and candidate overlaid."""
    import plotly.graph_objects as go  # deferred: only the HTML reports need Plotly
    from plotly.subplots import make_subplots  # deferred: as above

    figures = []
    for cls, metrics in result.cdfs.items():
        names = list(metrics)
        fig = make_subplots(rows=1, cols=len(names), subplot_titles=[f"{m} CDF" for m in names])
        for col, m in enumerate(names, start=1):
            for side, color in (("base", "#1f77b4"), ("candidate", "#d62728")):
                cdf = metrics[m].get(side)
                if cdf:
                    fig.add_trace(
                        go.Scatter(
                            x=cdf["x"],
                            y=cdf["y"],
                            mode="lines",
                            name=side,
                            line={"color": color},
                            legendgroup=side,
                            showlegend=col == 1,
                        ),
                        row=1,
                        col=col,
                    )
            fig.update_xaxes(title_text="ms", row=1, col=col)
        fig.update_layout(height=360, margin={"t": 40})
        figures.append((f"class {cls}: base against candidate", fig))
    write_output_text(path, plotly_html("loadgen diff", figures, _diff_table(result)))
    return path
