"""Agent sessions: steps that wait for every reply they name plus a tool time, fan-out into sub-sessions, and
the recorded coding-agent sessions (kv-cache-tester) replayed at their recorded pacing.

Real parts: the importer reads the shared JSON files; runs go over loopback to the live simulated engine
(``loadgen sim serve``) and through the worksheet; every expectation is recomputed here from the files or
from the run's Parquet rows.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from shared_paths import REPO, shared_trace

from loadgen.analysis import analyze_run
from loadgen.driver import RunOptions, run_trace_sync
from loadgen.rundir.io import load_run
from loadgen.sim import run_worksheet
from loadgen.targets import launch_sim_server
from loadgen.trace.agentic import import_agentic
from loadgen.trace.io import read_trace
from loadgen.workload.scenario import parse_scenario
from loadgen.workload.sessions import ReplyWaits, reply_dependencies

AGENTIC = "agentic/kv-cache-tester/traces"
NS = 1_000_000_000
#: instant engine, long context, a tokenizer that counts characters (prompts of ~100k tokens stay cheap)
ENGINE = (REPO / "scenarios" / "engines" / "instant-long-context.toml").read_text()


def _plain(requests: list[dict]) -> list[dict]:
    return [r for r in requests if r.get("type") != "subagent"]


def _subs(requests: list[dict]) -> list[dict]:
    return [r for r in requests if r.get("type") == "subagent"]


def _rows(table) -> dict[str, dict]:
    return {r["request_id"]: r for r in table.to_pylist()}


def test_a_fan_out_step_is_due_one_tool_time_after_the_last_reply_it_waits_for() -> None:
    # r0 fans out into a/0 and b/0; r1 waits for r0 and both sub-sessions
    ids = ["r0", "a", "b", "r1"]
    think = [None, 5, 7, 11]
    deps = reply_dependencies(
        ids, ["s", "s/a", "s/b", "s"], [0, 0, 0, 1], think, [None, ["r0"], ["r0"], ["r0", "a", "b"]]
    )
    assert deps == {1: [0], 2: [0], 3: [0, 1, 2]}
    waits = ReplyWaits(deps, think)
    assert waits.waiting() == {1, 2, 3}
    assert waits.ended(0, 100) == [(105, 1), (107, 2)]
    assert waits.ended(2, 300) == []  # r1 still waits for a
    assert waits.ended(1, 250) == [(300 + 11, 3)]  # the last of its replies ended at 300


def test_the_importer_gives_the_files_counts_lengths_blocks_and_think_times(tmp_path: Path) -> None:
    files = sorted(shared_trace(AGENTIC).glob("trace_*.json"))
    assert len(files) == 10
    table, meta = read_trace(import_agentic(files, tmp_path / "all.parquet"))
    rows = _rows(table)
    assert meta["sessions"] == 10 and meta["block_hash_tokens"] == 64
    expected = 0
    compared_think = 0
    for k, path in enumerate(files):
        data = json.loads(path.read_text())
        name = data["id"]
        sessions = [(name, 0.0, _plain(data["requests"]))]
        sessions += [(f"{name}/{s['agent_id']}", s["t"], _plain(s["requests"])) for s in _subs(data["requests"])]
        for conv, base, reqs in sessions:
            expected += len(reqs)
            for j, r in enumerate(reqs):
                row = rows[f"{conv}#{j}"]
                assert (row["conversation_id"], row["turn_index"]) == (conv, j)
                assert (row["prompt_tokens"], row["output_tokens"]) == (r["in"], r["out"])
                assert row["scheduled_offset_ns"] == round((base + r["t"]) * NS)
                assert row["prompt_block_hashes"] == [h + k * 2**32 for h in r["hash_ids"]]
                assert len(row["prompt_block_hashes"]) == r["in"] // 64
                if "api_time" in r:
                    assert row["service_ns"] == round(r["api_time"] * NS)
                if j == 0 or len(row["wait_for_ids"]) != 1:
                    continue
                # a step chained to the one before: think = its start - the previous reply's recorded end
                prev = reqs[j - 1]
                # (without api_time: the next step's t - think_time, never before its own start)
                prev_end = prev["t"] + prev["api_time"] if "api_time" in prev else r["t"] - r.get("think_time", 0)
                prev_end = max(prev_end, prev["t"])
                assert row["think_after_reply_ns"] == round(max(0.0, r["t"] - prev_end) * NS)
                # ... which is the file's think_time within its whole-second rounding of t
                if "api_time" in prev and "think_time" in r:
                    assert abs(row["think_after_reply_ns"] / NS - r["think_time"]) <= 1.0 + 1e-9
                    compared_think += 1
    assert table.num_rows == expected == 685
    assert compared_think == 592  # the steps whose previous step has api_time and that carry a think_time


def test_sub_sessions_wait_for_their_launcher_and_the_parent_joins_them(tmp_path: Path) -> None:
    path = shared_trace(f"{AGENTIC}/trace_0291.json")
    data = json.loads(path.read_text())
    rows = _rows(read_trace(import_agentic([path], tmp_path / "t.parquet"))[0])
    main = _plain(data["requests"])
    for sub in _subs(data["requests"]):
        conv = f"trace_0291/{sub['agent_id']}"
        launcher = max(j for j, r in enumerate(main) if r["t"] <= sub["t"])
        assert rows[f"{conv}#0"]["wait_for_ids"] == [f"trace_0291#{launcher}"]
        last = len(_plain(sub["requests"])) - 1
        end = sub["t"] + sub["requests"][-1]["t"] + sub["requests"][-1]["api_time"]
        joiner = min(j for j, r in enumerate(main) if r["t"] >= end)  # the first parent step after it ended
        assert f"{conv}#{last}" in rows[f"trace_0291#{joiner}"]["wait_for_ids"]


def _import_scaled(tmp_path: Path, scale: float) -> Path:
    return import_agentic([shared_trace(f"{AGENTIC}/trace_0291.json")], tmp_path / "agent.parquet", time_scale=scale)


def _unclamped(trace_rows: dict[str, dict]) -> list[str]:
    """Rows whose recorded start is not before the recorded end of what they wait for (think not cut to 0)."""
    out = []
    for rid, r in trace_rows.items():
        waits = r["wait_for_ids"] or []
        ends = [trace_rows[w]["scheduled_offset_ns"] + trace_rows[w]["service_ns"] for w in waits]
        if not waits or r["scheduled_offset_ns"] >= max(ends):
            out.append(rid)
    return out


def test_the_worksheet_replays_the_recorded_instants_when_the_server_answers_in_api_time(tmp_path: Path) -> None:
    trace = _import_scaled(tmp_path, 0.01)
    trace_rows = _rows(read_trace(trace)[0])
    (tmp_path / "engine.toml").write_text(ENGINE)
    run = load_run(run_worksheet(trace, tmp_path / "engine.toml", tmp_path / "ws"))
    rows = {r["request_id"]: r for r in run.requests.to_pylist()}
    assert set(rows) == set(trace_rows) and all(r["status"] == "ok" for r in rows.values())
    unclamped = _unclamped(trace_rows)
    assert len(unclamped) == len(trace_rows)  # trace_0291 never starts a step before its waits ended
    for rid, r in rows.items():
        # each of the 32 steps (20 parent, 5 + 7 in two sub-sessions) at its recorded instant (ns rounding of the three times summed)
        assert abs(r["scheduled_ns"] - trace_rows[rid]["scheduled_offset_ns"]) <= 3
        assert r["done_ns"] - r["sent_ns"] >= trace_rows[rid]["service_ns"]


def test_a_live_agent_session_with_fan_out_keeps_the_rule_and_its_makespan(tmp_path: Path) -> None:
    trace = _import_scaled(tmp_path, 0.002)  # 1363 s recorded -> 2.7 s
    trace_rows = _rows(read_trace(trace)[0])
    (tmp_path / "engine.toml").write_text(ENGINE)
    with launch_sim_server(str(tmp_path / "engine.toml")) as sim:
        out = run_trace_sync(
            RunOptions(trace_path=trace, target_url=sim.base_url, out_dir=tmp_path / "run", progress="off")
        )
    rows = {r["request_id"]: r for r in load_run(out).requests.to_pylist()}
    assert set(rows) == set(trace_rows) and all(r["status"] == "ok" for r in rows.values())
    joins = 0
    for rid, r in rows.items():
        t = trace_rows[rid]
        # the engine held each reply to its recorded api_time (counted from its arrival, after scheduled; the
        # client's sent_ns is taken after its write returns, which a busy host can delay past that arrival)
        assert r["done_ns"] - r["scheduled_ns"] >= t["service_ns"]
        assert r["scheduled_ns"] >= t["scheduled_offset_ns"]  # never ahead of the recording
        waits = t["wait_for_ids"] or []
        if waits:
            # due one tool time after the last reply it waits for ended (every one of them), to the nanosecond: the
            # driver's own delay in starting it is client queue, not hidden (it was 50 us to 5 ms after the rule)
            assert r["scheduled_ns"] == max(rows[w]["done_ns"] for w in waits) + t["think_after_reply_ns"]
            joins += len(waits) > 1
    assert joins == 2
    # the makespan from the recorded instants, recomputed from the Parquet rows
    makespan_ms = (max(r["done_ns"] for r in rows.values()) - min(r["scheduled_ns"] for r in rows.values())) / 1e6
    scenario = parse_scenario(
        {
            "name": "agents",
            "seed": 1,
            "classes": {
                "agent": {
                    "share": 1.0,
                    "input_tokens": {"dist": "fixed", "value": 10},
                    "output_tokens": {"dist": "fixed", "value": 10},
                    "budgets": {"makespan_ms": {"p50": 600_000, "hard": True}},
                }
            },
            "traces": {"t": {"process": "constant", "rate_rps": 1.0, "duration_s": 1.0}},
        }
    )
    a = analyze_run(out, scenario=scenario)
    sessions = a.classes["agent"].sessions
    assert sessions is not None and sessions["n_sessions"] == 1 and sessions["n_incomplete"] == 0
    assert sessions["makespan_ms"]["max"] == makespan_ms
    check = next(c for c in a.checks if c.metric == "makespan_ms")
    # one session: its p50 interval is unbounded, so the verdict is honest about needing more sessions
    assert check.observed == makespan_ms and check.n == 1 and check.outcome == "inconclusive"
    assert set(a.classes["agent"].ttft_by_turn) >= {"0", "1", "9+"}  # per-step TTFT
    # the worksheet replays the same structure: every step after all it waits for, in the same order
    ws = {
        r["request_id"]: r
        for r in load_run(run_worksheet(trace, tmp_path / "engine.toml", tmp_path / "ws")).requests.to_pylist()
    }
    for rows_of in (rows, ws):
        for rid, t in trace_rows.items():
            for w in t["wait_for_ids"] or []:
                assert rows_of[rid]["scheduled_ns"] > rows_of[w]["done_ns"]

    def steps(run_rows: dict[str, dict]) -> dict[str, list[str]]:  # each (sub-)session's steps in time order
        out: dict[str, list[str]] = {}
        for rid in sorted(run_rows, key=lambda k: run_rows[k]["scheduled_ns"]):
            out.setdefault(run_rows[rid]["conversation_id"], []).append(rid)
        return out

    assert steps(rows) == steps(ws) and len(steps(ws)) == 3


def test_the_cli_imports_sessions_and_refuses_a_window(tmp_path: Path) -> None:
    path = shared_trace(f"{AGENTIC}/trace_0291.json")
    cmd = [
        sys.executable,
        "-m",
        "loadgen",
        "trace",
        "import",
        "agentic",
        str(path),
        "--out",
        str(tmp_path / "a.parquet"),
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    assert "1 sessions, 32 requests" in done.stdout
    bad = subprocess.run([*cmd, "--max-requests", "3"], capture_output=True, text=True, check=False)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1 and "--max-requests" in bad.stderr


TOOL_S = 0.2
#: every engine step takes 4 ms whatever it holds: a 20-token reply takes about 80 ms
PACED = ENGINE.replace("fixed_ms = 0.0", "fixed_ms = 4.0")


def _fanout_scenario():
    return parse_scenario(
        {
            "name": "agents",
            "seed": 5,
            "classes": {
                "agent": {
                    "share": 1.0,
                    "input_tokens": {"dist": "fixed", "value": 40},
                    "output_tokens": {"dist": "fixed", "value": 20},
                    "thread": {
                        "turns": {"dist": "fixed", "value": 4},
                        "think_time_s": {"dist": "fixed", "value": TOOL_S},
                        "wait_for_reply": True,
                        "fanout": {
                            "share": 1.0,
                            "width": {"dist": "fixed", "value": 2},
                            "turns": {"dist": "fixed", "value": 2},
                        },
                    },
                    "budgets": {"makespan_ms": {"p95": 60_000}},
                }
            },
            # 4 parent steps + 3 fan-outs x 2 sub-sessions x 2 steps = 16 requests a session: 2 sessions
            "traces": {"t": {"process": "constant", "rate_rps": 8.0, "duration_s": 4.0}},
        }
    )


def test_a_scenario_session_fans_out_and_joins(tmp_path: Path) -> None:
    from loadgen.trace.generate import generate_trace_file

    table, _ = read_trace(generate_trace_file(_fanout_scenario(), "t", tmp_path / "t.parquet"))
    rows = _rows(table)
    assert table.num_rows == 32
    by_key = {(r["conversation_id"], r["turn_index"]): rid for rid, r in rows.items()}
    sessions = sorted({c for c, _ in by_key if "/" not in c})
    assert len(sessions) == 2
    for s in sessions:
        for k in range(1, 4):
            subs = [f"{s}/f{k - 1}.{b}" for b in range(2)]
            step = rows[by_key[(s, k)]]
            assert step["wait_for_ids"] == [by_key[(s, k - 1)], *(by_key[(c, 1)] for c in subs)]
            assert step["think_after_reply_ns"] == int(TOOL_S * NS)
            for c in subs:
                assert rows[by_key[(c, 0)]]["wait_for_ids"] == [by_key[(s, k - 1)]]
                assert rows[by_key[(c, 1)]]["wait_for_ids"] == [by_key[(c, 0)]]
                assert rows[by_key[(c, 1)]]["prompt_tokens"] == 40 + 20 + 40  # the context grows
            # the parent's context grows by its reply and the new input (the tool result) step by step
            assert step["prompt_tokens"] == rows[by_key[(s, k - 1)]]["prompt_tokens"] + 20 + 40


def test_generated_fan_out_sessions_on_the_live_engine_and_the_worksheet(tmp_path: Path) -> None:
    trace = generate_trace_file_for(tmp_path)
    trace_rows = _rows(read_trace(trace)[0])
    (tmp_path / "engine.toml").write_text(PACED)
    with launch_sim_server(str(tmp_path / "engine.toml")) as sim:
        out = run_trace_sync(
            RunOptions(trace_path=trace, target_url=sim.base_url, out_dir=tmp_path / "run", progress="off")
        )
    live = {r["request_id"]: r for r in load_run(out).requests.to_pylist()}
    ws = {
        r["request_id"]: r
        for r in load_run(run_worksheet(trace, tmp_path / "engine.toml", tmp_path / "ws")).requests.to_pylist()
    }
    assert set(live) == set(ws) == set(trace_rows)
    for run_rows in (live, ws):  # both exactly: a step is scheduled at the rule's instant, not when noticed
        assert all(r["status"] == "ok" for r in run_rows.values())
        for rid, t in trace_rows.items():
            waits = t["wait_for_ids"] or []
            if waits:
                due = max(run_rows[w]["done_ns"] for w in waits) + t["think_after_reply_ns"]
                assert run_rows[rid]["scheduled_ns"] == due
    a = analyze_run(out, scenario=_fanout_scenario())
    spans = sorted(
        (max(r["done_ns"] for r in g) - min(r["scheduled_ns"] for r in g)) / 1e6 for g in _by_session(live).values()
    )
    sessions = a.classes["agent"].sessions
    assert sessions is not None and sessions["n_sessions"] == 2 and sessions["n_incomplete"] == 0
    assert (sessions["makespan_ms"]["p50"], sessions["makespan_ms"]["max"]) == ((spans[0] + spans[1]) / 2, spans[1])
    # a session's makespan holds at least its four parent steps' tool times
    assert spans[0] > 3 * TOOL_S * 1e3
    assert {c.metric for c in a.checks} >= {"makespan_ms"}


def generate_trace_file_for(tmp_path: Path) -> Path:
    from loadgen.trace.generate import generate_trace_file

    return generate_trace_file(_fanout_scenario(), "t", tmp_path / "t.parquet")


def _by_session(rows: dict[str, dict]) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for r in rows.values():
        out.setdefault(r["conversation_id"].split("/")[0], []).append(r)
    return out


def test_the_reports_show_the_sessions(tmp_path: Path) -> None:
    trace = generate_trace_file_for(tmp_path)
    (tmp_path / "engine.toml").write_text(PACED)
    out = run_worksheet(trace, tmp_path / "engine.toml", tmp_path / "ws", scenario=_fanout_scenario())
    done = subprocess.run(
        [sys.executable, "-m", "loadgen", "analyze", str(out), "--html", str(tmp_path / "r.html")],
        capture_output=True,
        text=True,
        check=False,
    )
    text = " ".join(done.stdout.split())  # the console wraps lines at its width
    assert "sessions 2 (0 incomplete): makespan p50/p99" in text, done.stdout + done.stderr
    assert "more sessions of class agent are needed" in text  # a makespan check's sample is sessions
    assert "session makespan" in (tmp_path / "r.html").read_text()


def _session(**changes: object) -> dict:
    """A hand-made two-request session (64-token blocks), the second request changed by ``changes``."""
    first = {"t": 0.0, "type": "n", "in": 130, "out": 5, "hash_ids": [1, 2], "api_time": 2.0, "think_time": 0.0}
    second = {"t": 5.0, "type": "s", "in": 200, "out": 7, "hash_ids": [1, 2, 3], "api_time": 1.0, "think_time": 3.0}
    return {"id": "s1", "block_size": 64, "requests": [first, second | changes]}


_SUB = {"t": 1.0, "type": "subagent", "agent_id": "a1"}


@pytest.mark.parametrize(
    ("data", "needle"),
    [
        (_session(think_time="x"), ".requests[1].think_time = 'x': expected seconds"),
        (_session(think_time=-1.0), ".requests[1].think_time = -1.0: expected seconds"),
        (_session(think_time=float("nan")), ".requests[1].think_time = nan: expected seconds"),
        (_session(think_time=True), ".requests[1].think_time = True: expected seconds"),
        (_session(hash_ids=[1, 2]), ".requests[1].hash_ids holds 2 ids: expected one per whole 64-token block"),
        (_session(hash_ids=[1, 2, 3, 4]), ".requests[1].hash_ids holds 4 ids: expected one per whole"),
        (_session(hash_ids=[1, True, 3]), ".requests[1].hash_ids: expected a list of block ids"),
        (_session(type="x"), ".requests[1].type = 'x': expected one of n, s, subagent"),
        (_session() | {"requests": [_session()["requests"][0], 5]}, ".requests[1] = 5: expected a request object"),
        (
            _session() | {"requests": [*_session()["requests"], _SUB | {"requests": 5}]},
            ".requests = 5: expected a list",
        ),
        (_session() | {"requests": [*_session()["requests"], _SUB | {"requests": "ab"}]}, ".requests = 'ab'"),
        (_session() | {"id": 7}, "id = 7: expected the session's name"),
    ],
)
def test_a_wrong_field_in_a_session_is_refused_in_one_line(tmp_path: Path, data: dict, needle: str) -> None:
    """A think time, server time or type that was not used, a request that was no object or a sub-agent's
    requests that were no list were silently skipped (a number there was a TypeError traceback); a hash_ids
    list of another length than the prompt's whole blocks was kept. Now one line naming file and field, exit 2."""
    src, out = tmp_path / "trace_x.json", tmp_path / "a.parquet"
    src.write_text(json.dumps(data))
    cmd = [sys.executable, "-m", "loadgen", "trace", "import", "agentic", str(src), "--out", str(out)]
    res = subprocess.run(cmd, capture_output=True, text=True, check=False)
    assert res.returncode == 2, res.stderr
    assert str(src) in res.stderr and needle in res.stderr and "Traceback" not in res.stderr, res.stderr
    assert len(res.stderr.strip().splitlines()) == 1 and not out.exists()
