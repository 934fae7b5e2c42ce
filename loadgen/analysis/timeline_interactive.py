"""The run timeline as an interactive Plotly figure (zoom, pan, hover) for the HTML report.

The same three panels as the report's static timeline, on one shared time axis with a range slider: offered,
sent, completed and failed rates per bin; every request's TTFT by class (failed ones marked at the top); and the
server's KV use, running and waiting requests (or, without server metrics, the client's in-flight count). The
TTFT scatter is the analysis' sample of at most ~4,000 requests, drawn as SVG (no WebGL needed).
"""

from __future__ import annotations

from typing import Any

from .model import Analysis

__all__ = ["timeline_figure"]


def _rates(fig: Any, go: Any, ts: dict[str, Any]) -> None:
    for key, name in (
        ("offered_rps", "offered (scheduled)"),
        ("send_rps", "sent"),
        ("completed_rps", "completed ok"),
        ("failed_rps", "failed"),
    ):
        fig.add_trace(go.Scatter(x=ts["t_s"], y=ts[key], name=name, line_shape="hv", legendgroup="rates"), row=1, col=1)


def _ttft(fig: Any, go: Any, a: Analysis) -> None:
    sc = a.plot_data.get("scatter", {})
    rows = list(zip(sc.get("t_s", []), sc.get("ttft_ms", []), sc.get("failed", []), sc.get("class", [])))
    for name in a.classes:
        pts = [(x, y) for x, y, f, c in rows if c == name and y is not None and not f]
        fig.add_trace(
            go.Scattergl(
                x=[p[0] for p in pts], y=[p[1] for p in pts], mode="markers", name=f"TTFT {name}", marker={"size": 4}
            ),
            row=2,
            col=1,
        )
    failed = [x for x, _, f, _ in rows if f]
    if failed:
        top = max((y for _, y, f, _ in rows if y is not None and not f), default=1.0) * 1.5
        fig.add_trace(
            go.Scatter(
                x=failed,
                y=[top] * len(failed),
                mode="markers",
                name="failed",
                marker={"symbol": "x", "color": "#d62728"},
            ),
            row=2,
            col=1,
        )


def _server(fig: Any, go: Any, a: Analysis) -> None:
    st = (a.server or {}).get("timeseries")
    if st and (st.get("kv_cache_usage") or st.get("running") or st.get("waiting")):
        if st.get("kv_cache_usage"):
            kv = [None if v is None else 100 * v for v in st["kv_cache_usage"]]
            fig.add_trace(go.Scatter(x=st["t_s"], y=kv, name="KV cache usage %"), row=3, col=1)
        for key in ("running", "waiting"):
            if st.get(key):
                fig.add_trace(go.Scatter(x=st["t_s"], y=st[key], name=key, line_shape="hv"), row=3, col=1)
        return
    ts = a.timeseries
    mids = [x + ts["bin_s"] / 2 for x in ts["t_s"]]
    fig.add_trace(go.Scatter(x=mids, y=ts["in_flight"], name="in flight (client side)"), row=3, col=1)


def timeline_figure(a: Analysis) -> Any | None:
    """The interactive timeline of an analysed run, or None when it has no time series."""
    ts = a.timeseries
    if not ts or not ts.get("t_s"):
        return None
    import plotly.graph_objects as go  # deferred: only the HTML report needs Plotly
    from plotly.subplots import make_subplots  # deferred: as above

    fig = make_subplots(rows=3, cols=1, shared_xaxes=True, vertical_spacing=0.04)
    _rates(fig, go, ts)
    _ttft(fig, go, a)
    _server(fig, go, a)
    fig.add_vrect(x0=a.window["start_s"], x1=a.window["end_s"], fillcolor="#999", opacity=0.08, line_width=0)
    fig.update_yaxes(title_text=f"req/s ({ts['bin_s']:g} s bins)", row=1, col=1)
    fig.update_yaxes(title_text="TTFT ms", type="log", row=2, col=1)
    fig.update_yaxes(title_text="KV % / requests", row=3, col=1)
    fig.update_xaxes(title_text="run clock, s", rangeslider={"visible": True, "thickness": 0.05}, row=3, col=1)
    fig.update_layout(height=820, margin={"t": 30}, legend={"font": {"size": 10}})
    return fig
