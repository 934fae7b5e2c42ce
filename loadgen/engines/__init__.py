"""Launching and identifying real engines (vLLM): model dirs without downloads, virtualenv setup,
launch/health/stop, startup-log facts for the manifest, process-tree memory sampling, and measured
runs against a launched server. loadgen never imports vLLM; it runs it from its own interpreter.

Each engine is a subpackage (``engines/vllm/``); the names below are re-exported from it. Engines
depend on ``loadgen.ledger`` (to reconcile what the engine reported), never the reverse.
"""

from __future__ import annotations

from .vllm import (
    MemorySampler,
    VllmConfig,
    VllmServer,
    make_model_dir,
    parse_vllm_log,
    parse_vllm_log_file,
    resolve_python,
    setup_venv,
    shipped_model_path,
    shipped_models,
)

__all__ = [
    "MemorySampler",
    "VllmConfig",
    "VllmServer",
    "make_model_dir",
    "parse_vllm_log",
    "parse_vllm_log_file",
    "resolve_python",
    "setup_venv",
    "shipped_model_path",
    "shipped_models",
]
