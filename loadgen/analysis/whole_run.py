"""Whole-run rates: the work a run did from its first scheduled request to its last one done.

The analysis window (the scheduled span) leaves out the drain after the last arrival; these rates
count it, so a target that finishes the same work later is not credited with work done outside the
window. Engine capacity (output tokens per second of engine busy time) comes from the server's
counters, their increase taken with resets by ``server.counter_increase``.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

from loadgen.analysis.server_metrics import GENERATION_TOKENS, SIM_BUSY_SECONDS, counter_increase
from loadgen.rundir.io import read_run_table
from loadgen.rundir.schema import REQUESTS_FILE, SERVER_METRICS_FILE, STATUS_OK

from . import metrics as M
from .metrics import NS_PER_S

__all__ = ["engine_busy_output_rate", "whole_run_rates"]

_COLUMNS = ["scheduled_ns", "done_ns", "status", "client_output_tokens", "server_output_tokens"]


def whole_run_rates(run_dir: Path | str) -> dict[str, float | None]:
    """Output tokens/s and ok requests/s from the first scheduled request to the last done, and that span (s).

    Output tokens are the server's count (usage) where present, else the client's. Every value is None
    when no request finished; the rates are None where the span measures no rate (``metrics.unmeasurable_rate``:
    one request, or a span shorter than its minimum).
    """
    table = read_run_table(run_dir, REQUESTS_FILE, _COLUMNS)  # five columns, reduced column-wise (no row objects)
    if table is None or table.num_rows == 0 or table.column("done_ns").null_count == table.num_rows:
        return {"output_tok_s_whole_run": None, "completed_rps_whole_run": None, "whole_run_s": None}
    span_s = (pc.max(table.column("done_ns")).as_py() - pc.min(table.column("scheduled_ns")).as_py()) / NS_PER_S
    rate_s = M.rate_window_s(span_s, table.num_rows)
    ok = table.filter(pc.equal(table.column("status"), STATUS_OK))
    best = pc.coalesce(ok.column("server_output_tokens"), ok.column("client_output_tokens"))
    tokens = pc.sum(best.cast(pa.int64())).as_py() or 0
    return {
        "output_tok_s_whole_run": M.tokens_per_s(tokens, rate_s),
        "completed_rps_whole_run": M.completed_rps(ok.num_rows, rate_s),
        "whole_run_s": span_s,
    }


def engine_busy_output_rate(run_dir: Path | str) -> float | None:
    """Output tokens per second of engine busy time over the run, from the server's counters.

    Only loadgen's simulated engine exports busy time (``loadgen_sim_busy_seconds_total``); both it and
    ``vllm:generation_tokens_total`` are counters, so their increase (resets handled) over the run is
    used. None without server metrics, without busy time, or with less busy time than a rate needs
    (``metrics.unmeasurable_rate``).
    """
    table = read_run_table(run_dir, SERVER_METRICS_FILE)
    if table is None:
        return None
    busy, tokens = counter_increase(table, SIM_BUSY_SECONDS), counter_increase(table, GENERATION_TOKENS)
    return M.tokens_per_s(tokens, M.rate_window_s(busy)) if tokens is not None else None
