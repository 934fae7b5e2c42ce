"""Server metrics joined on the run clock: KV usage, running/waiting, preemptions, prefix hits, batches.

Names are vLLM's; counters are accepted with and without the ``_total`` suffix, and the older
``gpu_cache_usage_perc`` / ``gpu_prefix_cache_hit_rate`` gauges are used when the newer ones are
absent. Gauges with several label sets are summed (running, waiting) or maxed (KV usage) per scrape;
counters are increases over the window (resets handled), summed over label sets. ``counter_increase``
is that increase for one counter over a whole run, for callers outside the window summary.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pyarrow as pa

from loadgen.analysis.metrics import NS_PER_S

__all__ = [
    "GENERATION_TOKENS",
    "KV_USAGE",
    "RUNNING",
    "SIM_BUSY_SECONDS",
    "WAITING",
    "counter_increase",
    "summarize_server_metrics",
]

KV_USAGE = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")
RUNNING = ("vllm:num_requests_running",)
WAITING = ("vllm:num_requests_waiting",)
PREEMPTIONS = ("vllm:num_preemptions", "vllm:num_preemptions_total")
PREFIX_QUERIES = ("vllm:prefix_cache_queries", "vllm:prefix_cache_queries_total")
PREFIX_HITS = ("vllm:prefix_cache_hits", "vllm:prefix_cache_hits_total")
PREFIX_HIT_RATE_GAUGE = ("vllm:gpu_prefix_cache_hit_rate",)
ITERATION_TOKENS = ("vllm:iteration_tokens_total", "vllm:iteration_tokens")
RSS = ("process_resident_memory_bytes",)
GENERATION_TOKENS = ("vllm:generation_tokens_total",)
#: Modelled engine busy time, exported by loadgen's simulated engine only (real engines do not say).
SIM_BUSY_SECONDS = ("loadgen_sim_busy_seconds_total",)


def _first_present(frames: dict[str, Any], names: tuple[str, ...]) -> tuple[str, Any] | None:
    for name in names:
        if name in frames:
            return name, frames[name]
    return None


def _gauge(df: Any, how: str) -> Any:
    """Per-scrape aggregate over label sets → Series indexed by time_ns."""
    # one value per label set and instant (the highest sampled): several samples of one label set at one instant
    # (zero-length engine steps) are readings of one gauge, not several label sets to add up
    per_set = df.groupby(["time_ns", "labels"], sort=True)["value"].max()
    g = per_set.groupby(level="time_ns")
    return g.sum() if how == "sum" else g.max()


def _counter_increase(df: Any) -> float:
    """Increase of a counter over the samples, per label set (a drop is a reset), summed."""
    total = 0.0
    for _, s in df.sort_values("time_ns").groupby("labels")["value"]:
        v = s.to_numpy()
        if len(v) < 2:
            continue
        d = np.diff(v)
        total += float(np.where(d < 0, v[1:], d).sum())
    return total


def counter_increase(table: pa.Table | None, names: tuple[str, ...]) -> float | None:
    """Increase of the first counter of ``names`` present, over every sample of ``table``.

    Per label set, a drop is a reset (the value after it is the increase since the reset); the label
    sets are summed. None when no sample has one of ``names`` or no label set was sampled twice.
    """
    if table is None or table.num_rows == 0:
        return None
    df = table.to_pandas()
    frames = {name: g for name, g in df[df["name"].isin(names)].groupby("name")}
    found = _first_present(frames, names)
    if found is None or not (found[1].groupby("labels").size() >= 2).any():
        return None
    return _counter_increase(found[1])


def summarize_server_metrics(table: pa.Table | None, lo_ns: float, hi_ns: float) -> dict[str, Any] | None:
    """Summary and time series of scraped samples inside [lo, hi]; None when the run has none."""
    if table is None or table.num_rows == 0:
        return None
    df = table.to_pandas()
    df = df[(df["time_ns"] >= lo_ns) & (df["time_ns"] <= hi_ns)]
    if df.empty:
        return {"samples": 0, "note": "no server metric samples inside the window"}
    frames = {name: g for name, g in df.groupby("name")}
    out: dict[str, Any] = {"samples": len(df), "names": sorted(frames)}
    series: dict[str, Any] = {}
    found = _first_present(frames, KV_USAGE)
    if found:
        s = _gauge(found[1], "max")
        out["kv_cache_usage"] = {"metric": found[0], "peak": float(s.max()), "mean": float(s.mean())}
        series["kv_cache_usage"] = s
    for key, names in (("running", RUNNING), ("waiting", WAITING)):
        found = _first_present(frames, names)
        if found:
            s = _gauge(found[1], "sum")
            out[key] = {"metric": found[0], "max": float(s.max()), "mean": float(s.mean())}
            series[key] = s
    found = _first_present(frames, PREEMPTIONS)
    if found:
        out["preemptions"] = {"metric": found[0], "increase": _counter_increase(found[1])}
    q, h = _first_present(frames, PREFIX_QUERIES), _first_present(frames, PREFIX_HITS)
    if q and h:
        dq, dh = _counter_increase(q[1]), _counter_increase(h[1])
        out["prefix_cache"] = {"queries": dq, "hits": dh, "hit_rate": (dh / dq) if dq > 0 else None}
    else:
        found = _first_present(frames, PREFIX_HIT_RATE_GAUGE)
        if found:
            s = _gauge(found[1], "max")
            out["prefix_cache"] = {"metric": found[0], "hit_rate": float(s.iloc[-1]), "mean_hit_rate": float(s.mean())}
    for base in ITERATION_TOKENS:
        if base + "_sum" in frames and base + "_count" in frames:
            ds, dc = _counter_increase(frames[base + "_sum"]), _counter_increase(frames[base + "_count"])
            out["batch_tokens_per_step"] = {"metric": base, "steps": dc, "mean": (ds / dc) if dc > 0 else None}
            break
    found = _first_present(frames, RSS)
    if found:
        out["process_rss_peak_bytes"] = float(_gauge(found[1], "sum").max())
    if "vllm:cache_config_info" in frames:
        labels = json.loads(frames["vllm:cache_config_info"]["labels"].iloc[-1])
        blocks = labels.get("num_gpu_blocks")
        out["cache_config"] = labels
        if blocks and "kv_cache_usage" in out:
            try:
                out["kv_cache_usage"]["peak_blocks"] = float(blocks) * out["kv_cache_usage"]["peak"]
            except ValueError:
                pass
    if series:
        times = sorted(set().union(*[set(s.index) for s in series.values()]))
        ts: dict[str, Any] = {"t_s": [t / NS_PER_S for t in times]}
        for key, s in series.items():
            s = s.reindex(times)
            ts[key] = [None if np.isnan(v) else float(v) for v in s.to_numpy(dtype=np.float64)]
        out["timeseries"] = ts
    return out
