"""Open-loop timing: fixed deadlines on the monotonic clock, precise waits, send-lag statistics.

Every request's deadline is ``anchor + offset`` (never "sleep since the previous send"), so a late
send does not push later ones back. The event loop's timers wake up to 1 ms late (epoll counts in
whole milliseconds, rounding up). On Linux ``sleep_until`` arms a timerfd (the kernel's
high-resolution timer, on the monotonic clock ``perf_counter_ns`` reads) that the event loop itself
watches: the loop wakes before the deadline (at most ``WAKE_EARLY_NS``, as early as its recent wake-ups
were late) with no thread and no hand-off, and a yielding spin covers the rest (a busy loop runs a whole
iteration of I/O callbacks before a woken task runs: waking only at the instant measured a send-lag p50
of ~0.25 ms at 2,500 req/s).
Elsewhere it sleeps on the loop to a few ms before the deadline, lets one timer thread
(``Condition.wait`` with a timeout: microsecond resolution) wake the loop ``WAKE_EARLY_NS`` before
it, and spins for the rest.
"""

from __future__ import annotations

import asyncio
import ctypes
import heapq
import os
import sys
import threading
import time
import weakref
from dataclasses import dataclass, field
from typing import cast

import anyio
import anyio.lowlevel
import numpy as np

from loadgen.stats.percentiles import percentile_nearest_rank

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
#: On the timerfd path those two are caps: the wake comes only as early as the loop's recent wake-ups were
#: late (the largest recent lateness, decaying by LATE_DECAY per wait, times two plus WAKE_MARGIN_NS), and
#: never less than WAKE_EARLY_MIN_NS ahead. A quiet loop wakes within tens of µs, so the fixed spin was
#: mostly waste, taken from the target, the part writer or other workers on the core: on an idle loop it
#: cost 692 µs of CPU per deadline 2 ms apart against 165 µs now (benchmarks/bench_sleep_until.py, the same
#: p50 1 µs and p99 3 µs), and a run at 500 req/s took 2.49 s of driver CPU against 1.60-1.65 s (send-lag
#: p99 0.08 and 0.07 ms). A busy loop's wake-ups are late by more (p99 ~370 µs at 2,500 req/s on one core),
#: which keeps the wake at the cap there.
WAKE_EARLY_MIN_NS = 50_000
WAKE_MARGIN_NS = 20_000
LATE_DECAY = 0.98
#: A wait longer than this counts as "long" for the choice above.
IDLE_WAIT_NS = 1_500_000
#: Below this much remaining time the wait moves to the timer thread's precise sleep.
THREAD_NS = 3_000_000

_now = time.perf_counter_ns


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


class _TimerFd:
    """Deadlines on a Linux timerfd the event loop watches (``add_reader``): a heap of waiters, the timer
    armed to the earliest; when it fires, the loop resolves every waiter that is due, then re-arms."""

    def __init__(self, loop: asyncio.AbstractEventLoop, fd: int, arm) -> None:
        self._loop = weakref.ref(loop)  # not a strong one: the loop's collection closes the fd (finalize)
        self._fd = fd
        self._arm_at = arm  # arm(fd, absolute monotonic ns)
        self._heap: list[tuple[int, int, asyncio.Future]] = []
        self._seq = 0
        self._armed: int | None = None
        self._late_ns = WAKE_EARLY_NS // 2  # starts at the cap: nothing is known of this loop yet
        loop.add_reader(fd, self._fire)

    def early_ns(self, cap_ns: int) -> int:
        """How long before a deadline to wake: enough for the loop's recent lateness, at most ``cap_ns``."""
        return min(cap_ns, max(WAKE_EARLY_MIN_NS, 2 * self._late_ns + WAKE_MARGIN_NS))

    def woke(self, late_ns: int) -> None:
        """A wait's wake-up came ``late_ns`` after the instant it asked for (the loop's turn, the kernel's)."""
        self._late_ns = max(late_ns, int(self._late_ns * LATE_DECAY))

    async def wait(self, deadline_ns: int) -> None:
        future = asyncio.get_running_loop().create_future()
        self._seq += 1
        heapq.heappush(self._heap, (deadline_ns, self._seq, future))
        if self._armed is None or deadline_ns < self._armed:
            self._armed = deadline_ns
            self._arm_at(self._fd, deadline_ns)
        await future

    def _fire(self) -> None:
        try:
            os.read(self._fd, 8)
        except (BlockingIOError, InterruptedError):
            pass
        heap = self._heap
        now = _now()
        while heap and (heap[0][0] <= now or heap[0][2].done()):
            future = heapq.heappop(heap)[2]
            if not future.done():
                future.set_result(None)
        self._armed = heap[0][0] if heap else None
        if self._armed is not None:
            self._arm_at(self._fd, self._armed)

    def close(self) -> None:
        loop = self._loop()
        try:
            if loop is not None and not loop.is_closed():
                loop.remove_reader(self._fd)
        finally:
            os.close(self._fd)


class _Itimerspec(ctypes.Structure):
    _fields_ = [
        ("interval_s", ctypes.c_long),
        ("interval_ns", ctypes.c_long),
        ("s", ctypes.c_long),
        ("ns", ctypes.c_long),
    ]


def _timerfd_calls():
    """(create() -> fd, arm(fd, abs_ns)) on Linux when ``perf_counter_ns`` is CLOCK_MONOTONIC; else None."""
    if not sys.platform.startswith("linux"):
        return None
    if abs(time.clock_gettime_ns(time.CLOCK_MONOTONIC) - time.perf_counter_ns()) > 1_000_000:
        return None  # perf_counter is another clock here: an absolute timerfd deadline would be wrong
    flags = os.O_NONBLOCK | os.O_CLOEXEC  # TFD_NONBLOCK and TFD_CLOEXEC have these values
    if hasattr(os, "timerfd_create"):  # Python 3.13+
        abstime = getattr(os, "TFD_TIMER_ABSTIME", 1)

        def arm_os(fd: int, abs_ns: int) -> None:
            os.timerfd_settime_ns(fd, flags=abstime, initial=max(abs_ns, 1))  # type: ignore[attr-defined]

        return (lambda: os.timerfd_create(time.CLOCK_MONOTONIC, flags=flags)), arm_os
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        create, settime = libc.timerfd_create, libc.timerfd_settime
    except (OSError, AttributeError):
        return None
    create.argtypes, create.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    settime.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.POINTER(_Itimerspec), ctypes.c_void_p]
    settime.restype = ctypes.c_int
    spec = _Itimerspec()
    ref = ctypes.byref(spec)

    def make() -> int:
        fd = create(time.CLOCK_MONOTONIC, flags)
        if fd < 0:
            raise OSError(ctypes.get_errno(), "timerfd_create failed")
        return fd

    def arm(fd: int, abs_ns: int) -> None:
        abs_ns = max(abs_ns, 1)  # 0 would disarm
        spec.s, spec.ns = divmod(abs_ns, 1_000_000_000)
        if settime(fd, 1, ref, None) != 0:  # TFD_TIMER_ABSTIME
            raise OSError(ctypes.get_errno(), "timerfd_settime failed")

    return make, arm


_TIMERFD_CALLS = _timerfd_calls()
_timerfds: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _TimerFd] = weakref.WeakKeyDictionary()


def _timerfd() -> _TimerFd | None:
    """This event loop's timerfd waiter (made on first use; closed with the loop), or None (no timerfd here)."""
    if _TIMERFD_CALLS is None or not on_asyncio():
        return None
    loop = asyncio.get_running_loop()
    timer = _timerfds.get(loop)
    if timer is None:
        make, arm = _TIMERFD_CALLS
        try:
            timer = _TimerFd(loop, make(), arm)
        except (OSError, NotImplementedError, RuntimeError):  # a loop without add_reader (Windows proactor)
            return None
        _timerfds[loop] = timer
        weakref.finalize(loop, _close_quietly, timer)
    return timer


def _close_quietly(timer: _TimerFd) -> None:
    try:
        timer.close()
    except OSError:
        pass


_timer: _TimerThread | None = None


def on_asyncio() -> bool:
    """True inside a task of an asyncio event loop (anyio's asyncio backend); False on any other backend."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:  # no asyncio loop in this thread
        return False
    return True


def _timer_thread() -> _TimerThread:
    """The shared timer thread (it wakes asyncio futures: the driver runs on anyio's asyncio backend only,
    as every ``anyio.run`` of it says)."""
    global _timer
    if _timer is None:
        _timer = _TimerThread()
    return _timer


async def sleep_until(deadline_ns: int) -> None:
    """Wait until ``perf_counter_ns() >= deadline_ns`` (absolute, same clock); returns at once if past."""
    remaining = deadline_ns - _now()
    if remaining <= 0:
        return
    early = WAKE_EARLY_IDLE_NS if remaining > IDLE_WAIT_NS else WAKE_EARLY_NS
    timerfd = _timerfd()
    if timerfd is not None:
        early = timerfd.early_ns(early)
        if remaining > early:
            wake_ns = deadline_ns - early
            await timerfd.wait(wake_ns)
            timerfd.woke(_now() - wake_ns)
        while _now() < deadline_ns:
            await anyio.lowlevel.checkpoint()
        return
    if remaining > THREAD_NS:
        await anyio.sleep((remaining - THREAD_NS + 1_000_000) / 1e9)  # coarse: may wake up to 1 ms late
        remaining = deadline_ns - _now()
    if remaining > max(SPIN_NS, early + 50_000):
        await _timer_thread().wait(deadline_ns - early)
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
