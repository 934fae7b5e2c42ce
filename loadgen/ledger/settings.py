"""Engine settings the ledger needs: precision, paging, parallelism, scheduler limits, LoRA, memory budget."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Any

from ..errors import LedgerError
from ..limits import is_finite
from .config import dtype_bytes

__all__ = ["EngineSettings", "LoraSettings", "QUANT_WEIGHT_BITS", "KV_CACHE_DTYPES", "GIB"]

GIB = 1 << 30
#: Largest memory budget the ledger accepts (1 PiB).
MAX_MEMORY_GIB = float(1 << 20)

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


@dataclass(frozen=True)
class LoraSettings:
    """LoRA adapters resident at once (vLLM ``--max-loras``), their max rank and target modules."""

    count: int = 0
    rank: int = 16
    targets: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj")


@dataclass(frozen=True)
class EngineSettings:
    """How the engine is configured; the KV budget is ``kv_cache_gib`` or ``device_memory_gib`` × utilization.

    Defaults follow vLLM's GPU defaults (block 16, 8192 batched tokens, 256 sequences).
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
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    concurrent_batches: int = 1
    lora: LoraSettings = field(default_factory=LoraSettings)
    kv_cache_gib: float | None = None
    device_memory_gib: float | None = None
    gpu_memory_utilization: float = 0.9
    device: str = "cuda"
    # Estimates for the non-KV lines (every one is printed with its factor):
    fragmentation_fraction: float = 0.05  # of activations + workspaces (caching allocator slack)
    graph_buffer_gib: float | None = None  # None: 0.5 GiB on cuda with graphs, 0 on cpu
    safety_margin_fraction: float = 0.05  # of the accounted total when the budget is kv_cache_gib

    def __post_init__(self) -> None:
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
        for name in ("kv_cache_gib", "device_memory_gib", "graph_buffer_gib"):
            value = getattr(self, name)
            if value is not None and (not is_finite(value) or not 0 < value <= MAX_MEMORY_GIB):
                raise LedgerError(
                    f"{name} = {value}: expected a positive finite number of GiB (at most {MAX_MEMORY_GIB})"
                )
        for name in ("fragmentation_fraction", "safety_margin_fraction"):
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

    def with_(self, **changes: Any) -> EngineSettings:
        return replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["lora"]["targets"] = list(self.lora.targets)
        return d
