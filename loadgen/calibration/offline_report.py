"""The offline validation's outputs: the console table, the HTML page (tables and one overlay plot per run)."""

from __future__ import annotations

import base64
import html
import io
from typing import Any

__all__ = ["format_offline", "offline_html"]

_UNITS = {"throughput_rps": "req/s"}


def _num(value: Any, digits: int = 1) -> str:
    return "—" if value is None else f"{value:,.{digits}f}"


def _pct(value: Any) -> str:
    return "—" if value is None else f"{value:+.1f}%"


def _run_lines(run: dict[str, Any]) -> list[str]:
    lines = [f"run {run['name']}  ({run['run_dir']})"]
    lines += [f"  ENGINE DOES NOT MODEL THIS RUN: {m}" for m in run.get("mismatches") or []]
    settings = run["settings"]
    lines.append(
        "  settings: "
        + ", ".join(
            f"{k} {settings[k]} ({settings['source'].get(k, 'engine TOML')})" for k in settings if k != "source"
        )
    )
    lines.append(f"  {'figure':<16}{'measured':>12}{'predicted':>12}{'error':>9}{'theirs':>9}")
    for row in run["rows"]:
        unit = _UNITS.get(row["figure"], "ms")
        theirs = run["published"].get(row["figure"])
        error = _pct(row["signed_pct"]) if row["signed_pct"] is not None else f"{_num(row['diff'], 2)} {unit}"
        lines.append(
            f"  {row['figure']:<16}{_num(row['measured'], 2):>12}{_num(row['predicted'], 2):>12}{error:>9}"
            f"{_pct(theirs):>9}"
        )
    worst = run["worst"] or {}
    lines.append(
        f"  MPE {_pct(run['mpe_pct'])}  MAPE {_num(run['mape_pct'])}%  worst {worst.get('figure')} "
        f"{_pct(worst.get('signed_pct'))}"
    )
    if run["published"]:
        worst = max(run["published"].items(), key=lambda kv: abs(kv[1]))
        lines.append(f"  theirs (LLMServingSim, validation/summary.txt): worst {worst[0]} {worst[1]:+.1f}%")
    lines += [f"  note: {note}" for note in run["notes"]]
    return lines


def format_offline(result: dict[str, Any]) -> str:
    """The console table: per run, every figure measured, predicted, our signed error and theirs."""
    lines = [result["engine_label"], "ms unless stated; error = (predicted - measured) / measured"]
    if anchor := result.get("anchor"):
        lines.append(f"arrivals: {anchor['name']}: {anchor['means']}")
    for run in result["runs"]:
        lines += ["", *_run_lines(run)]
    if result["worst"]:
        w = result["worst"]
        lines += ["", f"worst over all runs: {w['figure']} {w['signed_pct']:+.1f}% ({w['run']})"]
    if any(run.get("mismatches") for run in result["runs"]):
        lines.append("not recorded in the engine TOML: the engine does not model every run's deployment (above)")
    return "\n".join(lines)


def _plot_png(run: dict[str, Any]) -> str | None:
    """The running / waiting / KV-use overlay of one run as a base64 PNG (None without series)."""
    series = run["series"]
    if not series:
        return None
    import matplotlib  # why: heavy, and only the HTML page draws

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # why: as above

    fig, axes = plt.subplots(len(series), 1, figsize=(8, 2.4 * len(series)), sharex=True, squeeze=False)
    for ax, (label, s) in zip(axes[:, 0], series.items(), strict=True):
        ax.plot(s["t_s"], s["measured"], label="measured", color="black")
        if s["predicted"]:
            ax.plot(s["t_s"], s["predicted"], label="predicted", color="tab:orange", linestyle="--")
        ax.set_ylabel(label)
        ax.legend(loc="upper right", fontsize=8)
    axes[-1, 0].set_xlabel("s from the workload's zero")
    fig.suptitle(run["name"])
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90)
    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode()


def offline_html(result: dict[str, Any]) -> str:
    """A standalone page: each run's table (with the published simulator's errors as theirs) and plot."""
    parts = [
        "<!doctype html><meta charset='utf-8'><title>loadgen sim validate --measured</title>",
        f"<h1>{html.escape(result['engine_label'])}</h1><p>{html.escape(result['definitions'])}</p>",
    ]
    if anchor := result.get("anchor"):
        parts.append(f"<p><b>arrivals: {html.escape(anchor['name'])}</b>: {html.escape(anchor['means'])}</p>")
    for run in result["runs"]:
        parts.append(f"<h2>{html.escape(run['name'])}</h2>")
        parts.append(
            "<table border='1' cellpadding='3'><tr><th>figure</th><th>measured</th><th>predicted</th>"
            "<th>signed error</th><th>|error|</th><th>theirs (LLMServingSim)</th></tr>"
        )
        for row in run["rows"]:
            cells = [
                row["figure"],
                _num(row["measured"], 2),
                _num(row["predicted"], 2),
                _pct(row["signed_pct"]),
                _num(row["abs_pct"]),
                _pct(run["published"].get(row["figure"])),
            ]
            parts.append("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in cells) + "</tr>")
        parts.append(
            f"</table><p>MPE {_pct(run['mpe_pct'])}, MAPE {_num(run['mape_pct'])}%; "
            + html.escape("; ".join(run["notes"]))
            + "</p>"
        )
        for mismatch in run.get("mismatches") or []:
            parts.append(f"<p><strong>The engine does not model this run:</strong> {html.escape(mismatch)}</p>")
        png = _plot_png(run)
        if png:
            parts.append(
                f"<img alt='running, waiting, KV use: measured vs predicted' src='data:image/png;base64,{png}'>"
            )
    return "\n".join(parts)
