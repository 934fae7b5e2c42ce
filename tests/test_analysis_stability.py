"""Stability and Little's Law: applied over a steady run, refused (with the reason) when overloaded."""

from __future__ import annotations

import numpy as np
import pytest
from test_analysis_run import build_run

from loadgen.analysis import analyze_run
from loadgen.analysis.stability import assess_stability

S = 1_000_000_000


def _requests(sched_s, done_s):
    return [
        dict(
            request_id=f"q{i}",
            request_class="burst",
            scheduled_ns=int(s * S),
            sent_ns=int(s * S),
            first_token_ns=int(s * S) + 10_000_000,
            done_ns=int(d * S),
            status="ok",
        )
        for i, (s, d) in enumerate(zip(sched_s, done_s))
    ]


def test_stable_run_applies_littles_law(tmp_path):
    # 10 req/s for 60 s, each in the system 0.5 s → L = λW = 5
    sched = np.arange(600) / 10.0
    a = analyze_run(build_run(tmp_path / "r", _requests(sched, sched + 0.5)))
    st = a.stability
    assert st["applied"], st
    assert st["lambda_rps"] == pytest.approx(10, rel=0.01)
    assert st["W_s"] == pytest.approx(0.5)
    assert st["L"] == pytest.approx(5, rel=0.02) and st["lambda_W"] == pytest.approx(5, rel=0.02)
    assert st["relative_difference"] < 0.02


def test_overloaded_run_refuses_littles_law(tmp_path):
    # 10 req/s offered to a FIFO server that completes one request per 0.2 s (5 req/s): the queue grows
    sched = np.arange(600) / 10.0
    done, free = [], 0.0
    for s in sched:
        free = max(free, s) + 0.2
        done.append(free)
    a = analyze_run(build_run(tmp_path / "r", _requests(sched, np.array(done))))
    st = a.stability
    assert not st["applied"]
    assert "not steady" in st["reason"]
    assert st["completions"] < 0.7 * st["arrivals"]
    assert st["in_flight_end"] > st["in_flight_start"] + 100
    assert "L" not in st  # no numbers pretending the law holds
    assert a.overall.offered_rps == pytest.approx(10, rel=0.01)
    assert a.overall.completed_rps < 6  # offered and completed differ, reported apart


def test_growing_queue_with_balanced_counts_is_refused():
    # arrivals ≈ completions in count, but the number in system climbs steadily (times in system grow)
    sched = np.arange(2000) / 10.0
    tis = np.linspace(0.1, 20.0, len(sched))
    st = assess_stability(sched * S, (sched + tis) * S, 0.0, 200.0 * S)
    assert not st["applied"]


def test_too_few_arrivals_and_unfinished_requests_are_reasons():
    st = assess_stability(np.array([0.0, S]), np.array([0.5 * S, 1.5 * S]), 0.0, 2.0 * S)
    assert not st["applied"] and "arrivals" in st["reason"]
    sched = np.arange(200) / 10.0 * S
    done = sched + 0.3 * S
    done[100] = np.nan
    st = assess_stability(sched, done, 0.0, 20.0 * S)
    assert not st["applied"] and "never finished" in st["reason"]


def test_stability_sentence_when_lambda_w_is_zero():
    from loadgen.analysis.report_console import stability_sentence

    text = stability_sentence(
        {
            "applied": True,
            "interval_s": [0.0, 1.0],
            "L": 0.0,
            "lambda_rps": 0.0,
            "W_s": 0.1,
            "lambda_W": 0.0,
            "relative_difference": None,
        }
    )
    assert "no relative difference" in text
