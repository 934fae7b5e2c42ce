"""vLLM 0.19's GPU memory accounting: the non-KV lines its KV budget subtracts, derived, each with its assumption.

vLLM 0.19 (V1 GPU worker; read, not copied: vllm/v1/worker/gpu_worker.py ``init_device`` and
``determine_available_memory``, vllm/utils/mem_utils.py ``memory_profiling``) sizes the KV cache as

    available = total × gpu_memory_utilization − (weights + torch peak increase + non-torch increase)
                − CUDA graph estimate (applied only with VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=1)

- ``total`` is ``cudaMemGetInfo``'s total (what a run's meta.json records as device_total_memory_bytes).
- The baseline snapshot is taken after the CUDA context and NCCL exist, so neither is in any line:
  they sit in the (1 − utilization) share (the ledger's ``runtime`` line says so).
- ``weights`` is what the model holds after loading: parameters plus buffers. The one buffer of a
  dense decoder is the rotary cos/sin table, max_position_embeddings × rotary dim in the model dtype,
  shared by every layer (vLLM's get_rope cache); it is why vLLM logs Llama-3.1-8B at 14.9889 GiB
  (vllm-project/vllm#17122) where the parameters are 14.9571 GiB.
- ``torch peak increase`` is the allocator's allocated-bytes peak during ``profile_run`` over what was
  allocated before it: one forward of max_num_batched_tokens dummy tokens, then the sampler on the last
  token of min(max_num_seqs, max_num_batched_tokens) dummy requests. The ledger's ``activations`` line is
  the forward's peak; ``workspaces`` is what the sampler's peak adds above it, so the two sum to the peak.
- ``non-torch increase`` (device memory outside torch's allocator that appears between the snapshot and
  the end of profiling: kernel images loaded lazily, cuBLAS/cuBLASLt handles) cannot be derived from the
  config. It is an assumed per-device constant, NON_TORCH_INCREASE_GIB, with its source.
- The CUDA graph estimate (``profile_cudagraph_memory``, vllm-project/vllm#30515) is off by default in
  0.19; it became the default in v0.21.0. Its line is 0 unless ``graph_buffer_gib`` is given.
"""

from __future__ import annotations

from loadgen.util.errors import LedgerError

from .config import ModelConfig
from .settings import GIB, EngineSettings

__all__ = [
    "NON_TORCH_INCREASE_GIB",
    "SAMPLER_BYTES_PER_LOGIT",
    "rotary_buffer_bytes",
    "forward_peak_bytes",
    "sampler_peak_bytes",
    "sampler_rows",
    "non_torch_increase_gib",
    "non_torch_bytes",
]

#: Device memory outside torch's allocator that vLLM's profile sees appear (its ``non_torch_increase``), GiB
#: per device. ASSUMED, not derived: vLLM's own profile reported 0.11 GiB for two models of different size
#: on one A100 at TP 1 (ovg-project/kvcached#448, recent vLLM, enforce_eager), and a public H100 profile
#: of vLLM 0.11 (8 models) 0.13-0.14 GiB at TP 1. Taken as 0.11 for any model and TP degree (unmeasured at
#: TP > 1 in 0.19, whose NCCL buffers predate the snapshot). Not fitted to any run of ours.
NON_TORCH_INCREASE_GIB = 0.11

#: Bytes live per logit (rows × vocab) at the peak of vLLM V1's sampler under ``_dummy_sampler_run``'s
#: dummy parameters (temperature 0.5, top-k vocab − 1, top-p 0.9: the PyTorch top-k/top-p path), read from
#: vllm/v1/sample/sampler.py and ops/topk_topp_sampler.py: the lm_head's logits in the model dtype (2) and
#: their float32 copy (4), the ascending sort's values (4) and int64 indices (8), the top-p softmax (4, the
#: cumsum writes into it) and its mask (1), and the scatter back to vocabulary order (4). Sort scratch
#: space (cub) is not counted: an assumption, it is freed before the scatter.
SAMPLER_BYTES_PER_LOGIT = 2 + 4 + 4 + 8 + 4 + 1 + 4


def rotary_buffer_bytes(m: ModelConfig, weight_bytes: float) -> int:
    """The rotary cos/sin table vLLM keeps as a buffer: max_position_embeddings × rotary dim × dtype bytes.

    Assumes a full rotary dimension (head_dim; MLA: qk_rope_head_dim) and no rope-scaling extension of the
    table; one table for the model (vLLM shares it between layers).
    """
    rotary_dim = int(m.qk_rope_head_dim) if m.is_mla and m.qk_rope_head_dim else m.head_dim
    return int((m.max_position_embeddings or 0) * rotary_dim * weight_bytes)


def _mlp_width(m: ModelConfig) -> int:
    if not m.is_moe:
        return m.intermediate_size
    routed = int(m.num_experts_per_tok or 1) * int(m.moe_intermediate_size or 0)
    return max(m.intermediate_size, routed + int(m.shared_expert_intermediate_size or 0))


def forward_peak_bytes(m: ModelConfig, e: EngineSettings, act_bytes: float) -> tuple[int, str]:
    """(bytes, formula): the forward's live tensors at its largest point, the MLP of one layer.

    Live at once: the residual and the normed input (hidden each), the fused gate/up projection (2 × mlp /
    tp) and its activation (mlp / tp), for max_num_batched_tokens tokens. Attention's q/k/v and output are
    narrower for every supported model; an assumption that the compiled graph frees each layer's tensors.
    """
    T, h, tp = e.max_num_batched_tokens, m.hidden_size, e.tensor_parallel_size
    mlp = _mlp_width(m)
    width = 2 * h + (3 * mlp) // tp
    formula = (
        f"forward at max_num_batched_tokens {T}: (residual + normed input 2 × hidden {h} + gate/up and activation "
        f"3 × mlp {mlp} / tp {tp}) × {act_bytes:g} B"
    )
    return int(T * width * act_bytes), formula


def sampler_rows(e: EngineSettings) -> int:
    """Dummy requests in vLLM's profile run: min(max_num_seqs, max_num_batched_tokens)."""
    return min(e.max_num_seqs, e.max_num_batched_tokens)


def sampler_peak_bytes(m: ModelConfig, e: EngineSettings, act_bytes: float) -> tuple[int, str]:
    """(bytes, formula): the sampler's peak plus the forward's hidden states it runs beside.

    The sampler sees the whole vocabulary on every rank (the logits are gathered), so no / tp.
    """
    rows, V, T, h = sampler_rows(e), m.vocab_size, e.max_num_batched_tokens, m.hidden_size
    sampler = rows * V * SAMPLER_BYTES_PER_LOGIT
    held = int(T * h * act_bytes)
    formula = (
        f"sampler: rows min(max_num_seqs, max_num_batched_tokens) {rows} × vocab {V} × {SAMPLER_BYTES_PER_LOGIT} B "
        f"(logits 2 + fp32 4 + sort values 4 + int64 indices 8 + top-p probs 4 + mask 1 + scatter 4) "
        f"+ hidden states held {T} × {h} × {act_bytes:g} B"
    )
    return sampler + held, formula


def non_torch_increase_gib(e: EngineSettings) -> float:
    """The non-torch increase used: the engine's ``non_torch_gib`` when given, else NON_TORCH_INCREASE_GIB."""
    value = e.non_torch_gib if e.non_torch_gib is not None else NON_TORCH_INCREASE_GIB
    if value < 0:
        raise LedgerError(f"non_torch_gib = {value}: expected a non-negative number of GiB")
    return value


def non_torch_bytes(e: EngineSettings) -> int:
    return int(non_torch_increase_gib(e) * GIB)
