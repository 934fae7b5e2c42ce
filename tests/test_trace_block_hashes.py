"""Prompt block hashes: the LLMServingSim workload import keeps counts, lengths, arrivals and prefix structure
exactly (recomputed here from the file), Mooncake keeps its hash_ids, and a trace file carries them intact."""

from __future__ import annotations

import hashlib
import json
import struct
import subprocess
import sys

import pyarrow as pa
import pytest
from shared_paths import shared_trace

from loadgen.rundir.schema import TRACE_FULL_SCHEMA
from loadgen.trace.block_hashes import chained_block_hashes
from loadgen.trace.importers import import_trace
from loadgen.trace.io import read_trace, write_trace
from loadgen.util.errors import TraceError

WORKLOADS = ["sharegpt-llama-3.1-8b-300-sps10.jsonl", "sharegpt-qwen3-30b-a3b-300-sps10.jsonl"]


def _reference_hashes(ids: list[int], block: int = 16) -> list[int]:
    """The documented rule written out independently: blake2b-64(prev int64 LE || ids int64 LE), full blocks."""
    out, prev = [], 0
    for k in range(len(ids) // block):
        payload = struct.pack("<q", prev) + struct.pack(f"<{block}q", *ids[k * block : (k + 1) * block])
        prev = struct.unpack("<q", hashlib.blake2b(payload, digest_size=8).digest())[0]
        out.append(prev)
    return out


@pytest.mark.parametrize("name", WORKLOADS)
def test_llmservingsim_workload_import_keeps_everything_exactly(tmp_path, name):
    src = shared_trace(f"llmservingsim/workloads/{name}")
    records = [json.loads(line) for line in src.read_text().splitlines() if line.strip()]
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "loadgen",
            "trace",
            "import",
            "llmservingsim",
            str(src),
            "--out",
            str(tmp_path / "t.pq"),
        ],
        capture_output=True,
        text=True,
    )
    assert res.returncode == 0, res.stderr
    table, meta = read_trace(tmp_path / "t.pq")
    rows = table.to_pylist()
    assert len(rows) == len(records) == meta["requests"] == 300
    assert meta["block_hash_tokens"] == 16
    assert [r["scheduled_offset_ns"] for r in rows] == [rec["arrival_time_ns"] for rec in records]
    assert [r["prompt_tokens"] for r in rows] == [rec["input_toks"] for rec in records]
    assert [r["output_tokens"] for r in rows] == [rec["output_toks"] for rec in records]
    assert [r["prompt_block_hashes"] for r in rows] == [_reference_hashes(rec["input_tok_ids"]) for rec in records]


def test_equal_hashes_mean_equal_prefixes_in_the_shared_workload():
    """Hash k of two requests agree exactly when their first 16 (k + 1) token ids agree (and repeats exist)."""
    src = shared_trace(f"llmservingsim/workloads/{WORKLOADS[0]}")
    ids = [json.loads(line)["input_tok_ids"] for line in src.read_text().splitlines() if line.strip()]
    by_hash: dict[int, tuple[int, ...]] = {}
    repeats = 0
    for prompt in ids:
        for k, h in enumerate(chained_block_hashes(prompt)):
            prefix = tuple(prompt[: 16 * (k + 1)])
            seen = by_hash.setdefault(h, prefix)
            assert seen == prefix
            repeats += seen is not prefix
    distinct_prefixes = {tuple(p[: 16 * (k + 1)]) for p in ids for k in range(len(p) // 16)}
    assert len(by_hash) == len(distinct_prefixes)
    assert repeats > 0  # the workload does repeat prompt blocks (SOURCES.md: ~7.7%)


def test_mooncake_hash_ids_kept_as_given(tmp_path):
    src = shared_trace("mooncake_fast25/synthetic_trace.jsonl")
    records = [json.loads(line) for line in src.read_text().splitlines() if line.strip()][:50]
    table, meta = read_trace(import_trace("mooncake", src, tmp_path / "m.pq", max_requests=50))
    assert meta["block_hash_tokens"] == 512
    by_stamp = sorted(records, key=lambda r: r["timestamp"])  # the importer orders by time (stable)
    assert table.column("prompt_block_hashes").to_pylist() == [r["hash_ids"] for r in by_stamp]


def _table(hashes: list[object]) -> pa.Table:
    n = len(hashes)
    return pa.Table.from_pydict(
        {
            "request_id": [f"r{i}" for i in range(n)],
            "request_class": ["c"] * n,
            "scheduled_offset_ns": list(range(n)),
            "prompt_tokens": [32] * n,
            "output_tokens": [4] * n,
            "prefix_group": [None] * n,
            "prefix_tokens": [None] * n,
            "conversation_id": [None] * n,
            "turn_index": [None] * n,
            "cancel_after_tokens": [None] * n,
            "think_after_reply_ns": [None] * n,
            "reasoning_tokens": [None] * n,
            "prompt_block_hashes": hashes,
            "wait_for_ids": [None] * n,
            "service_ns": [None] * n,
        },
        schema=TRACE_FULL_SCHEMA,
    )


def test_trace_file_round_trip_and_refusals(tmp_path):
    hashes = [[1, -(2**63)], None, [2**63 - 1, 5]]
    write_trace(_table(hashes), tmp_path / "ok.pq", {"block_hash_tokens": 16})
    assert read_trace(tmp_path / "ok.pq")[0].column("prompt_block_hashes").to_pylist() == hashes
    with pytest.raises(TraceError, match="block_hash_tokens is missing"):
        write_trace(_table(hashes), tmp_path / "a.pq", {})
    with pytest.raises(TraceError, match=r"null hash \(row 2\)"):
        write_trace(_table([[1], None, [3, None]]), tmp_path / "b.pq", {"block_hash_tokens": 16})
    with pytest.raises(TraceError, match="block_hash_tokens = 0"):
        write_trace(_table([None, None, None]), tmp_path / "c.pq", {"block_hash_tokens": 0})


def test_bad_llmservingsim_lines_give_one_line_errors(tmp_path):
    bad = tmp_path / "w.jsonl"
    cases = [
        ('{"input_toks": 3, "output_toks": 2, "arrival_time_ns": 0, "input_tok_ids": [1, 2]}', "2 ids"),
        ('{"session_id": "s", "arrival_time_ns": 0, "sub_requests": []}', "agentic session"),
        ('{"input_toks": 3, "output_toks": 2, "arrival_time_ns": -5}', "arrival_time_ns = -5"),
        ('{"input_toks": 2, "output_toks": 2, "arrival_time_ns": 0, "input_tok_ids": [1, 1e3]}', "int64"),
    ]
    for line, message in cases:
        bad.write_text(line + "\n")
        with pytest.raises(TraceError, match=message):
            import_trace("llmservingsim", bad, tmp_path / "o.pq")
