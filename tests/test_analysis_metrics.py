"""Metric formulas and the percentile rule: hand-worked answers and hypothesis laws."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loadgen.analysis import metrics as M
from loadgen.stats.percentiles import PERCENTILE_RULE, SortedParts, percentile, summarize, summarize_parts

MS = 1_000_000


def test_ttft_parts_hand_worked():
    # scheduled 0, sent 5 ms, first token 55 ms → TTFT 55, client queue 5, server side 50
    assert M.ttft_ms(0, 55 * MS) == 55
    assert M.client_queue_ms(0, 5 * MS) == 5
    assert M.server_ttft_ms(5 * MS, 55 * MS) == 50
    assert M.e2e_ms(0, 120 * MS) == 120
    assert M.ttft_ms(0, None) is None and M.e2e_ms(0, None) is None


def test_multi_token_chunk_gives_k_gaps_and_one_stall():
    # a 3-token chunk 30 ms after the previous chunk → three 10 ms ITL gaps and one 30 ms stall
    arrivals, tokens = [0, 30 * MS], [1, 3]
    assert M.itl_gaps_ms(arrivals, tokens) == [10.0, 10.0, 10.0]
    assert M.inter_chunk_gaps_ms(arrivals, tokens) == [30.0]


def test_first_chunk_extra_tokens_are_zero_gaps_and_empty_chunks_ignored():
    assert M.itl_gaps_ms([0, 20 * MS, 21 * MS], [2, 2, 0]) == [0.0, 10.0, 10.0]
    assert M.inter_chunk_gaps_ms([0, 20 * MS, 21 * MS], [2, 2, 0]) == [20.0]
    assert M.itl_gaps_ms([], []) == [] and M.itl_gaps_ms([5], [0]) == []


def test_tpot_undefined_for_one_token():
    assert M.tpot_ms(10 * MS, 10 * MS, 1) is None
    assert M.tpot_ms(10 * MS, 40 * MS, 4) == 10
    assert M.tpot_ms(10 * MS, None, 4) is None
    arr = M.tpot_ms(np.array([0.0, 0.0]), np.array([30e6, 0.0]), np.array([4.0, 1.0]))
    assert arr[0] == 10 and math.isnan(arr[1])


def test_rates_and_shares_undefined_cases():
    assert M.offered_rps(10, 2.0) == 5 and M.offered_rps(10, 0) is None and M.send_rps(3, None) is None
    assert M.attainment(0, 0) is None and M.attainment(3, 4) == 0.75
    assert M.error_share(1, 100) == 0.01 and M.error_share(0, 0) is None
    assert M.littles_law_rhs(10.0, 0.5) == 5.0 and M.littles_law_rhs(None, 1.0) is None


def test_time_average_in_system():
    # two requests: [0, 2) s and [1, 3) s over [0, 4) → (2 + 2) / 4 = 1 in system on average
    s = M.NS_PER_S
    assert M.time_average_in_system(np.array([0, s]), np.array([2 * s, 3 * s]), 0, 4 * s) == 1.0
    # never done counts up to the end of the interval
    assert M.time_average_in_system(np.array([0.0]), np.array([np.nan]), 0, 4 * s) == 1.0


def test_percentile_rule_is_numpy_linear_and_named():
    values = list(range(1, 101))  # 1..100 ms
    assert percentile(values, 0.99) == pytest.approx(99.01)  # nearest rank would say 99
    assert percentile(values, 0.99) == np.percentile(values, 99)
    assert "linear" in PERCENTILE_RULE
    s = summarize(values)
    assert (s["p50"], s["n"], s["max"], s["p99_low_sample"]) == (50.5, 100, 100, False)
    assert summarize(values[:99])["p99_low_sample"] is True


def test_empty_sample_is_none_not_zero():
    s = summarize([])
    assert s == {
        "p50": None,
        "p95": None,
        "p99": None,
        "mean": None,
        "max": None,
        "n": 0,
        "p99_low_sample": True,
        "ci": {"p50": None, "p95": None, "p99": None},
        "ci_level": 0.95,
    }


def test_infinite_failures_reach_the_tail():
    s = summarize([10.0] * 98 + [math.inf] * 2)
    assert s["p50"] == 10 and math.isinf(s["p99"]) and math.isinf(s["max"])
    assert summarize([10.0] * 999 + [math.inf])["p99"] == 10


finite = st.floats(min_value=0, max_value=1e7, allow_nan=False, allow_infinity=False)


@given(st.lists(finite, min_size=1, max_size=300), st.randoms(use_true_random=False))
def test_law_quantiles_ordered_and_shuffle_invariant(values, rnd):
    s = summarize(values)
    assert s["p50"] <= s["p95"] <= s["p99"] <= s["max"]
    shuffled = list(values)
    rnd.shuffle(shuffled)
    assert summarize(shuffled) == s
    for q in (0.5, 0.95, 0.99):
        assert percentile(values, q) == pytest.approx(float(np.percentile(values, q * 100)), rel=1e-12, abs=1e-9)


def _assert_close(got, want) -> None:
    """Equal structure; numbers equal within float summation noise (intervals are nested lists, None is None)."""
    if isinstance(want, dict):
        assert set(got) == set(want)
        for key, value in want.items():
            _assert_close(got[key], value)
    elif isinstance(want, list):
        assert isinstance(got, list) and len(got) == len(want)
        for a, b in zip(got, want, strict=True):
            _assert_close(a, b)
    elif want is None or isinstance(want, bool):
        assert got is want
    else:
        assert got == pytest.approx(want, rel=1e-12, abs=1e-9)


@given(st.lists(st.lists(finite, max_size=60), min_size=1, max_size=4))
def test_law_sorted_parts_equal_one_sorted_sample(parts):
    arrays = [np.sort(np.array(p, dtype=np.float64)) for p in parts]
    whole = summarize(np.concatenate(arrays))
    split = summarize_parts(arrays)
    _assert_close(split, whole)
    if len(whole) and whole["n"]:
        assert SortedParts(arrays).kth(whole["n"] - 1) == whole["max"]


@given(
    st.lists(st.lists(finite, min_size=1, max_size=40), min_size=2, max_size=4),
    st.lists(
        st.lists(st.integers(min_value=-(2**62), max_value=2**62), min_size=1, max_size=40), min_size=2, max_size=4
    ),
)
def test_law_kth_many_is_kth_of_every_rank(float_parts, int_parts):
    """The vectorised search (CDF points, prefetched summary ranks) gives exactly what one search per rank gives,
    for floats of either sign and for int64 values across the whole range, also for parts spilled to disk."""
    for parts in (float_parts, int_parts):
        dtype = np.float64 if parts is float_parts else np.int64
        arrays = [np.sort(np.array(p, dtype=dtype)) for p in parts]
        sp = SortedParts(arrays)
        ranks = np.arange(sp.n)
        assert sp.kth_many(ranks).tolist() == [sp.kth(int(r)) for r in ranks]
        assert sp.kth_many(ranks).tolist() == np.sort(np.concatenate(arrays)).tolist()


def test_kth_many_over_runs_on_disk(tmp_path):
    from loadgen.analysis.spill import _BLOCK, RunFile

    rng = np.random.default_rng(5)
    runs = [np.sort(rng.normal(0, 100, n)) for n in (3 * _BLOCK + 7, _BLOCK, 5)]
    for i, run in enumerate(runs):
        run.tofile(tmp_path / f"run{i}")  # the raw ascending values, as SortedRuns spills them
    files = [RunFile(tmp_path / f"run{i}", run) for i, run in enumerate(runs)]
    try:
        ranks = np.unique(rng.integers(0, sum(map(len, runs)), 300))
        on_disk = SortedParts(files).kth_many(ranks)
        assert on_disk.tolist() == np.sort(np.concatenate(runs))[ranks].tolist()
        assert on_disk.tolist() == [SortedParts(files).kth(int(r)) for r in ranks]
    finally:
        for f in files:
            f.close()


def test_kth_many_over_long_ties_in_memory_and_on_disk(tmp_path):
    """Runs of equal values many blocks long (zero gaps, whole-ms gaps), in parts longer than the sample stride,
    in memory and on disk: every rank, the ends of each tie included, is the element one sorted array has there."""
    from loadgen.analysis.spill import _BLOCK, RunFile

    rng = np.random.default_rng(11)
    runs = [
        np.sort(np.concatenate([np.zeros(5 * _BLOCK + 3), rng.integers(1, 4, 4 * _BLOCK).astype(float)])),
        np.sort(np.concatenate([np.zeros(2 * _BLOCK), rng.exponential(2.0, 3 * _BLOCK + 11)])),
        np.sort(rng.integers(0, 3, 6 * _BLOCK + 1).astype(float)),
        np.array([0.0, 2.0, 2.0, 7.5]),
    ]
    whole = np.sort(np.concatenate(runs))
    for i, run in enumerate(runs[:2]):
        run.tofile(tmp_path / f"run{i}")
    files = [RunFile(tmp_path / f"run{i}", run) for i, run in enumerate(runs[:2])]
    try:
        ranks = np.unique(
            np.concatenate([rng.integers(0, len(whole), 1500), edges := np.flatnonzero(np.diff(whole)), edges + 1])
        )
        ranks = ranks[ranks < len(whole)]
        for parts in (runs, files + runs[2:]):
            assert SortedParts(parts).kth_many(ranks).tolist() == whole[ranks].tolist()
    finally:
        for f in files:
            f.close()


chunk = st.tuples(st.integers(min_value=0, max_value=10**9), st.integers(min_value=0, max_value=8))


@given(st.integers(min_value=0, max_value=10**12), st.lists(chunk, min_size=1, max_size=40))
@settings(max_examples=200)
def test_law_gaps_sum_to_last_minus_first_token(start, chunks):
    arrivals, t = [], start
    for gap, _ in chunks:
        t += gap
        arrivals.append(t)
    tokens = [k for _, k in chunks]
    gaps = M.itl_gaps_ms(arrivals, tokens)
    content = [(a, k) for a, k in zip(arrivals, tokens) if k > 0]
    if not content:
        assert gaps == []
        return
    n_tokens = sum(k for _, k in content)
    assert len(gaps) == n_tokens - 1
    span_ms = (content[-1][0] - content[0][0]) / MS
    assert sum(gaps) == pytest.approx(span_ms, rel=1e-9, abs=1e-6)
    tpot = M.tpot_ms(content[0][0], content[-1][0], n_tokens)
    if n_tokens > 1:
        assert float(np.mean(gaps)) == pytest.approx(tpot, rel=1e-9, abs=1e-9)
    assert sum(M.inter_chunk_gaps_ms(arrivals, tokens)) == pytest.approx(span_ms, rel=1e-9, abs=1e-6)


def test_vectorised_and_scalar_formulas_agree():
    rng = random.Random(3)
    sched = [rng.randrange(0, 10**10) for _ in range(50)]
    first = [s + rng.randrange(0, 10**9) for s in sched]
    vec = M.ttft_ms(np.array(sched, dtype=float), np.array(first, dtype=float))
    assert [M.ttft_ms(s, f) for s, f in zip(sched, first)] == pytest.approx(list(vec))
