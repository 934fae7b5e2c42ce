"""How long one contract replay holds its event loop while it reads long answers (the loop a run under load shares).

``loadgen contract under-load`` replays the contract's cases on the measured run's own event loop. Each case's
answer (up to 16 MiB) was read there: its SSE events parsed, its secrets replaced and its checks run, all in
one go. This script starts ``tests/hostile_server.py --behaviour long-stream`` (every answer about 14 MiB of
one-token events, then ``[DONE]``), replays the canonical contract's cases against it with ``stream`` on, and
prints the longest the event loop went without running a 1 ms ticker task beside the replay (its longest stall,
in ms), and the replay's wall time. Run it with ``PYTHONPATH`` at another checkout for before/after.

    python benchmarks/bench_contract_loop.py
    PYTHONPATH=/tmp/base python benchmarks/bench_contract_loop.py   # the loadgen at /tmp/base, this server

Figures only: no pass/fail (timing belongs here, not in tests).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import anyio

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from hostile_server import MODEL, hostile_server

from loadgen.contract import load_cases, replay_cases


async def _replay_with_ticker(url: str) -> tuple[float, float, int]:
    """(longest stall of a 1 ms ticker in ms, replay wall time in s, cases replayed)."""
    cases = load_cases(REPO / "scenarios" / "contract" / "canonical.toml")
    stall_s = 0.0
    done = anyio.Event()

    async def ticker() -> None:
        nonlocal stall_s
        last = time.perf_counter()
        while not done.is_set():
            await anyio.sleep(0.001)
            now = time.perf_counter()
            stall_s = max(stall_s, now - last)
            last = now

    async with anyio.create_task_group() as tg:
        tg.start_soon(ticker)
        start = time.perf_counter()
        result = await replay_cases(cases, url, MODEL, stream=True, concurrency=4)
        wall_s = time.perf_counter() - start
        done.set()
    return stall_s * 1e3, wall_s, len(result.cases)


def main() -> None:
    import loadgen

    print(f"loadgen from {Path(loadgen.__file__).parent}; host load average {os.getloadavg()[0]:.1f}")
    with hostile_server("long-stream") as server:
        stall_ms, wall_s, n = anyio.run(_replay_with_ticker, server.base_url)
    print(f"{n} cases, answers of ~14 MiB streamed: longest event-loop stall {stall_ms:.0f} ms, replay {wall_s:.1f} s")


if __name__ == "__main__":
    main()
