"""How precisely the driver's ``sleep_until`` wakes at fixed deadlines (prints figures; asserts nothing).

    python benchmarks/bench_sleep_until.py [--deadlines 2000] [--every-ms 2]

A plain event-loop sleep is ~0.5-1 ms late on median (epoll rounds its timeout up to whole
milliseconds); ``sleep_until`` sleeps short and spins the rest. Each line also gives the CPU the waits
took per deadline (the spin's cost: on an otherwise idle loop, nearly all of it). The figures depend on
what else the host is running: report them with the load (``uptime``) beside them.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from loadgen.driver.schedule import sleep_until


async def _lags(n: int, every_ns: int, plain: bool) -> list[int]:
    start = time.perf_counter_ns() + 5_000_000
    lags = []
    for k in range(n):
        deadline = start + k * every_ns
        if plain:
            await anyio.sleep(max(0.0, (deadline - time.perf_counter_ns()) / 1e9))
        else:
            await sleep_until(deadline)
        lags.append(time.perf_counter_ns() - deadline)
    return lags


def _summary(n: int, every_ns: int, plain: bool) -> str:
    cpu_s = time.process_time()
    lags = sorted(anyio.run(_lags, n, every_ns, plain))
    cpu_us = (time.process_time() - cpu_s) / n * 1e6
    pick = lambda q: lags[min(len(lags) - 1, int(q * len(lags)))] / 1e3
    return (
        f"min {lags[0] / 1e3:.0f} µs, p50 {pick(0.5):.0f} µs, p99 {pick(0.99):.0f} µs, max {lags[-1] / 1e3:.0f} µs; "
        f"CPU {cpu_us:.0f} µs per deadline"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--deadlines", type=int, default=2000)
    parser.add_argument("--every-ms", type=float, default=2.0)
    args = parser.parse_args()
    every_ns = int(args.every_ms * 1e6)
    print(
        f"host load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores; "
        f"{args.deadlines} deadlines every {args.every_ms:g} ms"
    )
    print(f"  sleep_until:  {_summary(args.deadlines, every_ns, False)}")
    print(f"  anyio.sleep:  {_summary(args.deadlines, every_ns, True)}")


if __name__ == "__main__":
    from docs_page import recorded  # why: run as a script, benchmarks/ is on sys.path

    with recorded(__file__):  # its figures into docs/benchmarks.md
        main()
