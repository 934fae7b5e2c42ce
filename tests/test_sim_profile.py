"""The profiled cost model (operator profiles of real GPUs) and the scheduler it runs under, on hand-made traces.

Expected values are computed by hand from the shipped profile CSVs (the rows are quoted beside each figure).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from loadgen.rundir.schema import TRACE_FULL_SCHEMA
from loadgen.sim import load_engine_config, parse_engine_config
from loadgen.sim.config import PRESETS_DIR
from loadgen.sim.dp_balance import VLLM_DP
from loadgen.sim.engine import Engine, Seq
from loadgen.sim.prefix_chain import engine_block_chain
from loadgen.sim.profile import expected_experts, load_profile
from loadgen.sim.profile_grid import AXES
from loadgen.sim.worksheet import simulate_trace
from loadgen.trace.importers import import_trace
from loadgen.trace.io import read_trace
from loadgen.util.errors import ScenarioError
from tests.shared_paths import shared_trace

PROFILES = PRESETS_DIR / "profiles"
RTX4090 = str(PROFILES / "RTX4090/meta-llama/Llama-3.1-8B/bf16")
PRO_LLAMA = str(PROFILES / "RTXPRO6000/meta-llama/Llama-3.1-8B/bf16")
PRO_MOE = str(PROFILES / "RTXPRO6000/Qwen/Qwen3-30B-A3B-Instruct-2507/bf16")
LLAMA = str(PROFILES / "models/Llama-3.1-8B.json")
QWEN_MOE = str(PROFILES / "models/Qwen3-30B-A3B-Instruct-2507.json")


def test_dense_ops_interpolate_between_profiled_token_counts() -> None:
    p = load_profile(RTX4090, 1, LLAMA)
    # qkv_proj,16,56.4653 and qkv_proj,20,60.551: 18 tokens lie half way
    keys, values = p.dense_us["qkv_proj"]
    from loadgen.sim.profile import interp_axis

    assert interp_axis(keys, values, 18) == pytest.approx(56.4653 + 0.5 * (60.551 - 56.4653))
    # lm_head,240,1663.6 and lm_head,256,1671.15: 300 sequences extrapolate from the last two points
    keys, values = p.per_sequence_us["lm_head"]
    assert interp_axis(keys, values, 300) == pytest.approx(1671.15 + (300 - 256) / 16 * (1671.15 - 1663.6))


def test_decode_attention_is_bilinear_in_decodes_and_kv_times_layers() -> None:
    p = load_profile(RTX4090, 1, LLAMA)
    # 0,0,32,512,107.068 / 0,0,32,1024,181.391 / 0,0,64,512,191.925 / 0,0,64,1024,333.295; 32 layers
    at_32 = 107.068 + 0.5 * (181.391 - 107.068)
    at_64 = 191.925 + 0.5 * (333.295 - 191.925)
    assert p.attention_us(0, 0, 48, 48 * 768) == pytest.approx(32 * (at_32 + at_64) / 2)
    # a 5-token chunk costs what the 16-token one does (16,0,0,0,9.546): held at the first positive point
    assert p.attention_us(5, 0, 0, 0) == pytest.approx(32 * 9.546)


def test_a_step_sums_every_operator_over_the_layers() -> None:
    p = load_profile(RTX4090, 1, LLAMA)
    # one decode of 16 KV tokens: each dense op at 1 token (layernorm twice a layer), 32 layers; embedding and
    # final_layernorm once; lm_head and sampler at 1 sequence; attention 0,0,1,16,9.31067 a layer
    layer = 2.592 + 126.766 + 247.292 + 2 * 1.85083 + 38.1313 + 54.898 + 2.17567
    expected = 32 * layer + 2.837 + 1.94167 + 1096.93 + 25.001 + 32 * 9.31067
    assert p.step_us(0, 0, 1, 16, 1) == pytest.approx(expected)


def test_moe_layers_price_the_expected_activated_experts() -> None:
    assert expected_experts(128, 8, 1) == pytest.approx(8.0)  # one token activates its top-8
    assert expected_experts(128, 8, 10_000, ep=2) == pytest.approx(64.0)  # a GPU of two holds half the experts
    p = load_profile(PRO_MOE, 1, QWEN_MOE)
    assert p.moe_layers == 48 and p.layers == 48
    active = 128 * (1 - (1 - 8 / 128) ** 64)
    # 64,64,432.672 and 64,128,827.81 (tokens, activated experts, µs)
    assert p.moe_at(64) == pytest.approx(432.672 + (active - 64) / 64 * (827.81 - 432.672))


def test_mixed_kv_lengths_use_the_profiles_fitted_skew() -> None:
    p = load_profile(PRO_LLAMA, 1, LLAMA)
    assert p.skew is not None and p.skew.alpha_default == pytest.approx(0.0543)  # meta.yaml per_tp 1
    # skew_fit.csv: 0,n<=128,sr<=40%,kvB<=16k,kp=0,0.026
    assert p.skew.at(0, 100, 0.3, 5000, 0) == pytest.approx(0.026)
    assert p.skew.at(17, 100, 0.3, 5000, 0) == pytest.approx(0.0543)  # no such bucket: the pooled alpha
    grid = p.decode_attention
    t_mean, t_max = grid.at(0, 0, 100, 2000), grid.at(0, 0, 100, 5000)
    rate = (2000 - 300) / (5000 - 300)
    alpha = p.skew.at(0, 100, rate, 5000, 0)
    assert p.attention_us(0, 0, 100, 200_000, 5000, 300) == pytest.approx(32 * (t_mean + alpha * (t_max - t_mean)))
    assert load_profile(RTX4090, 1, LLAMA).skew is None  # that profile fitted none: no correction


def test_a_profile_without_its_tables_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(ScenarioError, match="tp = 4: no tp4/ folder"):
        load_profile(RTX4090, 4, LLAMA)
    (tmp_path / "meta.yaml").write_text("gpu: x\n")
    (tmp_path / "tp1").mkdir()
    (tmp_path / "tp1" / "attention.csv").write_text("prefill_chunk,kv_prefill,n_decode,kv_decode,time_us\n0,0,1,16,x\n")
    with pytest.raises(ScenarioError, match=r"attention.csv: time_us = 'x': expected a number$"):
        load_profile(str(tmp_path), 1, LLAMA)


def test_profiled_engines_say_where_their_costs_came_from() -> None:
    for name in ("rtx4090-llama-3.1-8b-tp1", "rtxpro6000-qwen3-32b-tp2", "rtxpro6000-qwen3-30b-a3b-tp1-ep2"):
        cfg = load_engine_config(name)
        label = cfg.calibration_label()
        assert "profiled" in label and "uncalibrated" not in label and "vLLM 0.19.0" in label, label
        assert cfg.cost.profile is not None and Path(cfg.cost.profile.path).is_dir()
    assert load_engine_config("rtx4090-llama-3.1-8b-tp1").num_kv_blocks == 2588  # logged by the shared run


def test_chunked_prefill_stops_at_the_token_budget_and_each_chunk_is_priced() -> None:
    cfg = load_engine_config("rtx4090-llama-3.1-8b-tp1")
    engine = Engine(cfg)
    p = load_profile(RTX4090, 1, LLAMA)
    engine.add(Seq(0, 5000, 2, 0))
    steps = [engine.step(0) for _ in range(3)]
    assert [s.prefill_tokens for s in steps] == [2048, 2048, 904]
    assert steps[0].duration_ns == int(p.step_us(2048, 0, 0, 0, 1) * 1e3)
    assert steps[1].duration_ns == int(p.step_us(2048, 2048, 0, 0, 1) * 1e3)  # over its 2,048 cached tokens
    assert [len(s.emitted) for s in steps] == [0, 0, 1]


def _profiled(**kv: object) -> Engine:
    data = {
        "name": "profiled-test",
        "scheduler": {"max_num_seqs": 8, "max_num_batched_tokens": 2048, "max_model_len": 4096},
        "kv": {"block_size": 16, **kv},
        "cost": {
            "fixed_ms": 0.0,
            "profile": {"path": RTX4090, "model_config": LLAMA, "gpu": "RTX 4090", "vllm_version": "0.19.0"},
        },
    }
    return Engine(parse_engine_config(data))


def test_the_newest_sequence_is_preempted_when_blocks_run_out() -> None:
    engine = _profiled(num_kv_blocks=10, enable_prefix_caching=False)
    a, b = Seq(0, 64, 40, 0), Seq(1, 64, 40, 0)  # 4 blocks each to start; 7 each by the end: 14 > 10
    engine.add(a)
    engine.add(b)
    t = 0
    while engine.has_work:
        t += engine.step(t).duration_ns
    assert engine.num_preemptions >= 1 and b.preemptions >= 1 and a.preemptions == 0
    assert a.state == b.state == "finished" and a.output == b.output == 40


def _trace(rows: list[tuple[int, int, list[int] | None]], block_hash_tokens: int) -> tuple[pa.Table, dict]:
    n = len(rows)
    cols = {
        "request_id": [f"r{i}" for i in range(n)],
        "request_class": ["c"] * n,
        "scheduled_offset_ns": [i * 10_000_000_000 for i in range(n)],  # 10 s apart: each finds the last done
        "prompt_tokens": [r[0] for r in rows],
        "output_tokens": [r[1] for r in rows],
        "prompt_block_hashes": [r[2] for r in rows],
    }
    table = pa.Table.from_pydict(
        {f.name: cols.get(f.name, [None] * n) for f in TRACE_FULL_SCHEMA}, schema=TRACE_FULL_SCHEMA
    )
    return table, {"mode": "open", "block_hash_tokens": block_hash_tokens}


def test_a_repeated_prompt_block_is_a_prefix_hit() -> None:
    cfg = load_engine_config("rtx4090-llama-3.1-8b-tp1")
    table, meta = _trace([(70, 4, [1, 2, 3, 4]), (90, 4, [1, 2, 3, 9, 10]), (40, 4, [7, 8])], 16)
    result = simulate_trace(table, meta, cfg)
    assert result.notes["prefix_cache_hits"] == 3 * 16  # r1 reuses r0's first three blocks; r2 nothing
    column = table.schema.get_field_index("prompt_block_hashes")
    no_hashes = table.set_column(column, "prompt_block_hashes", pa.nulls(3, pa.list_(pa.int64())))
    assert simulate_trace(no_hashes, {"mode": "open"}, cfg).notes["prefix_cache_hits"] == 0


def test_trace_blocks_of_another_size_map_onto_the_engines() -> None:
    assert engine_block_chain([11, 12], 32, 16, 64)[1] == 11  # engine block 1 ends where trace block 0 does
    assert engine_block_chain([11, 12, 13], 16, 32, 48) == [12]  # one 32-token block: the hash of 32 tokens
    cfg = load_engine_config("rtx4090-llama-3.1-8b-tp1")
    table, meta = _trace([(64, 4, [1, 2]), (64, 4, [1, 3])], 32)
    assert simulate_trace(table, meta, cfg).notes["prefix_cache_hits"] == 32  # trace block 0 = engine blocks 0, 1


def test_data_parallel_replicas_share_the_load_behind_the_router() -> None:
    cfg = load_engine_config("rtxpro6000-qwen3-30b-a3b-tp1-ep2")
    n = 6
    cols = {
        "request_id": [f"r{i}" for i in range(n)],
        "request_class": ["c"] * n,
        "scheduled_offset_ns": [i * 1_000_000 for i in range(n)],
        "prompt_tokens": [500] * n,
        "output_tokens": [20] * n,
    }
    table = pa.Table.from_pydict(
        {f.name: cols.get(f.name, [None] * n) for f in TRACE_FULL_SCHEMA}, schema=TRACE_FULL_SCHEMA
    )
    result = simulate_trace(table, {"mode": "open"}, cfg, replicas=2, route_policy="least-in-flight")
    assert result.notes["routed"] == [3, 3]
    assert all(r["steps"] > 0 for r in result.notes["per_replica"])
    one = simulate_trace(table, {"mode": "open"}, cfg)
    last = max(result.requests_table.column("done_ns").to_pylist())
    assert last < max(one.requests_table.column("done_ns").to_pylist())  # two engines finish sooner than one


#: (shared run, workload, engine, replicas): the runs whose every figure the goal holds within 10%.
SHARED_RUNS = {
    "rtx4090-llama": ("RTX4090/Llama-3.1-8B", "llama-3.1-8b", "rtx4090-llama-3.1-8b-tp1", 1),
    "rtxpro6000-llama": ("RTXPRO6000/Llama-3.1-8B", "llama-3.1-8b", "rtxpro6000-llama-3.1-8b-tp1", 1),
    "rtxpro6000-moe": (
        "RTXPRO6000/Qwen3-30B-A3B-Instruct-2507",
        "qwen3-30b-a3b",
        "rtxpro6000-qwen3-30b-a3b-tp1-ep2",
        2,
    ),
}


@pytest.mark.parametrize("run", sorted(SHARED_RUNS))
def test_shared_runs_are_predicted_within_ten_percent(tmp_path: Path, run: str) -> None:
    """TTFT, TPOT and E2E (mean, p50, p90, p99) of the worksheet against vLLM's own per-request instants
    (arrivals mapped onto the engine clock by the smallest queued - arrival offset)."""
    measured_dir, workload, engine, replicas = SHARED_RUNS[run]
    rows = [
        json.loads(line)
        for line in shared_trace(f"llmservingsim/bench/examples/{measured_dir}/vllm/requests.jsonl").open()
    ]
    jsonl = shared_trace(f"llmservingsim/workloads/sharegpt-{workload}-300-sps10.jsonl")
    table, meta = read_trace(import_trace("llmservingsim", jsonl, tmp_path / "t.parquet"))
    policy = VLLM_DP if replicas > 1 else "round-robin"  # DP ranks behind vLLM's own balancer, as the run had
    result = simulate_trace(table, meta, load_engine_config(engine), replicas=replicas, route_policy=policy)
    offset = min(r["queued_ts"] - r["arrival_time"] for r in rows)
    measured = {
        "ttft": [r["first_token_ts"] - r["arrival_time"] - offset for r in rows],
        "tpot": [(r["last_token_ts"] - r["first_token_ts"]) / (r["output_toks"] - 1) for r in rows],
        "e2e": [r["last_token_ts"] - r["arrival_time"] - offset for r in rows],
    }
    req = result.requests_table.to_pydict()
    sched, first, last = (
        np.array(req[k], dtype=float) / 1e9 for k in ("scheduled_ns", "first_token_ns", "last_token_ns")
    )
    out = np.array(req["client_output_tokens"], dtype=float)
    predicted = {"ttft": first - sched, "tpot": (last - first) / (out - 1), "e2e": last - sched}
    for metric, values in measured.items():
        for stat in ("mean", 50, 90, 99):
            m = np.mean(values) if stat == "mean" else np.percentile(values, stat)
            p = np.mean(predicted[metric]) if stat == "mean" else np.percentile(predicted[metric], stat)
            assert abs(p - m) / m < 0.10, f"{run}: {metric} {stat}: measured {m:.4f} s, predicted {p:.4f} s"


def test_an_expert_parallel_group_steps_in_lockstep_over_its_tokens() -> None:
    p = load_profile(PRO_MOE, 1, QWEN_MOE, ep=2)
    assert p.group_delta_us(300, 600) == pytest.approx(0.0)  # ranks equally loaded: as tokens_us priced it
    assert p.group_delta_us(100, 2100) > 0 > p.group_delta_us(2000, 2100)  # the experts run the group's tokens
    cfg = load_engine_config("rtxpro6000-qwen3-30b-a3b-tp1-ep2")
    table, meta = _trace([(100, 3, None), (2000, 3, None)], 16)
    table = table.set_column(2, "scheduled_offset_ns", pa.array([0, 0], pa.int64()))  # both at once
    result = simulate_trace(table, meta, cfg, replicas=2, route_policy="round-robin")
    first = result.requests_table.column("first_token_ns").to_pylist()
    assert first[0] == first[1]  # the short prompt's rank waits for the long prefill on the other
    alone = simulate_trace(table.slice(0, 1), meta, cfg, replicas=2, route_policy="round-robin")
    assert alone.requests_table.column("first_token_ns")[0].as_py() < first[0]


def _first_token_steps(async_scheduling: bool, short_output: int | None) -> int:
    """The step in which a request ``b``, arriving during step 1, emits its first token, beside a long-running
    sequence and (``short_output``) one that finishes early, with two seats."""
    data = {
        "name": "async",
        "scheduler": {"max_num_seqs": 2, "max_num_batched_tokens": 2048, "async_scheduling": async_scheduling},
        "kv": {"num_kv_blocks": 1000},
    }
    engine = Engine(parse_engine_config(data))
    engine.add(Seq(0, 32, 50, 0))
    if short_output is not None:
        engine.add(Seq(1, 32, short_output, 0))
    t = engine.step(0).duration_ns
    b = Seq(2, 32, 3, t // 2)
    engine.add(b)  # during step 1
    for k in range(2, 20):
        t += engine.step(t).duration_ns
        if b.output:
            return k
    raise AssertionError("b never ran")


def test_async_scheduling_admits_an_arrival_two_steps_late_and_frees_seats_a_step_late() -> None:
    """vLLM 0.19 schedules step N+1 as step N begins: a request arriving during step N runs in step N+2, and a
    sequence finished by step N (others running on) still holds its seat when step N+1 is scheduled."""
    assert _first_token_steps(False, None) == 2
    assert _first_token_steps(True, None) == 3  # arrived during step 1: step 2 was already scheduled
    # the short sequence finishes in step 3: synchronously b takes its seat in step 4, asynchronously in step 5
    assert _first_token_steps(False, 3) == 4
    assert _first_token_steps(True, 3) == 5


def test_practice_takes_two_simulated_candidates_or_says_why(tmp_path: Path) -> None:
    import subprocess
    import sys

    cmd = [sys.executable, "-m", "loadgen", "practice", "--candidate", "rtx4090-llama-3.1-8b-tp1"]
    done = subprocess.run([*cmd, "--out", str(tmp_path / "p")], capture_output=True, text=True, check=False)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "given 1 time(s): expected two simulated candidates" in done.stderr


def test_linear_terms_fitted_to_a_profile_reproduce_its_steps() -> None:
    from loadgen.sim.profile import fit_linear_cost

    p = load_profile(PRO_LLAMA, 1, LLAMA)
    terms = fit_linear_cost(p, 128, 2048)
    assert all(v >= 0 for v in terms.values()) and terms["per_prefill_token_ms"] > 0

    def linear_us(prefill: int, decodes: int, kv_read: int) -> float:
        return 1e3 * (
            terms["fixed_ms"]
            + terms["per_prefill_token_ms"] * prefill
            + terms["per_decode_seq_ms"] * decodes
            + terms["per_kv_token_ms"] * kv_read
        )

    for prefill, decodes, kv in ((0, 64, 1024), (0, 128, 2048), (2048, 0, 0)):
        want = p.step_us(prefill, 0, decodes, decodes * kv, max(decodes, 1))
        assert linear_us(prefill, decodes, decodes * kv + prefill) == pytest.approx(want, rel=0.2)


def test_a_mixed_step_past_the_profiled_decodes_adds_the_decode_only_increment() -> None:
    p = load_profile(RTX4090, 1, LLAMA)
    assert p.mixed_attention.nd[-1] == 128 and p.decode_attention.nd[-1] == 256
    # 512,0,128,2048,4578.6 (mixed); 0,0,128,2048,1180.0 and 0,0,256,2048,2312.6 (decode-only): 192 decodes
    # with a 512-token chunk add what 64 more decodes add without one: half of 2312.6 - 1180.0
    beyond = 0.5 * (p.decode_attention.at(0, 0, 256, 2048) - p.decode_attention.at(0, 0, 128, 2048))
    expected = p.mixed_attention.at(512, 0, 128, 2048) + beyond
    assert p.attention_us(512, 0, 192, 192 * 2048) == pytest.approx(32 * expected)
    assert p.mixed_attention.at(512, 0, 128, 2048) == pytest.approx(4578.6, rel=1e-4)
    assert beyond == pytest.approx(0.5 * (2312.6 - 1180.0), rel=1e-3)
    # within the mixed grid nothing changes: 96 decodes read between 64 and 128 as before
    assert p.attention_us(512, 0, 96, 96 * 2048) == pytest.approx(32 * p.mixed_attention.at(512, 0, 96, 2048))


def test_cuda_graph_capture_sizes_are_vllms_defaults() -> None:
    """The sizes vLLM 0.19 captured on the shared RTX 4090 run (max_num_seqs 256), as its meta.json logs them,
    and by hand for smaller limits: 1, 2, 4, steps of 8 below 256, steps of 16, up to min(2 x seqs, 512, budget)."""
    from loadgen.sim.profile import cudagraph_capture_sizes

    meta = json.loads(shared_trace("llmservingsim/bench/examples/RTX4090/Llama-3.1-8B/vllm/meta.json").read_text())
    logged = meta["resolved_config"]["compilation_config"]["cudagraph_capture_sizes"]
    assert cudagraph_capture_sizes(256, 2048) == logged and logged[-1] == 512
    assert cudagraph_capture_sizes(128, 2048) == [1, 2, 4, *range(8, 256, 8), 256]
    assert cudagraph_capture_sizes(2, 2048) == [1, 2, 4]
    assert cudagraph_capture_sizes(128, 100)[-1] == 96  # the largest size within the token budget


def test_a_step_within_the_largest_graph_runs_its_token_terms_at_the_capture_size() -> None:
    """A decode-only step of 35 sequences replays the 40-token graph: its dense ops at 40 tokens, its attention
    and logits at 35 sequences. Past the largest graph (512 here) a step runs unpadded; so does every step of an
    engine without CUDA graphs (--enforce-eager)."""
    from loadgen.sim.profile import cudagraph_capture_sizes, cudagraph_tokens

    sizes = cudagraph_capture_sizes(256, 2048)
    assert [cudagraph_tokens(n, sizes) for n in (1, 3, 35, 40, 250, 257, 512, 513, 2048)] == [
        1, 4, 40, 40, 256, 272, 512, 513, 2048,
    ]  # fmt: skip
    assert cudagraph_tokens(35, []) == 35
    p = load_profile(RTX4090, 1, LLAMA)
    for graphs, tokens in ((True, 40), (False, 35)):
        cfg = parse_engine_config(
            {
                "name": "graphs",
                "scheduler": {"max_num_seqs": 256, "max_num_batched_tokens": 2048, "cuda_graphs": graphs},
                "kv": {"block_size": 16, "num_kv_blocks": 4096},
                "cost": {
                    "fixed_ms": 0.0,
                    "profile": {"path": RTX4090, "model_config": LLAMA, "gpu": "RTX 4090", "vllm_version": "0.19.0"},
                },
            }
        )
        engine = Engine(cfg)
        for i in range(35):
            engine.add(Seq(i, 16, 8, 0))
        engine.step(0)  # every prompt in one step (560 tokens: past the largest graph, unpadded)
        step = engine.step(1)  # 35 decodes of 17 KV tokens each
        assert step.decode_seqs == 35 and step.prefill_tokens == 0
        want = p.tokens_us(tokens) + p.sequences_us(35) + p.attention_us(0, 0, 35, 35 * 17, 17, 17)
        assert step.duration_ns == int(want * 1e3), graphs


def test_each_prefill_chunk_of_a_step_attends_to_its_own_keys() -> None:
    """vLLM runs a step's attention as one varlen call in which each sequence attends to its own keys: two prompts
    prefilled in one step cost the attention of each, not of one sequence as long as both (which would count
    the cross terms of a causal 500-token sequence that no request has)."""
    from loadgen.sim.profile import cudagraph_capture_sizes, cudagraph_tokens

    p = load_profile(RTX4090, 1, LLAMA)
    engine = Engine(load_engine_config("rtx4090-llama-3.1-8b-tp1"))
    engine.add(Seq(0, 300, 2, 0))
    engine.add(Seq(1, 200, 2, 0))
    step = engine.step(0)
    assert step.prefill_tokens == 500 and step.decode_seqs == 0
    tokens = cudagraph_tokens(500, cudagraph_capture_sizes(256, 2048))  # 512: within the largest graph
    per_chunk = p.attention_us(300, 0, 0, 0) + p.attention_us(200, 0, 0, 0)
    assert step.duration_ns == int((p.tokens_us(tokens) + p.sequences_us(2) + per_chunk) * 1e3)
    assert p.attention_us(500, 0, 0, 0) > per_chunk


def test_a_chunk_past_the_fine_chunk_grid_is_priced_from_the_measured_doubling_grid() -> None:
    # The RTX PRO 6000 profile holds a full x1.5 chunk grid (to 1,384 tokens) beside its doubling one (to 2,048).
    # A chunk past 1,384 is read from the doubling grid's measured points, not continued past 1,384:
    # 1024,0,0,0,61.0667 / 2048,0,0,0,172.609; 32 layers
    p = load_profile(PRO_LLAMA, 1, LLAMA)
    assert p.mixed_attention.pc[-1] == 1384 and p.mixed_wide is not None and p.mixed_wide.pc[-1] == 2048
    assert p.attention_us(2048, 0, 0, 0) == pytest.approx(32 * 172.609)
    assert p.attention_us(1700, 0, 0, 0) == pytest.approx(32 * (61.0667 + (1700 - 1024) / 1024 * (172.609 - 61.0667)))
    # within the fine grid it still reads the fine grid; a decode KV below its first KV point reads the doubling one
    assert p.attention_us(1000, 600, 8, 8 * 1024) == pytest.approx(32 * p.mixed_attention.at(1000, 600, 8, 1024))
    assert p.attention_us(1024, 0, 8, 8 * 100) == pytest.approx(32 * p.mixed_wide.at(1024, 0, 8, 100))
    # the RTX 4090 profile's chunk grid is its doubling grid: nothing beside it
    assert load_profile(RTX4090, 1, LLAMA).mixed_wide is None


def test_steps_past_the_profiles_grid_are_counted_by_axis() -> None:
    data = {
        "name": "wide-budget",
        "scheduler": {"max_num_seqs": 8, "max_num_batched_tokens": 8192, "max_model_len": 20000},
        "kv": {"block_size": 16, "num_kv_blocks": 4096},
        "cost": {
            "fixed_ms": 0.0,
            "profile": {"path": RTX4090, "model_config": LLAMA, "gpu": "RTX 4090", "vllm_version": "0.19.0"},
        },
    }
    engine = Engine(parse_engine_config(data))
    grid = engine.grid
    assert grid is not None and (grid.tokens, grid.prefill_chunk, grid.sequences, grid.kv) == (2048, 2048, 256, 16384)
    assert [f.name for f in dataclasses.fields(grid)] == list(AXES)  # beyond() reads the fields as the axes
    engine.add(Seq(0, 6000, 3, 0))  # one 6,000-token prefill step (past 2,048 tokens and chunk), then decodes
    steps = [engine.step(0) for _ in range(3)]
    assert [s.prefill_tokens for s in steps] == [6000, 0, 0]
    cov = engine.grid_coverage
    assert (cov.steps, cov.steps_beyond, cov.by_axis) == (3, 1, {"tokens": 1, "prefill_chunk": 1})
    assert cov.profiled_ns_beyond == pytest.approx(steps[0].duration_ns, abs=1)
    assert cov.profiled_ns == pytest.approx(sum(s.duration_ns for s in steps), abs=3)


def test_a_plan_on_a_profiled_engine_says_how_much_the_profile_measured(tmp_path: Path) -> None:
    import subprocess
    import sys

    def plan(engine: str, out: str) -> str:
        cmd = [sys.executable, "-m", "loadgen", "plan", "quick", "--sim-worksheet", engine, "--quiet"]
        res = subprocess.run([*cmd, "--out", str(tmp_path / out)], capture_output=True, text=True)
        assert res.returncode == 0, res.stderr
        return res.stdout

    from loadgen.plan.coverage import plan_profile_grid

    profiled = plan("rtxpro6000-llama-3.1-8b-tp1", "pro")
    runs, note = plan_profile_grid(tmp_path / "pro")
    assert runs > 0 and note is not None and note["steps_beyond"] == 0
    # every run directory, extensions included (the plan's "N runs" counts only the cells' repeats)
    assert runs == len(list((tmp_path / "pro").glob("cells/*/rep*/manifest.json")))
    assert (
        f"profile grid: all {note['steps']:,} steps priced between measured points (over the plan's {runs} run "
        "directories, extensions included)" in profiled
    )
    assert "profile grid" not in plan("interactive-small-batch", "preset")  # hand-set costs: no profile, no line
