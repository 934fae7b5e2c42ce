"""Open-loop timing: fixed deadlines on the monotonic clock, precise waits, send-lag statistics.

Every request's deadline is ``anchor + offset`` (never "sleep since the previous send"), so a late
send does not push later ones back. The event loop's timers wake up to 1 ms late (epoll counts in
whole milliseconds, rounding up), so ``sleep_until`` sleeps on the loop to a few ms before the
deadline, lets one timer thread (``Condition.wait`` with a timeout: microsecond resolution) wake
the loop ``WAKE_EARLY_NS`` before it, and yields in a short spin for the rest. On an idle host that
keeps the median send lag at a few microseconds without spinning for whole milliseconds.
"""

from __future__ import annotations

import asyncio
import heapq
import threading
import time
from dataclasses import dataclass, field
from typing import cast

import anyio
import anyio.lowlevel
import numpy as np

from ..analysis.percentiles import percentile_nearest_rank

__all__ = [
    "SPIN_NS",
    "THREAD_NS",
    "WAKE_EARLY_IDLE_NS",
    "WAKE_EARLY_NS",
    "LagStats",
    "RateGate",
    "on_asyncio",
    "sleep_until",
]

#: Below this much remaining time the wait is a yielding spin (cheaper than a thread round trip).
SPIN_NS = 350_000
#: The timer thread wakes the loop this long before the deadline; a yielding spin covers the rest.
#: Thread wake-up plus loop hand-off measured ~230 µs median, ~1.2 ms p99 on the shared 2-core CI
#: host. When the wait is long (low rates) the spin is cheap to afford and starts WAKE_EARLY_IDLE_NS
#: ahead; when deadlines are close (high rates) a long spin would steal CPU from the work and the
#: target on the same host, so it starts only WAKE_EARLY_NS ahead.
WAKE_EARLY_NS = 300_000
WAKE_EARLY_IDLE_NS = 700_000
#: A wait longer than this counts as "long" for the choice above.
IDLE_WAIT_NS = 1_500_000
#: Below this much remaining time the wait moves to a worker thread's precise sleep.
THREAD_NS = 3_000_000

_now = time.perf_counter_ns


def _thread_sleep_until(deadline_ns: int) -> None:
    remaining = deadline_ns - _now()
    if remaining > 0:
        time.sleep(remaining / 1e9)


class _TimerThread:
    """One daemon thread that wakes asyncio futures at deadlines (a heap; many waiters).

    ``Condition.wait(timeout)`` sleeps with microsecond resolution (futex/semaphore on the
    monotonic clock), unlike the event loop's millisecond epoll timeout. Cheaper per wait than a
    worker-thread round trip: a notify to start, ``call_soon_threadsafe`` to finish.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._heap: list[tuple[int, int, asyncio.AbstractEventLoop, asyncio.Future]] = []
        self._seq = 0
        threading.Thread(target=self._run, name="loadgen-timer", daemon=True).start()

    def _run(self) -> None:
        heap, cond = self._heap, self._cond
        while True:
            with cond:
                while not heap:
                    cond.wait()
                remaining = heap[0][0] - _now()
                if remaining > 0:
                    cond.wait(remaining / 1e9)  # an earlier deadline posted meanwhile wakes us
                    continue
                _, _, loop, future = heapq.heappop(heap)
            try:
                loop.call_soon_threadsafe(_resolve, future)
            except RuntimeError:  # loop closed meanwhile
                pass

    async def wait(self, deadline_ns: int) -> None:
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        with self._cond:
            self._seq += 1
            heapq.heappush(self._heap, (deadline_ns, self._seq, loop, future))
            if self._heap[0][2] is loop and self._heap[0][3] is future:
                self._cond.notify()
        await future


def _resolve(future: asyncio.Future) -> None:
    if not future.done():
        future.set_result(None)


_timer: _TimerThread | None = None


def on_asyncio() -> bool:
    """True inside a task of an asyncio event loop (anyio's asyncio backend); False on any other backend."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:  # no asyncio loop in this thread
        return False
    return True


def _timer_thread() -> _TimerThread | None:
    """The shared timer thread when running on asyncio (else None: use anyio's worker threads)."""
    global _timer
    if not on_asyncio():
        return None
    if _timer is None:
        _timer = _TimerThread()
    return _timer


async def sleep_until(deadline_ns: int) -> None:
    """Wait until ``perf_counter_ns() >= deadline_ns`` (absolute, same clock); returns at once if past."""
    remaining = deadline_ns - _now()
    early = WAKE_EARLY_IDLE_NS if remaining > IDLE_WAIT_NS else WAKE_EARLY_NS
    if remaining > THREAD_NS:
        await anyio.sleep((remaining - THREAD_NS + 1_000_000) / 1e9)  # coarse: may wake up to 1 ms late
        remaining = deadline_ns - _now()
    if remaining > max(SPIN_NS, early + 50_000):
        timer = _timer_thread()
        if timer is not None:
            await timer.wait(deadline_ns - early)
        else:
            await anyio.to_thread.run_sync(_thread_sleep_until, deadline_ns - early)
    while _now() < deadline_ns:
        await anyio.lowlevel.checkpoint()


class RateGate:
    """Client-side requests-per-second cap (to stay under a declared quota).

    Permits are spaced ``1/rate`` apart in arrival order; the wait is client queue time, recorded
    by the caller. ``None`` rate means no cap.
    """

    def __init__(self, rate_rps: float | None) -> None:
        self.interval_ns = int(1e9 / rate_rps) if rate_rps else 0
        self._next_ns = 0
        self.waited = 0  # requests that had to wait

    async def wait(self) -> bool:
        """Wait for the next permit; True when the caller had to wait."""
        if not self.interval_ns:
            return False
        now = _now()
        permit = max(now, self._next_ns)
        self._next_ns = permit + self.interval_ns
        if permit > now:
            self.waited += 1
            await sleep_until(permit)
            return True
        return False


@dataclass
class LagStats:
    """Send lag (sent − scheduled, ns) of requests that never waited for a slot or the rate gate."""

    values: list[int] = field(default_factory=list)

    def add(self, lag_ns: int) -> None:
        self.values.append(lag_ns)

    def summary(self) -> dict[str, int | None]:
        """{p50, p99, max, n} in ns (nearest-rank percentiles: observed values); None values when empty."""
        if not self.values:
            return {"p50": None, "p99": None, "max": None, "n": 0}
        arr = np.sort(np.asarray(self.values, dtype=np.int64))
        # nearest rank of a non-empty int64 array: an observed value, a Python int
        return {
            "p50": cast(int, percentile_nearest_rank(arr, 0.50)),
            "p99": cast(int, percentile_nearest_rank(arr, 0.99)),
            "max": int(arr[-1]),
            "n": len(arr),
        }
