"""The ledger's CUDA path (vLLM 0.19 accounting) against the shared real GPU runs: predicted vs logged KV blocks.

For each run under ``../shared/traces/llmservingsim/bench/examples`` it prints what the run logs (KV blocks,
device memory) and what the ledger predicts from the model config and the run's engine settings, with every
non-KV line. Only the RTX 4090 run records its KV blocks and device memory; the RTX PRO 6000 runs record
neither, so their prediction is printed at the device total another public run of that GPU model logged
(``loadgen.ledger.gpus``; ``--pro6000-total-bytes`` gives another), which the output says. Deterministic: no
GPU, no timing.

It then sets the ledger beside public vLLM 0.19 runs on an H100 (llm-d-planner's logs) and vLLM 0.28 runs on the
RTX PRO 6000 that log their KV pool (LLMServingSim), each source named where it is listed.

    python benchmarks/bench_ledger_gpu_runs.py
    python benchmarks/bench_ledger_gpu_runs.py --pro6000-total-bytes 96000000000
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from loadgen.ledger import GIB, EngineSettings, compute_ledger, read_model_config
from loadgen.ledger.gpus import gpu_memory

REPO = Path(__file__).resolve().parents[1]
SIM = REPO.parent / "shared" / "traces" / "llmservingsim"
#: The runs: (example dir, model config under configs/model, why a run is not predicted or None).
RUNS = (
    ("RTX4090/Llama-3.1-8B", "meta-llama/Llama-3.1-8B.json", None),
    ("RTXPRO6000/Llama-3.1-8B", "meta-llama/Llama-3.1-8B.json", None),
    (
        "RTXPRO6000/Qwen3-30B-A3B-Instruct-2507",
        "Qwen/Qwen3-30B-A3B-Instruct-2507.json",
        "DP 2 with expert parallelism: the ledger does not shard experts across data-parallel ranks",
    ),
)
#: The GPU a run ran on when its meta.json does not name it: the name its operator profile's meta.yaml gives.
PROFILE_GPU_NAMES = {"RTXPRO6000": "NVIDIA RTX PRO 6000 Blackwell Server Edition"}
#: The RTX PRO 6000's device total: the ledger's table (logged on a public run of the same GPU model).
PRO6000_MEMORY = gpu_memory(PROFILE_GPU_NAMES["RTXPRO6000"])


def _gpu_name(name: str, meta: dict) -> str:
    """The GPU as the run's meta.json names it, else as the operator profile of that GPU does."""
    return (meta.get("hardware") or {}).get("device_name") or PROFILE_GPU_NAMES.get(name.split("/")[0], "")


def _engine(meta: dict, total_bytes: int, gpu_name: str) -> EngineSettings:
    kwargs = meta["engine_kwargs"]
    kv = meta.get("kv_cache") or {}
    return EngineSettings(
        max_num_seqs=kwargs["max_num_seqs"],
        max_num_batched_tokens=kwargs["max_num_batched_tokens"],
        max_model_len=kwargs.get("max_model_len"),
        tensor_parallel_size=kwargs["tensor_parallel_size"],
        device_memory_gib=total_bytes / GIB,
        gpu_memory_utilization=kv.get("gpu_memory_utilization", 0.9),
        block_size=kv.get("block_size", 16),
        device_name=gpu_name,
    )


def _report(name: str, config: str, skip: str | None, pro6000_total: int) -> None:
    meta = json.loads((SIM / "bench" / "examples" / name / "vllm" / "meta.json").read_text())
    logged_total = (meta.get("hardware") or {}).get("device_total_memory_bytes")
    logged_blocks = (meta.get("kv_cache") or {}).get("num_gpu_blocks")
    print(f"== {name}: vLLM {meta['vllm_version']}, engine {meta['engine_kwargs']}")
    print(
        f"   logged: KV blocks {logged_blocks if logged_blocks is not None else 'not logged'}; device total bytes "
        f"{logged_total if logged_total is not None else 'not logged'}"
    )
    if skip:
        print(f"   not predicted: {skip}")
        return
    total = int(logged_total) if logged_total is not None else pro6000_total
    if logged_total is not None:
        source = "logged"
    elif PRO6000_MEMORY is not None and pro6000_total == PRO6000_MEMORY.total_bytes:
        source = f"not logged by this run; {PRO6000_MEMORY.source}"
    else:
        source = "given (not logged)"
    led = compute_ledger(
        read_model_config(SIM / "configs" / "model" / config), _engine(meta, total, _gpu_name(name, meta))
    )
    print(
        f"   device total {total:,} B ({source}) × utilization {led.engine.gpu_memory_utilization:g} "
        f"= {int(total * led.engine.gpu_memory_utilization):,} B"
    )
    for line in led.lines:
        if line.name not in ("kv_cache", "safety_margin", "runtime", "adapters"):
            print(f"   {line.name:<20} {line.bytes:>16,} B  {line.formula}")
    blocks = led.kv_cache_blocks or 0
    print(f"   KV budget {led.kv_budget_bytes:,} B → predicted blocks {blocks:,}")
    if logged_blocks is not None:
        error = (blocks - logged_blocks) / logged_blocks
        per_block = led.kv.bytes_per_block
        lo = int(total * led.engine.gpu_memory_utilization) - (logged_blocks + 1) * per_block
        hi = int(total * led.engine.gpu_memory_utilization) - logged_blocks * per_block
        predicted_non_kv = sum(
            line.bytes for line in led.lines if line.name not in ("kv_cache", "safety_margin", "runtime")
        )
        print(
            f"   vs logged {logged_blocks:,}: {error:+.2%}; vLLM's non-KV memory was {lo:,}-{hi:,} B, "
            f"the ledger's {predicted_non_kv:,} B ({predicted_non_kv - hi:+,} to {predicted_non_kv - lo:+,} B)"
        )
        others = predicted_non_kv - led.line("graph_comm_buffers").bytes
        print(
            f"   with every other line as derived, the non-torch increase vLLM saw was {(lo - others) / GIB:.3f}-"
            f"{(hi - others) / GIB:.3f} GiB (assumed: {led.line('graph_comm_buffers').factors['non_torch_gib']:g} GiB)"
        )
    else:
        print(
            f"   nothing logged to compare; each GiB of device total moves the prediction by "
            f"{0.9 * GIB / led.kv.bytes_per_block:.0f} blocks"
        )


#: Public vLLM 0.19.0 runs on an H100-80GB (79.19 GiB, utilization 0.95, vLLM's defaults: 8,192 tokens, 1,024
#: sequences), published by llm-d-incubation/llm-d-planner: Llama-3.1-8B-Instruct from its raw log
#: (accuracy/results/v0.19.0/logs/meta-llama-llama-3-1-8b--h100-80gb--tp1pp1dp1--16384.log), Qwen2.5-7B-Instruct
#: from its report's table (accuracy/results/v0.19.0/accuracy_report.md), Qwen1.5-MoE-A2.7B from its raw log
#: (accuracy/results/v0.19.0/logs/qwen-qwen1-5-moe-a2-7b--h100-80gb--tp1pp1dp1--8192.log: "torch peak memory
#: increase: 2.47GiB; non-torch forward increase memory: 0.25GiB; weights memory: 26.67GiB", "Available KV cache
#: memory: 45.83 GiB", "GPU KV cache size: 250,304 tokens", "Using TRITON backend for Unquantized MoE"), DeepSeek-
#: V2-Lite-Chat's and Qwen3-30B-A3B's torch peaks from that report's planner constants and errors (constant /
#: (1 + error); the repository holds no raw log of those two runs). GiB as logged (2 decimals); None = not given.
H100_RUNS: tuple[dict[str, Any], ...] = (
    {
        "name": "Llama-3.1-8B-Instruct",
        "config": "loadgen/data/models/llama-3.1-8b.json",
        "max_model_len": 16384,
        "torch_peak_gib": 1.89,
        "non_torch_gib": 0.25,
        "weights_gib": 14.99,
        "kv_gib": 58.11,
        "tokens": 476_016,
    },
    {
        "name": "Qwen2.5-7B-Instruct",
        "config": "loadgen/data/models/qwen2.5-7b.json",
        "max_model_len": 8192,
        "torch_peak_gib": 2.21,
        "non_torch_gib": 0.24,
        "weights_gib": 14.25,
        "kv_gib": 58.53,
        "tokens": 1_096_000,
    },
    {
        "name": "DeepSeek-V2-Lite-Chat (MoE)",
        "config": "loadgen/data/models/deepseek-v2-lite.json",
        "max_model_len": 8192,
        "torch_peak_gib": round(8.0 / 4.1451, 2),
        "non_torch_gib": None,
        "weights_gib": None,
        "kv_gib": None,
        "tokens": None,
    },
    {
        "name": "Qwen1.5-MoE-A2.7B (MoE)",
        "config": "loadgen/data/models/qwen1.5-moe-a2.7b.json",
        "max_model_len": 8192,
        "torch_peak_gib": 2.47,
        "non_torch_gib": 0.25,
        "weights_gib": 26.67,
        "kv_gib": 45.83,
        "tokens": 250_304,
    },
    {
        "name": "Qwen3-30B-A3B (MoE)",
        "config": "scenarios/engines/profiles/models/Qwen3-30B-A3B-Instruct-2507.json",
        "max_model_len": 8192,
        "torch_peak_gib": round(8.0 / 2.9851, 2),
        "non_torch_gib": None,
        "weights_gib": None,
        "kv_gib": None,
        "tokens": None,
    },
)


#: Public vLLM 0.28.0 runs on the RTX PRO 6000 (LLMServingSim, casys-kaist/LLMServingSim), their logged KV pools:
#: the Llama-3.1-8B TP 1 rerun of the shared run's workload (bench/examples/RTXPRO6000/Llama-3.1-8B/vllm/meta.json
#: at commit 0acc21b27fb2950bdfac90162e7bd3de43fe3dff, 2026-09-07; 13,753 B, sha256 d840175d79eb...; the repository
#: stores no requests.jsonl of that rerun, so only its pool is used) and the held-out Qwen3-32B TP 2 run
#: (bench/examples/RTXPRO6000/Qwen3-32B/vllm/meta.json at 0d3de681adbd9c515fc378e94e3e625b6e250dad; its files
#: are fetched by bench_heldout_runs.py). Both: device 101,976,440,832 B, gpu_memory_utilization 0.92, 128
#: sequences, 2,048 tokens, torch 2.13.0+cu130; max_model_len as vLLM resolved it.
VLLM_028_RUNS: tuple[dict[str, Any], ...] = (
    {
        "name": "Llama-3.1-8B, TP 1",
        "config": "loadgen/data/models/llama-3.1-8b.json",
        "tp": 1,
        "max_model_len": 131072,
        "blocks": 35_913,
        "settings": {},
    },
    {
        "name": "Qwen3-32B, TP 2",
        "config": "scenarios/engines/profiles/models/Qwen3-32B.json",
        "tp": 2,
        "max_model_len": 40960,
        "blocks": 28_884,
        "settings": {"allreduce_rms_fusion": False},  # logged: fuse_allreduce_rms off
    },
)


def _report_028(run: dict[str, Any]) -> None:
    """A vLLM 0.28 run beside the ledger (vLLM 0.19 accounting): the blocks, and what vLLM subtracted beyond the
    weights, forward and sampler the ledger derives (its non-torch increase and, from v0.21.0, its CUDA graph
    estimate, which the ledger does not model)."""
    engine = EngineSettings(
        max_num_seqs=128,
        max_num_batched_tokens=2048,
        max_model_len=run["max_model_len"],
        tensor_parallel_size=run["tp"],
        device_memory_gib=101_976_440_832 / GIB,
        gpu_memory_utilization=0.92,
        device_name="NVIDIA RTX PRO 6000 Blackwell Server Edition",
        **run["settings"],
    )
    led = compute_ledger(read_model_config(REPO / run["config"]), engine)
    blocks, logged, per_block = int(led.kv_cache_blocks or 0), run["blocks"], led.kv.bytes_per_block
    usable = int(101_976_440_832 * 0.92)
    graph = led.line("graph_comm_buffers").bytes
    others = sum(line.bytes for line in led.lines if line.name not in ("kv_cache", "safety_margin", "runtime")) - graph
    lo, hi = usable - (logged + 1) * per_block - others, usable - logged * per_block - others
    print(f"== public vLLM 0.28.0 run, RTX PRO 6000 × 0.92, {run['name']} (LLMServingSim)")
    print(f"   KV blocks   ledger {blocks:,}, logged {logged:,} ({(blocks - logged) / logged:+.2%})")
    print(
        f"   non-torch increase + CUDA graph estimate vLLM subtracted, with the other lines as derived: "
        f"{lo / GIB:.3f}-{hi / GIB:.3f} GiB per GPU (the ledger: {graph / GIB:.3f} GiB, vLLM 0.19's, no estimate)"
    )


def _pct(ours: float, theirs: float | None) -> str:
    return "" if theirs is None else f" ({(ours - theirs) / theirs:+.1%})"


def _report_h100(run: dict[str, Any]) -> None:
    """One public H100 run beside the ledger: the torch peak and weights lines are held out; the non-torch
    constant is the Llama log's own figure (0.25 GiB), so the KV figures check the other lines."""
    engine = EngineSettings(
        max_model_len=run["max_model_len"],
        device_memory_gib=79.19,
        gpu_memory_utilization=0.95,
        device_name="NVIDIA H100 80GB HBM3",
    )
    model = read_model_config(REPO / run["config"])
    led = compute_ledger(model, engine)
    peak = (led.line("activations").bytes + led.line("workspaces").bytes) / GIB
    weights = led.line("weights").bytes / GIB
    tokens = (led.kv_cache_blocks or 0) * engine.block_size
    print(f"== public vLLM 0.19.0 run, H100-80GB × 0.95, {run['name']} (llm-d-planner)")
    print(
        f"   torch peak  ledger {peak:.3f} GiB, logged {run['torch_peak_gib']} GiB{_pct(peak, run['torch_peak_gib'])}"
    )
    if model.is_moe or model.is_mla:
        print(f"   forward     {led.line('activations').bytes / GIB:.3f} GiB: {led.line('activations').formula}")
        print(
            f"   sampler     {led.line('workspaces').factors['sampler_peak_bytes'] / GIB:.3f} GiB with what it runs beside"
        )
    print(
        f"   weights     ledger {weights:.3f} GiB, logged {run['weights_gib']} GiB{_pct(weights, run['weights_gib'])}"
    )
    if run["tokens"] is not None:
        print(
            f"   KV          ledger {(led.kv_budget_bytes or 0) / GIB:.2f} GiB = {tokens:,} tokens, logged {run['kv_gib']} GiB = "
            f"{run['tokens']:,} tokens{_pct(tokens, run['tokens'])} (non-torch: ledger 0.25, logged {run['non_torch_gib']})"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    default = PRO6000_MEMORY.total_bytes if PRO6000_MEMORY is not None else None
    ap.add_argument("--pro6000-total-bytes", type=int, default=default)
    args = ap.parse_args()
    if not SIM.exists():
        raise SystemExit(f"shared data not present: {SIM}")
    for name, config, skip in RUNS:
        _report(name, config, skip, args.pro6000_total_bytes)
    for run in H100_RUNS:
        _report_h100(run)
    for run in VLLM_028_RUNS:
        _report_028(run)


if __name__ == "__main__":
    from docs_page import recorded  # why: run as a script, benchmarks/ is on sys.path

    with recorded(__file__):  # its figures into docs/benchmarks.md
        main()
