"""Reasoning models: reasoning deltas recorded apart from the answer, TTFT and TTFAT exact.

The five recorded real streams of ``shared/traces/reasoning_sse/`` (SOURCES.md §7: ``reasoning_content`` and
``reasoning``, several tokens per chunk, reasoning followed by tool calls; six responses, the Cerebras file
holds two) are replayed by a small scripted server on loopback and recorded by the real driver. Every
expected number below was counted by hand from the files (event indices from 0, the ``data:`` events of one
response in order; tokens of the run's tokenizer, cl100k_base, per delta).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from shared_paths import shared_trace

from loadgen.analysis import analyze_run
from loadgen.driver import RunOptions, run_trace_sync
from loadgen.driver.sse import parse_chunk
from loadgen.rundir.io import load_run
from loadgen.rundir.schema import TRACE_FULL_SCHEMA, TRACE_SCHEMA
from loadgen.trace.io import write_trace
from loadgen.workload.scenario import parse_scenario

STREAMS_DIR = "reasoning_sse/vercel-ai"

#: class name -> (file, response index in the file, first reasoning event, first answer event, reasoning
#: events, answer events, client reasoning tokens, client answer tokens, server completion tokens, server
#: reasoning tokens, finish reason)
CASES = {
    "deepseek": ("deepseek-reasoning.chunks.txt", 0, 1, 206, 205, 13, 205, 13, 219, 205, "stop"),
    "deepseek-tools": ("deepseek-tool-call.chunks.txt", 0, 1, 40, 39, 11, 39, 12, 83, 39, "tool_calls"),
    "groq": ("groq-reasoning.chunks.txt", 0, 1, 964, 963, 139, 963, 139, 1107, 963, "stop"),
    "qwen3-max": ("alibaba-reasoning.chunks.txt", 0, 1, 221, 220, 52, 1080, 269, 1355, 1084, "stop"),
    "glm-tools-1": ("cererebras-structured-output-tools.1.chunks.txt", 0, 1, 33, 32, 1, 96, 5, 104, 97, "tool_calls"),
    "glm-tools-2": (
        "cererebras-structured-output-tools.1.chunks.txt",
        1,
        1,
        53,
        51,
        8,
        107,
        12,
        122,
        108,
        "tool_calls",
    ),
}


def _responses(name: str) -> list[list[bytes]]:
    """The event payloads of each response in a recorded file (one JSON chunk per line), by response id."""
    by_id: dict[str, list[bytes]] = {}
    for line in shared_trace(f"{STREAMS_DIR}/{name}").read_bytes().split(b"\n"):
        if line.strip():
            by_id.setdefault(json.loads(line).get("id"), []).append(line)
    return list(by_id.values())


def _events(case: str) -> list[bytes]:
    file, index, *_ = CASES[case]
    return _responses(file)[index]


@pytest.mark.parametrize("case", list(CASES))
def test_parser_keeps_reasoning_apart(case: str) -> None:
    _, _, first_r, first_a, n_r, n_a, _, _, completion, reasoning, finish = CASES[case]
    chunks = [parse_chunk(p) for p in _events(case)]
    kinds = [(bool(c.reasoning), bool(c.text)) for c in chunks]
    assert kinds.index((True, False)) == first_r and kinds.index((False, True)) == first_a
    assert sum(r for r, _ in kinds) == n_r and sum(a for _, a in kinds) == n_a
    assert not any(r and a for r, a in kinds)  # no recorded chunk carries both kinds
    last = next(c for c in reversed(chunks) if c.completion_tokens is not None)
    assert (last.completion_tokens, last.reasoning_tokens) == (completion, reasoning)
    assert [c.finish_reason for c in chunks if c.finish_reason][-1] == finish


def test_a_chunk_with_both_kinds_and_usage_splits_by_the_reasoning_text() -> None:
    chunk = parse_chunk(
        b'{"choices":[{"delta":{"reasoning":"so yes","content":"Yes"}}],'
        b'"usage":{"prompt_tokens":3,"completion_tokens":9,"completion_tokens_details":{"reasoning_tokens":7}}}'
    )
    assert (chunk.text, chunk.reasoning, chunk.pieces, chunk.reasoning_tokens) == ("Yes", "so yes", 1, 7)


SERVER = r"""
import asyncio, json, sys
RESPONSES = json.load(open(sys.argv[1]))  # case -> list of event payloads (str)
PAUSE_S = 0.05  # before the first answer event: the answer arrives apart from the reasoning

async def handle(reader, writer):
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            lines = head.decode().split("\r\n")
            method, path, _ = lines[0].split(" ")
            hdr = {l.split(":", 1)[0].lower(): l.split(":", 1)[1].strip() for l in lines[1:] if ":" in l}
            body = await reader.readexactly(int(hdr.get("content-length", "0")))
            if method == "GET":
                data = b'{"data": [{"id": "reasoner", "owned_by": "replay"}]}' if path == "/v1/models" else b"{}"
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n" % len(data) + data)
                await writer.drain()
                continue
            messages = json.loads(body)["messages"]
            case = messages[-1]["content"].split()[0]
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
            answered = False
            for payload in RESPONSES[case]:
                delta = (json.loads(payload).get("choices") or [{}])[0].get("delta") or {}
                if not answered and (delta.get("content") or delta.get("tool_calls")):
                    answered = True
                    await asyncio.sleep(PAUSE_S)
                part = b"data: " + payload.encode() + b"\n\n"
                writer.write(b"%x\r\n" % len(part) + part + b"\r\n")
                await writer.drain()
            tail = b"data: [DONE]\n\n"
            writer.write(b"%x\r\n" % len(tail) + tail + b"\r\n0\r\n\r\n")
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    finally:
        writer.close()

async def main():
    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    print("listening", server.sockets[0].getsockname()[1], flush=True)
    async with server:
        await server.serve_forever()

asyncio.run(main())
"""


@pytest.fixture(scope="module")
def replay_url(tmp_path_factory: pytest.TempPathFactory):
    responses = tmp_path_factory.mktemp("replay") / "responses.json"
    responses.write_text(json.dumps({case: [p.decode() for p in _events(case)] for case in CASES}))
    proc = subprocess.Popen([sys.executable, "-c", SERVER, str(responses)], stdout=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        assert line.startswith("listening"), line
        yield f"http://127.0.0.1:{int(line.split()[1])}"
    finally:
        proc.kill()
        proc.wait(timeout=10)


def _scenario():
    budget = {"ttft_ms": {"p50": 60_000}, "ttfat_ms": {"p50": 1}}  # TTFAT's limit fails: the pause alone is 50 ms
    classes = {
        case: {
            "share": 1 / len(CASES),
            "input_tokens": {"dist": "fixed", "value": 8},
            "output_tokens": {"dist": "fixed", "value": 8},
            "budgets": budget,
        }
        for case in CASES
    }
    return parse_scenario(
        {
            "name": "reasoning-replay",
            "seed": 1,
            "endpoint": "chat",
            "classes": classes,
            "traces": {"t": {"process": "constant", "rate_rps": 10, "duration_s": 1}},
        }
    )


def test_recorded_reasoning_streams_through_the_driver(replay_url, tmp_path: Path, monkeypatch) -> None:
    import loadgen.driver.jobs as jobs

    class Steered(jobs.PromptSynth):  # the prompt's first word names the recorded response to replay
        def text(self, key, n_tokens, prefix_key=None, prefix_tokens=0):
            return f"{key} please"

    monkeypatch.setattr(jobs, "PromptSynth", Steered)
    rows = [
        {
            "request_id": case,
            "request_class": case,
            "scheduled_offset_ns": i * 200_000_000,
            "prompt_tokens": 8,
            "output_tokens": 8,
            "prefix_group": None,
            "prefix_tokens": None,
            "conversation_id": None,
            "turn_index": None,
            "cancel_after_tokens": None,
        }
        for i, case in enumerate(CASES)
    ]
    trace = write_trace(
        pa.Table.from_pylist(rows, schema=TRACE_SCHEMA),
        tmp_path / "t.parquet",
        {"mode": "open", "max_in_flight": 1, "trace_name": "reasoning", "seed": 0},
    )
    out = run_trace_sync(
        RunOptions(
            trace_path=trace,
            target_url=replay_url,
            out_dir=tmp_path / "run",
            endpoint="chat",
            progress="off",
            vllm_extensions="off",
        )
    )
    run = load_run(out)
    requests = {r["request_id"]: r for r in run.requests.to_pylist()}
    chunks = run.chunks.to_pandas()
    analysis = analyze_run(out, scenario=_scenario())
    for case, (_, _, first_r, first_a, n_r, n_a, r_tok, a_tok, completion, reasoning, finish) in CASES.items():
        row = requests[case]
        mine = chunks[chunks.request_id == case].sort_values("seq")
        arrival = mine.arrival_ns.tolist()
        assert row["status"] == "ok" and row["finish_reason"] == finish, row
        # one chunk row per event: the first token of either kind is event first_r, the first answer event first_a
        assert row["first_token_ns"] == arrival[first_r] and row["first_answer_token_ns"] == arrival[first_a]
        assert row["first_answer_token_ns"] >= arrival[first_a - 1] >= row["first_token_ns"]
        assert (mine.kind == "reasoning").sum() == n_r
        assert ((mine.kind == "answer") & (mine.tokens > 0)).sum() == n_a
        assert (row["client_reasoning_tokens"], row["client_output_tokens"] - row["client_reasoning_tokens"]) == (
            r_tok,
            a_tok,
        )
        assert (row["server_output_tokens"], row["server_reasoning_tokens"]) == (completion, reasoning)
        # the analysis per class: one request each, so p50 is that request's TTFT and TTFAT, exactly
        metrics = analysis.classes[case].metrics
        assert metrics["ttft_ms"]["p50"] == (row["first_token_ns"] - row["scheduled_ns"]) / 1e6
        assert metrics["ttfat_ms"]["p50"] == (row["first_answer_token_ns"] - row["scheduled_ns"]) / 1e6
        assert analysis.classes[case].tokens["reasoning"]["client_reasoning"] == r_tok
        assert analysis.classes[case].tokens["reasoning"]["server_reasoning"] == reasoning
    # one request per class: every verdict is inconclusive, but the point estimates say which budget holds
    over = {(c.class_name, c.metric) for c in analysis.checks if not c.passed}
    assert over == {(case, "ttfat_ms") for case in CASES}  # TTFT's budget holds, TTFAT's does not


# ------------------------------------------------------------------ the simulated engine's reasoning phase

SIM_SCENARIO = """\
name = "reasoner"
seed = 11
endpoint = "chat"

[classes.think]
share = 0.5
input_tokens = { dist = "fixed", value = 32 }
output_tokens = { dist = "fixed", value = 6 }
# bimodal: most requests think briefly, a quarter think long
reasoning_tokens = { dist = "mixture", components = [
  { weight = 3, of = { dist = "fixed", value = 4 } },
  { weight = 1, of = { dist = "uniform", low = 20, high = 30 } },
] }
[classes.think.budgets]
ttfat_ms = { p99 = 60000 }

[classes.plain]
share = 0.5
input_tokens = { dist = "fixed", value = 32 }
output_tokens = { dist = "fixed", value = 6 }

[traces.t]
process = "constant"
rate_rps = 20
duration_s = 2
"""

#: One step = 10 ms, nothing else costs: a lone request's k-th output token (from 1) arrives at k x 10 ms.
STEP_ENGINE = """\
name = "ten-ms-steps"
model = "loadgen-sim"
tokenizer = "cl100k_base"
[scheduler]
max_num_seqs = 64
max_num_batched_tokens = 4096
chunked_prefill = true
max_model_len = 8192
[kv]
block_size = 16
num_kv_blocks = 4096
enable_prefix_caching = false
[cost]
fixed_ms = 10.0
per_prefill_token_ms = 0.0
per_decode_seq_ms = 0.0
per_kv_token_ms = 0.0
noise_sigma = 0.0
[batching]
window_ms = 0
[stream]
coalesce = false
"""


def test_mixture_distribution_is_bimodal_and_seeded(tmp_path: Path) -> None:
    import numpy as np

    from loadgen.workload.distributions import sample_tokens
    from loadgen.workload.scenario import load_scenario

    scenario = load_scenario(_write(tmp_path, "s.toml", SIM_SCENARIO))
    dist = scenario.classes["think"].reasoning_tokens
    a = sample_tokens(dist, np.random.default_rng(3), 40_000)
    assert (a == sample_tokens(dist, np.random.default_rng(3), 40_000)).all()
    short, long = a == 4, (a >= 20) & (a <= 30)
    assert (short | long).all() and abs(short.mean() - 0.75) < 0.01  # weight 3 of 4


def _write(directory: Path, name: str, text: str) -> Path:
    path = directory / name
    path.write_text(text)
    return path


def test_trace_carries_reasoning_on_top_of_the_answer(tmp_path: Path) -> None:
    from loadgen.trace.generate import generate_trace
    from loadgen.workload.scenario import load_scenario

    table, _ = generate_trace(load_scenario(_write(tmp_path, "s.toml", SIM_SCENARIO)), "t")
    rows = table.to_pylist()
    think = [r for r in rows if r["request_class"] == "think"]
    assert think and all(r["output_tokens"] == 6 + r["reasoning_tokens"] for r in think)
    assert {r["reasoning_tokens"] == 4 for r in think} == {True, False}  # both modes drawn
    assert all(r["reasoning_tokens"] is None and r["output_tokens"] == 6 for r in rows if r["request_class"] == "plain")


def test_worksheet_ttft_and_ttfat_exact(tmp_path: Path) -> None:
    """A lone request, R reasoning then A answer tokens, one token per 10 ms step: TTFT = 10 ms (the prefill
    step emits the first token), TTFAT = (R + 1) x 10 ms, E2E = (R + A) x 10 ms."""
    from loadgen.sim import run_worksheet

    engine = _write(tmp_path, "engine.toml", STEP_ENGINE)
    rows = [
        {
            "request_id": f"r{i}",
            "request_class": "think",
            "scheduled_offset_ns": i * 10**9,  # a second apart: never two in one step
            "prompt_tokens": 32,
            "output_tokens": reasoning + 3,
            "prefix_group": None,
            "prefix_tokens": None,
            "conversation_id": None,
            "turn_index": None,
            "cancel_after_tokens": None,
            "think_after_reply_ns": None,
            "reasoning_tokens": reasoning,
        }
        for i, reasoning in enumerate([0, 1, 7, 25])
    ]
    trace = write_trace(
        pa.Table.from_pylist(rows, schema=TRACE_FULL_SCHEMA),
        tmp_path / "t.parquet",
        {"mode": "open", "max_in_flight": 8, "trace_name": "t", "seed": 0},
    )
    scenario = _write(tmp_path, "s.toml", SIM_SCENARIO)
    run_worksheet(trace, engine, tmp_path / "ws", scenario=scenario)
    run = load_run(tmp_path / "ws")
    got = {r["request_id"]: r for r in run.requests.to_pylist()}
    chunks = run.chunks.to_pandas()
    for i, reasoning in enumerate([0, 1, 7, 25]):
        row = got[f"r{i}"]
        t0 = row["scheduled_ns"]
        assert row["first_token_ns"] - t0 == 10_000_000
        assert row["first_answer_token_ns"] - t0 == (reasoning + 1) * 10_000_000
        assert row["last_token_ns"] - t0 == (reasoning + 3) * 10_000_000
        assert (row["client_reasoning_tokens"], row["server_reasoning_tokens"]) == (reasoning, reasoning or None)
        mine = chunks[chunks.request_id == f"r{i}"]
        assert (mine.kind == "reasoning").sum() == reasoning and (mine.kind == "answer").sum() == 3
    analysis = analyze_run(tmp_path / "ws")
    ttfat = analysis.classes["think"].metrics["ttfat_ms"]
    assert (ttfat["n"], ttfat["max"]) == (4, 260.0) and analysis.classes["think"].metrics["ttft_ms"]["max"] == 10.0


def test_live_simulated_engine_streams_reasoning(tmp_path: Path, sim_server) -> None:
    from loadgen.trace.generate import generate_trace_file
    from loadgen.workload.scenario import load_scenario

    scenario_path = _write(tmp_path, "s.toml", SIM_SCENARIO)
    trace = generate_trace_file(load_scenario(scenario_path), "t", tmp_path / "t.parquet")
    sim = sim_server("interactive-small-batch")  # a step per token (~6 ms): reasoning and answer arrive apart
    out = run_trace_sync(
        RunOptions(
            trace_path=trace,
            target_url=sim.base_url,
            out_dir=tmp_path / "live",
            scenario_path=scenario_path,
            progress="off",
        )
    )
    run = load_run(out)
    asked = {r["request_id"]: r["reasoning_tokens"] for r in pq_rows(trace)}
    chunks = run.chunks.to_pandas()
    for row in run.requests.to_pylist():
        reasoning = asked[row["request_id"]] or 0
        assert row["status"] == "ok", row
        assert (row["client_reasoning_tokens"], row["server_reasoning_tokens"]) == (reasoning, reasoning or None)
        assert row["client_output_tokens"] - row["client_reasoning_tokens"] == 6
        mine = chunks[(chunks.request_id == row["request_id"]) & (chunks.tokens > 0)].sort_values("seq")
        answer = mine[mine.kind == "answer"]
        assert row["first_answer_token_ns"] == answer.arrival_ns.iloc[0]
        assert row["first_token_ns"] == mine.arrival_ns.iloc[0] <= row["first_answer_token_ns"]
        assert mine[mine.kind == "reasoning"].tokens.sum() == reasoning  # one token per event (coalesce off)
    analysis = analyze_run(out)
    think, plain = analysis.classes["think"].metrics, analysis.classes["plain"].metrics
    assert think["ttfat_ms"]["n"] == think["ttft_ms"]["n"] and think["ttfat_ms"]["mean"] > think["ttft_ms"]["mean"]
    assert analysis.classes["think"].tokens["reasoning"]["client_reasoning"] == sum(
        v or 0 for k, v in asked.items() if k in set(run.requests.column("request_id").to_pylist())
    )
    assert analysis.classes["plain"].tokens["reasoning"]["n_requests_with_reasoning"] == 0
    assert plain["ttfat_ms"]["n"] == plain["ttft_ms"]["n"]
    assert any(c.class_name == "think" and c.metric == "ttfat_ms" for c in analysis.checks)


def pq_rows(path: Path) -> list[dict]:
    return pq.read_table(path).to_pylist()
