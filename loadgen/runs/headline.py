"""The headline figures of one run, per class, as the run catalog holds them.

Read from the requests table alone (never the chunks), so indexing stays cheap: per class the scheduled,
ok and failed counts, TTFT, TPOT and E2E p50/p99 (ms, the analysis' percentile rule,
``loadgen.stats.percentiles``, over ok requests) and
the completed rate (ok requests per second of the run's scheduled span). They are a summary for finding runs,
not the analysis: ``loadgen analyze`` gives windows, intervals and budgets.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow.compute as pc

from loadgen.analysis import metrics as M
from loadgen.rundir.io import read_run_table
from loadgen.rundir.schema import REQUESTS_FILE
from loadgen.stats.percentiles import percentile_sorted

__all__ = ["HEADLINE_COLUMNS", "ClassHeadline", "headline_figures"]

_COLUMNS = [
    "request_class",
    "status",
    "scheduled_ns",
    "first_token_ns",
    "last_token_ns",
    "done_ns",
    "client_output_tokens",
    "server_output_tokens",
]


@dataclass(frozen=True)
class ClassHeadline:
    """One class of one run (``overall``: every class)."""

    request_class: str
    scheduled: int
    ok: int
    failed: int
    ttft_p50_ms: float | None
    ttft_p99_ms: float | None
    tpot_p50_ms: float | None
    tpot_p99_ms: float | None
    e2e_p50_ms: float | None
    e2e_p99_ms: float | None
    completed_rps: float | None


#: The catalog's ``classes`` columns, in order (the dataclass fields).
HEADLINE_COLUMNS = tuple(ClassHeadline.__dataclass_fields__)


def _p(values: np.ndarray, q: float) -> float | None:
    values = np.sort(values[~np.isnan(values)])
    return percentile_sorted(values, q) if len(values) else None


def _column(table: object, name: str) -> np.ndarray:
    col = table.column(name)  # type: ignore[attr-defined]
    return np.asarray(pc.fill_null(col.cast("float64"), np.nan), dtype=np.float64)


def headline_figures(run_dir: Path) -> list[ClassHeadline]:
    """Per class (sorted by name), then ``overall``; empty when the run has no requests table."""
    table = read_run_table(run_dir, REQUESTS_FILE, columns=_COLUMNS)
    if table is None or table.num_rows == 0:
        return []
    cls = np.asarray(table.column("request_class").to_pylist(), dtype=object)
    status = np.asarray(table.column("status").to_pylist(), dtype=object)
    sched, first, last, done = (
        _column(table, c) for c in ("scheduled_ns", "first_token_ns", "last_token_ns", "done_ns")
    )
    out_tokens = _column(table, "client_output_tokens")
    out_tokens = np.where(np.isnan(out_tokens), _column(table, "server_output_tokens"), out_tokens)
    span_s = (np.nanmax(sched) - np.nanmin(sched)) / M.NS_PER_S if len(sched) > 1 else None
    ttft, tpot, e2e = M.ttft_ms(sched, first), M.tpot_ms(first, last, out_tokens), M.e2e_ms(sched, done)
    ok = status == "ok"
    rows = []
    for name in [*sorted({str(c) for c in cls}), "overall"]:
        sel = np.ones(len(cls), bool) if name == "overall" else cls == name
        good = sel & ok
        n_ok = int(good.sum())
        rows.append(
            ClassHeadline(
                request_class=name,
                scheduled=int(sel.sum()),
                ok=n_ok,
                failed=int((sel & (status != "ok") & (status != "cancelled")).sum()),
                ttft_p50_ms=_p(ttft[good], 0.50),
                ttft_p99_ms=_p(ttft[good], 0.99),
                tpot_p50_ms=_p(tpot[good], 0.50),
                tpot_p99_ms=_p(tpot[good], 0.99),
                e2e_p50_ms=_p(e2e[good], 0.50),
                e2e_p99_ms=_p(e2e[good], 0.99),
                completed_rps=M.completed_rps(n_ok, span_s),
            )
        )
    return rows
