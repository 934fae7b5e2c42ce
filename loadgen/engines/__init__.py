"""Launching and identifying real engines (vLLM): model dirs without downloads, virtualenv setup,
launch/health/stop, startup-log facts for the manifest, process-tree memory sampling, and measured
runs against a launched server. loadgen never imports vLLM; it runs it from its own interpreter.
"""

from __future__ import annotations

from .vllm import (
    MemorySampler,
    VllmConfig,
    VllmServer,
    make_model_dir,
    resolve_python,
    run_with_server,
    setup_venv,
    shipped_model_path,
    shipped_models,
)
from .vllm_log import parse_vllm_log, parse_vllm_log_file

__all__ = [
    "VllmConfig", "VllmServer", "MemorySampler", "make_model_dir", "setup_venv", "resolve_python",
    "shipped_models", "shipped_model_path", "run_with_server", "parse_vllm_log", "parse_vllm_log_file",
]
