"""Interactive HTML pages (Plotly): one self-contained file, Plotly's script inlined, that opens without a network.

Used by the diff report, the plan's latency-throughput curves and the Pareto front of runs.
"""

from __future__ import annotations

import html
from typing import Any

__all__ = ["PAGE_STYLE", "plotly_html"]

PAGE_STYLE = (
    "body{font-family:sans-serif;margin:1.5em}table{border-collapse:collapse;font-size:13px}"
    "td,th{border:1px solid #ccc;padding:2px 6px;text-align:right}.regressed{background:#fdd}"
    ".improved{background:#dfd}"
)


def plotly_html(title: str, figures: list[tuple[str, Any]], table_html: str = "") -> str:
    """One self-contained page: Plotly's script once, then each (heading, figure)."""
    import plotly.io as pio  # deferred: only the HTML reports need Plotly

    body = []
    for i, (heading, fig) in enumerate(figures):
        fig_html = pio.to_html(fig, full_html=False, include_plotlyjs=(i == 0), config={"displaylogo": False})
        body.append(f"<h2>{html.escape(heading)}</h2>\n{fig_html}")
    return (
        f"<!doctype html>\n<html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
        f"<style>{PAGE_STYLE}</style></head><body>"
        f"<h1>{html.escape(title)}</h1>{table_html}{''.join(body)}</body></html>\n"
    )
