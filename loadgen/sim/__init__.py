"""The simulated engine: a discrete-event model of a continuous-batching server, with two faces.

It owns the engine model (waiting queue, running cap, token budget, chunked prefill, paged KV
blocks with admission and preemption by recompute, prefix cache, batching window, step cost
model), the virtual-time worksheet that writes a run directory in the measured-run schema
(``run_worksheet``), and the live OpenAI-compatible HTTP server with vLLM-named ``/metrics`` and
fault injection (``serve``). Engine configs are TOML files; presets live in ``scenarios/engines/``.
"""

from __future__ import annotations

from .config import EngineConfig, list_presets, load_engine_config, parse_engine_config
from .engine import Engine, Seq, StepResult
from .faults import FaultPlan, parse_fault_header
from .server import serve as _serve
from .worksheet import run_worksheet, simulate_trace

__all__ = [
    "EngineConfig",
    "Engine",
    "Seq",
    "StepResult",
    "FaultPlan",
    "list_presets",
    "load_engine_config",
    "parse_engine_config",
    "parse_fault_header",
    "run_worksheet",
    "simulate_trace",
    "serve",
]


def serve(*args, **kwargs):

    return _serve(*args, **kwargs)


serve.__doc__ = "Run the live server until SIGTERM/SIGINT (see loadgen.sim.server.serve)."
