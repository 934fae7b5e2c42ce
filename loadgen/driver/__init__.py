"""The open-loop driver: replay a trace against an OpenAI-compatible endpoint and record a run dir.

It owns the schedule (fixed deadlines on the monotonic clock, client queue behind a concurrency
bound, optional client-side rate cap), the streaming client with its pure SSE parser, the one
mapping from failures to error kinds, the recorder that writes rows incrementally, the /metrics
scraper and the progress line. ``run_trace(RunOptions(...))`` is the whole public entry point.
"""

from __future__ import annotations

import anyio

from .error_kinds import classify_exception, classify_http_status
from .metrics_scrape import MetricsScraper, parse_prometheus_text, samples_to_columns
from .options import RunOptions, RunSettings
from .run import run_trace
from .sse import Chunk, SSEDecoder, SSEProtocolError, parse_chunk

__all__ = [
    "RunOptions",
    "RunSettings",
    "run_trace",
    "run_trace_sync",
    "SSEDecoder",
    "SSEProtocolError",
    "Chunk",
    "parse_chunk",
    "classify_exception",
    "classify_http_status",
    "parse_prometheus_text",
    "samples_to_columns",
    "MetricsScraper",
]


def run_trace_sync(options: RunOptions):
    """``anyio.run(run_trace, options)`` on asyncio, with uvloop when installed; returns the run directory.

    ``options.workers`` > 1 or ``options.ray``: the run is spread over workers (``loadgen.driver.workers``).
    """
    if options.workers > 1 or options.ray:
        from .workers import run_workers_sync  # deferred: the single-process path loads none of it

        return run_workers_sync(options)
    try:
        import uvloop  # noqa: F401

        backend_options = {"use_uvloop": True}
    except ImportError:
        backend_options = {}
    return anyio.run(run_trace, options, backend="asyncio", backend_options=backend_options)
