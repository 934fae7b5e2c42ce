"""The memory ledger: model config.json + engine settings (+ workload) → bytes per line, with formulas.

Owns reading Hugging Face configs (``read_model_config``), engine settings (``EngineSettings``), the one
KV-cache formula (``kv.kv_spec``; vLLM's block arithmetic for pool size and reported capacity), the
ledger lines (``compute_ledger``), per-class concurrency from a scenario's length distributions,
text/JSON rendering, and reconciliation with what a running vLLM reported (``reconcile``).
"""

from __future__ import annotations

from .compute import LINE_NAMES, ClassConcurrency, Ledger, LedgerLine, compute_ledger, count_parameters
from .config import ModelConfig, dtype_bytes, parse_model_config, read_model_config
from .kv import KVSpec, blocks_for_sequence, kv_blocks_for_budget, kv_spec, vllm_kv_capacity
from .reconcile import Reconciliation, ReconcileRow, engine_report, reconcile
from .render import format_ledger
from .settings import GIB, EngineSettings, LoraSettings

__all__ = [
    "ModelConfig", "read_model_config", "parse_model_config", "dtype_bytes",
    "EngineSettings", "LoraSettings", "GIB",
    "KVSpec", "kv_spec", "kv_blocks_for_budget", "blocks_for_sequence", "vllm_kv_capacity",
    "Ledger", "LedgerLine", "ClassConcurrency", "compute_ledger", "count_parameters", "LINE_NAMES",
    "format_ledger", "reconcile", "Reconciliation", "ReconcileRow", "engine_report",
]
