"""HTML report: one self-contained file, plots embedded as base64 PNG (matplotlib, Agg backend), and an
interactive copy of the timeline (Plotly, its script inlined: zoom and pan, offline).

Plots: TTFT/ITL/E2E CDFs per class with budget lines; a timeline of offered vs completed rate with
the TTFT scatter and server KV usage / queue (or in-flight) beneath; token-length histograms.
A two-line script sets the document title to ``JS error: ...`` on any script error, which the
headless-browser test reads back.
"""

from __future__ import annotations

import base64
import html
import io
import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from loadgen.util.outputfile import write_output_text

from .model import METRICS, Analysis, GroupSummary, stop_sentence
from .report_console import fmt_ci, fmt_ms, fmt_share, stability_sentence
from .timeline_interactive import timeline_figure

__all__ = ["render_html", "write_html"]

_COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b"]
_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:24px;color:#222;max-width:1200px}
h1{font-size:22px} h2{font-size:18px;margin-top:28px;border-bottom:1px solid #ddd}
table{border-collapse:collapse;margin:8px 0;font-size:13px} td,th{border:1px solid #ddd;padding:3px 8px;text-align:right}
th{background:#f4f4f4} td.l,th.l{text-align:left} .pass{color:#137333;font-weight:bold} .fail{color:#c5221f;font-weight:bold}
.warn{color:#b06000} .verdict{font-size:20px;padding:10px 14px;border-radius:6px;display:inline-block}
.vpass{background:#e6f4ea} .vfail{background:#fce8e6} .vnone{background:#fef7e0} img{max-width:100%} .dim{color:#777;font-size:12px}
"""


def _e(x: Any) -> str:
    return html.escape(str(x))


def _pyplot() -> Any:
    """``matplotlib.pyplot`` on the Agg backend."""
    import matplotlib  # deferred on purpose: a heavy dependency only the HTML report's plots need

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # deferred with matplotlib above

    return plt


def _plotly(fig: Any) -> str:
    """A Plotly figure inline, its script included (the report stays one file that opens offline)."""
    import plotly.io as pio  # deferred: heavy, loaded only when a report is written

    return str(pio.to_html(fig, full_html=False, include_plotlyjs=True, config={"displaylogo": False}))


def _png(fig: Any) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
    _pyplot().close(fig)
    return '<img alt="plot" src="data:image/png;base64,' + base64.b64encode(buf.getvalue()).decode("ascii") + '">'


def _legend(ax: Any, **kw: Any) -> None:
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8, **kw)


def _cdf_figure(a: Analysis) -> str | None:
    plt = _pyplot()
    cdf = a.plot_data.get("cdf", {})
    budgets = a.plot_data.get("budgets", {})
    names = list(a.classes)
    if not names:
        return None
    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    for ax, metric, title in zip(axes, ("ttft_ms", "itl_ms", "e2e_ms"), ("TTFT", "ITL (per token)", "E2E")):
        drawn = False
        for i, name in enumerate(names):
            color = _COLORS[i % len(_COLORS)]
            pts = (cdf.get(name) or {}).get(metric)
            if pts:
                ax.plot(pts["x"], pts["y"], color=color, label=name)
                drawn = True
            for pname, limit in (budgets.get(name, {}).get(metric) or {}).items():
                ax.axvline(limit, color=color, linestyle="--", linewidth=1)
                ax.text(limit, 0.02 + 0.08 * i, f" {pname}", color=color, fontsize=8)
        ax.set_title(title)
        ax.set_xlabel("ms")
        ax.set_ylim(0, 1.02)
        ax.grid(alpha=0.3)
        if drawn:
            ax.set_xscale("log")
            ax.legend(fontsize=8, loc="lower right")
        else:
            ax.text(0.5, 0.5, "no samples", ha="center", transform=ax.transAxes)
    axes[0].set_ylabel("fraction of samples (failures not shown)")
    return _png(fig)


def _timeline_figure(a: Analysis) -> str | None:
    plt = _pyplot()
    ts = a.timeseries
    if not ts or not ts.get("t_s"):
        return None
    server_ts = (a.server or {}).get("timeseries")
    fig, axes = plt.subplots(3, 1, figsize=(15, 9), sharex=True)
    t = ts["t_s"]
    ax = axes[0]
    ax.step(t, ts["offered_rps"], where="post", label="offered (scheduled)")
    ax.step(t, ts["send_rps"], where="post", label="sent", alpha=0.7)
    ax.step(t, ts["completed_rps"], where="post", label="completed ok")
    ax.step(t, ts["failed_rps"], where="post", label="failed", color="#d62728")
    ax.set_ylabel(f"req/s (bins of {ts['bin_s']:g} s)")
    _legend(ax, loc="upper right")
    ax.axvspan(a.window["start_s"], a.window["end_s"], color="#999", alpha=0.08)
    ax.grid(alpha=0.3)
    ax = axes[1]
    sc = a.plot_data.get("scatter", {})
    names = list(a.classes)
    finite = [v for v in sc.get("ttft_ms", []) if v is not None]
    top = max(finite) * 1.5 if finite else 1.0
    for i, name in enumerate(names):
        xs = [
            x
            for x, y, f, c in zip(sc.get("t_s", []), sc.get("ttft_ms", []), sc.get("failed", []), sc.get("class", []))
            if c == name and y is not None and not f
        ]
        ys = [
            y
            for x, y, f, c in zip(sc.get("t_s", []), sc.get("ttft_ms", []), sc.get("failed", []), sc.get("class", []))
            if c == name and y is not None and not f
        ]
        ax.scatter(xs, ys, s=4, color=_COLORS[i % len(_COLORS)], label=name, alpha=0.6)
    fx = [x for x, f in zip(sc.get("t_s", []), sc.get("failed", [])) if f]
    if fx:
        ax.scatter(fx, [top] * len(fx), marker="x", color="#d62728", s=12, label="failed")
    ax.set_ylabel("TTFT ms")
    if finite and min(finite) > 0:
        ax.set_yscale("log")
    _legend(ax, loc="upper right")
    ax.grid(alpha=0.3)
    ax = axes[2]
    if server_ts and (server_ts.get("kv_cache_usage") or server_ts.get("running") or server_ts.get("waiting")):
        st = server_ts["t_s"]
        if server_ts.get("kv_cache_usage"):
            ax.plot(
                st,
                [None if v is None else 100 * v for v in server_ts["kv_cache_usage"]],
                color="#9467bd",
                label="KV cache usage %",
            )
            ax.set_ylabel("KV usage %")
        ax2 = ax.twinx()
        for key, color in (("running", "#2ca02c"), ("waiting", "#d62728")):
            if server_ts.get(key):
                ax2.step(st, server_ts[key], where="post", color=color, label=key)
        ax2.set_ylabel("requests")
        lines = ax.get_legend_handles_labels()
        lines2 = ax2.get_legend_handles_labels()
        ax.legend(lines[0] + lines2[0], lines[1] + lines2[1], fontsize=8, loc="upper right")
    else:
        mids = [x + ts["bin_s"] / 2 for x in t]
        ax.plot(mids, ts["in_flight"], color="#8c564b", label="in flight (client side)")
        ax.set_ylabel("in flight")
        _legend(ax, loc="upper right")
        ax.text(0.01, 0.9, "no server metrics in this run", transform=ax.transAxes, fontsize=8, color="#777")
    ax.set_xlabel("run clock, s")
    ax.grid(alpha=0.3)
    return _png(fig)


def _token_figure(a: Analysis) -> str | None:
    plt = _pyplot()
    tokens = a.plot_data.get("tokens", {})
    if not any(len(v["prompt"]) or len(v["output"]) for v in tokens.values()):
        return None
    fig, axes = plt.subplots(1, 2, figsize=(15, 3.5))
    for ax, key in zip(axes, ("prompt", "output")):
        for i, (name, v) in enumerate(tokens.items()):
            vals = np.asarray(v[key], dtype=np.float64)
            vals = vals[~np.isnan(vals)]
            if len(vals):
                ax.hist(vals, bins=40, alpha=0.5, color=_COLORS[i % len(_COLORS)], label=name)
        ax.set_title(f"{key} tokens per ok request")
        ax.set_xlabel("tokens")
        _legend(ax)
        ax.grid(alpha=0.3)
    return _png(fig)


def _table(headers: list[str], rows: list[list[Any]], left: int = 1) -> str:
    out = [
        "<table><tr>"
        + "".join(f'<th class="{"l" if i < left else ""}">{_e(h)}</th>' for i, h in enumerate(headers))
        + "</tr>"
    ]
    for row in rows:
        out.append(
            "<tr>" + "".join(f'<td class="{"l" if i < left else ""}">{c}</td>' for i, c in enumerate(row)) + "</tr>"
        )
    out.append("</table>")
    return "".join(out)


def _num(v: Any, fmt: str = "{:,.3f}") -> str:
    if v is None:
        return "—"
    if isinstance(v, float) and math.isinf(v):
        return "inf"
    return fmt.format(v) if isinstance(v, (int, float)) else _e(v)


def _header(a: Analysis) -> list[str]:
    """Document head, title line, verdict banner, failed checks and the run line."""
    run = a.run
    cls = {"pass": "vpass", "fail": "vfail"}.get(a.verdict, "vnone")
    head = {
        "pass": "PASS: every hard budget met (95% intervals within the limits)",
        "fail": f"FAIL: {len(a.hard_failures)} hard check(s) failed",
        "inconclusive": (
            f"INCONCLUSIVE: no hard budget failed, {len(a.hard_inconclusive)} hard check(s) straddle "
            "their limit (more requests needed)"
        ),
        "no budgets": "NO BUDGETS (numbers only)",
        "no data": "NO DATA: no requests in the window",
    }[a.verdict]
    if a.errored:
        head += f" · ERRORED RUN (error share {a.error_share:.1%} > {a.error_rate_limit:.1%})"
        cls = "vfail"
    parts = [
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">',
        "<title>loadgen report</title>",
        "<script>window.addEventListener('error',function(e){document.title='JS error: '+e.message});</script>",
        f"<style>{_CSS}</style></head><body>",
        f"<h1>loadgen analysis · {_e(run.get('scenario') or 'no scenario')} · {_e(run.get('run_kind'))}</h1>",
    ]
    stop = stop_sentence(run.get("stop") or {})
    if stop:
        parts.append(f'<div class="verdict vnone" id="run-state">{_e(stop)}</div>')
    if run.get("prompt_tokens_differ"):
        parts.append(f'<div class="verdict vnone" id="prompt-tokens">workload: {_e(run["prompt_tokens_differ"])}</div>')
    if run.get("client_fell_behind"):
        parts.append(f'<div class="verdict vnone" id="client-lag">measurement: {_e(run["client_fell_behind"])}</div>')
    parts.append(f'<div class="verdict {cls}" id="verdict">{_e(head)}</div>')
    if a.failed_checks or a.hard_inconclusive:
        parts.append(
            "<ul>"
            + "".join(f'<li class="{"fail" if c.hard else "warn"}">{_e(c.reason)}</li>' for c in a.failed_checks)
            + "".join(f'<li class="warn">{_e(c.reason)}</li>' for c in a.hard_inconclusive)
            + "</ul>"
        )
    target = run.get("target") or {}
    parts.append(
        f'<p class="dim">run {_e(a.run_dir)} · model {_e(target.get("model"))} · target {_e(target.get("kind"))} '
        f"· started {_e(run.get('started_utc'))} · {run.get('requests')} requests, {run.get('chunk_rows')} chunk rows "
        f"· window {a.window['start_s']:.3f}–{a.window['end_s']:.3f} s · analysis schema {_e(a.schema_version)}</p>"
    )
    return parts


def _load_section(a: Analysis) -> list[str]:
    """Offered, sent and completed rates, token throughput, goodput and attainment."""
    o = a.overall
    rate_rows = [
        ["offered (scheduled)", _num(o.offered_rps), "req/s"],
        ["sent", _num(o.send_rps), "req/s"],
        ["completed ok", _num(o.completed_rps), "req/s"],
        ["prompt tokens", _num(o.prompt_tok_s, "{:,.1f}"), "tok/s"],
        ["output tokens", _num(o.output_tok_s, "{:,.1f}"), "tok/s"],
        ["goodput (completed ok in the window, every hard budget met)", _num(o.goodput_rps), "req/s"],
        [
            "attainment (of requests scheduled in the window) [95% Wilson interval]",
            _e(fmt_share(o.attainment, o.attainment_ci)),
            "",
        ],
        ["error share [95% Wilson interval]", _e(fmt_share(a.error_share, a.error_share_ci)), ""],
    ]
    parts = ["<h2>Load and throughput</h2>", _table(["measure", "value", "unit"], rate_rows)]
    if not a.rates_meaningful:
        parts.append(
            '<p class="warn">Instants were synthesized by the importer: rates and time series are not measurements.</p>'
        )
    return parts


def _checks_section(a: Analysis) -> list[str]:
    """Every budget check with observed value, limit, n and result (nothing when there are none)."""
    if not a.checks:
        return []
    rows = [
        [
            _e(c.class_name),
            _e(c.metric),
            _e(c.percentile or ""),
            _num(c.observed, "{:,.2f}"),
            _e(_check_ci(c)),
            _num(c.limit, "{:,.2f}"),
            c.n,
            "hard" if c.hard else "soft",
            _outcome_html(c),
            "" if c.more_requests is None else f"{c.more_requests:,}",
        ]
        for c in a.checks
    ]
    return [
        "<h2>Budget checks</h2>",
        _table(
            ["class", "metric", "pct", "observed", "95% CI", "limit", "n", "kind", "result", "more requests needed"],
            rows,
            left=3,
        ),
        '<p class="dim">pass: the 95% interval lies at or below the limit; fail: above it; inconclusive: it '
        "straddles the limit, and about the number of requests shown would decide it. "
        + _e(a.definitions.get("confidence", ""))
        + "</p>",
    ]


def _check_ci(c: Any) -> str:
    if not c.ci:
        return ""
    if c.metric == "error_share":
        return f"[{c.ci[0]:.2%}, {c.ci[1]:.2%}]"
    return fmt_ci(c.ci)


def _outcome_html(c: Any) -> str:
    if not c.evaluated:
        return "n/a"
    css = {"pass": "pass", "fail": "fail" if c.hard else "warn", "inconclusive": "warn"}[c.outcome]
    return f'<span class="{css}">{_e(c.outcome)}</span>'


def _class_sections(a: Analysis, groups: list[GroupSummary]) -> list[str]:
    """Per class (and overall): status counts, failures, goodput and the metric table."""
    parts = ["<h2>Per class</h2>"]
    for g in groups:
        counts = ", ".join(f"{k} {v}" for k, v in g.status_counts.items() if v)
        kinds = ", ".join(f"{k} {v}" for k, v in g.error_kinds.items())
        parts.append(
            f"<h3>{_e(g.name)}</h3><p>{g.n_scheduled} scheduled · {_e(counts)}"
            f"{' · abandoned ' + str(g.abandoned) if g.abandoned else ''}{' · failures: ' + _e(kinds) if kinds else ''}"
            f"{' · goodput ' + _num(g.goodput_rps) + ' req/s' if g.goodput_rps is not None else ''}</p>"
        )
        rows = []
        for m in METRICS:
            s = g.metrics[m]
            flag = "*" if s["n"] and s["p99_low_sample"] else ""
            ci = s.get("ci") or {}
            cells = [
                fmt_ms(s[q])
                + (flag if q == "p99" else "")
                + (f'<br><span class="dim">{_e(fmt_ci(ci.get(q)))}</span>' if ci.get(q) else "")
                for q in ("p50", "p95", "p99")
            ]
            rows.append([_e(m), s["n"], *cells, fmt_ms(s["mean"]), fmt_ms(s["max"])])
        parts.append(_table(["metric", "n", "p50", "p95", "p99", "mean", "max"], rows))
        if g.ttft_by_turn:
            parts.append(
                _table(
                    ["TTFT by turn", "n", "p50", "p95", "p99"],
                    [
                        [_e(t), s["n"], fmt_ms(s["p50"]), fmt_ms(s["p95"]), fmt_ms(s["p99"])]
                        for t, s in g.ttft_by_turn.items()
                    ],
                )
            )
        if g.sessions:
            span = g.sessions["makespan_ms"]
            parts.append(
                _table(
                    ["session makespan", "sessions", "incomplete", "p50", "p95", "p99", "max"],
                    [
                        [
                            "last step done - first step scheduled",
                            g.sessions["n_sessions"],
                            g.sessions["n_incomplete"],
                            *(fmt_ms(span[q]) for q in ("p50", "p95", "p99", "max")),
                        ]
                    ],
                )
            )
        if g.attainment is not None:
            parts.append(
                f"<p>attainment {_e(fmt_share(g.attainment, g.attainment_ci))} ({g.n_good}/{g.n_eligible})</p>"
            )
    parts.append(
        '<p class="dim">Under each percentile: its 95% confidence interval [low, high] (order statistics; inf: '
        "not bounded by this many samples). * p99 from fewer than 100 samples. Percentiles: "
        + _e(a.definitions.get("percentiles", ""))
        + "</p>"
    )
    return parts


def _warm_cold_section(a: Analysis) -> list[str]:
    """Warm/cold state, the cold rule, warm vs cold TTFT/E2E, and what the engine noted."""
    wc = a.warm_cold
    parts = ["<h2>Warm / cold</h2>"]
    parts.append(
        f"<p>state {_e(wc['state'])}; actions: {_e('; '.join(wc.get('actions') or []) or 'none recorded')}; "
        f"cold rule: {_e(wc['cold_rule'])}; {wc['n_cold']} cold request(s)"
        f"{' (in the tables)' if wc.get('cold_in_tables') else ' (apart from the tables)'}.</p>"
    )
    rows = [
        [
            label,
            wc[label]["n"],
            fmt_ms(wc[label]["ttft_ms"]["p50"]),
            fmt_ms(wc[label]["ttft_ms"]["p99"]),
            fmt_ms(wc[label]["e2e_ms"]["p50"]),
        ]
        for label in ("warm", "cold")
    ]
    parts.append(_table(["", "n", "TTFT p50", "TTFT p99", "E2E p50"], rows))
    if wc.get("engine_notes") or wc.get("behavior_relevant"):
        parts.append(
            "<pre>"
            + _e(
                json.dumps(
                    {"engine_notes": wc.get("engine_notes"), "behavior_relevant": wc.get("behavior_relevant")},
                    indent=1,
                    default=str,
                )
            )
            + "</pre>"
        )
    return parts


def _token_table(groups: list[GroupSummary]) -> str:
    """Target, client-counted and server-reported tokens per class, and how many requests disagree."""
    rows = []
    for g in groups:
        for kind in ("prompt", "output"):
            t = g.tokens.get(kind) or {}
            rows.append(
                [
                    _e(g.name),
                    kind,
                    _num(t.get("target"), "{:,.0f}"),
                    _num(t.get("client"), "{:,.0f}"),
                    _num(t.get("server"), "{:,.0f}"),
                    _num(t.get("server_minus_client"), "{:,.0f}"),
                    _num(t.get("server_minus_target"), "{:,.0f}"),
                    t.get("n_server_client_mismatch"),
                ]
            )
    return _table(
        ["class", "tokens", "target", "client", "server", "server−client", "server−target", "requests mismatched"],
        rows,
        left=2,
    )


def _replica_section(section: dict[str, Any]) -> list[str]:
    """Per replica (several target URLs): routed, sent, completed, failed, TTFT and ITL p50/p99."""
    rows = []
    for r in section["replicas"]:
        ttft, itl = r["ttft_ms"], r["itl_ms"]
        kinds = ", ".join(f"{k} {v}" for k, v in r["error_kinds"].items())
        rows.append(
            [
                _num(r["target_index"], "{}"),
                _e(r["base_url"]),
                _num(r["n_scheduled"], "{}"),
                _num(r["sent"], "{}"),
                _num(r["completed"], "{}"),
                _num(r["failed"], "{}") + (f" ({_e(kinds)})" if kinds else ""),
                f"{_num(ttft['p50'])} / {_num(ttft['p99'])} (n={ttft['n']})",
                f"{_num(itl['p50'])} / {_num(itl['p99'])} (n={itl['n']})",
            ]
        )
    note = f"<p>{section['not_routed']} request(s) never routed (not dispatched).</p>" if section["not_routed"] else ""
    return [
        "<h2>Per replica</h2>",
        _table(
            ["#", "target", "routed", "sent", "completed", "failed", "TTFT p50 / p99 ms", "ITL p50 / p99 ms"], rows, 2
        )
        + note,
    ]


def render_html(analysis: Analysis) -> str:
    """The whole report as one HTML string."""
    a = analysis
    parts = _header(a) + _load_section(a) + _checks_section(a)
    fig = _cdf_figure(a)
    if fig:
        parts.append("<h2>Latency CDFs (dashed: budget limits)</h2>" + fig)
    groups = list(a.classes.values()) + ([a.overall] if len(a.classes) != 1 else [])
    parts += _class_sections(a, groups)
    if a.replicas:
        parts += _replica_section(a.replicas)
    fig = _timeline_figure(a)
    if fig:
        parts.append("<h2>Timeline</h2>" + fig)
    interactive = timeline_figure(a)
    if interactive is not None:
        parts.append("<h2>Timeline, interactive (drag to zoom, double-click to reset)</h2>" + _plotly(interactive))
    css = "" if a.stability.get("applied") else ' class="warn"'
    parts += ["<h2>Stability and Little's Law</h2>", f"<p{css}>{_e(stability_sentence(a.stability))}</p>"]
    parts += _warm_cold_section(a)
    if a.server:
        parts.append(
            "<h2>Server metrics</h2><pre>"
            + _e(
                json.dumps(
                    {k: v for k, v in a.server.items() if k not in ("timeseries", "names")}, indent=1, default=str
                )
            )
            + "</pre>"
        )
    fig = _token_figure(a)
    parts.append("<h2>Token lengths and accounting</h2>")
    if fig:
        parts.append(fig)
    parts.append(_token_table(groups))
    if a.notes:
        parts.append("<h2>Notes</h2><ul>" + "".join(f"<li>{_e(n)}</li>" for n in a.notes) + "</ul>")
    parts.append(
        "<h2>Definitions</h2>"
        + _table(
            ["name", "definition"],
            [[_e(k), f'<span style="text-align:left">{_e(v)}</span>'] for k, v in a.definitions.items()],
        )
    )
    parts.append("</body></html>")
    return "\n".join(parts)


def write_html(analysis: Analysis, path: Path | str) -> Path:
    """Write the self-contained HTML report to ``path``; returns the path."""
    path = Path(path)
    write_output_text(path, render_html(analysis))
    return path
