"""Whole-run rates: the work a run did from its first scheduled request to its last one done.

The analysis window (the scheduled span) leaves out the drain after the last arrival; these rates
count it, so a target that finishes the same work later is not credited with work done outside the
window. Engine capacity (output tokens per second of engine busy time) comes from the server's
counters, their increase taken with resets by ``server.counter_increase``.
"""

from __future__ import annotations

from pathlib import Path

from ..records import REQUESTS_FILE, SERVER_METRICS_FILE, STATUS_OK
from ..rundir import read_run_table
from . import metrics as M
from .metrics import NS_PER_S
from .server import GENERATION_TOKENS, SIM_BUSY_SECONDS, counter_increase

__all__ = ["engine_busy_output_rate", "whole_run_rates"]

_COLUMNS = ["scheduled_ns", "done_ns", "status", "client_output_tokens", "server_output_tokens"]


def whole_run_rates(run_dir: Path | str) -> dict[str, float | None]:
    """Output tokens/s and ok requests/s from the first scheduled request to the last done, and that span (s).

    Output tokens are the server's count (usage) where present, else the client's. Every value is None
    when no request finished; the rates are None for an empty span.
    """
    table = read_run_table(run_dir, REQUESTS_FILE, _COLUMNS)
    rows = table.to_pylist() if table is not None else []
    ok = [r for r in rows if r["status"] == STATUS_OK]
    done = [r["done_ns"] for r in rows if r["done_ns"] is not None]
    if not rows or not done:
        return {"output_tok_s_whole_run": None, "completed_rps_whole_run": None, "whole_run_s": None}
    span_s = (max(done) - min(r["scheduled_ns"] for r in rows)) / NS_PER_S
    tokens = sum(
        (r["server_output_tokens"] if r["server_output_tokens"] is not None else r["client_output_tokens"] or 0)
        for r in ok
    )
    return {
        "output_tok_s_whole_run": M.tokens_per_s(tokens, span_s),
        "completed_rps_whole_run": M.completed_rps(len(ok), span_s),
        "whole_run_s": span_s,
    }


def engine_busy_output_rate(run_dir: Path | str) -> float | None:
    """Output tokens per second of engine busy time over the run, from the server's counters.

    Only loadgen's simulated engine exports busy time (``loadgen_sim_busy_seconds_total``); both it and
    ``vllm:generation_tokens_total`` are counters, so their increase (resets handled) over the run is
    used. None without server metrics, without busy time, or with no busy time spent.
    """
    table = read_run_table(run_dir, SERVER_METRICS_FILE)
    if table is None:
        return None
    busy, tokens = counter_increase(table, SIM_BUSY_SECONDS), counter_increase(table, GENERATION_TOKENS)
    return tokens / busy if busy and tokens is not None and busy > 0 else None
