"""Traces: deterministic synthetic generation from a scenario, importers for public traces, statistics.

A trace is a Parquet file with TRACE_SCHEMA (loadgen.rundir.schema) and its provenance in the key-value
metadata under ``loadgen.trace``. Generation is a pure function of (scenario, trace name, seed).
"""

from __future__ import annotations

from .generate import GENERATOR_VERSION, generate_trace
from .io import read_trace, write_trace
from .stats import TraceStats, trace_stats

__all__ = ["GENERATOR_VERSION", "generate_trace", "read_trace", "write_trace", "TraceStats", "trace_stats"]
