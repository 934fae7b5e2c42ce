"""The percentile rules live in ``analysis.percentiles``: linear (reports) and nearest rank (driver self-checks)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from loadgen.driver.schedule import LagStats
from loadgen.stats.percentiles import (
    NEAREST_RANK_RULE,
    PERCENTILE_RULE,
    percentile,
    percentile_nearest_rank,
)
from loadgen.trace.stats import trace_stats

ONE_TO_100 = np.arange(1, 101)


def test_the_two_rules_on_1_to_100():
    assert percentile(ONE_TO_100, 0.99) == 99.01  # linear: numpy's default
    assert percentile_nearest_rank(ONE_TO_100, 0.99) == 99  # an observed value
    assert percentile_nearest_rank(ONE_TO_100, 0.5) == 50 and percentile_nearest_rank(ONE_TO_100, 0.0) == 1
    assert percentile_nearest_rank(np.array([], np.int64), 0.5) is None
    assert "linear" in PERCENTILE_RULE and "nearest rank" in NEAREST_RANK_RULE
    assert type(percentile_nearest_rank(ONE_TO_100, 0.99)) is int


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.integers(0, 10**12), min_size=1, max_size=300),
    st.sampled_from([0.0, 0.01, 0.5, 0.9, 0.95, 0.99, 0.999, 1.0]),
)
def test_each_rule_is_numpys(values, q):
    arr = np.sort(np.asarray(values, dtype=np.int64))
    assert percentile_nearest_rank(arr, q) == np.quantile(arr, q, method="inverted_cdf")
    assert percentile(arr, q) == np.quantile(arr, q)


def test_send_lag_uses_nearest_rank():
    stats = LagStats()
    for v in np.random.default_rng(1).permutation(ONE_TO_100):
        stats.add(int(v))
    assert stats.summary() == {"p50": 50, "p99": 99, "max": 100, "n": 100}


def test_trace_stats_use_the_linear_rule():
    n = 100
    table = pa.table(
        {
            "scheduled_offset_ns": pa.array(range(n), pa.int64()),
            "prompt_tokens": pa.array(range(1, n + 1), pa.int32()),
            "output_tokens": pa.array([5] * n, pa.int32()),
            "request_class": ["c"] * n,
            "conversation_id": pa.array([None] * n, pa.string()),
            "prefix_group": pa.array([None] * n, pa.string()),
            "cancel_after_tokens": pa.array([None] * n, pa.int32()),
        }
    )
    assert trace_stats(table).prompt_tokens["p99"] == 99.01
