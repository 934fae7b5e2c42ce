"""Agent steps whose replies end in tool calls: the trace's ``tool_call_tokens``, the simulated engine's
``tool_calls`` deltas (live server) and finish reason, the driver's records, and the worksheet.

Real parts: scenario -> trace Parquet -> the live ``loadgen sim serve`` over loopback -> run directory; the
worksheet over the same trace. Expectations come from the trace rows, never from the engine's code.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import httpx
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from loadgen.driver import RunOptions, run_trace_sync
from loadgen.rundir.io import load_run
from loadgen.rundir.schema import SIM_TOOL_CALL_FIELD, TRACE_FULL_SCHEMA
from loadgen.sim import run_worksheet
from loadgen.sim.protocol import tool_call_piece
from loadgen.targets import launch_sim_server
from loadgen.trace.generate import generate_trace_file
from loadgen.trace.io import read_trace, write_trace
from loadgen.util.errors import TraceError
from loadgen.workload.prompts import get_tokenizer
from loadgen.workload.scenario import load_scenario

#: one token per 4 ms engine step whatever the batch holds; cl100k_base (tool-call pieces are one token each)
ENGINE = """\
name = "tool-steps"
model = "loadgen-sim"
tokenizer = "cl100k_base"
[scheduler]
max_num_seqs = 64
max_num_batched_tokens = 8192
chunked_prefill = true
max_model_len = 16384
[kv]
block_size = 16
num_kv_blocks = 8192
enable_prefix_caching = false
[cost]
fixed_ms = 4.0
per_prefill_token_ms = 0.0
per_decode_seq_ms = 0.0
per_kv_token_ms = 0.0
noise_sigma = 0.0
[batching]
window_ms = 0
[stream]
coalesce = true
"""


SCENARIO = """\
name = "tools"
seed = 11
endpoint = "chat"

[privacy]
retain_completion_text = true

[classes.agent]
share = 1.0
input_tokens = { dist = "fixed", value = 40 }
output_tokens = { dist = "fixed", value = 5 }
reasoning_tokens = { dist = "fixed", value = 3 }

[classes.agent.thread]
turns = { dist = "fixed", value = 4 }
think_time_s = { dist = "fixed", value = 0.05 }
wait_for_reply = true
fanout = { share = 1.0, width = { dist = "fixed", value = 1 }, turns = { dist = "fixed", value = 2 } }
TOOLS

[traces.t]
process = "constant"
rate_rps = 4.0
duration_s = 1.0
"""
TOOLS = 'tool_calls = { share = 0.7, tokens = { dist = "uniform", low = 1, high = 30 } }'


def _scenario_file(directory: Path, tool_calls: bool = True) -> Path:
    path = directory / ("tools.toml" if tool_calls else "plain.toml")
    path.write_text(SCENARIO.replace("TOOLS", TOOLS if tool_calls else ""))
    return path


def _trace(directory: Path, tool_calls: bool = True) -> Path:
    scenario = load_scenario(_scenario_file(directory, tool_calls))
    return generate_trace_file(scenario, "t", directory / ("t.parquet" if tool_calls else "plain.parquet"))


def test_every_tool_call_piece_is_one_token_and_the_arguments_are_json() -> None:
    tok = get_tokenizer("cl100k_base")
    for count in range(1, 60):
        pieces = [tool_call_piece(j, count) for j in range(count)]
        assert [tok.count(p) for p in pieces] == [1] * count
        if count > 1:
            assert isinstance(json.loads("".join(pieces[1:])), dict)


def test_the_scenario_ends_non_final_steps_in_tool_calls_on_top_of_the_answer(tmp_path: Path) -> None:
    table, _ = read_trace(_trace(tmp_path))
    rows = table.to_pylist()
    last_turn: dict[str, int] = {}
    for r in rows:
        last_turn[r["conversation_id"]] = max(last_turn.get(r["conversation_id"], 0), r["turn_index"])
    with_tool = [r for r in rows if r["tool_call_tokens"] is not None]
    assert with_tool and len(with_tool) < len(rows)
    assert any("/" in r["conversation_id"] for r in with_tool)  # sub-session steps too
    for r in rows:
        tool = r["tool_call_tokens"] or 0
        assert r["output_tokens"] == 5 + (r["reasoning_tokens"] or 0) + tool  # sub-sessions do not reason
        if r["turn_index"] == last_turn[r["conversation_id"]]:
            assert r["tool_call_tokens"] is None  # a session's final step answers in text
    # without tool_calls: the same draws otherwise, and no tool_call_tokens column in the file at all
    plain = _trace(tmp_path, tool_calls=False)

    assert "tool_call_tokens" not in pq.read_schema(plain).names
    assert "tool_call_tokens" in pq.read_schema(tmp_path / "t.parquet").names
    plain_rows = read_trace(plain)[0].to_pylist()
    assert [(r["conversation_id"], r["turn_index"], r["prompt_tokens"] == 40) for r in plain_rows] == [
        (r["conversation_id"], r["turn_index"], r["prompt_tokens"] == 40) for r in rows
    ]


def test_a_live_agent_session_streams_the_tool_calls_asked_for(tmp_path: Path) -> None:
    trace = _trace(tmp_path)
    asked = {r["request_id"]: r for r in read_trace(trace)[0].to_pylist()}
    (tmp_path / "engine.toml").write_text(ENGINE)
    with launch_sim_server(str(tmp_path / "engine.toml")) as sim:
        out = run_trace_sync(
            RunOptions(
                trace_path=trace,
                target_url=sim.base_url,
                out_dir=tmp_path / "live",
                scenario_path=_scenario_file(tmp_path),
                progress="off",
            )
        )
    run = load_run(out)
    chunks = run.chunks.to_pandas()
    requests = run.requests.to_pylist()
    assert {r["request_id"] for r in requests} == set(asked)
    for row in requests:
        t = asked[row["request_id"]]
        tool = t["tool_call_tokens"] or 0
        assert row["status"] == "ok", row
        assert row["finish_reason"] == ("tool_calls" if tool else "length")
        assert row["client_output_tokens"] == row["server_output_tokens"] == t["output_tokens"]
        reasoning = t["reasoning_tokens"] or 0  # main-session steps reason, sub-session steps do not
        assert row["client_reasoning_tokens"] == reasoning
        mine = chunks[(chunks.request_id == row["request_id"]) & (chunks.tokens > 0)].sort_values("seq")
        assert mine[mine.kind == "reasoning"].tokens.sum() == reasoning
        answer = mine[mine.kind == "answer"]
        assert answer.tokens.sum() == t["output_tokens"] - reasoning  # the answer and the tool call
        assert row["first_answer_token_ns"] == answer.arrival_ns.iloc[0]  # TTFAT's end: answer or tool call
        if tool:  # a tool call goes out one token per event: its chunks are the last `tool` answer chunks
            assert (answer.tokens.iloc[-tool:] == 1).all()
    # the recorded text: a tool call's name and arguments follow the answer, as the driver joins them
    texts = {r["request_id"]: r["completion_text"] for r in requests}
    for rid, t in asked.items():
        tool = t["tool_call_tokens"] or 0
        if tool:
            expected = "".join(tool_call_piece(j, tool) for j in range(tool))
            assert texts[rid].endswith(expected)


def _trace_rows(tools: list[int | None]) -> list[dict]:
    return [
        {
            "request_id": f"r{i}",
            "request_class": "agent",
            "scheduled_offset_ns": i * 10**9,  # a second apart: each alone in the engine
            "prompt_tokens": 32,
            "output_tokens": 9,
            "prefix_group": None,
            "prefix_tokens": None,
            "conversation_id": None,
            "turn_index": None,
            "cancel_after_tokens": None,
            "reasoning_tokens": 2 if i % 2 else None,
            "tool_call_tokens": tool,
        }
        for i, tool in enumerate(tools)
    ]


def test_the_worksheet_times_tool_call_tokens_as_any_output_token(tmp_path: Path) -> None:
    (tmp_path / "engine.toml").write_text(ENGINE)
    meta = {"mode": "open", "max_in_flight": 8, "trace_name": "t", "seed": 0}
    # odd rows reason 2 of their 9 tokens: r3 is reasoning then a tool call alone, r4 a tool call alone
    tools = [None, 1, 4, 7, 9, None]
    with_tools = write_trace(
        pa.Table.from_pylist(_trace_rows(tools), schema=TRACE_FULL_SCHEMA), tmp_path / "tools.parquet", meta
    )
    plain = write_trace(
        pa.Table.from_pylist(_trace_rows([None] * len(tools)), schema=TRACE_FULL_SCHEMA), tmp_path / "p.parquet", meta
    )
    scenario = _scenario_file(tmp_path)  # endpoint chat
    a = load_run(run_worksheet(with_tools, tmp_path / "engine.toml", tmp_path / "wa", scenario=scenario))
    b = load_run(run_worksheet(plain, tmp_path / "engine.toml", tmp_path / "wb", scenario=scenario))
    timing = ["first_token_ns", "first_answer_token_ns", "last_token_ns", "done_ns", "client_output_tokens"]
    assert a.requests.select(timing).equals(b.requests.select(timing))
    assert a.chunks.select(["arrival_ns", "tokens", "kind"]).equals(b.chunks.select(["arrival_ns", "tokens", "kind"]))
    reasons = a.requests.column("finish_reason").to_pylist()
    assert reasons == ["tool_calls" if t else "length" for t in tools]


def test_a_tool_call_longer_than_the_output_after_reasoning_is_refused(tmp_path: Path) -> None:
    rows = _trace_rows([None, 8])  # r1 reasons 2 of its 9 tokens: 7 are left
    table = pa.Table.from_pylist(rows, schema=TRACE_FULL_SCHEMA)
    with pytest.raises(TraceError, match=r"tool_call_tokens = 8 \(row 1\): expected at most output_tokens"):
        write_trace(table, tmp_path / "bad.parquet", {"mode": "open"})
    pq.write_table(table, tmp_path / "bad.parquet")  # as another tool might write it
    cli = subprocess.run(
        [sys.executable, "-m", "loadgen", "trace", "stats", str(tmp_path / "bad.parquet")],
        capture_output=True,
        text=True,
    )
    assert cli.returncode == 2 and "Traceback" not in cli.stderr
    assert len(cli.stderr.strip().splitlines()) == 1 and "tool_call_tokens = 8 (row 1)" in cli.stderr


def test_a_whole_reply_names_its_tool_call(tmp_path: Path) -> None:
    (tmp_path / "engine.toml").write_text(ENGINE)
    with launch_sim_server(str(tmp_path / "engine.toml")) as sim:
        body = {"model": "loadgen-sim", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 12}
        reply = httpx.post(f"{sim.base_url}/v1/chat/completions", json={**body, SIM_TOOL_CALL_FIELD: 8}).json()
    choice = reply["choices"][0]
    assert choice["finish_reason"] == "tool_calls" and reply["usage"]["completion_tokens"] == 12
    call = choice["message"]["tool_calls"][0]
    assert call["type"] == "function" and call["function"]["name"] == tool_call_piece(0, 8)
    assert json.loads(call["function"]["arguments"]) == {"q": "".join(tool_call_piece(j, 8) for j in range(4, 7))}
    tok = get_tokenizer("cl100k_base")
    assert tok.count(choice["message"]["content"]) == 4  # the answer before the call
