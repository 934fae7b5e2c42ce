"""Hand-built run directories with answers worked out by hand (times in ms below; files hold ns)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from loadgen.analysis import analyze_run
from loadgen.analysis import metrics as M
from loadgen.rundir.io import RunWriter
from loadgen.rundir.manifest import Manifest
from loadgen.rundir.schema import empty_request_row
from loadgen.workload.scenario import parse_scenario, scenario_manifest

MS = 1_000_000


def build_run(
    run_dir: Path,
    requests: list[dict[str, Any]],
    chunks: list[tuple[str, int, int, int]] = (),
    *,
    scenario: Any = None,
    metrics: list[tuple[int, str, dict, float]] = (),
    manifest: dict[str, Any] | None = None,
) -> Path:
    """Write a run directory: request rows (missing columns null), chunk rows
    ``(request_id, seq, arrival_ns, tokens)`` in the given order, server metric samples."""
    m = {
        "run_kind": "simulated",
        "target": {"kind": "sim", "model": "test"},
        "scenario": scenario_manifest(scenario) if scenario is not None else None,
        "warm_state": {"state": "warm", "actions": []},
    }
    m.update(manifest or {})
    with RunWriter(run_dir, Manifest.model_validate(m), flush_rows=3) as w:
        for r in requests:
            row = {"target_prompt_tokens": 10, "target_output_tokens": 5, **r}
            w.add_request(empty_request_row(**row))
        if chunks:
            w.add_chunks(
                {
                    "request_id": [c[0] for c in chunks],
                    "seq": [c[1] for c in chunks],
                    "arrival_ns": [c[2] for c in chunks],
                    "tokens": [c[3] for c in chunks],
                    "bytes": [100] * len(chunks),
                }
            )
        if metrics:
            w.add_metrics(
                {
                    "time_ns": [s[0] for s in metrics],
                    "name": [s[1] for s in metrics],
                    "labels": [json.dumps(s[2], sort_keys=True) for s in metrics],
                    "value": [s[3] for s in metrics],
                }
            )
    return run_dir


def scenario_two_classes() -> Any:
    data = {
        "name": "known",
        "seed": 1,
        "classes": {
            "short-message": {
                "share": 0.5,
                "input_tokens": {"dist": "fixed", "value": 10},
                "output_tokens": {"dist": "fixed", "value": 5},
                "budgets": {
                    "ttft_ms": {"p50": 100, "p99": 200, "hard": True},
                    "itl_ms": {"p99": 20, "hard": True},
                    "e2e_ms": {"p99": 1000, "hard": False},
                },
            },
            "burst": {
                "share": 0.5,
                "input_tokens": {"dist": "fixed", "value": 10},
                "output_tokens": {"dist": "fixed", "value": 5},
                "budgets": {"ttft_ms": {"p99": 500, "hard": True}},
            },
        },
        "traces": {"t": {"process": "poisson", "rate_rps": 1, "duration_s": 1}},
    }
    return parse_scenario(data)


def known_requests() -> list[dict[str, Any]]:
    sm, b = "short-message", "burst"
    return [
        # r1: ok, 3 content chunks (1, 1, 3 tokens) + a usage-only chunk
        dict(
            request_id="r1",
            request_class=sm,
            scheduled_ns=0,
            sent_ns=5 * MS,
            first_token_ns=55 * MS,
            last_token_ns=95 * MS,
            done_ns=100 * MS,
            status="ok",
            client_output_tokens=5,
            server_output_tokens=5,
            server_prompt_tokens=10,
            client_prompt_tokens=10,
        ),
        # r2: ok, first chunk carries 2 tokens
        dict(
            request_id="r2",
            request_class=sm,
            scheduled_ns=100 * MS,
            sent_ns=100 * MS,
            first_token_ns=180 * MS,
            last_token_ns=200 * MS,
            done_ns=210 * MS,
            status="ok",
            client_output_tokens=3,
            server_output_tokens=4,
            target_output_tokens=3,
            server_prompt_tokens=10,
            client_prompt_tokens=10,
        ),
        dict(
            request_id="r3",
            request_class=sm,
            scheduled_ns=200 * MS,
            sent_ns=200 * MS,
            done_ns=250 * MS,
            status="error",
            error_kind="http_5xx",
            http_status=503,
        ),
        # r4: planned abandonment after 2 tokens
        dict(
            request_id="r4",
            request_class=sm,
            scheduled_ns=300 * MS,
            sent_ns=301 * MS,
            first_token_ns=340 * MS,
            last_token_ns=350 * MS,
            done_ns=351 * MS,
            status="cancelled",
            cancel_after_tokens=2,
            client_output_tokens=2,
        ),
        dict(request_id="r5", request_class=sm, scheduled_ns=400 * MS, status="not_sent", error_kind="run_interrupted"),
        dict(
            request_id="r6",
            request_class=b,
            scheduled_ns=50 * MS,
            sent_ns=50 * MS,
            first_token_ns=150 * MS,
            last_token_ns=150 * MS,
            done_ns=160 * MS,
            status="ok",
            client_output_tokens=1,
            server_output_tokens=1,
        ),
        dict(
            request_id="r7",
            request_class=b,
            scheduled_ns=150 * MS,
            sent_ns=150 * MS,
            done_ns=1150 * MS,
            status="timeout",
            error_kind="ttft_timeout",
        ),
    ]


def known_chunks() -> list[tuple[str, int, int, int]]:
    # grouped per request but not in request order (writers append in completion order)
    return [
        ("r6", 0, 150 * MS, 1),
        ("r1", 0, 55 * MS, 1),
        ("r1", 1, 65 * MS, 1),
        ("r1", 2, 95 * MS, 3),
        ("r1", 3, 99 * MS, 0),
        ("r2", 0, 180 * MS, 2),
        ("r2", 1, 200 * MS, 1),
        ("r4", 0, 340 * MS, 1),
        ("r4", 1, 350 * MS, 1),
    ]


@pytest.fixture
def known(tmp_path):
    run = build_run(tmp_path / "run", known_requests(), known_chunks(), scenario=scenario_two_classes())
    return analyze_run(run)


def approx(x: float) -> Any:
    return pytest.approx(x, rel=1e-12, abs=1e-9)


def test_ttft_and_parts_known_answers(known):
    sm = known.classes["short-message"].metrics
    # ok + abandoned: r1 55, r2 80, r4 40
    assert sm["ttft_ms"]["n"] == 3
    assert sm["ttft_ms"]["p50"] == approx(55)
    assert sm["ttft_ms"]["p95"] == approx(77.5)  # h = 1.9 → 55 + 0.9·25
    assert sm["ttft_ms"]["p99"] == approx(79.5)
    assert sm["ttft_ms"]["mean"] == approx(175 / 3)
    assert sm["ttft_ms"]["max"] == approx(80)
    assert sm["ttft_ms"]["p99_low_sample"] is True
    assert sorted([sm["client_queue_ms"]["p50"], sm["client_queue_ms"]["max"]]) == [approx(1), approx(5)]
    assert sm["server_ttft_ms"]["max"] == approx(80) and sm["server_ttft_ms"]["p50"] == approx(50)


def test_itl_per_token_and_inter_chunk_known_answers(known):
    sm = known.classes["short-message"].metrics
    # r1: [10] + 3×[10]; r2: first chunk of 2 → one 0 gap, then [20]; r4: [10]
    assert sm["itl_ms"]["n"] == 7
    assert sm["itl_ms"]["mean"] == approx(10)
    assert sm["itl_ms"]["p50"] == approx(10)
    assert sm["itl_ms"]["max"] == approx(20)
    assert sm["itl_ms"]["p99"] == approx(19.4)  # h = 5.94 between 10 and 20
    # raw stalls: r1 10, 30; r2 20; r4 10 (the usage-only chunk is not content)
    assert sm["inter_chunk_ms"]["n"] == 4
    assert sm["inter_chunk_ms"]["max"] == approx(30)
    assert sm["inter_chunk_ms"]["mean"] == approx(17.5)
    assert sm["tpot_ms"]["n"] == 3 and sm["tpot_ms"]["p50"] == approx(10) and sm["tpot_ms"]["max"] == approx(10)
    burst = known.classes["burst"].metrics
    assert burst["tpot_ms"]["n"] == 0 and burst["tpot_ms"]["p50"] is None  # one token → undefined, not 0
    assert burst["itl_ms"]["n"] == 0 and burst["itl_ms"]["mean"] is None


def test_e2e_ok_only_and_status_counts(known):
    sm = known.classes["short-message"]
    assert sm.metrics["e2e_ms"]["n"] == 2 and sm.metrics["e2e_ms"]["p50"] == approx(105)
    assert sm.status_counts == {"ok": 2, "error": 1, "timeout": 0, "cancelled": 1, "not_sent": 1}
    assert sm.abandoned == 1
    assert sm.error_kinds == {"http_5xx": 1, "run_interrupted": 1}
    assert sum(known.overall.status_counts.values()) == known.overall.n_scheduled == 7
    assert known.classes["burst"].error_kinds == {"ttft_timeout": 1}


def test_rates_are_three_separate_numbers(known):
    window_s = 0.4 + 0.4 / 6  # first arrival to one mean gap after the last
    assert known.window["duration_s"] == approx(window_s)
    o = known.overall
    assert o.offered_rps == approx(7 / window_s)
    assert o.send_rps == approx(6 / window_s)
    assert o.completed_rps == approx(3 / window_s)  # r1, r2, r6 finished ok inside the window
    assert o.output_tok_s == approx((5 + 4 + 1) / window_s)  # server usage preferred
    assert o.prompt_tok_s == approx((10 + 10 + 10) / window_s)


def test_budget_checks_count_failures_as_infinite(known):
    by = {(c.class_name, c.metric, c.percentile): c for c in known.checks}
    p50 = by[("short-message", "ttft_ms", "p50")]
    assert p50.n == 5 and p50.observed == approx(80) and p50.passed  # [40, 55, 80, inf, inf]
    p99 = by[("short-message", "ttft_ms", "p99")]
    assert math.isinf(p99.observed) and not p99.passed and p99.hard and p99.failures_as_inf == 2
    itl = by[("short-message", "itl_ms", "p99")]
    assert itl.observed == approx(19.4) and itl.passed
    e2e = by[("short-message", "e2e_ms", "p99")]  # abandoned r4 is neither sample nor violation
    assert e2e.n == 4 and math.isinf(e2e.observed) and not e2e.passed and not e2e.hard
    burst = by[("burst", "ttft_ms", "p99")]
    assert burst.n == 2 and not burst.passed
    err = by[("overall", "error_share", None)]
    assert err.observed == approx(3 / 7) and not err.passed
    assert known.errored and known.verdict == "fail" and known.passed is False
    assert {c.reason for c in known.hard_failures} >= {p99.reason, burst.reason}
    assert e2e in known.soft_failures


def test_goodput_and_attainment(known):
    sm = known.classes["short-message"]
    # counted: r1, r2, r3, r5 (the abandoned r4 is neither good nor bad); good: r1, r2
    assert (sm.n_good, sm.n_eligible) == (2, 4)
    assert sm.attainment == approx(0.5)
    assert sm.goodput_rps == approx(2 / known.window["duration_s"])
    assert (known.classes["burst"].n_good, known.classes["burst"].n_eligible) == (1, 2)
    assert (known.overall.n_good, known.overall.n_eligible) == (3, 6)


def test_token_accounting(known):
    out = known.classes["short-message"].tokens["output"]
    assert out["server"] == 9 and out["client"] == 8 and out["target"] == 8
    assert out["server_minus_client"] == 1 and out["server_minus_target"] == 1 and out["client_minus_target"] == 0
    assert out["n_server_client_mismatch"] == 1


def test_json_is_strict_and_versioned(known, tmp_path):
    d = known.to_dict()
    text = json.dumps(d, allow_nan=False)  # +inf written as "inf"
    back = json.loads(text)
    assert back["schema_version"] == "1"
    assert back["verdict"]["status"] == "fail" and back["verdict"]["errored"] is True
    assert back["classes"]["short-message"]["metrics"]["itl_ms"]["n"] == 7
    inf_checks = [c for c in back["checks"] if c["observed"] == "inf"]
    assert inf_checks and all(
        set(c) >= {"class", "metric", "percentile", "observed", "limit", "n", "hard", "passed", "reason"}
        for c in back["checks"]
    )


def test_no_scenario_gives_numbers_but_no_verdicts(tmp_path):
    run = build_run(tmp_path / "run", known_requests(), known_chunks())
    a = analyze_run(run)
    assert a.verdict == "no budgets" and a.checks == [] and a.passed is None
    assert a.overall.goodput_rps is None
    assert a.classes["short-message"].metrics["itl_ms"]["n"] == 7
    assert a.errored  # the default 1% error limit still marks the run


def test_window_selects_by_scheduled_instant(tmp_path):
    run = build_run(tmp_path / "run", known_requests(), known_chunks(), scenario=scenario_two_classes())
    a = analyze_run(run, window=(0.1, 0.3))  # r2 (100), r7 (150), r3 (200)
    assert a.overall.n_scheduled == 3
    assert a.overall.offered_rps == approx(3 / 0.2)
    assert a.classes["short-message"].metrics["itl_ms"]["n"] == 2  # r2 only
    assert analyze_run(run, window="0.1:0.3").overall.n_scheduled == 3


def test_chunk_order_and_batch_edges_do_not_matter(tmp_path, monkeypatch):
    import loadgen.analysis.chunks as chunks

    base = analyze_run(build_run(tmp_path / "a", known_requests(), known_chunks()))
    monkeypatch.setattr(chunks, "BATCH_ROWS", 2)  # request runs straddle every batch edge
    small = analyze_run(build_run(tmp_path / "b", known_requests(), known_chunks()))
    assert not any("re-sorted" in n for n in small.notes)  # a request run across an edge is one run
    monkeypatch.undo()
    shuffled = list(reversed(known_chunks()))  # neither contiguous in order nor seq-ordered
    resorted = analyze_run(build_run(tmp_path / "c", known_requests(), shuffled))
    assert any("re-sorted" in n for n in resorted.notes)
    for a in (small, resorted):
        for name in ("short-message", "overall"):
            assert a.group(name).metrics == base.group(name).metrics


def test_orphan_chunk_rows_are_counted_and_ignored_at_every_batch_edge(tmp_path, monkeypatch):
    """Chunk rows naming no request (a stray id, among others and at batch edges) are counted in a note
    and change no figure, whatever the batch size."""
    import loadgen.analysis.chunks as chunks

    base = analyze_run(build_run(tmp_path / "a", known_requests(), known_chunks()))
    stray = [("zz", 0, 60 * MS, 1), ("zz", 1, 70 * MS, 2), ("r1x", 0, 80 * MS, 1), ("zz2", 0, 90 * MS, 1)]
    rows = known_chunks()  # r6, r1 (4 rows), r2 (2), r4 (2): strays go between requests, never inside one
    with_orphans = stray[:1] + rows[:5] + stray[1:3] + rows[5:] + stray[3:]
    for batch_rows in (1, 2, 3, 1 << 19):
        monkeypatch.setattr(chunks, "BATCH_ROWS", batch_rows)
        a = analyze_run(build_run(tmp_path / f"b{batch_rows}", known_requests(), with_orphans))
        assert any(n.startswith("4 chunk row(s) name no request") for n in a.notes), (batch_rows, a.notes)
        assert not any("re-sorted" in n for n in a.notes)
        for name in ("short-message", "overall"):
            assert a.group(name).metrics == base.group(name).metrics, batch_rows


def test_many_classes_in_one_batch_split_by_mask_or_by_sort_alike(tmp_path, monkeypatch):
    """A batch's rows go to their class's samples by one mask per code, or by one sort past
    ``_MASKED_CODES`` codes: both give every figure of every class alike."""
    import loadgen.analysis.analyze as analyze

    requests, chunks = [], []
    for i in range(24):  # 12 classes, ok and failed requests in each: 24 codes in one batch
        rid, ok = f"q{i}", i % 2 == 0
        requests.append(
            dict(
                request_id=rid,
                request_class=f"class-{i // 2:02d}",
                scheduled_ns=i * MS,
                sent_ns=i * MS,
                first_token_ns=(i + 10) * MS,
                last_token_ns=(i + 40) * MS,
                done_ns=(i + 41) * MS,
                status="ok" if ok else "error",
                error_kind=None if ok else "http_5xx",
            )
        )
        chunks += [(rid, k, (i + 10 + 7 * k + (i % 5)) * MS, 1 + (i + k) % 3) for k in range(5)]
    figures = []
    for masked in (0, 1000):
        monkeypatch.setattr(analyze, "_MASKED_CODES", masked)
        a = analyze_run(build_run(tmp_path / f"m{masked}", requests, chunks))
        figures.append({g: a.group(g).metrics for g in ["overall"] + [f"class-{c:02d}" for c in range(12)]})
    assert figures[0] == figures[1]
    assert figures[0]["class-03"]["itl_ms"]["n"] > 0


def test_first_chunk_with_many_tokens_gives_zero_gaps(tmp_path):
    reqs = [
        dict(
            request_id="a",
            request_class="burst",
            scheduled_ns=0,
            sent_ns=0,
            first_token_ns=10 * MS,
            last_token_ns=40 * MS,
            done_ns=40 * MS,
            status="ok",
            client_output_tokens=7,
        )
    ]
    chunks = [("a", 0, 10 * MS, 4), ("a", 1, 40 * MS, 3)]
    m = analyze_run(build_run(tmp_path / "r", reqs, chunks)).overall.metrics
    # 3 zero gaps from the first chunk, then 3 gaps of 10: six gaps summing to 30 = last − first
    assert m["itl_ms"]["n"] == 6 and m["itl_ms"]["mean"] == approx(5) and m["itl_ms"]["p50"] == approx(5)
    assert m["tpot_ms"]["p50"] == approx(5)  # mean per-token gap equals TPOT
    assert m["inter_chunk_ms"]["n"] == 1 and m["inter_chunk_ms"]["p50"] == approx(30)


def test_cold_requests_reported_apart(tmp_path):
    reqs = []
    for i in range(6):
        cold = i < 2
        reqs.append(
            dict(
                request_id=f"c{i}",
                request_class="burst",
                warm=not cold,
                scheduled_ns=i * 100 * MS,
                sent_ns=i * 100 * MS,
                first_token_ns=i * 100 * MS + (900 if cold else 20) * MS,
                done_ns=i * 100 * MS + (950 if cold else 50) * MS,
                status="ok",
            )
        )
    a = analyze_run(
        build_run(
            tmp_path / "r",
            reqs,
            manifest={
                "warm_state": {"state": "cold", "actions": ["restarted"]},
                "engine_notes": {"load_s": 12.5, "compile": "cuda graphs"},
            },
        )
    )
    assert a.warm_cold["n_cold"] == 2 and a.warm_cold["cold"]["ttft_ms"]["p50"] == approx(900)
    assert a.warm_cold["warm"]["n"] == 4 and a.overall.metrics["ttft_ms"]["max"] == approx(20)
    assert a.warm_cold["state"] == "cold" and a.warm_cold["actions"] == ["restarted"]
    assert a.warm_cold["engine_notes"] == {"load_s": 12.5, "compile": "cuda graphs"}
    inc = analyze_run(tmp_path / "r", include_cold=True)
    assert inc.overall.metrics["ttft_ms"]["max"] == approx(900)


def test_cold_manifest_without_flags_uses_first_completion(tmp_path):
    reqs = [
        dict(
            request_id=f"c{i}",
            request_class="burst",
            scheduled_ns=i * 100 * MS,
            sent_ns=i * 100 * MS,
            first_token_ns=i * 100 * MS + 150 * MS,
            done_ns=i * 100 * MS + 250 * MS,
            status="ok",
        )
        for i in range(5)
    ]
    reqs.append(dict(request_id="never", request_class="burst", scheduled_ns=10 * MS, status="not_sent", warm=False))
    a = analyze_run(build_run(tmp_path / "r", reqs, manifest={"warm_state": {"state": "cold", "actions": []}}))
    assert a.warm_cold["n_cold"] == 3  # sent at 0, 100, 200 < first done at 250
    assert a.overall.status_counts["not_sent"] == 1  # a request never sent did not meet the cold server


@pytest.mark.parametrize("suffix", ["_total", ""])
def test_server_metrics_joined(tmp_path, suffix):
    s = 1_000_000_000
    metrics = []
    for t, kv, run_a, run_b, wait, pre, q, h in [
        (0, 0.1, 1, 0, 0, 0, 0, 0),
        (1, 0.7, 3, 2, 4, 2, 100, 50),
        (2, 0.5, 2, 1, 1, 5, 200, 150),
    ]:
        metrics += [
            (t * s, "vllm:kv_cache_usage_perc", {"model_name": "m"}, kv),
            (t * s, "vllm:num_requests_running", {"engine": "0"}, run_a),
            (t * s, "vllm:num_requests_running", {"engine": "1"}, run_b),
            (t * s, "vllm:num_requests_waiting", {"engine": "0"}, wait),
            (t * s, "vllm:num_preemptions" + suffix, {}, pre),
            (t * s, "vllm:prefix_cache_queries" + suffix, {}, q),
            (t * s, "vllm:prefix_cache_hits" + suffix, {}, h),
        ]
    reqs = [
        dict(
            request_id=f"x{i}",
            request_class="burst",
            scheduled_ns=i * s,
            sent_ns=i * s,
            first_token_ns=i * s + 10 * MS,
            done_ns=i * s + 20 * MS,
            status="ok",
        )
        for i in range(3)
    ]
    a = analyze_run(build_run(tmp_path / "r", reqs, metrics=metrics))
    sv = a.server
    assert sv["kv_cache_usage"]["peak"] == approx(0.7)
    assert sv["running"]["max"] == 5 and sv["waiting"]["max"] == 4
    assert sv["preemptions"]["increase"] == 5
    assert sv["prefix_cache"]["hit_rate"] == approx(0.75)
    assert sv["timeseries"]["running"] == [1, 5, 3]


def test_bad_input_is_one_line_error(tmp_path):
    from loadgen.util.errors import RunDirError

    with pytest.raises(RunDirError, match="manifest"):
        analyze_run(tmp_path)
    from loadgen.analysis import parse_window

    with pytest.raises(RunDirError, match="start:end"):
        parse_window("10")
    with pytest.raises(RunDirError, match="after start"):
        parse_window("5:1")


def test_abandoned_before_first_token_is_a_failure(tmp_path):
    reqs = [
        dict(
            request_id="x",
            request_class="burst",
            scheduled_ns=0,
            sent_ns=0,
            done_ns=5 * MS,
            status="cancelled",
            cancel_after_tokens=3,
        ),
        dict(
            request_id="y",
            request_class="burst",
            scheduled_ns=MS,
            sent_ns=MS,
            first_token_ns=9 * MS,
            done_ns=12 * MS,
            status="cancelled",
            cancel_after_tokens=1,
        ),
    ]
    a = analyze_run(build_run(tmp_path / "r", reqs, scenario=scenario_two_classes()))
    b = a.classes["burst"]
    assert b.abandoned == 1 and b.error_kinds == {"cancelled": 1}
    check = next(c for c in a.checks if c.class_name == "burst" and c.metric == "ttft_ms")
    assert check.n == 2 and check.failures_as_inf == 1


from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402


@given(
    st.lists(
        st.tuples(
            st.sampled_from(["ok", "error", "timeout", "cancelled", "not_sent"]),
            st.sampled_from(["short-message", "burst"]),
            st.booleans(),
        ),
        min_size=1,
        max_size=25,
    )
)
@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_law_every_scheduled_request_has_exactly_one_status(tmp_path_factory, rows):
    reqs = []
    for i, (status, cls, planned) in enumerate(rows):
        r = dict(request_id=f"h{i}", request_class=cls, scheduled_ns=i * MS, status=status)
        if status != "not_sent":
            r.update(sent_ns=i * MS, done_ns=i * MS + 50 * MS)
        if status in ("ok", "cancelled"):
            r.update(first_token_ns=i * MS + 20 * MS)
        if status == "cancelled" and planned:
            r.update(cancel_after_tokens=2)
        reqs.append(r)
    a = analyze_run(build_run(tmp_path_factory.mktemp("law") / "r", reqs, scenario=scenario_two_classes()))
    assert a.overall.n_scheduled == len(rows) == sum(a.overall.status_counts.values())
    assert sum(g.n_scheduled for g in a.classes.values()) == len(rows)
    failed = sum(a.overall.error_kinds.values())
    assert failed + a.overall.status_counts["ok"] + a.overall.abandoned == len(rows)


def test_empty_run_is_no_data_not_pass(tmp_path):
    a = analyze_run(build_run(tmp_path / "r", [], scenario=scenario_two_classes()))
    assert a.verdict == "no data" and a.passed is None
    assert a.overall.metrics["ttft_ms"]["p50"] is None and a.overall.offered_rps is None
    assert all(not c.evaluated for c in a.checks if c.metric != "error_share")


def test_duplicate_request_ids_are_bad_input(tmp_path):
    from loadgen.util.errors import RunDirError

    reqs = known_requests()
    reqs[1] = dict(reqs[1], request_id="r1")
    with pytest.raises(RunDirError, match="'r1' appears more than once"):
        analyze_run(build_run(tmp_path / "r", reqs, known_chunks()))


def test_budgeted_class_without_requests_is_present_and_empty(tmp_path):
    reqs = [r for r in known_requests() if r["request_class"] == "short-message"]
    a = analyze_run(build_run(tmp_path / "r", reqs, known_chunks(), scenario=scenario_two_classes()))
    burst = a.classes["burst"]
    assert burst.n_scheduled == 0 and burst.metrics["ttft_ms"]["p99"] is None and burst.metrics["ttft_ms"]["n"] == 0
    check = next(c for c in a.checks if c.class_name == "burst")
    assert not check.evaluated and check.n == 0


def test_server_counters_reset_histograms_and_old_gauge_names():
    import pyarrow as pa

    from loadgen.analysis.server_metrics import summarize_server_metrics
    from loadgen.rundir.schema import SERVER_METRICS_SCHEMA

    s = 1_000_000_000
    rows = []
    for t, pre, tok_sum, tok_cnt, kv in [
        (0, 5, 0, 0, 0.2),
        (1, 8, 640, 10, 0.9),
        (2, 2, 1280, 20, 0.4),
        (3, 4, 1920, 30, 0.1),
    ]:
        rows += [
            (t * s, "vllm:num_preemptions_total", "{}", pre),  # 5 → 8 → (restart) 2 → 4: increase 3 + 2 + 2
            (t * s, "vllm:iteration_tokens_total_sum", "{}", tok_sum),
            (t * s, "vllm:iteration_tokens_total_count", "{}", tok_cnt),
            (t * s, "vllm:gpu_cache_usage_perc", "{}", kv),
            (t * s, "vllm:cache_config_info", '{"block_size": "16", "num_gpu_blocks": "1000"}', 1.0),
        ]
    table = pa.table(
        {
            "time_ns": [r[0] for r in rows],
            "name": [r[1] for r in rows],
            "labels": [r[2] for r in rows],
            "value": [float(r[3]) for r in rows],
        },
        schema=SERVER_METRICS_SCHEMA,
    )
    sv = summarize_server_metrics(table, 0, 3 * s)
    assert sv["preemptions"]["increase"] == 7
    assert sv["batch_tokens_per_step"]["mean"] == 64
    assert sv["kv_cache_usage"]["metric"] == "vllm:gpu_cache_usage_perc" and sv["kv_cache_usage"]["peak"] == 0.9
    assert sv["kv_cache_usage"]["peak_blocks"] == 900
    assert summarize_server_metrics(None, 0, 1) is None


def test_goodput_checks_itl_of_requests_scheduled_before_the_window(tmp_path):
    # "early" is scheduled before the window, completes inside it and stalled 100 ms between tokens (ITL
    # limit 20 ms); "clean" is scheduled and completed inside it. Only "clean" met every hard budget.
    sm = "short-message"
    base = dict(request_class=sm, status="ok", sent_ns=1 * MS, target_output_tokens=3)
    requests = [
        dict(
            base, request_id="early", scheduled_ns=0, first_token_ns=50 * MS, last_token_ns=250 * MS, done_ns=251 * MS
        ),
        dict(
            base,
            request_id="clean",
            scheduled_ns=150 * MS,
            sent_ns=151 * MS,
            first_token_ns=160 * MS,
            last_token_ns=170 * MS,
            done_ns=171 * MS,
        ),
    ]
    chunks = [
        ("early", 0, 50 * MS, 1),
        ("early", 1, 150 * MS, 1),
        ("early", 2, 250 * MS, 1),
        ("clean", 0, 160 * MS, 1),
        ("clean", 1, 165 * MS, 1),
        ("clean", 2, 170 * MS, 1),
    ]
    run = build_run(tmp_path / "run", requests, chunks, scenario=scenario_two_classes())
    a = analyze_run(run, window=(0.1, 0.3))
    g = a.classes[sm]
    assert g.n_good_completed == 1 and g.goodput_rps == approx(1 / 0.2)
    # the window's own ITL sample still holds only the request scheduled in it
    assert g.metrics["itl_ms"]["n"] == 2
    # with the whole run in the window, "early" is judged the same way
    assert analyze_run(run, window=(0.0, 0.3)).classes[sm].n_good_completed == 1


def test_inter_chunk_gaps_are_the_correctly_rounded_ms(tmp_path: Path) -> None:
    """A raw gap of 101,257,423 ns is 101.257423 ms, the value ``ns / 1e6`` gives TTFT and the per-request
    helper; the analysis took ``ns * 1e-6`` for this one metric and reported 101.25742299999999 (an outside
    recompute from the Parquet found it)."""
    gap_ns = 101_257_423
    row = {"request_id": "r1", "request_class": "c", "status": "ok", "scheduled_ns": 0, "sent_ns": 0}
    row |= {"first_token_ns": gap_ns, "last_token_ns": 2 * gap_ns, "done_ns": 2 * gap_ns, "client_output_tokens": 2}
    run = build_run(tmp_path / "run", [row], [("r1", 0, gap_ns, 1), ("r1", 1, 2 * gap_ns, 1)])
    metrics = analyze_run(run).classes["c"].metrics
    assert gap_ns * 1e-6 != gap_ns / 1e6  # the two conversions differ for this value
    assert metrics["inter_chunk_ms"]["max"] == gap_ns / 1e6 == metrics["ttft_ms"]["max"]
    assert metrics["inter_chunk_ms"]["p50"] == M.inter_chunk_gaps_ms([gap_ns, 2 * gap_ns], [1, 1])[0]
