"""ShareGPT import: the real text as prompts, threads with the recorded replies as history, token counts from
the given tokenizer; figures recomputed here from the JSON, and a live replay on the simulated engine."""

from __future__ import annotations

import json
import subprocess
import sys

from loadgen.driver.jobs import build_jobs
from loadgen.rundir.io import load_run
from loadgen.trace.io import read_trace
from loadgen.workload.prompts import get_tokenizer

CONVERSATIONS = [
    {
        "id": "a1",
        "conversations": [
            {"from": "human", "value": "What is a KV cache?"},
            {"from": "gpt", "value": "It stores the keys and values of earlier tokens so they are not recomputed."},
            {"from": "human", "value": "And prefix caching?"},
            {"from": "gpt", "value": "Requests that start alike reuse those blocks."},
        ],
    },
    {"id": "b2", "conversations": [{"from": "gpt", "value": "orphan reply"}, {"from": "human", "value": "no answer"}]},
    {
        "id": "c3",
        "conversations": [
            {"from": "system", "value": "be brief"},
            {"from": "human", "value": "Name three"},
            {"from": "human", "value": "prime numbers."},
            {"from": "gpt", "value": "2, 3, 5."},
        ],
    },
]


def _import(tmp_path, *extra: str):
    src = tmp_path / "sharegpt.json"
    src.write_text(json.dumps(CONVERSATIONS))
    out = tmp_path / "t.pq"
    cmd = [sys.executable, "-m", "loadgen", "trace", "import", "sharegpt", str(src), "--out", str(out), *extra]
    res = subprocess.run(cmd, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    return read_trace(out)


def test_turns_text_and_token_counts_follow_the_file(tmp_path):
    table, meta = _import(tmp_path, "--rate-rps", "2")
    rows = table.to_pylist()
    count = get_tokenizer("cl100k_base").count
    a = CONVERSATIONS[0]["conversations"]
    c_user, c_reply = "Name three\nprime numbers.", "2, 3, 5."
    assert [r["prompt_text"] for r in rows] == [a[0]["value"], a[2]["value"], c_user]
    assert [r["reply_text"] for r in rows] == [a[1]["value"], a[3]["value"], c_reply]
    assert [r["conversation_id"] for r in rows] == ["sg0", "sg0", "sg2"]  # b2 has no answered user message
    assert [r["turn_index"] for r in rows] == [0, 1, 0]
    first = count(a[0]["value"])
    assert [r["prompt_tokens"] for r in rows] == [
        first,
        first + count(a[1]["value"]) + count(a[2]["value"]),
        count(c_user),
    ]
    assert [r["output_tokens"] for r in rows] == [count(a[1]["value"]), count(a[3]["value"]), count(c_reply)]
    assert [r["scheduled_offset_ns"] for r in rows] == [0, 1, 500_000_000]  # 2 conversations/s
    assert [r["think_after_reply_ns"] for r in rows] == [None, 0, None]
    assert meta["conversations"] == 2 and meta["tokenizer"] == "cl100k_base"


def test_the_driver_sends_the_real_text_with_the_replies_as_history(tmp_path):
    table, _ = _import(tmp_path)
    jobs = build_jobs(table, model="m", endpoint="chat", tokenizer=get_tokenizer("cl100k_base"))
    second = json.loads(jobs[1].body)["messages"]
    a = CONVERSATIONS[0]["conversations"]
    assert second == [
        {"role": "user", "content": a[0]["value"]},
        {"role": "assistant", "content": a[1]["value"]},
        {"role": "user", "content": a[2]["value"]},
    ]
    assert [job.client_prompt_tokens for job in jobs] == table.column("prompt_tokens").to_pylist()


def test_a_window_keeps_only_the_threads_it_opens(tmp_path):
    table, _ = _import(tmp_path, "--start-s", "0.5")
    assert table.column("conversation_id").to_pylist() == ["sg2"]
    assert table.column("scheduled_offset_ns").to_pylist() == [0]


def test_live_replay_on_the_simulated_engine(tmp_path, sim_server):
    _import(tmp_path, "--rate-rps", "50")
    sim = sim_server("instant")
    run = [sys.executable, "-m", "loadgen", "run", str(tmp_path / "t.pq"), "--target", sim.base_url]
    run += ["--out", str(tmp_path / "run"), "--endpoint", "chat", "--progress", "off"]
    res = subprocess.run(run, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    req = load_run(tmp_path / "run").requests.to_pandas().sort_values("request_id")
    assert (req.status == "ok").all() and len(req) == 3
    assert (req.client_output_tokens == req.target_output_tokens).all()
    assert (req.server_prompt_tokens == req.target_prompt_tokens).all()  # the engine counts what was imported


def test_bad_sharegpt_is_refused_in_one_line(tmp_path):
    src = tmp_path / "bad.json"
    src.write_text(json.dumps([{"id": 1, "conversations": [{"from": "human"}]}]))
    cmd = [sys.executable, "-m", "loadgen", "trace", "import", "sharegpt", str(src), "--out", str(tmp_path / "t")]
    res = subprocess.run(cmd, capture_output=True, text=True)
    assert res.returncode == 2 and "message 0" in res.stderr and len(res.stderr.strip().splitlines()) == 1
