"""A one-line live progress display on a terminal (stderr): sent, in flight, done, errors, p99 TTFT.

Plain ``\\r`` line, redrawn twice a second; nothing is printed when stderr is not a TTY (unless
forced), so logs and CI output stay quiet.
"""

from __future__ import annotations

import sys
import time

import anyio
import numpy as np

from ..analysis.percentiles import percentile_nearest_rank

__all__ = ["Progress"]


class Progress:
    """Reads a RunContext's live counters; ``run`` redraws until cancelled, ``close`` ends the line."""

    def __init__(self, ctx, total: int, stream=None, interval_s: float = 0.5) -> None:
        self.ctx = ctx
        self.total = total
        self.stream = stream or sys.stderr
        self.interval_s = interval_s
        self.start = time.monotonic()
        self.drawn = False

    def line(self) -> str:
        ctx = self.ctx
        recent = ctx.recent_ttft_ns[-2000:]
        p99_ns = percentile_nearest_rank(np.sort(np.asarray(recent)), 0.99) if recent else None
        p99 = f"{p99_ns / 1e6:,.0f} ms" if p99_ns is not None else "-"
        elapsed = time.monotonic() - self.start
        return (
            f"loadgen run {elapsed:6.1f}s  sent {ctx.sent}/{self.total}  in flight {ctx.in_flight}  "
            f"done {ctx.done}  errors {ctx.errors}  p99 TTFT {p99}"
        )

    def draw(self) -> None:
        self.stream.write("\r" + self.line() + "\x1b[K")
        self.stream.flush()
        self.drawn = True

    async def run(self) -> None:
        while True:
            self.draw()
            await anyio.sleep(self.interval_s)

    def close(self) -> None:
        if self.drawn:
            self.draw()
            self.stream.write("\n")
            self.stream.flush()
