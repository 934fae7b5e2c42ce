"""A one-line live progress display on a terminal (stderr): sent, in flight, done, errors, p99 TTFT.

Plain ``\\r`` line, redrawn twice a second; nothing is printed when stderr is not a TTY (unless
forced), so logs and CI output stay quiet. The line reads a ``Counts`` callable: one run's live counters
(``context_counts``), or, for a run spread over workers, the latest counts each worker reported over
the control channel, merged (``merged_counts``: sums, and the worst worker's p99 TTFT).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any, TextIO

import anyio
import numpy as np

from loadgen.stats.percentiles import percentile_nearest_rank

__all__ = ["Counts", "Progress", "context_counts", "merged_counts", "shows_progress"]

#: The TTFTs the p99 is over: the most recent ones.
RECENT_TTFTS = 2000


@dataclass(frozen=True)
class Counts:
    """What the line shows: requests sent, in flight, done (sent and finished), errors; p99 TTFT (ns)."""

    sent: int = 0
    in_flight: int = 0
    done: int = 0
    errors: int = 0
    p99_ttft_ns: int | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, value: Any) -> Counts | None:
        """Counts from a worker's report; None when it is not one (never raises)."""
        if not isinstance(value, dict):
            return None
        ints = {key: value.get(key) for key in ("sent", "in_flight", "done", "errors")}
        p99 = value.get("p99_ttft_ns")
        if not all(type(v) is int for v in ints.values()) or not (p99 is None or type(p99) is int):
            return None
        return cls(**ints, p99_ttft_ns=p99)  # type: ignore[arg-type]


def context_counts(ctx: Any) -> Counts:
    """A RunContext's live counters (``sent``, ``in_flight``, ``done``, ``errors``, ``recent_ttft_ns``)."""
    recent = ctx.recent_ttft_ns[-RECENT_TTFTS:]
    p99 = percentile_nearest_rank(np.sort(np.asarray(recent)), 0.99) if recent else None
    return Counts(ctx.sent, ctx.in_flight, ctx.done, ctx.errors, int(p99) if p99 is not None else None)


def merged_counts(counts: Sequence[Counts]) -> Counts:
    """Several workers' counts as one: the sums, and the worst (highest) of their p99 TTFTs."""
    p99s = [c.p99_ttft_ns for c in counts if c.p99_ttft_ns is not None]
    return Counts(
        sent=sum(c.sent for c in counts),
        in_flight=sum(c.in_flight for c in counts),
        done=sum(c.done for c in counts),
        errors=sum(c.errors for c in counts),
        p99_ttft_ns=max(p99s) if p99s else None,
    )


def shows_progress(setting: str) -> bool:
    """``--progress``: on, off, or auto (on when stderr is a terminal)."""
    return setting == "on" or (setting == "auto" and sys.stderr.isatty())


class Progress:
    """Draws ``counts()`` out of ``total``; ``run`` redraws until cancelled, ``close`` ends the line."""

    def __init__(
        self,
        counts: Callable[[], Counts],
        total: int,
        what: str = "loadgen run",
        ttft_label: str = "p99 TTFT",
        stream: TextIO | None = None,
        interval_s: float = 0.5,
    ) -> None:
        self.counts, self.total, self.what, self.ttft_label = counts, total, what, ttft_label
        self.stream = stream or sys.stderr
        self.interval_s = interval_s
        self.start = time.monotonic()
        self.drawn = False

    def line(self) -> str:
        c = self.counts()
        p99 = f"{c.p99_ttft_ns / 1e6:,.0f} ms" if c.p99_ttft_ns is not None else "-"
        elapsed = time.monotonic() - self.start
        return (
            f"{self.what} {elapsed:6.1f}s  sent {c.sent}/{self.total}  in flight {c.in_flight}  "
            f"done {c.done}  errors {c.errors}  {self.ttft_label} {p99}"
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
