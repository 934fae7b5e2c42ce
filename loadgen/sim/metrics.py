"""Prometheus metrics of the simulated engine under vLLM's names (checked against vLLM 0.32 source).

Counters are exposed with the ``_total`` suffix as prometheus_client writes them
(``vllm:num_preemptions_total``), histograms with ``_bucket``/``_sum``/``_count``; labels are
``model_name`` and ``engine`` as in vLLM. The worksheet writes the same names into
``server_metrics.parquet`` (labels as sorted JSON), so a scraped and a simulated run look alike.
"""

from __future__ import annotations

import bisect
import json
from collections.abc import Iterable

import numpy as np

__all__ = [
    "TTFT_BUCKETS",
    "ITL_BUCKETS",
    "E2E_BUCKETS",
    "ITERATION_TOKENS_BUCKETS",
    "STEP_METRICS",
    "Histogram",
    "histogram_samples",
    "metric_labels_json",
    "format_value",
]

#: vLLM's default buckets (vllm/v1/metrics/buckets.py).
TTFT_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
    640.0,
    2560.0,
)
ITL_BUCKETS = (
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
)
E2E_BUCKETS = (
    0.3,
    0.5,
    0.8,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    40.0,
    50.0,
    60.0,
    120.0,
    240.0,
    480.0,
    960.0,
    1920.0,
    7680.0,
)
ITERATION_TOKENS_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)

#: Per-step samples the worksheet writes, as (exposition name, meaning).
STEP_METRICS = (
    ("vllm:num_requests_running", "requests running after the step (async scheduling: once the next is scheduled)"),
    ("vllm:num_requests_waiting", "requests waiting to be scheduled (async scheduling: once the next step is)"),
    (
        "vllm:kv_cache_usage_perc",
        "share of KV blocks held by requests (1 = 100%; async: once the next step is scheduled)",
    ),
    ("vllm:prefix_cache_queries_total", "prompt tokens looked up in the prefix cache (cumulative)"),
    ("vllm:prefix_cache_hits_total", "prompt tokens found in the prefix cache (cumulative)"),
    ("vllm:num_preemptions_total", "preemptions by recompute (cumulative)"),
    ("vllm:prompt_tokens_total", "prefill tokens computed, recompute included (cumulative)"),
    ("vllm:generation_tokens_total", "tokens generated (cumulative)"),
    ("loadgen_sim_step_prefill_tokens", "prefill tokens in the step's batch"),
    ("loadgen_sim_step_decode_seqs", "decoding sequences in the step's batch"),
    ("loadgen_sim_step_duration_seconds", "step duration from the cost model"),
    ("loadgen_sim_kv_blocks_used", "KV blocks held by running requests"),
)


def metric_labels_json(model: str, **extra: str) -> str:
    """Labels of one sample as sorted JSON (the server_metrics ``labels`` column)."""
    return json.dumps({"engine": "0", "model_name": model, **extra}, sort_keys=True)


def format_value(value: float) -> str:
    """Prometheus float text as prometheus_client writes it (1.0, 0.25, +Inf)."""
    if value == float("inf"):
        return "+Inf"
    return repr(float(value))


class Histogram:
    """A cumulative Prometheus histogram (per-bucket counts, sum, count)."""

    __slots__ = ("buckets", "counts", "sum", "count")

    def __init__(self, buckets: Iterable[float]) -> None:
        self.buckets = tuple(buckets)
        self.counts = [0] * (len(self.buckets) + 1)
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float, n: int = 1) -> None:
        self.counts[bisect.bisect_left(self.buckets, value)] += n
        self.sum += value * n
        self.count += n

    def lines(self, name: str, labels: str) -> list[str]:
        """Exposition lines; ``labels`` is the inner label text (``a="b",c="d"``)."""
        out = []
        acc = 0
        for le, c in zip(self.buckets + (float("inf"),), self.counts):
            acc += c
            out.append(f'{name}_bucket{{{labels},le="{format_value(le)}"}} {format_value(acc)}')
        out.append(f"{name}_sum{{{labels}}} {format_value(self.sum)}")
        out.append(f"{name}_count{{{labels}}} {format_value(self.count)}")
        return out


def histogram_samples(
    name: str, buckets: tuple[float, ...], data: np.ndarray, model: str
) -> list[tuple[str, str, float]]:
    """(sample name, labels JSON, value) of a histogram over ``data``, as one scrape would show it."""
    data = np.asarray(data, dtype=float)
    edges = np.asarray(buckets, dtype=float)
    # samples <= each edge: one pass over the data (sorting it costs more on millions of samples)
    cum = np.cumsum(np.bincount(np.searchsorted(edges, data, side="left"), minlength=len(edges) + 1))[: len(edges)]
    out = [(f"{name}_bucket", metric_labels_json(model, le=format_value(le)), float(c)) for le, c in zip(buckets, cum)]
    out.append((f"{name}_bucket", metric_labels_json(model, le="+Inf"), float(len(data))))
    out.append((f"{name}_sum", metric_labels_json(model), float(data.sum()) if len(data) else 0.0))
    out.append((f"{name}_count", metric_labels_json(model), float(len(data))))
    return out
