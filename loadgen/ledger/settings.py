"""Engine settings the ledger needs: precision, paging, parallelism, scheduler limits, LoRA, memory budget."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Any

from loadgen.util.errors import LedgerError
from loadgen.util.limits import MAX_MEMORY_GIB, is_finite

from .config import dtype_bytes

__all__ = [
    "EngineSettings",
    "LoraSettings",
    "QUANT_WEIGHT_BITS",
    "KV_CACHE_DTYPES",
    "GIB",
    "USAGE_CONTEXTS",
    "vllm_batch_defaults",
]

GIB = 1 << 30

#: Bits per weight element of linear layers for each quantization, and the group size of its scales.
QUANT_WEIGHT_BITS: dict[str, tuple[float, int | None]] = {
    "none": (0, None),  # 0 = use the weight dtype
    "fp8": (8, None),  # per-tensor/per-channel scales: negligible
    "int8": (8, None),
    "int4": (4, 128),
    "awq": (4, 128),
    "gptq": (4, 128),
}

KV_CACHE_DTYPES = (
    "auto",
    "bf16",
    "bfloat16",
    "fp16",
    "float16",
    "half",
    "fp8",
    "fp8_e4m3",
    "fp8_e5m2",
    "float32",
    "fp32",
)


#: vLLM's usage contexts that choose scheduler defaults: the OpenAI API server (``vllm serve``) or the LLM class.
USAGE_CONTEXTS = ("api_server", "llm_class")


def vllm_batch_defaults(
    device: str,
    usage_context: str = "api_server",
    world_size: int = 1,
    device_memory_gib: float | None = None,
    device_name: str = "",
    max_model_len: int | None = None,
    *,
    max_num_seqs: int | None = None,
    max_num_batched_tokens: int | None = None,
    tier_160_gib: bool = True,
) -> tuple[int, int]:
    """(max_num_batched_tokens, max_num_seqs) vLLM ends up with; None for either = vLLM's default.

    vLLM 0.32's rule (read, not copied: vllm/engine/arg_utils.py ``EngineArgs.get_batch_defaults`` and
    ``_set_default_max_num_seqs_and_batched_tokens_args``), defaults for the API server / the LLM class:
    - CPU: 2048 × world / 4096 × world tokens, 128 × world / 256 × world sequences;
    - GPU with ≥ 160 GiB: 16384 / 16384 tokens, 1024 sequences (``tier_160_gib``; vLLM 0.19 has no such tier,
      it came with vllm-project/vllm#51726, so a 0.19 engine passes False and such a GPU takes the next);
    - GPU with ≥ 70 GiB, not an A100: 8192 / 16384 tokens, 1024 sequences;
    - other GPUs (and an unknown device memory): 2048 / 8192 tokens, 256 sequences.
    Then, with chunked prefill on (vLLM v1's default): a defaulted token budget becomes
    min(max_num_seqs × max_model_len, budget), and defaulted sequences min(sequences, token budget).
    """
    api = usage_context == "api_server"
    if device == "cpu":
        tokens, seqs = (2048 if api else 4096) * world_size, (128 if api else 256) * world_size
    elif tier_160_gib and device_memory_gib is not None and device_memory_gib >= 160:
        tokens, seqs = 16384, 1024
    elif device_memory_gib is not None and device_memory_gib >= 70 and "a100" not in device_name.lower():
        tokens, seqs = (8192 if api else 16384), 1024
    else:
        tokens, seqs = (2048 if api else 8192), 256
    seqs = max_num_seqs if max_num_seqs is not None else seqs
    if max_num_batched_tokens is not None:
        tokens = max_num_batched_tokens
    elif max_model_len:
        tokens = min(seqs * max_model_len, tokens)
    if max_num_seqs is None:
        seqs = min(seqs, tokens)
    return tokens, seqs


@dataclass(frozen=True)
class LoraSettings:
    """LoRA adapters resident at once (vLLM ``--max-loras``), their max rank and target modules."""

    count: int = 0
    rank: int = 16
    targets: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj")


@dataclass(frozen=True)
class EngineSettings:
    """How the engine is configured; the KV budget is ``kv_cache_gib`` or ``device_memory_gib`` × utilization.

    ``max_num_seqs`` and ``max_num_batched_tokens`` left at None take vLLM's defaults for ``device``,
    ``usage_context``, world size and device memory (``vllm_batch_defaults``); ``with_`` re-derives them
    when those inputs change. Block size defaults to 16 (vLLM's GPU default).
    ``device`` is "cuda" or "cpu" (CPU builds default to block 128 in vLLM; pass it explicitly).
    ``concurrent_batches`` is vLLM's ``max_concurrent_batches`` (2 with async scheduling on GPU, 1 on CPU):
    sliding-window layers must hold that many in-flight batches of tokens beyond the window.
    """

    dtype: str = "auto"  # weight dtype; auto = the config's torch_dtype
    quantization: str = "none"
    kv_cache_dtype: str = "auto"
    block_size: int = 16
    tensor_parallel_size: int = 1
    max_model_len: int | None = None  # None = the config's max_position_embeddings
    max_num_seqs: int = None  # type: ignore[assignment]  # None = vLLM's default (resolved in __post_init__)
    max_num_batched_tokens: int = None  # type: ignore[assignment]
    concurrent_batches: int = 1
    lora: LoraSettings = field(default_factory=LoraSettings)
    kv_cache_gib: float | None = None
    device_memory_gib: float | None = None
    gpu_memory_utilization: float = 0.9
    device: str = "cuda"
    usage_context: str = "api_server"
    device_name: str = ""  # the GPU's name (vLLM's defaults treat an A100 apart)
    # Estimates for the non-KV lines (every one is printed with its factor):
    # of activations + workspaces (caching allocator slack). None: 0 on cuda (vLLM 0.19's budget counts
    # allocated bytes after empty_cache, so slack is outside it), 0.05 on cpu
    fragmentation_fraction: float | None = None
    # the CUDA graph pool the KV budget subtracts. None: 0 (vLLM 0.19 does not apply its estimate unless
    # VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=1; the default from v0.21.0): give it for those versions
    graph_buffer_gib: float | None = None
    # cuda: device memory outside torch's allocator that vLLM's profile sees appear, GiB per device.
    # None: ledger.cuda.NON_TORCH_INCREASE_GIB / _TP_GIB (measured by others on vLLM 0.19; sources there)
    non_torch_gib: float | None = None
    # cuda, TP > 1: whether vLLM 0.19 runs its FlashInfer all-reduce + RMSNorm fusion, which is what brings the
    # communication buffers into the measured window. None: vLLM 0.19's default for the GPU (ledger.cuda)
    allreduce_rms_fusion: bool | None = None
    safety_margin_fraction: float = 0.05  # of the accounted total when the budget is kv_cache_gib
    # The runtime: interpreters, torch and the engine's processes (RSS on CPU). None: the measured default
    # for the CPU build (compute.CPU_RUNTIME_GIB), not estimated on cuda; `loadgen vllm run` measures it.
    runtime_gib: float | None = None
    #: Which of max_num_seqs / max_num_batched_tokens took vLLM's default (set by __post_init__).
    defaulted: tuple[str, ...] = field(default=(), compare=False)

    def __post_init__(self) -> None:
        self._resolve_batch_defaults()
        if self.block_size <= 0:
            raise LedgerError(f"block_size = {self.block_size}: expected a positive integer")
        if self.tensor_parallel_size <= 0:
            raise LedgerError(f"tensor_parallel_size = {self.tensor_parallel_size}: expected a positive integer")
        if self.quantization not in QUANT_WEIGHT_BITS:
            raise LedgerError(f"quantization = {self.quantization!r}: expected one of {', '.join(QUANT_WEIGHT_BITS)}")
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise LedgerError(f"kv_cache_dtype = {self.kv_cache_dtype!r}: expected one of auto, bf16, fp16, fp8")
        if self.dtype != "auto":
            dtype_bytes(self.dtype, "dtype")
        if self.runtime_gib is not None and (not is_finite(self.runtime_gib) or not 0 <= self.runtime_gib <= 1024):
            raise LedgerError(f"runtime_gib = {self.runtime_gib}: expected a finite number of GiB in [0, 1024]")
        for name in ("kv_cache_gib", "device_memory_gib", "graph_buffer_gib"):
            value = getattr(self, name)
            if value is not None and (not is_finite(value) or not 0 < value <= MAX_MEMORY_GIB):
                raise LedgerError(
                    f"{name} = {value}: expected a positive finite number of GiB (at most {MAX_MEMORY_GIB})"
                )
        if self.non_torch_gib is not None and (
            not is_finite(self.non_torch_gib) or not 0 <= self.non_torch_gib <= 1024
        ):
            raise LedgerError(f"non_torch_gib = {self.non_torch_gib}: expected a finite number of GiB in [0, 1024]")
        for name in ("fragmentation_fraction", "safety_margin_fraction"):
            if getattr(self, name) is None:
                continue
            if not is_finite(getattr(self, name)) or not 0 <= getattr(self, name) < 1:
                raise LedgerError(f"{name} = {getattr(self, name)}: expected a number in [0, 1)")
        if not is_finite(self.gpu_memory_utilization) or not 0 < self.gpu_memory_utilization <= 1:
            raise LedgerError(f"gpu_memory_utilization = {self.gpu_memory_utilization}: expected a number in (0, 1]")
        for name in ("max_num_seqs", "max_num_batched_tokens", "concurrent_batches"):
            if getattr(self, name) <= 0:
                raise LedgerError(f"{name} = {getattr(self, name)}: expected a positive integer")
        if self.max_model_len is not None and self.max_model_len <= 0:
            raise LedgerError(f"max_model_len = {self.max_model_len}: expected a positive integer")
        if self.device not in ("cuda", "cpu"):
            raise LedgerError(f"device = {self.device!r}: expected 'cuda' or 'cpu'")

    def _resolve_batch_defaults(self) -> None:
        missing = tuple(n for n in ("max_num_batched_tokens", "max_num_seqs") if getattr(self, n) is None)
        if not missing:
            return
        if self.usage_context not in USAGE_CONTEXTS:
            raise LedgerError(f"usage_context = {self.usage_context!r}: expected one of {', '.join(USAGE_CONTEXTS)}")
        tokens, seqs = vllm_batch_defaults(
            self.device,
            self.usage_context,
            self.tensor_parallel_size,
            self.device_memory_gib,
            self.device_name,
            self.max_model_len,
            max_num_seqs=self.max_num_seqs,
            max_num_batched_tokens=self.max_num_batched_tokens,
        )
        for name, value in (("max_num_batched_tokens", tokens), ("max_num_seqs", seqs)):
            if name in missing:
                object.__setattr__(self, name, value)
        object.__setattr__(self, "defaulted", missing)

    @property
    def fragmentation(self) -> float:
        """The fragmentation fraction in use: the setting, else 0 on cuda (vLLM's accounting) and 0.05 on cpu."""
        if self.fragmentation_fraction is not None:
            return self.fragmentation_fraction
        return 0.0 if self.device == "cuda" else 0.05

    def with_(self, **changes: Any) -> EngineSettings:
        """A copy with ``changes``; scheduler limits that were vLLM's defaults are re-derived for the new settings."""
        again: dict[str, Any] = {name: None for name in self.defaulted if name not in changes}
        return replace(self, **again, **changes, defaulted=())

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["lora"]["targets"] = list(self.lora.targets)
        d["defaulted"] = list(self.defaulted)
        return d
