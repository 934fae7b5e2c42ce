"""The virtual-time worksheet: run directory contract, determinism, physics of the two presets."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from loadgen.rundir.io import load_run
from loadgen.rundir.schema import (
    CHUNKS_FILE,
    REQUESTS_FILE,
    SERVER_METRICS_FILE,
    TRACE_FULL_SCHEMA,
    TRACE_SCHEMA,
)
from loadgen.sim import load_engine_config, parse_engine_config, run_worksheet
from loadgen.sim.config import PRESETS_DIR
from loadgen.trace.io import write_trace

REPO = Path(__file__).resolve().parents[1]

#: Manifest keys that legitimately differ between two identical simulations (clock and process).
VOLATILE_MANIFEST_KEYS = ("started_utc", "ended_utc", "anchor", "harness", "host", "writer", "last_flush")


def make_trace(path: Path, n: int = 60, seed: int = 0, rate_rps: float = 8.0, **meta) -> Path:
    """A small open-loop trace with shared prefixes, a conversation and cancellations."""
    rng = np.random.default_rng(seed)
    t = np.cumsum(rng.exponential(1 / rate_rps, n))
    rows = []
    for i in range(n):
        group = "sys" if i % 2 == 0 else None
        conv = "c1" if i in (5, 25, 45) else None
        rows.append(
            {
                "request_id": f"r{i:04d}",
                "request_class": ("short-message", "burst", "long-thread")[i % 3],
                "scheduled_offset_ns": int(t[i] * 1e9),
                "prompt_tokens": int(rng.integers(40, 900)) + (256 if group else 0),
                "output_tokens": int(rng.integers(5, 120)),
                "prefix_group": group,
                "prefix_tokens": 256 if group else None,
                "conversation_id": conv,
                "turn_index": (5, 25, 45).index(i) if conv else None,
                "cancel_after_tokens": 3 if i % 17 == 3 else None,
            }
        )
    metadata = {"trace_name": "test", "seed": seed, "mode": "open", "max_in_flight": 256, "duration_s": float(t[-1])}
    metadata.update(meta)
    write_trace(pa.Table.from_pylist(rows, schema=TRACE_SCHEMA), path, metadata)
    return path


def table_digest(path: Path) -> str:
    """sha256 of a Parquet file's table content (Arrow IPC of the data, schema metadata dropped)."""
    table = pq.read_table(path)
    table = table.replace_schema_metadata(None)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return hashlib.sha256(sink.getvalue().to_pybytes()).hexdigest()


def stable_manifest(run_dir: Path) -> dict:
    manifest = json.loads((run_dir / "manifest.json").read_text())
    return {k: v for k, v in manifest.items() if k not in VOLATILE_MANIFEST_KEYS}


def test_run_directory_has_the_measured_run_schema(tmp_path):
    trace = make_trace(tmp_path / "t.parquet")
    out = run_worksheet(trace, "interactive-small-batch", tmp_path / "run", seed=0)
    run = load_run(out)
    m = run.manifest.to_dict()
    assert m["run_kind"] == "simulated" and m["modelExecuted"] is False and m["benchmarkExecuted"] is False
    assert m["target"]["kind"] == "sim"
    assert m["target"]["engine"]["config"]["config"]["name"] == "interactive-small-batch"
    assert m["engine_config"]["config"]["scheduler"]["max_num_seqs"] == 64
    assert m["state"] == "complete" and m["requests_recorded"] == 60
    req = run.requests.to_pandas()
    assert sorted(req.status.unique()) == ["cancelled", "ok"]
    ok = req[req.status == "ok"]
    assert (ok.client_output_tokens == ok.target_output_tokens).all()
    assert (ok.server_prompt_tokens == ok.target_prompt_tokens).all()
    assert (ok.first_token_ns >= ok.sent_ns).all() and (ok.done_ns >= ok.last_token_ns).all()
    cancelled = req[req.status == "cancelled"]
    assert (cancelled.client_output_tokens == 3).all()
    chunks = run.chunks.to_pandas()
    per_req = chunks.groupby("request_id").tokens.sum()
    assert (per_req[ok.request_id].values == ok.target_output_tokens.values).all()
    assert (chunks.groupby("request_id").seq.max() + 1 == chunks.groupby("request_id").size()).all()
    names = set(run.server_metrics.column("name").to_pylist())
    for name in (
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
        "vllm:prefix_cache_queries_total",
        "vllm:prefix_cache_hits_total",
        "vllm:num_preemptions_total",
        "vllm:time_to_first_token_seconds_bucket",
        "vllm:inter_token_latency_seconds_count",
    ):
        assert name in names
    hits = run.server_metrics.filter(
        pa.compute.equal(run.server_metrics.column("name"), "vllm:prefix_cache_hits_total")
    )
    assert hits.column("value").to_pylist()[-1] > 0, "the shared system prompt is reused"
    labels = json.loads(run.server_metrics.column("labels")[0].as_py())
    assert labels == {"engine": "0", "model_name": "loadgen-sim"}


def test_worksheet_is_reproducible(tmp_path):
    """Same trace + engine + seed → identical table contents of every Parquet file.

    File bytes also embed the manifest (start time, pid), so we compare the tables' Arrow IPC
    bytes with schema metadata dropped, and the manifest without VOLATILE_MANIFEST_KEYS.
    """
    trace = make_trace(tmp_path / "t.parquet")
    engine = parse_engine_config(
        {
            "name": "noisy",
            "cost": {"noise_sigma": 0.3},
            "faults": {"stall_rate": 0.2, "disconnect_rate": 0.1, "error_rate": 0.05},
        }
    )
    runs = [run_worksheet(trace, engine, tmp_path / f"run{i}", seed=7) for i in range(2)]
    other = run_worksheet(trace, engine, tmp_path / "other", seed=8)
    for name in (REQUESTS_FILE, CHUNKS_FILE, SERVER_METRICS_FILE):
        assert table_digest(runs[0] / name) == table_digest(runs[1] / name), name
    assert stable_manifest(runs[0]) == stable_manifest(runs[1])
    assert table_digest(runs[0] / CHUNKS_FILE) != table_digest(other / CHUNKS_FILE), "the seed drives noise and faults"


def test_kv_exhaustion_preempts_in_the_worksheet(tmp_path):
    trace = make_trace(tmp_path / "t.parquet", rate_rps=50)
    small = parse_engine_config({"name": "small-kv", "kv": {"num_kv_blocks": 200, "enable_prefix_caching": False}})
    run = load_run(run_worksheet(trace, small, tmp_path / "run"))
    assert (run.manifest.engine_notes.preemptions or 0) > 0
    metrics = run.server_metrics.to_pandas()
    pre = metrics[metrics.name == "vllm:num_preemptions_total"].value
    assert pre.iloc[-1] > 0 and pre.is_monotonic_increasing
    req = run.requests.to_pandas()
    ok = req[req.status == "ok"]
    assert (ok.client_output_tokens == ok.target_output_tokens).all(), "preempted requests are recomputed, not lost"
    usage = metrics[metrics.name == "vllm:kv_cache_usage_perc"].value
    assert usage.max() > 0.9


def test_client_concurrency_limit_queues_on_the_client(tmp_path):
    trace = make_trace(tmp_path / "t.parquet", rate_rps=200, max_in_flight=2)
    req = load_run(run_worksheet(trace, "interactive-small-batch", tmp_path / "run")).requests.to_pandas()
    assert (req.slot_acquired_ns > req.scheduled_ns).sum() > 10
    events = sorted([(t, 1) for t in req.sent_ns] + [(t, -1) for t in req.done_ns])
    in_flight = np.cumsum([e for _, e in sorted(events, key=lambda x: (x[0], x[1]))])
    assert in_flight.max() <= 2


def test_worksheet_faults_become_rows(tmp_path):
    trace = make_trace(tmp_path / "t.parquet", n=200)
    engine = parse_engine_config(
        {
            "name": "faulty",
            "faults": {
                "error_rate": 0.1,
                "error_statuses": [503],
                "rate_limit_rate": 0.1,
                "retry_after_s": 2.0,
                "disconnect_rate": 0.1,
                "disconnect_after_tokens": 2,
                "stall_rate": 0.1,
                "stall_s": 1.5,
                "stall_after_tokens": 1,
            },
        }
    )
    run = load_run(run_worksheet(trace, engine, tmp_path / "run"))
    req = run.requests.to_pandas()
    notes = run.manifest.engine_notes.faults_injected or {}
    assert (req.http_status == 503).sum() == notes["error"]
    r429 = req[req.error_kind == "http_429"]
    assert len(r429) == notes["rate_limit"] and (r429.retry_after_s == 2.0).all()
    reset = req[req.error_kind == "reset_mid_stream"]
    assert len(reset) > 0 and (reset.client_output_tokens == 2).all()
    assert notes["stall"] > 0
    chunks = run.chunks.to_pandas().sort_values(["request_id", "seq"])
    gaps = chunks.groupby("request_id").arrival_ns.diff().dropna()
    assert (gaps >= 1.5e9).sum() >= 1


def test_ledger_sized_engine(tmp_path):
    model = REPO / "loadgen" / "data" / "models" / "llama-3.1-8b.json"
    if not model.exists():
        pytest.skip("model config not shipped")
    path = tmp_path / "e.toml"
    path.write_text(f'name = "ledger"\n[kv]\nmodel_config = "{model}"\nkv_cache_gib = 10\n')
    config = load_engine_config(path)
    # llama-3.1-8b: 32 layers x 2 x 8 KV heads x 128 x 2 B = 128 KiB/token; 16-token blocks of 2 MiB
    assert config.num_kv_blocks == 10 * 1024 // 2


def _sim_run(trace: Path, engine: str | Path, out: Path) -> subprocess.CompletedProcess:
    """``loadgen sim run TRACE --engine ENGINE --out OUT`` through the real CLI."""
    args = [sys.executable, "-m", "loadgen", "sim", "run", str(trace), "--engine", str(engine), "--out", str(out)]
    return subprocess.run(args, cwd=REPO, capture_output=True, text=True, timeout=120, check=False)


def test_cli_sim_run(tmp_path):
    trace = make_trace(tmp_path / "t.parquet", n=20)
    out = tmp_path / "run"
    proc = _sim_run(trace, "throughput-large-batch", out)
    assert proc.returncode == 0, proc.stderr
    assert "simulated" in proc.stdout and (out / REQUESTS_FILE).exists()
    bad = _sim_run(trace, "nope", tmp_path / "x")
    assert bad.returncode == 2 and "no such preset" in bad.stderr


def test_a_tiny_pool_replays_to_the_end(tmp_path):
    """Found waiting forever on main (the worksheet stopped with "made no progress"; the live server never
    answered): a pool of 2 blocks of 2 tokens (+ the null block). The first request caches one block of its prefix
    group; the second shares 1 token with it, hits nothing, and needs both blocks: the cached one, referenced by
    nobody, is evicted for it, as vLLM does. Run through the CLI in a subprocess, bounded, so the suite cannot hang."""
    rows = [
        {
            "request_id": f"r{i}",
            "request_class": "burst",
            "scheduled_offset_ns": 0,
            "prompt_tokens": prompt,
            "output_tokens": out,
            "prefix_group": "g",
            "prefix_tokens": shared,
        }
        for i, (prompt, out, shared) in enumerate([(2, 2, 2), (3, 1, 1)])
    ]
    trace = tmp_path / "t.parquet"
    meta = {"trace_name": "tiny", "seed": 0, "mode": "open", "max_in_flight": 8, "duration_s": 0.0}
    write_trace(pa.Table.from_pylist(rows, schema=TRACE_SCHEMA), trace, meta)
    engine = tmp_path / "tiny.toml"
    engine.write_text(
        'name = "tiny-pool"\n[scheduler]\nmax_num_seqs = 4\nmax_num_batched_tokens = 8\nmax_model_len = 4\n'
        "[kv]\nblock_size = 2\nnum_kv_blocks = 3\nenable_prefix_caching = true\n[cost]\nfixed_ms = 1.0\n"
    )
    args = [sys.executable, "-m", "loadgen", "sim", "run", str(trace), "--engine", str(engine), "--out"]
    done = subprocess.run([*args, str(tmp_path / "run")], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    req = load_run(tmp_path / "run").requests.to_pandas()
    assert list(req.status) == ["ok", "ok"] and list(req.client_output_tokens) == [2, 1]


@pytest.mark.parametrize(
    ("changes", "says"),
    [
        (
            {"max_num_batched_tokens": "true"},
            "scheduler.max_num_batched_tokens = True: expected a number, got the boolean true",
        ),
        (
            {"max_num_batched_tokens": "1"},
            "scheduler.max_num_batched_tokens = 1: expected at least max_num_seqs (1024), as vLLM requires",
        ),
        (
            {"max_num_batched_tokens": "2048", "chunked_prefill": "false"},
            "scheduler.max_num_batched_tokens = 2048: expected at least max_model_len (131072) without chunked_prefill",
        ),
    ],
)
def test_an_engine_config_that_cannot_serve_is_one_line(tmp_path, changes: dict[str, str], says: str) -> None:
    """Found by tests/test_fuzz_cli.py: a boolean taken as the number 1, and a token budget of 1, ended in a
    traceback (RuntimeError) instead of one line and exit 2. A budget vLLM would not start with (under
    max_num_seqs; under max_model_len without chunked prefill) is refused as vLLM refuses it."""
    preset = (PRESETS_DIR / "instant.toml").read_text()
    lines = [
        next((f"{k} = {v}" for k, v in changes.items() if ln.startswith(k + " ")), ln) for ln in preset.splitlines()
    ]
    engine = tmp_path / "m.toml"
    engine.write_text("\n".join(lines) + "\n")
    done = _sim_run(make_trace(tmp_path / "t.parquet", n=5), engine, tmp_path / "o")
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and says in done.stderr, done.stderr


@pytest.mark.slow
def test_presets_trade_throughput_for_burst_ttft(tmp_path):
    """On the canonical burst trace: large batches give more output tokens per busy second but
    breach the p99 TTFT budgets during bursts; the interactive preset meets them."""
    from loadgen.trace.generate import generate_trace_file
    from loadgen.workload.scenario import load_scenario

    scenario = load_scenario(REPO / "scenarios" / "canonical.toml")
    trace = generate_trace_file(scenario, "burst", tmp_path / "burst.parquet", 20261129)
    budgets = {name: cls.budgets.ttft_ms.p99 for name, cls in scenario.classes.items()}
    settings = scenario.traces["burst"]
    period = settings.burst_s + settings.gap_s
    results = {}
    for preset in ("interactive-small-batch", "throughput-large-batch"):
        run = load_run(run_worksheet(trace, preset, tmp_path / preset, scenario=REPO / "scenarios" / "canonical.toml"))
        req = run.requests.to_pandas()
        req = req[req.first_token_ns.notna()]
        in_burst = (req.scheduled_ns / 1e9) % period >= settings.gap_s  # on/off traces start quiet
        ttft = (req.first_token_ns - req.scheduled_ns) / 1e6
        p99 = {
            c: float(np.percentile(ttft[in_burst & (req.request_class == c)], 99)) for c in ("short-message", "burst")
        }
        results[preset] = (p99, run.manifest.engine_notes.output_tokens_per_busy_s)
    inter, thru = results["interactive-small-batch"], results["throughput-large-batch"]
    assert thru[1] > inter[1], results
    assert inter[0]["burst"] <= budgets["burst"] and inter[0]["short-message"] <= budgets["short-message"], results
    assert thru[0]["burst"] > budgets["burst"] or thru[0]["short-message"] > budgets["short-message"], results


#: Pinned before the worksheet's decode fast path (issue 13): the fast path must not change one byte.
PINNED_CASES = {
    "interactive": ("interactive-small-batch", {}, dict(n=300, rate_rps=20.0)),
    "throughput": ("throughput-large-batch", {}, dict(n=300, rate_rps=20.0)),
    "noisy-faults": (
        None,
        {"name": "noisy", "cost": {"noise_sigma": 0.3}, "faults": {"stall_rate": 0.2, "disconnect_rate": 0.1}},
        dict(n=200, rate_rps=8.0),
    ),
    "small-kv": (
        None,
        {"name": "small-kv", "kv": {"num_kv_blocks": 200, "enable_prefix_caching": False}},
        dict(n=200, rate_rps=50.0),
    ),
    "priority-few-seats": (
        None,
        {"name": "prio", "scheduler": {"policy": "priority", "max_num_seqs": 4}, "cost": {"noise_sigma": 0.1}},
        dict(n=200, rate_rps=10.0),
    ),
}
#: sha256 prefixes of (requests, chunks, server metrics) table contents (Arrow IPC, see table_digest).
#: Re-pinned once, for the requests table only, when the record schema gained `target_index` (replicas): with
#: that column dropped, the new tables hash to the earlier pins (2f457c03…, 20574558…, 0204962e…, 03d1429b…,
#: 9cb60212…); chunks and server metrics are unchanged. Re-pinned again, requests only, when it gained
#: `server_queued_ns` / `server_scheduled_ns` (the engine's own instants): with those two dropped, the tables hash
#: to the previous pins (877df444…, 8be8ca26…, b06268a9…, f89939ae…, 54b6369c…). Re-pinned again for record
#: schema 3 (reasoning): with the requests' first_answer_token_ns, client_reasoning_tokens and
#: server_reasoning_tokens and the chunks' kind dropped, the tables hash to the previous pins (8e385cb1…/2d4c5d0d…,
#: 81b6cd5e…/ff8a4cfa…, 1dac609c…/e6941bc0…, 84596b2c…/233c7d69…, 3fa674aa…/6c07b639…). Re-pinned for a model
#: change, not a speed-up: the pool's block 0 is vLLM's null block (engine.NULL_BLOCKS), so KV use is over one
#: block fewer (every server-metrics pin) and the KV-bound small-kv case preempts differently (its three pins).
#: Re-pinned for a model change: KV blocks are ids in vLLM's BlockPool (one LRU free queue; full blocks hashed when
#: scheduled, as allocate_slots does, not when the prompt is done), so a prefix group's later requests share blocks a
#: step sooner: KV use at 15 samples of "interactive" (kv_cache_usage_perc, kv_blocks_used; its requests and
#: chunks unchanged), and "throughput"'s requests end 50 ms sooner on average (all three pins); the server-metrics
#: pins of "noisy-faults" and "priority-few-seats" likewise.
PINNED_DIGESTS: dict[str, tuple[str, str, str]] = {
    "interactive": ("0597b07c7e124f4d", "7d7d767755562b71", "fcdefd8b56216bc0"),
    "noisy-faults": ("adbf254946b81a50", "020e11a2331ba406", "e6ae150baf07fa2c"),
    "priority-few-seats": ("2c6d11f89d4eeca1", "62c9c1afe6d877cb", "fbabd547312fc6b9"),
    "small-kv": ("7ac2b6352a19f90b", "df829f8435998fbe", "cef8354101e3cef8"),
    "throughput": ("ca36ff1def61d8b8", "9bef93788192354a", "b96d2756dc9dc482"),
}


def _pinned_digests(tmp_path: Path, case: str) -> tuple[str, str, str]:
    preset, cfg, trace_args = PINNED_CASES[case]
    engine = preset if preset else parse_engine_config(cfg)
    trace = make_trace(tmp_path / "t.parquet", seed=3, **trace_args)
    run = run_worksheet(trace, engine, tmp_path / "run", seed=5)
    return tuple(table_digest(run / name)[:16] for name in (REQUESTS_FILE, CHUNKS_FILE, SERVER_METRICS_FILE))  # type: ignore[return-value]


@pytest.mark.parametrize("case", sorted(PINNED_CASES))
def test_worksheet_results_pinned(tmp_path, case):
    """Same trace, engine and seed give the very tables they gave before any speed-up."""
    assert _pinned_digests(tmp_path, case) == PINNED_DIGESTS[case]


def make_thread_trace(path: Path, conversations: int = 30, turns: int = 4, seed: int = 0) -> Path:
    """Multi-turn threads whose later turns wait for the previous reply (think_after_reply_ns), plus a
    shared-prefix stream: finished requests make new ones due in the middle of decode runs."""
    rng = np.random.default_rng(seed)
    rows = []
    for c in range(conversations):
        start = float(rng.uniform(0, 20))
        for k in range(turns):
            rows.append(
                {
                    "request_id": f"c{c:03d}-{k}",
                    "request_class": "long-thread",
                    "scheduled_offset_ns": int((start + 5 * k) * 1e9),
                    "prompt_tokens": 200 + 150 * k + int(rng.integers(0, 100)),
                    "output_tokens": int(rng.integers(20, 90)),
                    "prefix_group": None,
                    "prefix_tokens": None,
                    "conversation_id": f"c{c:03d}",
                    "turn_index": k,
                    "cancel_after_tokens": None,
                    "think_after_reply_ns": int(rng.integers(0, 300)) * 1_000_000 if k else None,
                }
            )
    for i in range(60):
        rows.append(
            {
                "request_id": f"s{i:03d}",
                "request_class": "short-message",
                "scheduled_offset_ns": int(i * 0.4e9),
                "prompt_tokens": 300 + int(rng.integers(0, 400)),
                "output_tokens": int(rng.integers(5, 60)),
                "prefix_group": "sys",
                "prefix_tokens": 256,
                "conversation_id": None,
                "turn_index": None,
                "cancel_after_tokens": 4 if i % 7 == 0 else None,
                "think_after_reply_ns": None,
            }
        )
    rows.sort(key=lambda r: r["scheduled_offset_ns"])
    table = pa.Table.from_pylist(rows, schema=TRACE_FULL_SCHEMA)
    meta = {"trace_name": "threads", "seed": seed, "mode": "open", "max_in_flight": 256, "duration_s": 40.0}
    write_trace(table, path, meta)
    return path


#: Engines and traces the decode fast path must leave exactly as step by step: (preset or config, trace
#: builder arguments). Between them they take decode runs that stop at arrivals, finishes, windows and
#: free blocks, admit in the middle of runs, evict cached prefixes and preempt step by step.
FAST_PATH_CASES = {
    "interactive": ("interactive-small-batch", dict(n=300, rate_rps=20.0)),
    "throughput-window": ("throughput-large-batch", dict(n=300, rate_rps=20.0)),
    "noise-faults-overhead": (
        {
            "name": "noisy",
            "cost": {"noise_sigma": 0.3, "request_overhead_ms": 4.0},
            "faults": {
                "stall_rate": 0.2,
                "disconnect_rate": 0.1,
                "error_rate": 0.05,
                "slow_start_rate": 0.1,
                "slow_start_s": 0.5,
            },
        },
        dict(n=200, rate_rps=8.0),
    ),
    "kv-pressure-preempts": (
        {"name": "small-kv", "kv": {"num_kv_blocks": 200, "enable_prefix_caching": False}},
        dict(n=200, rate_rps=50.0),
    ),
    "kv-pressure-evicts": (
        {"name": "cached-kv", "kv": {"num_kv_blocks": 400}, "cost": {"noise_sigma": 0.1}},
        dict(n=300, rate_rps=30.0),
    ),
    "priority-few-seats": (
        {"name": "prio", "scheduler": {"policy": "priority", "max_num_seqs": 4}, "cost": {"noise_sigma": 0.1}},
        dict(n=200, rate_rps=10.0),
    ),
    "tiny-budget-preempts": (
        {"name": "tiny", "scheduler": {"max_num_batched_tokens": 64}, "kv": {"num_kv_blocks": 150}},
        dict(n=120, rate_rps=50.0),
    ),
    "whole-prompts-window": (  # the queue head waits for budget (no chunking) while runs go on
        {
            "name": "whole",
            "scheduler": {
                "chunked_prefill": False,
                "max_num_batched_tokens": 620,
                "long_prefill_token_threshold": 600,
                "max_model_len": 620,
            },
            "batching": {"window_ms": 300, "min_waiting": 3},
            "kv": {"block_size": 32},
        },
        dict(n=200, rate_rps=40.0),
    ),
    "long-prefill-noise": (  # more steps than a batch of noise factors
        {"name": "long", "scheduler": {"long_prefill_token_threshold": 200}, "cost": {"noise_sigma": 0.2}},
        dict(n=500, rate_rps=10.0),
    ),
    "closed-loop": ("interactive-small-batch", dict(n=150, rate_rps=50.0, mode="closed", concurrency=3)),
    "speculative": ({"name": "spec", "scheduler": {"decode_tokens_per_step": 3}}, dict(n=100)),
    "threads": ({"name": "threads", "kv": {"num_kv_blocks": 600}, "cost": {"noise_sigma": 0.05}}, None),
    # the queue head waits for blocks while runs evict cached conversations ahead of its own
    "threads-tight-kv": ({"name": "tight", "kv": {"num_kv_blocks": 150}}, None),
    # step times from an operator profile (mixed KV lengths: the skew correction), under KV pressure and noise
    "profiled": ("rtxpro6000-llama-3.1-8b-tp1", dict(n=200, rate_rps=20.0)),
    "profiled-kv-pressure": (
        {
            "name": "profiled-small-kv",
            "kv": {"num_kv_blocks": 300},
            "cost": {
                "fixed_ms": 0.0,
                "noise_sigma": 0.05,
                "profile": {
                    "path": str(PRESETS_DIR / "profiles/RTXPRO6000/meta-llama/Llama-3.1-8B/bf16"),
                    "model_config": str(PRESETS_DIR / "profiles/models/Llama-3.1-8B.json"),
                    "gpu": "NVIDIA RTX PRO 6000 Blackwell Server Edition",
                    "vllm_version": "0.19.0",
                },
            },
        },
        dict(n=200, rate_rps=40.0),
    ),
}


@pytest.mark.parametrize("case", sorted(FAST_PATH_CASES))
def test_decode_fast_path_changes_nothing(tmp_path, case):
    """The decode fast path (issue 13) writes the very run step by step writes: every table and the manifest."""
    engine, trace_args = FAST_PATH_CASES[case]
    config = engine if isinstance(engine, str) else parse_engine_config(engine)
    if trace_args is None:
        trace = make_thread_trace(tmp_path / "t.parquet")
    else:
        trace = make_trace(tmp_path / "t.parquet", seed=3, **trace_args)
    fast = run_worksheet(trace, config, tmp_path / "fast", seed=5)
    slow = run_worksheet(trace, config, tmp_path / "slow", seed=5, fast=False)
    for name in (REQUESTS_FILE, CHUNKS_FILE, SERVER_METRICS_FILE):
        assert pq.read_table(fast / name).equals(pq.read_table(slow / name)), name
    assert stable_manifest(fast) == stable_manifest(slow)


@pytest.mark.parametrize(
    ("policy", "expected"),
    [
        ("clamp", [51, None, None, 100, None, 4]),  # vLLM 0.32: the output is cut to what the context leaves
        ("reject", [None, None, None, 100, None, None]),  # older vLLM: prompt + max_tokens must fit
    ],
)
def test_requests_past_max_model_len_follow_the_engines_rule(tmp_path, policy, expected):
    """One rule (``SchedulerConfig.output_tokens``) for the worksheet and the live server; here, the worksheet's
    rows: the tokens served, or HTTP 400."""
    from loadgen.sim.worksheet import simulate_trace

    asks = [(949, 203), (1000, 1), (1022, 10), (500, 100), (10, 1001), (996, 140)]
    n = len(asks)
    table = pa.Table.from_pydict(
        {
            "request_id": [f"r{i}" for i in range(n)],
            "request_class": ["c"] * n,
            "scheduled_offset_ns": [i * 1_000_000_000 for i in range(n)],
            "prompt_tokens": [p for p, _ in asks],
            "output_tokens": [o for _, o in asks],
            **{k: [None] * n for k in ("prefix_group", "prefix_tokens", "conversation_id", "turn_index")},
            "cancel_after_tokens": [None] * n,
        },
        schema=TRACE_SCHEMA,
    )
    scheduler = {"max_model_len": 1000, "over_length": policy}
    config = parse_engine_config({"name": "t", "scheduler": scheduler, "kv": {"num_kv_blocks": 4096}}, "t")
    assert [config.scheduler.output_tokens(p, o) for p, o in asks] == expected
    assert config.scheduler.output_tokens(500, 0) is None  # nothing asked for: refused under either rule
    rows = {r["request_id"]: r for r in simulate_trace(table, {}, config).requests}
    for i, tokens in enumerate(expected):
        row = rows[f"r{i}"]
        if tokens is None:
            assert (row["status"], row["http_status"]) == ("error", 400), row
        else:
            assert row["status"] == "ok" and row["server_output_tokens"] == tokens, row


def test_tail_eviction_keeps_the_decode_fast_path_exact(tmp_path):
    """A tiny pool under prefix groups whose shareable prefixes differ, so hits stop inside cached entries and
    their unreferenced tails are evicted (on main a queue head waited on them: "made no progress"): every request
    completes, and the fast path writes what step by step does."""
    rng = np.random.default_rng(9)
    rows = []
    for i in range(40):
        prompt = int(rng.integers(2, 30))
        rows.append(
            {
                "request_id": f"r{i:02d}",
                "request_class": "burst",
                "scheduled_offset_ns": i * 5_000_000,
                "prompt_tokens": prompt,
                "output_tokens": int(rng.integers(1, 15)),
                "prefix_group": f"g{i % 2}",
                "prefix_tokens": int(rng.integers(0, prompt + 1)),
            }
        )
    trace = tmp_path / "t.parquet"
    meta = {"trace_name": "tails", "seed": 9, "mode": "open", "max_in_flight": 64, "duration_s": 0.2}
    write_trace(pa.Table.from_pylist(rows, schema=TRACE_SCHEMA), trace, meta)
    config = parse_engine_config(
        {
            "name": "tiny-pool",
            "scheduler": {"max_num_seqs": 6, "max_num_batched_tokens": 64, "max_model_len": 64},
            "kv": {"block_size": 2, "num_kv_blocks": 25},  # the largest request: 23 blocks
            "cost": {"fixed_ms": 1.0, "per_decode_seq_ms": 0.1, "noise_sigma": 0.05},
        }
    )
    fast = run_worksheet(trace, config, tmp_path / "fast", seed=1)
    slow = run_worksheet(trace, config, tmp_path / "slow", seed=1, fast=False)
    for name in (REQUESTS_FILE, CHUNKS_FILE, SERVER_METRICS_FILE):
        assert pq.read_table(fast / name).equals(pq.read_table(slow / name)), name
    req = load_run(fast).requests.to_pandas()
    assert (req.status == "ok").all() and (req.client_output_tokens == req.target_output_tokens).all()


def _state_rows(async_scheduling: bool) -> tuple[dict[str, list[tuple[float, float]]], dict[str, tuple[float, float]]]:
    """Three requests on 1 ms steps: r0 (8 + 6 tokens) at 0, r1 (8 + 3) at 1.5 ms, inside r0's second step, r2
    (8 + 1) at 20 ms, on an idle engine. The running and KV-block rows (ms, value) and each request's queued and
    first scheduled instants (ms)."""
    from loadgen.sim.worksheet import simulate_trace

    ms = 1_000_000
    rows = [(0, 8, 6), (3 * ms // 2, 8, 3), (20 * ms, 8, 1)]
    trace = pa.Table.from_pylist(
        [
            {
                "request_id": f"r{i}",
                "request_class": "c",
                "scheduled_offset_ns": t,
                "prompt_tokens": p,
                "output_tokens": o,
            }
            for i, (t, p, o) in enumerate(rows)
        ],
        schema=TRACE_FULL_SCHEMA,
    )
    config = parse_engine_config(
        {
            "name": "ahead",
            "scheduler": {"async_scheduling": async_scheduling},
            "kv": {"block_size": 4, "num_kv_blocks": 64},
            "cost": {"fixed_ms": 1.0, "per_prefill_token_ms": 0.0, "per_decode_seq_ms": 0.0},
        }
    )
    res = simulate_trace(trace, {"mode": "open"}, config)
    m = res.metrics.to_pydict()
    series: dict[str, list[tuple[float, float]]] = {}
    for t, name, value in zip(m["time_ns"], m["name"], m["value"], strict=True):
        if name in ("vllm:num_requests_running", "loadgen_sim_kv_blocks_used") and t < 10 * ms:
            series.setdefault(name, []).append((t / ms, value))
    instants = {r["request_id"]: (r["server_queued_ns"] / ms, r["server_scheduled_ns"] / ms) for r in res.requests}
    return series, instants


def test_async_scheduling_stats_count_the_step_scheduled_ahead():
    """vLLM makes its scheduler stats in update_from_output, after it has scheduled the next step
    (EngineCore.step_with_batch_queue): the stat at a step's end already counts the requests the next step admits,
    with their blocks. Synchronous scheduling counts the step just done."""
    series, _ = _state_rows(async_scheduling=True)
    assert series["vllm:num_requests_running"] == [(1.0, 1), (2.0, 1), (3.0, 2), (4.0, 2), (5.0, 2), (6.0, 0)]
    blocks = dict(series["loadgen_sim_kv_blocks_used"])
    assert blocks[3.0] == blocks[2.0] + 2  # r1's 8-token prompt: 2 blocks of 4, taken by the step from 3 ms
    series, _ = _state_rows(async_scheduling=False)
    assert series["vllm:num_requests_running"] == [(1.0, 1), (2.0, 1), (3.0, 2), (4.0, 2), (5.0, 1), (6.0, 0)]


def test_async_scheduling_queued_and_scheduled_instants_are_vllms():
    """vLLM's engine core adds a request between two steps (queued_ts: once the step under way at its arrival has
    ended) and stamps it with the instant schedule() ran (scheduled_ts), which with asynchronous scheduling is
    as the step before the one it runs in begins. An idle engine queues and schedules a request as it arrives."""
    _, instants = _state_rows(async_scheduling=True)
    # r1 arrived at 1.5 ms, inside the step [1, 2); its first step [3, 4) was scheduled as [2, 3) began
    assert instants == {"r0": (0.0, 0.0), "r1": (2.0, 2.0), "r2": (20.0, 20.0)}
    _, instants = _state_rows(async_scheduling=False)
    assert instants == {"r0": (0.0, 0.0), "r1": (1.5, 2.0), "r2": (20.0, 20.0)}
