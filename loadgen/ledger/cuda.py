"""vLLM 0.19's GPU memory accounting: the non-KV lines its KV budget subtracts, derived, each with its assumption.

vLLM 0.19 (V1 GPU worker; read, not copied: vllm/v1/worker/gpu_worker.py ``init_device`` and
``determine_available_memory``, vllm/utils/mem_utils.py ``memory_profiling``) sizes the KV cache as

    available = total × gpu_memory_utilization − (weights + torch peak increase + non-torch increase)
                − CUDA graph estimate (applied only with VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=1)

- ``total`` is ``cudaMemGetInfo``'s total (what a run's meta.json records as device_total_memory_bytes).
- The baseline snapshot is taken after the CUDA context and NCCL's communicators exist, so the context is in no
  line: it sits in the (1 − utilization) share (the ledger's ``runtime`` line says so). What the communicators
  allocate on first use (TP > 1) appears in the non-torch increase.
- ``weights`` is what the model holds after loading: parameters plus buffers. The one buffer of a
  dense decoder is the rotary cos/sin table, max_position_embeddings × rotary dim in the model dtype,
  shared by every layer (vLLM's get_rope cache); it is why vLLM logs Llama-3.1-8B at 14.9889 GiB
  (vllm-project/vllm#17122) where the parameters are 14.9571 GiB.
- ``torch peak increase`` is the allocator's allocated-bytes peak during ``profile_run`` over what was
  allocated before it: one forward of max_num_batched_tokens dummy tokens, then the sampler on the last
  token of min(max_num_seqs, max_num_batched_tokens) dummy requests. The ledger's ``activations`` line is
  the forward's peak; ``workspaces`` is what the sampler's peak adds above it, so the two sum to the peak.
  For MoE models the fused-MoE workspace (Triton experts on CUDA, unquantized) is part of the forward's peak
  and, held by vLLM's WorkspaceManager, of the sampler's too; MLA models allocate a stand-in for the
  chunked-prefill up-projection in the profile run (ledger/cuda_moe.py says what was read).
  The sampler's path is 0.19's (vllm/v1/sample/ops/topk_topp_sampler.py ``apply_top_k_top_p``): with
  Triton (every CUDA build) and at least 8 rows, the fused Triton top-k/top-p kernel filters the float32
  logits in place with one cached scratch row per program; below 8 rows, the PyTorch sort path.
  The profile run's forward is also the process's first GEMM, so the workspace PyTorch gives cuBLAS (and
  cuBLASLt, for a biased linear layer) is allocated inside the window and stays for the sampler
  (``blas_workspace_bytes``).
- ``non-torch increase`` (device memory outside torch's allocator that appears between the snapshot and
  the end of profiling: kernel images loaded lazily, cuBLAS/cuBLASLt handles) cannot be derived from the
  config. It is a per-device constant measured by others on vLLM 0.19 (NON_TORCH_INCREASE_GIB at TP 1,
  NON_TORCH_INCREASE_TP_GIB at TP > 1 with the all-reduce fusion), with its source. At TP > 1, 0.19 builds its
  communicators (pynccl, symmetric memory, custom all-reduce) in ``init_worker_distributed_environment``, before
  ``init_device`` takes the snapshot, so they are outside the window. What appears inside it at TP > 1 comes
  with the FlashInfer all-reduce + RMSNorm fusion, built on the profile run's first compile: its workspace (three
  buffers, each rounded up to the multicast granularity) and the torch NCCL communicator its barrier brings up.
  0.19 enables that fusion only at TP > 1 on compute capability 9.0 or 10.x with flashinfer installed, DP 1,
  PP 1 (``config/vllm.py`` ``enable_allreduce_rms_fusion``). Without it the TP-1 figure is used; public H100
  logs at PP 2 and 4 (no fusion, communicators built) show 0.07 GiB. In 0.19, unless the engine runs eager,
  ``profile_cudagraph_memory`` (warm-up and capture of two graphs per CUDA graph mode) runs inside the
  measured window even though its estimate is not applied, so what that capture leaves outside torch's
  allocator is in this line too.
- The CUDA graph estimate (``profile_cudagraph_memory``, vllm-project/vllm#30515) is off by default in
  0.19; it became the default in v0.21.0. Its line is 0 unless ``graph_buffer_gib`` is given.
"""

from __future__ import annotations

from loadgen.util.errors import LedgerError

from .config import ModelConfig
from .cuda_moe import dense_mlp_bytes, forward_phases, moe_workspace_bytes
from .gpus import gpu_capability, gpu_sm_count
from .settings import GIB, EngineSettings

__all__ = [
    "NON_TORCH_INCREASE_GIB",
    "NON_TORCH_INCREASE_TP_GIB",
    "SAMPLER_TRITON_BYTES_PER_LOGIT",
    "SAMPLER_PYTORCH_BYTES_PER_LOGIT",
    "TRITON_SAMPLER_MIN_ROWS",
    "triton_buffer_rows",
    "rotary_buffer_bytes",
    "forward_peak_bytes",
    "sampler_peak_bytes",
    "sampler_rows",
    "non_torch_increase_gib",
    "non_torch_bytes",
    "non_torch_source",
    "allreduce_rms_fusion",
    "CUBLAS_WORKSPACE_BYTES_SM90",
    "CUBLAS_WORKSPACE_BYTES_DEFAULT",
    "CUBLASLT_WORKSPACE_BYTES",
    "blas_workspace_bytes",
]

#: Device memory outside torch's allocator that vLLM's profile sees appear (its ``non_torch_increase``), GiB
#: per device, at TP 1. MEASURED by others, not derived, not fitted to any run of ours: vLLM 0.19.0's own debug
#: line ("non-torch forward increase memory") on an H100-80GB with CUDA graphs on (0.19's default), published
#: with the raw logs in llm-d-incubation/llm-d-planner (accuracy/results/v0.19.0): Llama-3.1-8B-Instruct 0.25 GiB,
#: Qwen2.5-7B-Instruct 0.24; over that sweep's TP-1 runs 0.24-0.46 GiB (mean 0.27). Earlier vLLM, or eager
#: profiles, reported less (0.11-0.14 GiB: ovg-project/kvcached#448, an H100 profile of vLLM 0.11).
NON_TORCH_INCREASE_GIB = 0.25

#: The same at TP > 1 with vLLM 0.19's FlashInfer all-reduce + RMSNorm fusion on (``allreduce_rms_fusion``): the
#: same vLLM 0.19.0 H100 logs ("Enabled custom fusions: allreduce_rms"), Llama-3.1-8B-Instruct 2.07 GiB at TP 2
#: and 2.13 at TP 4 (Qwen2.5-7B-Instruct 2.06 and 2.13; Mistral-Small-24B w8a8 and gpt-oss-20b 2.07 at TP 2).
#: Measured on NVLink H100s. Its parts are not all derived: by our reading of flashinfer's source (not measured)
#: the fusion's workspace is 1.5 GiB there (3 buffers rounded up to a 512 MiB multicast granularity), leaving
#: 0.3-0.4 GiB for the NCCL communicator the fusion's barrier brings up.
NON_TORCH_INCREASE_TP_GIB = 2.07

#: PyTorch 2.10 (vLLM 0.19's; the RTX 4090 run's meta.json logs 2.10.0+cu128) gives each cuBLAS handle and
#: stream a workspace from its caching allocator on the handle's first GEMM, so it counts in allocated bytes
#: (aten/src/ATen/cuda/CublasHandlePool.cpp ``parseChosenWorkspaceSize``, ``setWorkspaceForHandle``; read, not
#: copied): 32 MiB on compute capability 9.0 (cuBLAS's recommendation for Hopper) and CUBLAS_WORKSPACE_CONFIG's
#: default ":4096:2:16:8" elsewhere, Blackwell included until PyTorch 2.11 (pytorch/pytorch#175344, 2026-02).
CUBLAS_WORKSPACE_BYTES_SM90 = 4096 * 1024 * 8
CUBLAS_WORKSPACE_BYTES_DEFAULT = 4096 * 1024 * 2 + 16 * 1024 * 8

#: cuBLASLt's own workspace in PyTorch 2.10 (CUBLASLT_WORKSPACE_SIZE's default, 1,024 KiB), allocated beside
#: cuBLAS's the first time a GEMM takes cuBLASLt: ``addmm`` with a bias vector (its epilogue), which a linear
#: layer with a bias (Qwen2's q/k/v) runs. The unified workspace that would share cuBLAS's is opt-in in 2.10.
CUBLASLT_WORKSPACE_BYTES = 1024 * 1024

#: vLLM 0.19 takes the fused Triton top-k/top-p kernel for a batch of at least this many rows
#: (vllm/v1/sample/ops/topk_topp_sampler.py ``apply_top_k_top_p``), the PyTorch sort path below it.
TRITON_SAMPLER_MIN_ROWS = 8

#: Bytes live per logit (rows × vocab) at the peak of vLLM 0.19's sampler under ``_dummy_sampler_run``'s dummy
#: parameters (temperature 0.5, top-k vocab − 1, top-p 0.9), Triton path, read from vllm/v1/sample/sampler.py
#: and ops/topk_topp_sampler.py: the lm_head's logits in the model dtype, held by the caller (2), their float32
#: copy, scaled and filtered in place (4), the softmax probabilities (4) and the exponential noise
#: ``random_sample`` divides them by, in place (4). The kernel's scratch rows are counted apart
#: (``triton_buffer_rows``).
SAMPLER_TRITON_BYTES_PER_LOGIT = 2 + 4 + 4 + 4

#: The same below TRITON_SAMPLER_MIN_ROWS rows (``apply_top_k_top_p_pytorch``), at its top-p step: logits (2),
#: float32 copy (4), the ascending sort's values (4) and int64 indices (8), the top-k mask (1), the top-p
#: softmax, which the cumsum overwrites (4), and the top-p mask (1). The scatter back is in place. Sort scratch
#: space (cub) is not counted: an assumption.
SAMPLER_PYTORCH_BYTES_PER_LOGIT = 2 + 4 + 4 + 8 + 1 + 4 + 1


def triton_buffer_rows(rows: int, sm_count: int) -> int:
    """Scratch rows the 0.19 Triton top-k/top-p kernel caches: min(next power of two of min(SMs, rows), SMs)."""
    programs = min(sm_count, rows)
    return min(1 << max(0, programs - 1).bit_length(), sm_count)


def rotary_buffer_bytes(m: ModelConfig, weight_bytes: float) -> int:
    """The rotary cos/sin table vLLM keeps as a buffer: max_position_embeddings × rotary dim × dtype bytes.

    Assumes a full rotary dimension (head_dim; MLA: qk_rope_head_dim) and no rope-scaling extension of the
    table; one table for the model (vLLM shares it between layers).
    """
    rotary_dim = int(m.qk_rope_head_dim) if m.is_mla and m.qk_rope_head_dim else m.head_dim
    return int((m.max_position_embeddings or 0) * rotary_dim * weight_bytes)


def forward_peak_bytes(m: ModelConfig, e: EngineSettings, act_bytes: float) -> tuple[int, str]:
    """(bytes, formula): the forward's live tensors at its largest point.

    A dense model without MLA: one MLP layer (``cuda_moe.dense_mlp_bytes``): the residual and the normed input
    (hidden each), the fused gate/up projection (2 × mlp / tp) and its activation (mlp / tp), for
    max_num_batched_tokens tokens; attention's q/k/v and output are narrower for every supported model. An MoE
    or MLA model: the largest of ``cuda_moe.forward_phases`` (the dense MLP layers, the MoE layer's shared and
    routed experts with the fused-MoE workspace, the MLA layer's profile-run up-projection). An assumption
    that the compiled graph frees each layer's tensors.
    """
    T, h, tp = e.max_num_batched_tokens, m.hidden_size, e.tensor_parallel_size
    if not m.is_moe and not m.is_mla:
        mlp = m.intermediate_size
        formula = (
            f"forward at max_num_batched_tokens {T}: (residual + normed input 2 × hidden {h} + gate/up and "
            f"activation 3 × mlp {mlp} / tp {tp}) × {act_bytes:g} B"
        )
        return dense_mlp_bytes(m, e, act_bytes), formula
    phases = forward_phases(m, e, act_bytes)
    peak = max(phases, key=lambda phase: phase.bytes)
    listed = "; ".join(f"{phase.formula} = {phase.bytes:,} B" for phase in phases)
    formula = f"forward at max_num_batched_tokens {T}, the largest of: {listed} → {peak.name}"
    return peak.bytes, formula


def sampler_rows(e: EngineSettings) -> int:
    """Dummy requests in vLLM's profile run: min(max_num_seqs, max_num_batched_tokens)."""
    return min(e.max_num_seqs, e.max_num_batched_tokens)


def sampler_peak_bytes(m: ModelConfig, e: EngineSettings, act_bytes: float) -> tuple[int, str]:
    """(bytes, formula): the sampler's peak plus the profile run's hidden states it runs beside.

    The sampler sees the whole vocabulary on every rank (the logits are gathered), so no / tp. Held beside
    it: the forward's hidden states (max_num_batched_tokens rows, kept by ``profile_run``), the last token's
    rows gathered from them and ``_dummy_sampler_run``'s random replacement of those (rows each), and for an
    MoE model the fused-MoE workspace, which vLLM's WorkspaceManager keeps after the forward
    (``cuda_moe.moe_workspace_bytes``).
    """
    rows, V, T, h = sampler_rows(e), m.vocab_size, e.max_num_batched_tokens, m.hidden_size
    workspace, workspace_formula = moe_workspace_bytes(m, e, act_bytes)
    held = int((T + 2 * rows) * h * act_bytes) + workspace
    hidden = f"+ hidden states held (max_num_batched_tokens {T} + 2 × rows {rows}) × {h} × {act_bytes:g} B"
    if workspace:
        hidden += f" + {workspace_formula}"
    if rows < TRITON_SAMPLER_MIN_ROWS:
        per = SAMPLER_PYTORCH_BYTES_PER_LOGIT
        formula = (
            f"sampler, PyTorch sort path (rows {rows} < {TRITON_SAMPLER_MIN_ROWS}): rows × vocab {V} × {per} B (logits 2 + "
            f"fp32 4 + sort values 4 + int64 indices 8 + top-k mask 1 + top-p probs 4 + top-p mask 1) {hidden}"
        )
        return rows * V * per + held, formula
    per = SAMPLER_TRITON_BYTES_PER_LOGIT
    sms, sm_source = gpu_sm_count(e.device_name)
    scratch = triton_buffer_rows(rows, sms)
    formula = (
        f"sampler, Triton top-k/top-p path: rows min(max_num_seqs, max_num_batched_tokens) {rows} × vocab {V} × "
        f"{per} B (logits 2 + fp32 4 + probs 4 + exponential noise 4) + scratch {scratch} rows × {V} × 4 B "
        f"({sm_source}) {hidden}"
    )
    return rows * V * per + scratch * V * 4 + held, formula


def blas_workspace_bytes(m: ModelConfig, e: EngineSettings) -> tuple[int, str]:
    """(bytes, formula): the GEMM libraries' workspaces the profile run's forward allocates and keeps.

    One cuBLAS handle on one stream runs the profile run's GEMMs (vLLM's MoE shared-experts stream is used
    only at 256 tokens or fewer, and the profile runs max_num_batched_tokens), so one workspace, sized by the
    GPU's compute capability; an unknown GPU is taken for an H100 (9.0), and the formula says so.
    """
    capability = gpu_capability(e.device_name)
    if capability is None:
        capability, named = (9, 0), f"{e.device_name or 'GPU not named'}: capability unknown, ASSUMED 9.0 (an H100's)"
    else:
        named = f"{e.device_name}: capability {capability[0]}.{capability[1]}"
    if capability == (9, 0):
        cublas, size = CUBLAS_WORKSPACE_BYTES_SM90, "32 MiB on 9.0"
    else:
        cublas, size = CUBLAS_WORKSPACE_BYTES_DEFAULT, "4096 KiB × 2 + 16 KiB × 8 off 9.0"
    formula = f"cuBLAS workspace {cublas:,} B (PyTorch 2.10: {size}; {named})"
    if not m.attention_bias:
        return cublas, formula
    return (
        cublas + CUBLASLT_WORKSPACE_BYTES,
        formula + f" + cuBLASLt workspace {CUBLASLT_WORKSPACE_BYTES:,} B (biased linear)",
    )


def allreduce_rms_fusion(e: EngineSettings) -> tuple[bool, str]:
    """Whether vLLM 0.19 runs its FlashInfer all-reduce + RMSNorm fusion for ``e``, and why: given, else 0.19's
    default (``enable_allreduce_rms_fusion``: TP > 1 on compute capability 9.0 or 10.x; flashinfer installed,
    as in vLLM's release images, and DP 1, PP 1 assumed)."""
    if e.tensor_parallel_size <= 1:
        return False, "TP 1"
    if e.allreduce_rms_fusion is not None:
        return e.allreduce_rms_fusion, f"{'on' if e.allreduce_rms_fusion else 'off'} (given)"
    capability = gpu_capability(e.device_name)
    if capability is None:
        return True, f"on: {e.device_name or 'GPU not named'}, capability unknown, ASSUMED an H100's (9.0)"
    major, minor = capability
    if (major, minor) == (9, 0) or major == 10:
        return True, f"on: {e.device_name}, capability {major}.{minor} (vLLM 0.19 enables it on 9.0 and 10.x)"
    return False, f"off: {e.device_name}, capability {major}.{minor} (vLLM 0.19 enables it on 9.0 and 10.x only)"


def non_torch_increase_gib(e: EngineSettings) -> float:
    """The non-torch increase used: the engine's ``non_torch_gib`` when given, else the measured default:
    NON_TORCH_INCREASE_TP_GIB at TP > 1 with the all-reduce fusion on, NON_TORCH_INCREASE_GIB otherwise."""
    if e.non_torch_gib is not None:
        value = e.non_torch_gib
    else:
        value = NON_TORCH_INCREASE_TP_GIB if allreduce_rms_fusion(e)[0] else NON_TORCH_INCREASE_GIB
    if value < 0:
        raise LedgerError(f"non_torch_gib = {value}: expected a non-negative number of GiB")
    return value


def non_torch_bytes(e: EngineSettings) -> int:
    return int(non_torch_increase_gib(e) * GIB)


def non_torch_source(e: EngineSettings) -> str:
    """Where the non-torch increase comes from, as the ledger line states it."""
    if e.non_torch_gib is not None:
        return "given"
    fusion, why = allreduce_rms_fusion(e)
    if e.tensor_parallel_size <= 1:
        return "vLLM 0.19.0's own figure on an H100 at TP 1, llm-d-planner's published logs"
    if fusion:
        return f"vLLM 0.19.0's own figure on H100s at TP > 1 with the all-reduce fusion, llm-d-planner's logs; fusion {why}"
    return (
        f"the TP-1 figure (vLLM 0.19.0 on an H100, llm-d-planner's logs): all-reduce fusion {why}, and the "
        "communicators are built before vLLM's snapshot"
    )
