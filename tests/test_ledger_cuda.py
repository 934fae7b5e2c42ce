"""The ledger's CUDA path (vLLM 0.19's accounting) held to hand-computed values, and against the logged RTX 4090 run.

Every expected figure below is computed by hand from the model config and the engine settings; the RTX 4090
test compares with the 2,588 blocks vLLM logged (meta.json) and records the gap, it does not fit to it.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from loadgen.ledger import GIB, EngineSettings, compute_ledger, parse_model_config, read_model_config
from loadgen.ledger.cuda import NON_TORCH_INCREASE_GIB, SAMPLER_BYTES_PER_LOGIT
from tests.shared_paths import shared_trace
from tests.test_ledger import LLAMA_31_8B  # the published config.json fields, one copy

ROOT = Path(__file__).resolve().parents[1]
RUN_4090 = "llmservingsim/bench/examples/RTX4090/Llama-3.1-8B/vllm/meta.json"
LLAMA_CONFIG = "llmservingsim/configs/model/meta-llama/Llama-3.1-8B.json"

TOTAL_4090 = 25_250_627_584  # meta.json hardware.device_total_memory_bytes


def _engine(**changes: object) -> EngineSettings:
    base: dict[str, object] = {
        "max_num_seqs": 256,
        "max_num_batched_tokens": 2048,
        "max_model_len": 32768,
        "device_memory_gib": TOTAL_4090 / GIB,
        "gpu_memory_utilization": 0.9,
    }
    base.update(changes)
    return EngineSettings(**base)  # type: ignore[arg-type]


def test_sampler_bytes_per_logit_is_the_sum_of_its_tensors():
    # bf16 logits 2 + fp32 copy 4 + sort values 4 + int64 indices 8 + top-p probs 4 + mask 1 + scatter 4
    assert SAMPLER_BYTES_PER_LOGIT == 27


def test_cuda_lines_by_hand():
    led = compute_ledger(parse_model_config(LLAMA_31_8B), _engine())
    params = 8_030_261_248
    rotary = 131_072 * 128 * 2
    assert led.line("weights").bytes == params * 2 + rotary == 16_094_076_928
    forward = 2048 * (2 * 4096 + 3 * 14336) * 2
    assert led.line("activations").bytes == forward == 209_715_200
    sampler = 256 * 128_256 * 27 + 2048 * 4096 * 2
    assert sampler == 903_282_688
    assert led.line("workspaces").bytes == sampler - forward  # the two lines sum to the torch peak
    assert led.line("fragmentation").bytes == 0
    assert led.line("graph_comm_buffers").bytes == int(0.11 * GIB) == 118_111_600
    requested = int(TOTAL_4090 * 0.9)
    assert requested == 22_725_564_825
    non_kv = params * 2 + rotary + sampler + int(0.11 * GIB)
    assert led.kv_budget_bytes == requested - non_kv
    assert led.kv_cache_blocks == (requested - non_kv) // (32 * 16 * 2 * 8 * 128 * 2) == 2675


def test_forward_peak_wins_over_a_small_sampler():
    # 8 sequences: the sampler's 8 × vocab × 27 B + held hidden states stay under the forward's peak
    led = compute_ledger(parse_model_config(LLAMA_31_8B), _engine(max_num_seqs=8))
    assert 8 * 128_256 * 27 + 2048 * 4096 * 2 < 209_715_200
    assert led.line("workspaces").bytes == 0
    assert led.line("activations").bytes == 209_715_200


def test_sampler_rows_are_capped_by_the_token_budget():
    led = compute_ledger(parse_model_config(LLAMA_31_8B), _engine(max_num_seqs=1024, max_num_batched_tokens=512))
    forward = 512 * (2 * 4096 + 3 * 14336) * 2
    sampler = 512 * 128_256 * 27 + 512 * 4096 * 2  # min(1024, 512) rows
    assert led.line("workspaces").bytes == sampler - forward


def test_tensor_parallel_splits_the_mlp_not_the_sampler():
    led = compute_ledger(parse_model_config(LLAMA_31_8B), _engine(tensor_parallel_size=2))
    forward = 2048 * (2 * 4096 + 3 * 14336 // 2) * 2
    assert led.line("activations").bytes == forward
    assert led.line("workspaces").bytes == 256 * 128_256 * 27 + 2048 * 4096 * 2 - forward


def test_given_non_torch_and_graph_estimate_replace_the_defaults():
    led = compute_ledger(parse_model_config(LLAMA_31_8B), _engine(non_torch_gib=0.25, graph_buffer_gib=0.5))
    assert led.line("graph_comm_buffers").bytes == int(0.25 * GIB) + int(0.5 * GIB)
    default = compute_ledger(parse_model_config(LLAMA_31_8B), _engine())
    assert default.line("graph_comm_buffers").factors["non_torch_gib"] == NON_TORCH_INCREASE_GIB
    assert default.kv_cache_blocks - led.kv_cache_blocks == pytest.approx(
        (int(0.25 * GIB) + int(0.5 * GIB) - int(0.11 * GIB)) / (2 * 1024 * 1024), abs=1
    )


def test_cpu_path_keeps_its_estimates():
    led = compute_ledger(parse_model_config(LLAMA_31_8B), EngineSettings(device="cpu", kv_cache_gib=4, block_size=128))
    assert led.line("fragmentation").factors["fraction"] == 0.05
    assert led.line("workspaces").bytes == led.engine.max_num_seqs * 128_256 * 4 * 2
    assert led.line("graph_comm_buffers").bytes == 0


def test_every_cuda_line_says_what_it_assumes():
    led = compute_ledger(parse_model_config(LLAMA_31_8B), _engine())
    assert "rotary cos/sin buffer" in led.line("weights").formula
    assert "assumption" in led.line("activations").factors and "assumption" in led.line("workspaces").factors
    graph = led.line("graph_comm_buffers").formula
    assert "assumed constant" in graph and "v0.21.0" in graph
    assert "predate vLLM's memory snapshot" in led.line("runtime").formula


def test_rtx4090_run_against_its_logged_blocks():
    meta = json.loads(shared_trace(RUN_4090).read_text())
    model = read_model_config(shared_trace(LLAMA_CONFIG))
    kwargs, kv = meta["engine_kwargs"], meta["kv_cache"]
    engine = EngineSettings(
        max_num_seqs=kwargs["max_num_seqs"],
        max_num_batched_tokens=kwargs["max_num_batched_tokens"],
        max_model_len=kwargs["max_model_len"],
        device_memory_gib=meta["hardware"]["device_total_memory_bytes"] / GIB,
        gpu_memory_utilization=kv["gpu_memory_utilization"],
        block_size=kv["block_size"],
    )
    led = compute_ledger(model, engine)
    assert kv["num_gpu_blocks"] == 2588
    assert led.kv_cache_blocks == 2675  # the hand-computed figure of test_cuda_lines_by_hand
    # the rule misses by +3.4%: vLLM's non-KV memory beyond the weights was 181-183 MB more than these lines
    assert (led.kv_cache_blocks - 2588) / 2588 == pytest.approx(0.0336, abs=0.0001)


def test_cli_takes_device_memory_in_bytes(tmp_path):
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(LLAMA_31_8B))
    out = subprocess.run(
        [sys.executable, "-m", "loadgen", "ledger", "--model", str(cfg), "--device-memory-bytes", str(TOTAL_4090)]
        + ["--max-num-seqs", "256", "--max-num-batched-tokens", "2048", "--max-model-len", "32768", "--json"],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["kv_cache_blocks"] == 2675
    both = subprocess.run(
        [sys.executable, "-m", "loadgen", "ledger", "--model", str(cfg), "--device-memory-bytes", "1"]
        + ["--device-memory-gib", "1"],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert both.returncode == 2 and "Traceback" not in both.stderr
