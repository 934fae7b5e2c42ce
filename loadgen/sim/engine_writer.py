"""Write a profiled engine TOML for your own GPU: an operator profile in, an engine the worksheet prices from it.

``loadgen sim engine --profile DIR --model-config FILE --out ENGINE.toml``. The profile is LLMServingSim's
format (``<GPU>/<org>/<model>/<dtype>/``: ``meta.yaml``, ``tp<N>/*.csv``), which its profiler writes for a GPU in
under an hour, or one of the published ones. The engine written is what the shipped ``scenarios/engines/*.toml``
are, and says where each setting came from in the same words:

- ``profile``: the profile's meta.yaml (the GPU, the vLLM version);
- ``given``: this command's arguments (the scheduler as you will launch vLLM, the pool vLLM logged);
- ``default``: vLLM's default for a GPU of this memory (``ledger.settings.vllm_batch_defaults``) or the model's
  config (``max_model_len``: its max_position_embeddings);
- ``ledger``: the KV pool, from the memory ledger for the GPU's memory (``ledger.gpus`` knows the shipped
  profiles' GPUs; ``--device-memory-bytes`` gives any other), unless ``--num-kv-blocks`` gives the one vLLM
  logged;
- ``assumed``: no CPU time between steps (vLLM 0.19 schedules asynchronously), arrivals taken as the engine's own.

The file is read back (``load_engine_config``, the profile composed at its TP and EP degrees) before it is kept,
so a profile without the TP degree asked for is refused in one line and no file is left.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from loadgen.ledger import GIB, EngineSettings, ModelConfig, compute_ledger, read_model_config
from loadgen.ledger.gpus import gpu_memory
from loadgen.ledger.settings import vllm_batch_defaults
from loadgen.util.errors import LoadgenError
from loadgen.util.outputfile import write_output_text

from .config import EngineConfig, load_engine_config
from .profile import load_profile, profile_meta
from .profile_grid import ProfileGrid

__all__ = ["ProfiledEngineSpec", "profile_settings_beyond", "write_profiled_engine"]

#: vLLM's default gpu_memory_utilization.
DEFAULT_UTILIZATION = 0.9
#: Tokens per KV block (vLLM's default on GPU, the profiles' block_size).
BLOCK_SIZE = 16


@dataclass(frozen=True)
class ProfiledEngineSpec:
    """What a profiled engine is built from; None = vLLM's default (or the ledger's pool)."""

    profile_dir: Path  # the profile's <dtype>/ folder (meta.yaml, tp<N>/)
    model_config: Path  # the model's Hugging Face config.json
    tp: int = 1
    ep: int = 1
    collectives: Path | None = None  # a measured collectives CSV (loadgen.sim.link); None: the assumed link
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    max_model_len: int | None = None
    num_kv_blocks: int | None = None  # the pool vLLM logged; None: the ledger's
    device_memory_bytes: int | None = None  # None: the ledger's table for the profile's GPU
    gpu_memory_utilization: float = DEFAULT_UTILIZATION
    name: str | None = None
    given: frozenset[str] = frozenset()  # the fields above given on the command line (tp, ep, ...), even at a default

    def source(self, field: str, default: object) -> str:
        """``given`` or ``default``: where ``field``'s value came from (a value other than the default was given)."""
        return "given" if field in self.given or getattr(self, field) != default else "default"


def _q(text: str) -> str:
    """``text`` as a TOML basic string (JSON's escapes are TOML's)."""
    return json.dumps(text, ensure_ascii=False)


def _rel(path: Path, out_dir: Path) -> str:
    """``path`` as the engine TOML names it: relative to the TOML's folder (engine paths are)."""
    return os.path.relpath(path.resolve(), out_dir.resolve())


def _batch(
    spec: ProfiledEngineSpec, device_gib: float | None, gpu: str, model_len: int, version: str
) -> tuple[int, int]:
    """(max_num_batched_tokens, max_num_seqs): given, else the profiled vLLM's defaults for a GPU of this memory
    (before 0.20 without the 160 GiB tier: ``vllm_batch_defaults``)."""
    major_minor = tuple(int(part) for part in version.split(".")[:2] if part.isdigit())
    return vllm_batch_defaults(
        "cuda",
        world_size=spec.tp,
        device_memory_gib=device_gib,
        device_name=gpu,
        max_model_len=model_len,
        max_num_seqs=spec.max_num_seqs,
        max_num_batched_tokens=spec.max_num_batched_tokens,
        tier_160_gib=major_minor > (0, 19),
    )


def _scheduler(spec: ProfiledEngineSpec, tokens: int, seqs: int, model_len: int) -> list[str]:
    said = "default (vLLM's for a GPU of this memory, API server)"
    return [
        "[scheduler]",
        f"max_num_seqs = {seqs}  # {'given' if spec.max_num_seqs is not None else said}",
        f"max_num_batched_tokens = {tokens}  # {'given' if spec.max_num_batched_tokens is not None else said}",
        "chunked_prefill = true  # default (vLLM 0.19 V1: always on)",
        "long_prefill_token_threshold = 0  # default",
        'policy = "fcfs"  # default',
        "async_scheduling = true  # default (vLLM 0.19 on GPU)",
        "reserve_full_isl = true  # default (scheduler_reserve_full_isl)",
        "cuda_graphs = true  # default (set false for a vLLM launched with enforce_eager)",
        "decode_tokens_per_step = 1  # default (no speculative decoding)",
        f"max_model_len = {model_len}  # "
        + ("given" if spec.max_model_len is not None else "default (the model's max_position_embeddings)"),
    ]


def _device_memory(spec: ProfiledEngineSpec, gpu: str) -> tuple[int, str] | None:
    """(the GPU's total bytes, where the figure came from): given, else the ledger's table; None if neither."""
    if spec.device_memory_bytes is not None:
        return spec.device_memory_bytes, "given"
    known = gpu_memory(gpu)
    return (known.total_bytes, known.source) if known is not None else None


def _pool(
    spec: ProfiledEngineSpec,
    model: ModelConfig,
    gpu: str,
    device: tuple[int, str] | None,
    model_len: int,
    seqs: int,
    tokens: int,
) -> tuple[int, str]:
    """(KV blocks, where they came from): given, else the ledger's for the GPU's memory (``device``)."""
    if spec.num_kv_blocks is not None:
        return spec.num_kv_blocks, "given (as vLLM logged it)"
    if spec.ep > 1:
        raise LoadgenError(
            f"--ep {spec.ep}: no --num-kv-blocks: expected the pool vLLM logs (the ledger does not shard experts "
            "across data-parallel ranks)"
        )
    if device is None:
        raise LoadgenError(
            f"{spec.profile_dir}: GPU {gpu!r}: its memory is not in the ledger's table: expected "
            "--device-memory-bytes (cudaMemGetInfo's total) or --num-kv-blocks"
        )
    total, source = device
    settings = EngineSettings(
        device_memory_gib=total / GIB,
        gpu_memory_utilization=spec.gpu_memory_utilization,
        tensor_parallel_size=spec.tp,
        max_num_seqs=seqs,
        max_num_batched_tokens=tokens,
        max_model_len=model_len,
        device_name=gpu,
    )
    ledger = compute_ledger(model, settings)
    blocks = int(ledger.kv_cache_blocks or 0)
    if blocks < 1:
        raise LoadgenError(
            f"{spec.model_config}: the ledger leaves no KV block on {total:,} B x {settings.gpu_memory_utilization}"
        )
    return blocks, (
        f"ledger: {total:,} B device ({source}) x gpu_memory_utilization {spec.gpu_memory_utilization:g} "
        f"({spec.source('gpu_memory_utilization', DEFAULT_UTILIZATION)}), TP {spec.tp}: "
        f"{ledger.kv_budget_bytes or 0:,} B of KV (loadgen ledger)"
    )


def profile_settings_beyond(spec: ProfiledEngineSpec, tokens: int, seqs: int, model_len: int) -> list[str]:
    """What an engine of these settings can run past its profile's measured grid (``ProfileGrid``)."""
    profile = load_profile(str(spec.profile_dir), spec.tp, str(spec.model_config), spec.ep)
    return ProfileGrid.of(profile).settings_beyond(tokens, seqs, model_len, spec.ep)


def profiled_engine_toml(spec: ProfiledEngineSpec, out: Path) -> str:
    """The engine TOML's text for ``spec``, its paths relative to ``out``'s folder."""
    meta = profile_meta(spec.profile_dir)
    gpu, version, model = meta.get("gpu"), meta.get("vllm_version"), meta.get("model") or "?"
    if not gpu or not version:
        raise LoadgenError(f"{spec.profile_dir / 'meta.yaml'}: no gpu or vllm_version: expected a profile's meta.yaml")
    config = read_model_config(spec.model_config)
    model_len = int(spec.max_model_len or config.max_position_embeddings or 0)
    if model_len < 1:
        raise LoadgenError(f"{spec.model_config}: no max_position_embeddings: expected --max-model-len")
    device = _device_memory(spec, gpu)
    tokens, seqs = _batch(spec, device[0] / GIB if device else None, gpu, model_len, version)
    blocks, pool_source = _pool(spec, config, gpu, device, model_len, seqs, tokens)
    if blocks * BLOCK_SIZE < model_len:
        raise LoadgenError(
            f"max_model_len {model_len:,}: more than the {blocks:,} KV blocks hold ({blocks * BLOCK_SIZE:,} tokens): "
            "expected --max-model-len at most that (vLLM refuses to start otherwise)"
        )
    beyond = profile_settings_beyond(spec, tokens, seqs, model_len)
    out_dir = out.parent
    short = model.rsplit("/", 1)[-1]
    name = spec.name or out.stem
    parallel = f"TP {spec.tp}" + (f", EP {spec.ep}" if spec.ep > 1 else "")
    lines = [
        f"# Engine: vLLM {version} serving {short} on {gpu}, {parallel}: PROFILED (loadgen sim engine).",
        "# Step times come from the GPU's operator profile, composed per step by loadgen.sim.profile. Where each",
        "# setting came from: profile = the profile's meta.yaml; given = loadgen sim engine's arguments; default =",
        "# vLLM's default; ledger = loadgen's memory ledger; assumed = stated here, not measured.",
        *(
            ["# Past the profile's measured points (steps there continue its tables linearly; a replay counts them"]
            + ["# in its engine notes, profile_grid): " + "; ".join(beyond) + "."]
            if beyond
            else []
        ),
        f"name = {_q(name)}",
        f"description = {_q(f'vLLM {version}, {short}, {gpu}, {parallel}: step times from the GPU operator profile.')}",
        f"model = {_q(model)}",
        'tokenizer = "cl100k_base"  # live server only: counts prompt tokens (the worksheet uses the trace\'s counts)',
        "",
        *_scheduler(spec, tokens, seqs, model_len),
        "",
        "[kv]",
        f"block_size = {BLOCK_SIZE}  # default",
        f"num_kv_blocks = {blocks}  # {pool_source}",
        "enable_prefix_caching = true  # default",
        "",
        "[cost]",
        "fixed_ms = 0.0  # assumed: no CPU time between steps (vLLM schedules asynchronously)",
        "request_overhead_ms = 0.0  # assumed: arrivals are the engine's own (queued) instants",
        "",
        "[cost.profile]",
        f"path = {_q(_rel(spec.profile_dir, out_dir))}  # profile",
        f"model_config = {_q(_rel(spec.model_config, out_dir))}  # given",
        f"tp = {spec.tp}  # {spec.source('tp', 1)}",
        f"ep = {spec.ep}  # {spec.source('ep', 1)}",
        f"gpu = {_q(gpu)}  # profile",
        f"vllm_version = {_q(version)}  # profile",
    ]
    if spec.collectives is not None:
        lines.append(f"collectives = {_q(_rel(spec.collectives, out_dir))}  # given: measured")
    return "\n".join(lines) + "\n"


def write_profiled_engine(spec: ProfiledEngineSpec, out: Path) -> EngineConfig:
    """Write ``out`` and return it as loaded, its profile composed; nothing is left on a refusal."""
    write_output_text(out, profiled_engine_toml(spec, out), check=_composes)
    return load_engine_config(out)


def _composes(path: Path) -> None:
    """Refuse (one line) an engine file that does not load with its profile composed at its TP and EP."""
    config = load_engine_config(path)
    assert config.cost.profile is not None
    config.cost.profile.load()
