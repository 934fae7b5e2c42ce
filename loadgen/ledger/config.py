"""Reading a Hugging Face ``config.json`` into the few numbers the memory ledger needs.

Covers Llama/Qwen2/Mistral-style GQA and MQA, sliding-window layers (Mistral's model-wide
``sliding_window``, Qwen2's ``use_sliding_window`` + ``max_window_layers``, explicit ``layer_types``,
Gemma-2/3 alternation), DeepSeek-style MLA (``kv_lora_rank`` + ``qk_rope_head_dim``) and MoE
parameter counts. Anything missing or malformed is one LedgerError line: file, field, value, expected.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from loadgen.util.errors import LedgerError, LoadgenError
from loadgen.util.jsonfile import read_json_object

__all__ = [
    "DTYPE_BYTES",
    "MODEL_CONFIG_WHAT",
    "ModelConfig",
    "dtype_bytes",
    "config_int",
    "model_config_file",
    "parse_model_config",
    "read_model_config",
    "read_model_config_json",
]

#: Bytes per element for the dtypes the ledger understands (names as HF/vLLM spell them).
DTYPE_BYTES: dict[str, float] = {
    "float32": 4,
    "fp32": 4,
    "float": 4,
    "bfloat16": 2,
    "bf16": 2,
    "float16": 2,
    "fp16": 2,
    "half": 2,
    "fp8": 1,
    "fp8_e4m3": 1,
    "fp8_e5m2": 1,
    "float8_e4m3fn": 1,
    "float8": 1,
    "int8": 1,
    "int4": 0.5,
}


def dtype_bytes(name: str, where: str = "dtype") -> float:
    """Bytes per element of a dtype name; LedgerError on an unknown name."""
    key = str(name).lower().replace("torch.", "")
    if key not in DTYPE_BYTES:
        raise LedgerError(f"{where} = {name!r}: expected one of {', '.join(sorted(DTYPE_BYTES))}")
    return DTYPE_BYTES[key]


@dataclass(frozen=True)
class ModelConfig:
    """The architecture facts the ledger uses; ``layer_kinds[i]`` is "full" or "sliding" per layer."""

    source: str
    architecture: str
    model_type: str
    hidden_size: int
    num_layers: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    intermediate_size: int
    tie_word_embeddings: bool
    torch_dtype: str
    max_position_embeddings: int | None
    attention_bias: bool
    sliding_window: int | None
    layer_kinds: tuple[str, ...]
    # MLA (DeepSeek-V2/V3): one latent of kv_lora_rank + qk_rope_head_dim per token per layer
    kv_lora_rank: int | None = None
    qk_rope_head_dim: int | None = None
    qk_nope_head_dim: int | None = None
    v_head_dim: int | None = None
    q_lora_rank: int | None = None
    # MoE
    num_experts: int | None = None
    num_experts_per_tok: int | None = None
    moe_intermediate_size: int | None = None
    shared_expert_intermediate_size: int | None = None  # total width of shared experts
    moe_layers: tuple[int, ...] = field(default_factory=tuple)  # indices of MoE layers
    shared_expert_gate: bool = False
    # quantization_config: the ledger's name for how the weights are stored (a QUANT_WEIGHT_BITS key), or
    # None; ``quantization_method`` is the config's own quant_method (kept when the ledger cannot cost it)
    quantization: str | None = None
    quantization_method: str | None = None

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank is not None

    @property
    def is_moe(self) -> bool:
        return bool(self.num_experts) and bool(self.moe_layers)

    @property
    def kv_head_dim(self) -> int:
        """Elements stored per KV head per token for K (and again for V unless MLA)."""
        if self.kv_lora_rank is not None:  # is_mla
            return int(self.kv_lora_rank) + int(self.qk_rope_head_dim or 0)
        return self.head_dim

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["layer_kinds"] = list(self.layer_kinds)
        d["moe_layers"] = list(self.moe_layers)
        return d


#: Largest integer any config.json field may hold (no real model has a dimension near 2^31).
MAX_CONFIG_INT = (1 << 31) - 1
#: Largest layer count (the deepest published models have a few hundred).
MAX_LAYERS = 65536


def config_int(
    cfg: dict[str, Any], src: str, name: str, *, required: bool = True, default: Any = None, positive: bool = True
) -> Any:
    """Field ``name`` of config ``cfg`` (from file ``src``) as an integer within the ledger's bound; missing,
    a boolean, a float, a string or out of range is one LedgerError line naming file, field and value."""
    value = cfg.get(name, default)
    if value is None:
        if required:
            raise LedgerError(f"{src}: {name}: missing; expected a positive integer")
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise LedgerError(f"{src}: {name} = {value!r}: expected an integer")
    if positive and value <= 0:
        raise LedgerError(f"{src}: {name} = {value!r}: expected a positive integer")
    if not -MAX_CONFIG_INT <= value <= MAX_CONFIG_INT:
        raise LedgerError(f"{src}: {name} = {value!r}: expected at most {MAX_CONFIG_INT}")
    return value


def _int_list(cfg: dict[str, Any], src: str, name: str) -> list[int]:
    value = cfg.get(name) or []
    if not isinstance(value, list) or any(isinstance(v, bool) or not isinstance(v, int) for v in value):
        raise LedgerError(f"{src}: {name} = {value!r}: expected a list of integers")
    return value


def _layer_kinds(
    cfg: dict[str, Any], src: str, model_type: str, num_layers: int, sliding_window: int | None
) -> tuple[str, ...]:
    """Which layers use sliding-window attention, mirroring how HF configs (and vLLM) decide."""
    layer_types = cfg.get("layer_types")
    if layer_types is not None:
        if not isinstance(layer_types, list) or len(layer_types) != num_layers:
            raise LedgerError(f"{src}: layer_types = {layer_types!r}: expected a list of {num_layers} entries")
        kinds = []
        for i, t in enumerate(layer_types):
            if t in ("full_attention", "full"):
                kinds.append("full")
            elif t in ("sliding_attention", "sliding"):
                if sliding_window is None:
                    raise LedgerError(f"{src}: layer_types[{i}] = {t!r}: expected sliding_window to be set")
                kinds.append("sliding")
            else:
                raise LedgerError(f"{src}: layer_types[{i}] = {t!r}: expected 'full_attention' or 'sliding_attention'")
        return tuple(kinds)
    if sliding_window is None:
        return ("full",) * num_layers
    if model_type == "gemma2":  # alternating, even layers slide
        return tuple("sliding" if i % 2 == 0 else "full" for i in range(num_layers))
    if model_type in ("gemma3", "gemma3_text"):
        pattern = config_int(cfg, src, "sliding_window_pattern", default=6)
        return tuple("full" if (i + 1) % pattern == 0 else "sliding" for i in range(num_layers))
    if model_type in ("qwen2", "qwen2_moe", "qwen3", "qwen3_moe"):
        first = config_int(cfg, src, "max_window_layers", default=num_layers, positive=False)
        return tuple("sliding" if i >= first else "full" for i in range(num_layers))
    return ("sliding",) * num_layers  # Mistral-style: one window for every layer


def _quantization(cfg: dict[str, Any], src: str) -> tuple[str | None, str | None]:
    """``(ledger name or None, quant_method)`` of a config's ``quantization_config`` (None, None without one).

    AWQ and GPTQ store 4-bit weights with group scales (GPTQ 8-bit: int8); FP8 one byte per weight;
    compressed-tensors says so in its first config group (``weights.num_bits`` and ``type``). Anything
    else keeps its method name and no ledger name: ``compute_ledger`` refuses it unless told.
    """
    qc = cfg.get("quantization_config")
    if qc is None:
        return None, None
    if not isinstance(qc, dict):
        raise LedgerError(f"{src}: quantization_config = {qc!r}: expected a JSON object")
    method = str(qc.get("quant_method", "")).lower() or "unknown"
    bits: Any = qc.get("bits", qc.get("w_bit"))
    if method in ("awq", "gptq"):
        names = {4: method, 8: "int8"} if method == "gptq" else {4: "awq"}
        return names.get(bits if bits is not None else 4), method
    if method in ("fp8", "fbgemm_fp8"):
        return "fp8", method
    if method == "compressed-tensors":
        groups = qc.get("config_groups")
        first = next(iter(groups.values()), None) if isinstance(groups, dict) and groups else None
        weights = first.get("weights") if isinstance(first, dict) else None
        if isinstance(weights, dict):
            by_weights: dict[tuple[Any, Any], str] = {("float", 8): "fp8", ("int", 8): "int8", ("int", 4): "int4"}
            return by_weights.get((weights.get("type"), weights.get("num_bits"))), method
    return None, method


def parse_model_config(cfg: dict[str, Any], source: str = "<config>") -> ModelConfig:
    """Validate a config.json mapping (``text_config`` is used when present) into a ModelConfig."""
    if not isinstance(cfg, dict):
        raise LedgerError(f"{source}: top level = {type(cfg).__name__}: expected a JSON object")
    if isinstance(cfg.get("text_config"), dict):
        cfg = {**cfg, **cfg["text_config"]}
    src = source
    archs = cfg.get("architectures") or []
    architecture = archs[0] if isinstance(archs, list) and archs else str(cfg.get("model_type", "unknown"))
    model_type = str(cfg.get("model_type", "")).lower()
    hidden, layers, heads, kv_heads, head_dim = _attention_shape(cfg, src)
    vocab = config_int(cfg, src, "vocab_size")
    inter = config_int(cfg, src, "intermediate_size")
    torch_dtype = cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16"
    dtype_bytes(torch_dtype, f"{src}: torch_dtype")
    sliding, kinds = _sliding_window(cfg, src, model_type, layers)
    kv_lora, rope, nope, v_head, q_lora = _mla(cfg, src)
    n_experts, top_k, moe_inter, shared_inter, moe_layers, shared_gate = _moe(cfg, src, layers, inter)
    bias = bool(cfg.get("attention_bias", model_type in ("qwen2", "qwen2_moe")))
    max_pos = cfg.get("max_position_embeddings")
    if max_pos is not None and (
        isinstance(max_pos, bool) or not isinstance(max_pos, int) or not 0 < max_pos <= MAX_CONFIG_INT
    ):
        raise LedgerError(
            f"{src}: max_position_embeddings = {max_pos!r}: invalid; expected a positive integer (at most "
            f"{MAX_CONFIG_INT}), or leave it out and pass max_model_len"
        )
    quantization, quant_method = _quantization(cfg, src)
    return ModelConfig(
        source=src,
        architecture=architecture,
        model_type=model_type,
        hidden_size=hidden,
        num_layers=layers,
        num_attention_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        vocab_size=vocab,
        intermediate_size=inter,
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        torch_dtype=str(torch_dtype).replace("torch.", ""),
        max_position_embeddings=max_pos,
        attention_bias=bias,
        sliding_window=sliding,
        layer_kinds=kinds,
        kv_lora_rank=kv_lora,
        qk_rope_head_dim=rope,
        qk_nope_head_dim=nope,
        v_head_dim=v_head,
        q_lora_rank=q_lora,
        num_experts=n_experts,
        num_experts_per_tok=top_k,
        moe_intermediate_size=moe_inter,
        shared_expert_intermediate_size=shared_inter,
        moe_layers=moe_layers,
        shared_expert_gate=shared_gate,
        quantization=quantization,
        quantization_method=quant_method,
    )


def _attention_shape(cfg: dict[str, Any], src: str) -> tuple[int, int, int, int, int]:
    """(hidden size, layers, attention heads, KV heads, head dim), each checked against the others."""
    hidden = config_int(cfg, src, "hidden_size")
    layers = config_int(cfg, src, "num_hidden_layers")
    if layers > MAX_LAYERS:  # the ledger walks the layers one by one
        raise LedgerError(f"{src}: num_hidden_layers = {layers}: expected at most {MAX_LAYERS}")
    heads = config_int(cfg, src, "num_attention_heads")
    kv_heads = config_int(cfg, src, "num_key_value_heads", required=False) or heads
    if kv_heads > heads or heads % kv_heads:
        raise LedgerError(
            f"{src}: num_key_value_heads = {kv_heads}: expected a divisor of num_attention_heads ({heads})"
        )
    head_dim = config_int(cfg, src, "head_dim", required=False)
    if head_dim is None:
        if hidden % heads:
            raise LedgerError(
                f"{src}: hidden_size = {hidden}: expected a multiple of num_attention_heads ({heads}) or an explicit head_dim"
            )
        head_dim = hidden // heads
    return hidden, layers, heads, kv_heads, head_dim


def _sliding_window(cfg: dict[str, Any], src: str, model_type: str, layers: int) -> tuple[int | None, tuple[str, ...]]:
    """(the sliding window, or None when no layer slides; each layer's kind, full or sliding)."""
    sliding = cfg.get("sliding_window")
    if sliding is not None and (isinstance(sliding, bool) or not isinstance(sliding, int) or sliding < 0):
        raise LedgerError(f"{src}: sliding_window = {sliding!r}: expected a positive integer or null")
    if sliding == 0:
        sliding = None  # some checkpoints use 0 for "disabled" (vLLM does the same)
    if model_type in ("qwen2", "qwen2_moe", "qwen3", "qwen3_moe") and not cfg.get("use_sliding_window", False):
        sliding = None  # Qwen configs carry sliding_window but only use it with use_sliding_window
    kinds = _layer_kinds(cfg, src, model_type, layers, sliding)
    return (sliding if "sliding" in kinds else None), kinds


def _mla(cfg: dict[str, Any], src: str) -> tuple[int | None, int | None, int | None, int | None, int | None]:
    """Multi-head latent attention (DeepSeek): (kv_lora_rank, qk_rope_head_dim, qk_nope_head_dim, v_head_dim,
    q_lora_rank), all None without ``kv_lora_rank``."""
    kv_lora = config_int(cfg, src, "kv_lora_rank", required=False)
    rope = config_int(cfg, src, "qk_rope_head_dim", required=False) if kv_lora else None
    if kv_lora and rope is None:
        raise LedgerError(f"{src}: qk_rope_head_dim: missing; expected a positive integer with kv_lora_rank (MLA)")
    nope = config_int(cfg, src, "qk_nope_head_dim", required=False) if kv_lora else None
    v_head = config_int(cfg, src, "v_head_dim", required=False) if kv_lora else None
    q_lora = config_int(cfg, src, "q_lora_rank", required=False) if kv_lora else None
    return kv_lora, rope, nope, v_head, q_lora


def _moe(
    cfg: dict[str, Any], src: str, layers: int, inter: int
) -> tuple[int | None, int | None, int | None, int | None, tuple[int, ...], bool]:
    """Mixture of experts: (experts, experts per token, expert intermediate size, shared expert intermediate
    size, the MoE layers, whether the shared expert is gated); no experts: (None, None, None, None, (), False)."""
    n_experts = None
    for key in ("n_routed_experts", "num_local_experts", "num_experts"):
        if cfg.get(key):
            n_experts = config_int(cfg, src, key)
            break
    if not n_experts:
        return n_experts, None, None, None, (), False
    top_k = config_int(cfg, src, "num_experts_per_tok", required=False)
    moe_inter = config_int(cfg, src, "moe_intermediate_size", required=False) or inter  # Mixtral: intermediate_size
    first_dense = config_int(cfg, src, "first_k_dense_replace", required=False, positive=False) or 0
    freq = (
        config_int(cfg, src, "moe_layer_freq", required=False)
        or config_int(cfg, src, "decoder_sparse_step", required=False)
        or 1
    )
    mlp_only = set(_int_list(cfg, src, "mlp_only_layers"))
    moe_layers = tuple(
        i
        for i in range(layers)
        if i >= first_dense
        and (i % freq == 0 if "moe_layer_freq" in cfg else (i + 1) % freq == 0)
        and i not in mlp_only
    )
    shared_inter, shared_gate = None, False
    if cfg.get("n_shared_experts"):
        shared_inter = config_int(cfg, src, "n_shared_experts") * moe_inter
    elif cfg.get("shared_expert_intermediate_size"):
        shared_inter = config_int(cfg, src, "shared_expert_intermediate_size")
        shared_gate = True  # Qwen2-MoE gates its shared expert
    return n_experts, top_k, moe_inter, shared_inter, moe_layers, shared_gate


#: What a model config file is, in every error about one.
MODEL_CONFIG_WHAT = "a Hugging Face config.json"


def model_config_file(path: str | Path) -> Path:
    """The config.json a user named: ``path`` itself, or ``path/config.json`` for a model directory."""
    p = Path(path)
    return p / "config.json" if p.is_dir() else p


def read_model_config_json(path: str | Path, error: type[LoadgenError] = LedgerError) -> tuple[Path, dict[str, Any]]:
    """The one reader of a config.json (or a model directory holding one): its path and its top-level object;
    missing, unreadable, not UTF-8, not JSON or not an object is one ``error`` line naming the file."""
    p = model_config_file(path)
    return p, read_json_object(p, MODEL_CONFIG_WHAT, error)


def read_model_config(path: str | Path) -> ModelConfig:
    """Read a Hugging Face config.json (or a model directory containing one)."""
    p, data = read_model_config_json(path)
    return parse_model_config(data, str(p))
