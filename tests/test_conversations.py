"""Conversations that wait for the reply: turn k+1 is sent one think time after turn k's reply ended
(live simulated engine over loopback, the real driver), and the analysis reports TTFT by turn index."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from loadgen.analysis import analyze_run
from loadgen.driver import RunOptions, run_trace_sync
from loadgen.rundir.io import load_run
from loadgen.targets import launch_sim_server
from loadgen.trace.generate import generate_trace_file
from loadgen.trace.io import read_trace
from loadgen.workload.scenario import parse_scenario

REPO = Path(__file__).resolve().parents[1]
THINK_S = 0.3
#: every engine step takes 4 ms whatever it holds: a 40-token reply takes about 160 ms
ENGINE = (
    (REPO / "scenarios" / "engines" / "instant.toml")
    .read_text()
    .replace('name = "instant"', 'name = "paced"')
    .replace("fixed_ms = 0.0", "fixed_ms = 4.0")
)


def _scenario(wait: bool):
    return parse_scenario(
        {
            "name": "conversations",
            "seed": 3,
            "classes": {
                "long-thread": {
                    "share": 1.0,
                    "input_tokens": {"dist": "fixed", "value": 40},
                    "output_tokens": {"dist": "fixed", "value": 40},
                    "thread": {
                        "turns": {"dist": "fixed", "value": 3},
                        "think_time_s": {"dist": "fixed", "value": THINK_S},
                        "wait_for_reply": wait,
                    },
                    "budgets": {"ttft_ms": {"p50": 5000, "hard": True}},
                }
            },
            "traces": {"t": {"process": "constant", "rate_rps": 6.0, "duration_s": 3.0}},
        }
    )


def test_the_trace_carries_the_think_time_only_when_turns_wait(tmp_path: Path) -> None:
    table, _ = read_trace(generate_trace_file(_scenario(True), "t", tmp_path / "wait.parquet"))
    think = table.column("think_after_reply_ns").to_pylist()
    turns = table.column("turn_index").to_pylist()
    assert all((t == int(THINK_S * 1e9)) if k else (t is None) for t, k in zip(think, turns))
    table, _ = read_trace(generate_trace_file(_scenario(False), "t", tmp_path / "open.parquet"))
    assert table.column("think_after_reply_ns").null_count == table.num_rows


@pytest.mark.slow
def test_turns_wait_for_the_reply_on_the_live_engine(tmp_path: Path) -> None:
    trace = generate_trace_file(_scenario(True), "t", tmp_path / "t.parquet")
    (tmp_path / "engine.toml").write_text(ENGINE)
    with launch_sim_server(str(tmp_path / "engine.toml")) as sim:
        out = run_trace_sync(
            RunOptions(trace_path=trace, target_url=sim.base_url, out_dir=tmp_path / "run", progress="off")
        )
    run = load_run(out)
    rows = run.requests.to_pylist()
    assert rows and all(r["status"] == "ok" for r in rows)
    by_conv: dict[str, dict[int, dict]] = {}
    for r in rows:
        by_conv.setdefault(r["conversation_id"], {})[r["turn_index"]] = r
    table, _ = read_trace(trace)
    offsets = dict(zip(table.column("request_id").to_pylist(), table.column("scheduled_offset_ns").to_pylist()))
    checked = 0
    for turns in by_conv.values():
        for k in sorted(turns)[1:]:
            prev, cur = turns[k - 1], turns[k]
            # ready = the previous reply's end + the think time: the recorded schedule says when the turn became ready
            assert cur["scheduled_ns"] >= prev["done_ns"] + int(THINK_S * 1e9)
            # later than the open-loop estimate (previous turn scheduled + think) by at least the reply's duration
            assert cur["scheduled_ns"] - prev["scheduled_ns"] > offsets[cur["request_id"]] - offsets[prev["request_id"]]
            checked += 1
    assert checked >= 10
    a = analyze_run(out, scenario=_scenario(True))
    by_turn = a.classes["long-thread"].ttft_by_turn
    assert set(by_turn) == {"0", "1", "2"} and all(s["n"] > 0 and s["p50"] is not None for s in by_turn.values())
    assert sum(s["n"] for s in by_turn.values()) == len(rows)
    assert a.to_dict()["classes"]["long-thread"]["ttft_by_turn"]["1"]["ci"]["p50"] is not None
    assert np.isfinite(by_turn["0"]["p50"])


def test_turns_wait_for_the_reply_on_the_worksheet(tmp_path: Path) -> None:
    """Virtual time: turn k+1 is due exactly one think time after turn k's reply ended (alone and in a fleet)."""
    from loadgen.sim import run_worksheet

    trace = generate_trace_file(_scenario(True), "t", tmp_path / "t.parquet")
    (tmp_path / "engine.toml").write_text(ENGINE)
    table, _ = read_trace(trace)
    offsets = dict(zip(table.column("request_id").to_pylist(), table.column("scheduled_offset_ns").to_pylist()))
    for replicas in (1, 2):
        out = run_worksheet(trace, tmp_path / "engine.toml", tmp_path / f"run{replicas}", replicas=replicas)
        rows = load_run(out).requests.to_pylist()
        assert len(rows) == table.num_rows and all(r["status"] == "ok" for r in rows)
        by_conv: dict[str, dict[int, dict]] = {}
        for r in rows:
            by_conv.setdefault(r["conversation_id"], {})[r["turn_index"]] = r
        checked = 0
        for turns in by_conv.values():
            assert len({r["target_index"] for r in turns.values()}) == 1  # sticky in a fleet
            for k in sorted(turns)[1:]:
                prev, cur = turns[k - 1], turns[k]
                assert cur["scheduled_ns"] == prev["done_ns"] + int(THINK_S * 1e9)  # exact in virtual time
                assert cur["sent_ns"] >= cur["scheduled_ns"]
                # later than the open-loop estimate by the previous reply's duration (≈ 40 steps of 4 ms)
                estimate = offsets[cur["request_id"]] - offsets[prev["request_id"]]
                assert cur["scheduled_ns"] - prev["scheduled_ns"] >= estimate + 100_000_000
                checked += 1
        assert checked >= 10
