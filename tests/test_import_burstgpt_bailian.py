"""BurstGPT CSV and Alibaba Bailian JSONL imports: small files written here after the published schemas
(SOURCES.md §9), imported through the real CLI, and every figure recomputed from the file independently:
request counts per class, token sums, arrival gaps, and (Bailian) the thread structure from the parent links."""

from __future__ import annotations

import csv
import json
import random
import subprocess
import sys
from collections import Counter, defaultdict
from pathlib import Path

import pytest

from loadgen.rundir.io import load_run
from loadgen.trace.io import read_trace

BURST_HEADER = ["Timestamp", "Model", "Request tokens", "Response tokens", "Total tokens", "Log Type"]


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "loadgen", "trace", "import", *args], capture_output=True, text=True)


def write_burstgpt(path: Path, n: int = 400, seed: int = 7) -> list[dict]:
    rng = random.Random(seed)
    rows, t = [], 0.0
    for _ in range(n):
        t += rng.choice([0.0, 0.25, 1.5, 3.0])
        req, resp = rng.randint(1, 3000), rng.choice([0, rng.randint(1, 900)])  # 0: a failed request
        rows.append(
            {
                "Timestamp": round(t, 3),
                "Model": rng.choice(["ChatGPT", "GPT-4"]),
                "Request tokens": req,
                "Response tokens": resp,
                "Total tokens": req + resp,
                "Log Type": rng.choice(["Conversation log", "API log"]),
            }
        )
    with open(path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, BURST_HEADER)
        writer.writeheader()
        writer.writerows(rows)
    return rows


def test_burstgpt_one_class_per_model_keeps_counts_lengths_and_gaps(tmp_path):
    src = tmp_path / "BurstGPT_1.csv"
    rows = write_burstgpt(src)
    res = _cli("burstgpt", str(src), "--out", str(tmp_path / "t.pq"), "--class-by", "model")
    assert res.returncode == 0, res.stderr
    table, meta = read_trace(tmp_path / "t.pq")
    got = table.to_pylist()
    assert len(got) == meta["requests"] == 400
    slug = {"ChatGPT": "chatgpt", "GPT-4": "gpt-4"}
    assert Counter(r["request_class"] for r in got) == Counter(slug[r["Model"]] for r in rows)
    assert [r["request_class"] for r in got] == [slug[r["Model"]] for r in rows]  # already in time order
    assert sum(r["prompt_tokens"] for r in got) == sum(r["Request tokens"] for r in rows)
    failed = sum(1 for r in rows if r["Response tokens"] == 0)
    assert sum(r["output_tokens"] for r in got) == sum(r["Response tokens"] for r in rows) + failed  # 0 -> 1
    gaps = [round((b["Timestamp"] - a["Timestamp"]) * 1e9) for a, b in zip(rows, rows[1:])]
    offsets = [r["scheduled_offset_ns"] for r in got]
    assert [b - a for a, b in zip(offsets, offsets[1:])] == gaps
    assert meta["class_by"] == "Model" and meta["duration_s"] == pytest.approx(
        rows[-1]["Timestamp"] - rows[0]["Timestamp"]
    )


def test_burstgpt_log_types_map_to_the_users_names_and_a_window_cuts(tmp_path):
    src = tmp_path / "b.csv"
    rows = write_burstgpt(src, seed=3)
    out = tmp_path / "t.pq"
    mapping = ["--class-map", "Conversation log=chat", "--class-map", "API log=api"]
    res = _cli("burstgpt", str(src), "--out", str(out), "--class-by", "log-type", *mapping, "--start-s", "20")
    assert res.returncode == 0, res.stderr
    table, _ = read_trace(out)
    kept = [r for r in rows if r["Timestamp"] - rows[0]["Timestamp"] >= 20]
    names = {"Conversation log": "chat", "API log": "api"}
    assert table.column("request_class").to_pylist() == [names[r["Log Type"]] for r in kept]
    assert table.column("prompt_tokens").to_pylist() == [r["Request tokens"] for r in kept]


def _bailian_sessions(n_sessions: int, seed: int) -> list[dict]:
    """Sessions of 1-5 turns; each turn's prompt holds the previous prompt and reply (16-token hash blocks)."""
    rng = random.Random(seed)
    lines, next_id, next_hash = [], 1000, 1
    for _ in range(n_sessions):
        t = rng.uniform(0, 600)
        parent, hashes, length = -1, [], 0
        for turn in range(1, rng.randint(1, 5) + 1):
            length += rng.randint(20, 400)
            while len(hashes) < -(-length // 16):
                hashes.append(next_hash)
                next_hash += 1
            out = rng.randint(1, 300)
            lines.append(
                {
                    "chat_id": next_id,
                    "parent_chat_id": parent,
                    "timestamp": round(t, 3),
                    "input_length": length,
                    "output_length": out,
                    "type": rng.choice(["text", "search", "image", "file"]),
                    "turn": turn,
                    "hash_ids": list(hashes),
                }
            )
            parent, next_id = next_id, next_id + 1
            length += out
            t += rng.uniform(5, 60)
    rng.shuffle(lines)  # the file need not be in time order
    return lines


def test_bailian_sessions_become_threads_in_parent_order(tmp_path):
    lines = _bailian_sessions(60, seed=11)
    src = tmp_path / "qwen_traceA.jsonl"
    src.write_text("".join(json.dumps(rec) + "\n" for rec in lines))
    res = _cli("bailian", str(src), "--out", str(tmp_path / "t.pq"), "--class-by", "type")
    assert res.returncode == 0, res.stderr
    table, meta = read_trace(tmp_path / "t.pq")
    got = table.to_pylist()
    ordered = sorted(lines, key=lambda r: r["timestamp"])
    assert len(got) == len(lines) and meta["block_hash_tokens"] == 16
    assert [r["prompt_tokens"] for r in got] == [r["input_length"] for r in ordered]
    assert [r["request_class"] for r in got] == [r["type"] for r in ordered]
    assert [r["prompt_block_hashes"] for r in got] == [r["hash_ids"] for r in ordered]
    # threads: the session's first chat id, from the parent links written out here
    by_id = {r["chat_id"]: r for r in lines}

    def root(rec: dict) -> int:
        while rec["parent_chat_id"] != -1:
            rec = by_id[rec["parent_chat_id"]]
        return rec["chat_id"]

    assert [r["conversation_id"] for r in got] == [f"bl{root(r)}" for r in ordered]
    assert [r["turn_index"] for r in got] == [r["turn"] - 1 for r in ordered]  # parents' order = turn order
    sessions = defaultdict(list)
    for r in got:
        sessions[r["conversation_id"]].append(r["scheduled_offset_ns"])
    assert len(sessions) == 60 and all(s == sorted(s) for s in sessions.values())
    t0 = ordered[0]["timestamp"]
    assert [r["scheduled_offset_ns"] for r in got] == [round((r["timestamp"] - t0) * 1e9) for r in ordered]


def test_bailian_replays_threads_against_the_live_engine(tmp_path, sim_server):
    lines = _bailian_sessions(6, seed=5)
    src = tmp_path / "b.jsonl"
    src.write_text("".join(json.dumps(rec) + "\n" for rec in lines))
    assert _cli("bailian", str(src), "--out", str(tmp_path / "t.pq"), "--time-scale", "0.001").returncode == 0
    sim = sim_server("instant")
    run = [sys.executable, "-m", "loadgen", "run", str(tmp_path / "t.pq"), "--target", sim.base_url]
    res = subprocess.run([*run, "--out", str(tmp_path / "run"), "--progress", "off"], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    req = load_run(tmp_path / "run").requests.to_pandas()
    ok = req[req.status == "ok"]
    assert len(ok) == len(lines)
    assert (ok.server_prompt_tokens == ok.target_prompt_tokens).all()


@pytest.mark.parametrize(
    ("kind", "text", "needle"),
    [
        ("burstgpt", "Timestamp,Model\n1,x\n", "header"),
        ("burstgpt", ",".join(BURST_HEADER) + "\n1.0,ChatGPT,abc,3,3,API log\n", "Request tokens"),
        ("burstgpt", ",".join(BURST_HEADER) + "\n-1.0,ChatGPT,1,3,4,API log\n", "Timestamp = -1.0"),
        ("burstgpt", ",".join(BURST_HEADER) + "\n1.0,ChatGPT,-5,3,-2,API log\n", "prompt tokens = -5"),
        ("bailian", '{"chat_id": 1, "parent_chat_id": -1}\n', "missing timestamp"),
        ("bailian", "not json\n", "expected Bailian JSONL"),
        (
            "bailian",
            '{"chat_id":1,"parent_chat_id":2,"timestamp":0,"input_length":1,"output_length":1}\n'
            '{"chat_id":2,"parent_chat_id":1,"timestamp":1,"input_length":1,"output_length":1}\n',
            "loops",
        ),
        (
            "bailian",
            '{"chat_id":1,"parent_chat_id":-1,"timestamp":0,"input_length":1,"output_length":1}\n' * 2,
            "more than once",
        ),
    ],
)
def test_bad_sources_are_refused_in_one_line(tmp_path, kind, text, needle):
    src = tmp_path / "bad"
    src.write_text(text)
    res = _cli(kind, str(src), "--out", str(tmp_path / "t.pq"))
    assert res.returncode == 2, res.stderr
    assert needle in res.stderr and "Traceback" not in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1


def test_a_source_value_that_is_no_class_name_asks_for_a_mapping(tmp_path):
    src = tmp_path / "b.csv"
    src.write_text(",".join(BURST_HEADER) + "\n1.0,???,1,3,4,API log\n")
    res = _cli("burstgpt", str(src), "--out", str(tmp_path / "t.pq"), "--class-by", "model")
    assert res.returncode == 2 and "--class-map" in res.stderr
    ok = _cli("burstgpt", str(src), "--out", str(tmp_path / "t.pq"), "--class-by", "model", "--class-map", "???=odd")
    assert ok.returncode == 0, ok.stderr


def _bailian_line(input_length: int, hash_ids: int) -> str:
    return json.dumps(
        {
            "chat_id": 1,
            "parent_chat_id": -1,
            "timestamp": 0,
            "input_length": input_length,
            "output_length": 1,
            "hash_ids": list(range(hash_ids)),
        }
    )


@pytest.mark.parametrize(
    ("kind", "text", "needle"),
    [
        (
            "burstgpt",
            ",".join(BURST_HEADER) + "\n1.0,ChatGPT,10,3,13,API log\n2.0,GPT-4,10,3,99,API log\n",
            "row 3: Total tokens = 99: expected Request tokens + Response tokens = 10 + 3",
        ),
        ("burstgpt", ",".join(BURST_HEADER) + "\n1.0,ChatGPT,10,0,0,API log\n", "row 2: Total tokens = 0"),
        ("bailian", _bailian_line(17, 3) + "\n", "request 1: hash_ids holds 3 ids: expected at most one per 16"),
        ("bailian", _bailian_line(0, 1) + "\n", "hash_ids holds 1 ids: expected at most one per 16-token block"),
        ("bailian", _bailian_line(16, 1 << 16) + "\n", "hash_ids holds 65536 ids"),
    ],
    ids=["burst-total", "burst-total-0", "bailian-3-ids", "bailian-empty-prompt", "bailian-65536-ids"],
)
def test_counts_that_disagree_with_the_requests_tokens_are_one_line(tmp_path, kind, text, needle):
    """Was: BurstGPT's Total tokens was never read, and Bailian hash_ids longer than the prompt's blocks were
    imported (65,536 ids for a 16-token prompt). Now each is one line naming the row, exit 2, no trace written."""
    src = tmp_path / "src"
    src.write_text(text)
    res = _cli(kind, str(src), "--out", str(tmp_path / "t.pq"))
    assert res.returncode == 2, res.stderr
    assert needle in res.stderr and str(src) in res.stderr and "Traceback" not in res.stderr, res.stderr
    assert len(res.stderr.strip().splitlines()) == 1 and not (tmp_path / "t.pq").exists()


@pytest.mark.parametrize(("input_length", "hash_ids"), [(17, 2), (17, 1), (16, 0), (0, 0)])
def test_bailian_hash_ids_up_to_the_prompts_blocks_import(tmp_path, input_length, hash_ids):
    src = tmp_path / "src"
    src.write_text(_bailian_line(input_length, hash_ids) + "\n")
    res = _cli("bailian", str(src), "--out", str(tmp_path / "t.pq"))
    assert res.returncode == 0, res.stderr
