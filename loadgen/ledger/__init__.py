"""The memory ledger: model config.json + engine settings (+ workload) → bytes per line, with formulas.

Owns reading Hugging Face configs (``read_model_config``), engine settings (``EngineSettings``), the one
KV-cache formula (``kv.kv_spec``; vLLM's block arithmetic for pool size and reported capacity), the
ledger lines (``compute_ledger``), per-class concurrency from a scenario's length distributions,
text/JSON rendering, and the comparison with what a running vLLM reported (``reconcile_report``; reading
that report from a log or run dir, and ``reconcile`` on it, live in ``loadgen.vllm.report``).
It never imports ``loadgen.vllm``: the engines, plan and CLI depend on the ledger, not the reverse.
"""

from __future__ import annotations

from .compute import (
    LINE_NAMES,
    ClassConcurrency,
    Ledger,
    LedgerLine,
    compute_ledger,
    count_parameters,
)
from .config import ModelConfig, dtype_bytes, parse_model_config, read_model_config
from .kv import (
    KVSpec,
    blocks_for_sequence,
    kv_blocks_for_budget,
    kv_spec,
    vllm_kv_capacity,
)
from .reconcile import ReconcileRow, Reconciliation, reconcile_report
from .render import format_ledger
from .settings import GIB, EngineSettings, LoraSettings

__all__ = [
    "GIB",
    "LINE_NAMES",
    "ClassConcurrency",
    "EngineSettings",
    "KVSpec",
    "Ledger",
    "LedgerLine",
    "LoraSettings",
    "ModelConfig",
    "ReconcileRow",
    "Reconciliation",
    "blocks_for_sequence",
    "compute_ledger",
    "count_parameters",
    "dtype_bytes",
    "format_ledger",
    "kv_blocks_for_budget",
    "kv_spec",
    "parse_model_config",
    "read_model_config",
    "reconcile_report",
    "vllm_kv_capacity",
]
