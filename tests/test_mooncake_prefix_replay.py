"""Mooncake hash_ids become prompt text block by block (same hash -> same 512 tokens), so the live simulated
engine with prefix caching hits what the trace's hash_ids imply. The implied figures are computed here from the
JSONL itself, independently of the importer, the driver and the engine."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import httpx
import pyarrow as pa
import pytest
from shared_paths import shared_trace

from loadgen.driver.jobs import build_jobs
from loadgen.targets import launch_sim_server
from loadgen.trace.importers import import_trace
from loadgen.trace.io import read_trace, write_trace
from loadgen.workload.prompts import get_tokenizer

WINDOW = 200  # the trace's first 200 requests (72 s of production traffic)
BLOCK = 512  # tokens per Mooncake hash id
SOURCE = "mooncake_fast25/conversation_trace.jsonl"
_REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow  # public data and a live replay of 200 requests (~10 s)


def _records(path: Path, n: int) -> list[dict]:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    rows.sort(key=lambda r: r["timestamp"])  # stable, as the importer orders them
    return rows[:n]


def implied_hit_rate_radix(records: list[dict]) -> float:
    """Hit tokens / prompt tokens with an unbounded radix cache of whole 512-token blocks, requests one after
    another: a request reuses its longest run of leading blocks that some earlier request already had (never
    the block holding its last token, which must be computed)."""
    seen: set[tuple[int, ...]] = set()
    hit = total = 0
    for rec in records:
        ids, length = rec["hash_ids"], rec["input_length"]
        usable = (length - 1) // BLOCK
        k = 0
        while k < min(len(ids), usable) and tuple(ids[: k + 1]) in seen:
            k += 1
        hit += k * BLOCK
        total += length
        seen.update(tuple(ids[: j + 1]) for j in range(len(ids)))
    return hit / total


@pytest.fixture(scope="module")
def replay(tmp_path_factory) -> tuple[list[dict], float, Path]:
    """(the window's records, the engine's hit rate in tokens, the one-output-token trace) of one live replay."""
    src = shared_trace(SOURCE)
    tmp = tmp_path_factory.mktemp("mooncake")
    import_trace("mooncake", src, tmp / "imported.pq", max_requests=WINDOW, time_scale=0.001)
    table, meta = read_trace(tmp / "imported.pq")
    # one output token each: the prompts carry the prefix structure, the replies only cost wall time
    column = table.schema.get_field_index("output_tokens")
    table = table.set_column(column, "output_tokens", pa.array([1] * table.num_rows, pa.int32()))
    write_trace(table, tmp / "t.pq", meta)
    engine = tmp / "instant-prefix-cache.toml"
    preset = (_REPO / "scenarios/engines/instant.toml").read_text()
    engine.write_text(preset.replace("enable_prefix_caching = false", "enable_prefix_caching = true"))
    with launch_sim_server(str(engine)) as sim:
        run = [sys.executable, "-m", "loadgen", "run", str(tmp / "t.pq"), "--target", sim.base_url]
        run += ["--out", str(tmp / "run"), "--max-concurrency", "1", "--endpoint", "completions"]
        res = subprocess.run([*run, "--progress", "off"], capture_output=True, text=True)
        assert res.returncode == 0, res.stderr
        metrics = httpx.get(sim.base_url + "/metrics").text
    values = {}
    for line in metrics.splitlines():
        if line.startswith("vllm:prefix_cache_"):
            name, value = line.split("{")[0], float(line.rsplit(" ", 1)[1])
            values[name] = value
    queries, hits = values["vllm:prefix_cache_queries_total"], values["vllm:prefix_cache_hits_total"]
    records = _records(src, WINDOW)
    assert queries == sum(r["input_length"] for r in records)  # every prompt arrived at its traced length
    return records, hits / queries, tmp / "t.pq"


def test_prompts_share_exactly_the_blocks_their_hashes_share(replay):
    records, _, trace = replay
    table, meta = read_trace(trace)
    table = table.slice(0, 40)
    tok = get_tokenizer("cl100k_base")
    jobs = build_jobs(
        table, model="m", endpoint="completions", tokenizer=tok, retain_prompt_text=True, block_hash_tokens=512
    )
    ids = [tok.encode(job.prompt_text or "") for job in jobs]
    assert [len(x) for x in ids] == [r["input_length"] for r in records[:40]]
    for a in range(40):
        for b in range(a):
            ha, hb = records[a]["hash_ids"], records[b]["hash_ids"]
            shared = next((k for k in range(min(len(ha), len(hb))) if ha[k] != hb[k]), min(len(ha), len(hb)))
            end = min(shared * BLOCK, len(ids[a]), len(ids[b]))
            assert ids[a][:end] == ids[b][:end]  # same hashes -> same tokens
            if shared < min(len(ha), len(hb)):  # the first differing block differs in its tokens
                lo, hi = shared * BLOCK, (shared + 1) * BLOCK
                assert ids[a][lo:hi] != ids[b][lo:hi]


def test_live_replay_hits_what_the_hash_ids_imply(replay):
    """Within 2 points of the hit rate the hash_ids imply for an unbounded radix cache, requests one at a time
    (the engine preset holds 16 M tokens, so nothing is evicted). Measured: 5.93 % against 5.93 % implied on
    these 200 requests; 21.57 % against 21.55 % on the first 1,000."""
    records, measured, _ = replay
    implied = implied_hit_rate_radix(records)
    assert implied > 0.05  # the window does share prefixes
    assert abs(measured - implied) <= 0.02, (measured, implied)
