"""vLLM 0.19's forward peak during ``profile_run`` for MoE and MLA models (CUDA, unquantized weights).

Read, not copied, from the vLLM 0.19.0 wheel (paths under vllm/):

- ``model_executor/layers/fused_moe/oracle/unquantized.py`` ``select_unquantized_moe_backend``: on CUDA the
  unquantized experts are Triton's unless VLLM_USE_FLASHINFER_MOE_FP16 is set (off by default), whatever the
  GPU; an H100 log of 0.19.0 says so ("Using TRITON backend for Unquantized MoE"). ``make_unquantized_moe_kernel``
  wraps ``TritonExperts`` in a ``FusedMoEKernel`` with ``MoEPrepareAndFinalizeNoDPEPModular``.
- ``fused_moe/modular_kernel.py`` ``FusedMoEKernel._allocate_buffers``: one chunk of all M tokens (0.19 has no
  VLLM_FUSED_MOE_CHUNK_SIZE; VLLM_MOE_DP_CHUNK_SIZE chunks only the DP/EP all-to-all kernels). The buffers come
  from ``current_workspace_manager().get_simultaneous`` (``v1/worker/workspace.py``): one uint8 tensor, each
  part rounded up to 256 B, allocated at the first MoE layer, grown but never freed, so it is still held when
  the sampler runs after the forward. Its parts, from ``fused_moe.py`` ``TritonExperts.workspace_shapes`` with
  N = 2 × moe_intermediate / tp (w1's gate and up rows on this rank), K = hidden:
  workspace13 = max(M × topk × max(N / 2, K), M × K) (the fused output shares it) and
  workspace2 = M × topk × max(N, K), in the activation dtype. ``TritonExperts.apply`` carves the three
  intermediate caches out of these two, so they add nothing beyond them.
- ``FusedMoEKernel.apply``: ``disable_inplace()`` is true from torch 2.9 (0.19 ships torch 2.10), so the
  output is a new M × hidden tensor.
- The router: the gate's logits, M × experts in the model dtype (``DeepseekV2MoE`` sets bf16 unless a
  monolithic DeepSeek-V3 kernel runs); ``router/fused_topk_router.py`` ``fused_topk``: topk_weights float32 and
  topk_ids int32 (its token_expert_indices are dropped by the router). The grouped top-k path's M × experts
  float32 temporaries (DeepSeek-V2) are freed before the experts run and are not counted.
- ``fused_moe/moe_align_block_size.py``: sorted_ids int32 of M × topk + experts × (BLOCK_SIZE_M − 1), expert_ids
  int32 of that over BLOCK_SIZE_M, one int32 count. BLOCK_SIZE_M is 128 in ``get_default_config`` above 512
  tokens; a tuned config file may pick another (a difference of at most experts × 128 × 4 B).
- ``fused_moe/runner/default_moe_runner.py`` ``forward_impl``: above VLLM_SHARED_EXPERTS_STREAM_TOKEN_THRESHOLD
  (256) tokens the shared experts run first on the main stream; their output (M × hidden) is held while the
  routed experts run.
- ``model_executor/layers/attention/mla_attention.py``: with no attention metadata (``profile_run``'s
  ``_dummy_run`` builds none) each MLA layer allocates chunked_prefill_workspace_size × heads / tp ×
  (qk_nope_head_dim + v_head_dim) in the model dtype, to stand for ``_compute_prefill_context``'s up-projection;
  ``determine_chunked_prefill_workspace_size`` sets that size to max(min(max(8 × max_model_len,
  4 × max_num_seqs × block_size), 65,536), max_num_seqs × block_size).

Each phase's live set is an assumption in the same spirit as the dense MLP's: the compiled graph frees a layer's
tensors once used; the residual stream and the layer's normed input are held through its MLP. Not modelled:
expert parallelism (experts sharded across ranks: the ledger has no such setting), DP chunking, and the kernels of
quantized or FlashInfer experts (Marlin, CUTLASS, TRT-LLM), whose workspaces are taken to be Triton's.
"""

from __future__ import annotations

from dataclasses import dataclass

from .config import ModelConfig
from .settings import EngineSettings

__all__ = [
    "MOE_BLOCK_SIZE_M",
    "MLA_PREFILL_WORKSPACE_MAX_TOKENS",
    "TOPK_BYTES_PER_CHOICE",
    "ForwardPhase",
    "dense_mlp_bytes",
    "max_model_len_of",
    "moe_workspace_bytes",
    "mla_prefill_workspace_tokens",
    "forward_phases",
]

#: BLOCK_SIZE_M of 0.19's default bf16 fused-MoE config above 512 tokens (``fused_moe.py`` ``get_default_config``).
MOE_BLOCK_SIZE_M = 128
#: The cap on MLA's chunked-prefill workspace, tokens (``determine_chunked_prefill_workspace_size``).
MLA_PREFILL_WORKSPACE_MAX_TOKENS = 64 * 1024
#: Router output per (token, chosen expert): topk_weights float32 (4) + topk_ids int32 (4).
TOPK_BYTES_PER_CHOICE = 4 + 4
#: int32 index bytes (moe_align_block_size's sorted_ids and expert_ids).
INDEX_BYTES = 4
#: The WorkspaceManager's alignment of each part of its buffer, bytes.
WORKSPACE_ALIGN_BYTES = 256


@dataclass(frozen=True)
class ForwardPhase:
    """One candidate for the forward's peak: its bytes and how they were counted."""

    name: str
    bytes: int
    formula: str


def max_model_len_of(m: ModelConfig, e: EngineSettings) -> int:
    """The context length the engine runs at: ``max_model_len``, else the config's max_position_embeddings."""
    return int(e.max_model_len or m.max_position_embeddings or 0)


def _round_up(n: int, to: int) -> int:
    return -(-n // to) * to


def _routed_width(m: ModelConfig, e: EngineSettings) -> tuple[int, int]:
    """(experts per token, one expert's intermediate width on this rank: moe_intermediate / tp)."""
    topk = int(m.num_experts_per_tok or 1)
    return topk, int(m.moe_intermediate_size or m.intermediate_size) // e.tensor_parallel_size


def moe_workspace_bytes(m: ModelConfig, e: EngineSettings, act_bytes: float) -> tuple[int, str]:
    """(bytes, formula): the fused-MoE workspace vLLM 0.19 keeps from the first MoE layer on; 0 for a dense model."""
    if not m.is_moe:
        return 0, "no MoE layers"
    T, K = e.max_num_batched_tokens, m.hidden_size
    topk, inter = _routed_width(m, e)
    ws13 = _round_up(int(max(T * topk * max(inter, K), T * K) * act_bytes), WORKSPACE_ALIGN_BYTES)
    ws2 = _round_up(int(T * topk * max(2 * inter, K) * act_bytes), WORKSPACE_ALIGN_BYTES)
    formula = (
        f"fused-MoE workspace (Triton experts, kept by vLLM's WorkspaceManager): max(tokens {T} × topk {topk} × "
        f"max(moe_intermediate/tp {inter}, hidden {K}), tokens × hidden) × {act_bytes:g} B + tokens × topk × "
        f"max(2 × {inter}, {K}) × {act_bytes:g} B = {ws13 + ws2:,} B"
    )
    return ws13 + ws2, formula


def _sorted_ids_bytes(m: ModelConfig, e: EngineSettings) -> int:
    """moe_align_block_size's sorted_ids, expert_ids and count, int32."""
    topk, _ = _routed_width(m, e)
    padded = e.max_num_batched_tokens * topk + int(m.num_experts or 0) * (MOE_BLOCK_SIZE_M - 1)
    return (padded + -(-padded // MOE_BLOCK_SIZE_M) + 1) * INDEX_BYTES


def _first_moe_layer(m: ModelConfig) -> int:
    return min(m.moe_layers) if m.moe_layers else m.num_layers


def dense_mlp_bytes(m: ModelConfig, e: EngineSettings, act_bytes: float) -> int:
    """A dense MLP layer's live tensors: residual and normed input (hidden each), the fused gate/up projection
    (2 × intermediate / tp) and its activation (intermediate / tp), for max_num_batched_tokens tokens."""
    T, h, tp = e.max_num_batched_tokens, m.hidden_size, e.tensor_parallel_size
    return int(T * (2 * h + (3 * m.intermediate_size) // tp) * act_bytes)


def _dense_mlp_phase(m: ModelConfig, e: EngineSettings, act_bytes: float, workspace: int) -> ForwardPhase | None:
    """The dense MLP layers (all of a dense model's; DeepSeek's first_k_dense_replace); the MoE workspace counts
    only when a dense layer follows the first MoE layer."""
    dense = [i for i in range(m.num_layers) if i not in set(m.moe_layers)]
    if not dense:
        return None
    T, h, tp, inter = e.max_num_batched_tokens, m.hidden_size, e.tensor_parallel_size, m.intermediate_size
    held = workspace if max(dense) > _first_moe_layer(m) else 0
    formula = (
        f"dense MLP layer: tokens {T} × (2 × hidden {h} + 3 × intermediate {inter} / tp {tp}) × {act_bytes:g} B"
        + (f" + workspace {held:,} B" if held else "")
    )
    return ForwardPhase("dense MLP", dense_mlp_bytes(m, e, act_bytes) + held, formula)


def _moe_phases(m: ModelConfig, e: EngineSettings, act_bytes: float, workspace: int) -> list[ForwardPhase]:
    """The MoE layer at its two largest points: the shared experts' MLP (run first), then the routed experts."""
    T, h, tp, E = e.max_num_batched_tokens, m.hidden_size, e.tensor_parallel_size, int(m.num_experts or 0)
    topk, _ = _routed_width(m, e)
    base = int(T * (2 * h + E) * act_bytes)  # residual + normed input + router logits
    base_text = f"tokens {T} × (residual + normed input 2 × hidden {h} + router logits {E}) × {act_bytes:g} B"
    shared = int(m.shared_expert_intermediate_size or 0) // tp
    routed_held = int(T * (1 + (1 if shared else 0)) * h * act_bytes)
    routed = base + routed_held + T * topk * TOPK_BYTES_PER_CHOICE + _sorted_ids_bytes(m, e) + workspace
    routed_text = (
        f"MoE routed experts: {base_text} + output{' and shared output' if shared else ''} "
        f"{routed_held:,} B + top-k weights/ids tokens × topk {topk} × {TOPK_BYTES_PER_CHOICE} B + sorted ids "
        f"(tokens × topk + experts {E} × {MOE_BLOCK_SIZE_M - 1}) × {INDEX_BYTES} B + workspace {workspace:,} B"
    )
    phases = [ForwardPhase("MoE routed experts", routed, routed_text)]
    if shared:
        held = workspace if len(m.moe_layers) > 1 else 0  # from the second MoE layer on
        total = base + int(T * 3 * shared * act_bytes) + held
        text = (
            f"MoE shared experts: {base_text} + gate/up and activation tokens × 3 × shared {shared} × "
            f"{act_bytes:g} B" + (f" + workspace {held:,} B" if held else "")
        )
        phases.append(ForwardPhase("MoE shared experts", total, text))
    return phases


def mla_prefill_workspace_tokens(m: ModelConfig, e: EngineSettings) -> int:
    """MLA's chunked_prefill_workspace_size, tokens (``determine_chunked_prefill_workspace_size``)."""
    per_request = e.max_num_seqs * e.block_size
    wanted = min(max(8 * max_model_len_of(m, e), 4 * per_request), MLA_PREFILL_WORKSPACE_MAX_TOKENS)
    return max(wanted, per_request)


def _mla_phase(m: ModelConfig, e: EngineSettings, act_bytes: float, workspace: int) -> ForwardPhase:
    """An MLA layer in the profile run: its inputs and output, and the up-projection it simulates."""
    T, h, tp = e.max_num_batched_tokens, m.hidden_size, e.tensor_parallel_size
    heads = m.num_attention_heads // tp
    nope, rope = int(m.qk_nope_head_dim or 0), int(m.qk_rope_head_dim or 0)
    v_head, latent = int(m.v_head_dim or 0), int(m.kv_lora_rank or 0)
    chunk = mla_prefill_workspace_tokens(m, e)
    live = int(T * (h + heads * (nope + rope) + latent + rope + heads * v_head) * act_bytes)
    simulated = int(chunk * heads * (nope + v_head) * act_bytes)
    held = workspace if m.is_moe and _first_moe_layer(m) < m.num_layers - 1 else 0
    formula = (
        f"MLA layer in profile_run: tokens {T} × (residual {h} + q {heads} × {nope + rope} + latent {latent} + "
        f"k_pe {rope} + output {heads} × {v_head}) × {act_bytes:g} B + simulated prefill-context up-projection "
        f"{chunk} tokens × {heads} heads × {nope + v_head} × {act_bytes:g} B"
        + (f" + workspace {held:,} B" if held else "")
    )
    return ForwardPhase("MLA attention", live + simulated + held, formula)


def forward_phases(m: ModelConfig, e: EngineSettings, act_bytes: float) -> list[ForwardPhase]:
    """The candidates for the forward's peak (the largest is the peak): the dense MLP layers, the MoE layer's two
    points, the MLA layer in the profile run, each with what is held beside it."""
    workspace, _ = moe_workspace_bytes(m, e, act_bytes)
    dense = _dense_mlp_phase(m, e, act_bytes, workspace)
    phases = [dense] if dense else []
    if m.is_moe:
        phases.extend(_moe_phases(m, e, act_bytes, workspace))
    if m.is_mla:
        phases.append(_mla_phase(m, e, act_bytes, workspace))
    return phases
