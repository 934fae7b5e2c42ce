"""The practice's KV ledger: a model config under each simulated candidate's settings, on the candidate's GPU.

A profiled engine names its GPU (``[cost.profile] gpu``); when ``loadgen.ledger.gpus`` knows that GPU's memory
the ledger sizes the KV pool as vLLM would on it (device memory × utilization − the other lines), under the
engine's own scheduler limits, and says how far that is from the pool the engine simulates. An engine with
no GPU (a preset) or an unknown one gets its own pool as the KV budget, and the ledger says so.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .ledger import GIB, EngineSettings, Ledger, ModelConfig, compute_ledger, format_ledger, read_model_config
from .ledger.gpus import gpu_memory
from .sim import EngineConfig
from .vllm.model_dir import model_config_path
from .workload.scenario import Scenario

__all__ = ["LedgerBudget", "candidate_ledgers", "ledger_budget", "model_config_path"]


@dataclass(frozen=True)
class LedgerBudget:
    """The ledger's settings for one candidate, and where its KV budget came from (one line)."""

    settings: EngineSettings
    source: str
    device_memory_bytes: int | None = None


def ledger_budget(cfg: EngineConfig, model: ModelConfig) -> LedgerBudget:
    """The candidate's scheduler limits, with its GPU's memory as the budget when known, else its own pool."""
    limits: dict[str, Any] = dict(
        block_size=cfg.kv.block_size,
        kv_cache_dtype=cfg.kv.kv_cache_dtype or "auto",
        max_num_seqs=cfg.scheduler.max_num_seqs,
        max_num_batched_tokens=cfg.scheduler.max_num_batched_tokens,
        max_model_len=cfg.scheduler.max_model_len,
    )
    profile = cfg.cost.profile
    gpu = gpu_memory(profile.gpu) if profile is not None else None
    if profile is not None and gpu is not None:
        settings = EngineSettings(
            **limits,
            device_memory_gib=gpu.total_gib,
            device_name=profile.gpu,
            tensor_parallel_size=profile.tp,
            concurrent_batches=2 if cfg.scheduler.async_scheduling else 1,
        )
        source = (
            f"device {profile.gpu}, {gpu.total_bytes:,} B ({gpu.source}) × gpu_memory_utilization "
            f"{settings.gpu_memory_utilization:g}"
        )
        return LedgerBudget(settings, source, gpu.total_bytes)
    probe = compute_ledger(model, EngineSettings(block_size=cfg.kv.block_size, kv_cache_gib=1.0))
    kv_gib = cfg.num_kv_blocks * probe.kv.bytes_per_block / GIB
    why = "no GPU named: a preset" if profile is None else f"memory of {profile.gpu} not in loadgen.ledger.gpus"
    source = f"the engine's own pool, {cfg.num_kv_blocks:,} blocks = {kv_gib:.3f} GiB ({why})"
    return LedgerBudget(EngineSettings(**limits, kv_cache_gib=kv_gib), source)


def _pool_line(cfg: EngineConfig, ledger: Ledger, budget: LedgerBudget) -> str:
    """What the engine simulates beside what the ledger gives for its GPU."""
    given = (
        "its TOML's num_kv_blocks" if cfg.kv.num_kv_blocks is not None else "its TOML's kv_cache_gib, via the ledger"
    )
    line = f"engine pool: {cfg.name} simulates {cfg.num_kv_blocks:,} KV blocks ({given})"
    if budget.device_memory_bytes is None or not ledger.kv_cache_blocks:
        return line
    diff_pct = (ledger.kv_cache_blocks - cfg.num_kv_blocks) / cfg.num_kv_blocks * 100
    return f"{line}; this ledger gives {ledger.kv_cache_blocks:,} on the GPU ({diff_pct:+.1f}%)"


def candidate_ledgers(
    model_config: str, engines: list[EngineConfig], scenario: Scenario
) -> tuple[dict[str, str], dict[str, Any]]:
    """Per candidate: the ledger text (budget line, ledger, engine pool) and its decision.json entry."""
    path = model_config_path(model_config)
    model = read_model_config(path)
    texts: dict[str, str] = {}
    data: dict[str, Any] = {}
    for cfg in engines:
        budget = ledger_budget(cfg, model)
        ledger = compute_ledger(model, budget.settings, scenario)
        pool = _pool_line(cfg, ledger, budget)
        texts[cfg.name] = "\n".join([f"KV budget: {budget.source}", format_ledger(ledger), pool])
        data[cfg.name] = ledger.result().document() | {  # the published ledger, then what the practice adds
            "model_config": str(path),
            "engine_label": cfg.calibration_label(),
            "kv_budget_source": budget.source,
            "gpu": budget.settings.device_name if budget.device_memory_bytes is not None else None,
            "device_memory_bytes": budget.device_memory_bytes,
            "engine_kv_blocks": cfg.num_kv_blocks,
            "engine_pool": pool,
            "kv_cache_gib": (ledger.kv_cache_blocks or 0) * ledger.kv.bytes_per_block / GIB,
        }
    return texts, data
