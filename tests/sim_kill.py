"""Kill a live simulated server after it has finished some requests, by its own counter (never by wall time)."""

from __future__ import annotations

import time

import httpx


def finished_requests(base_url: str) -> float:
    """The server's ``vllm:request_success_total`` summed over its labels (0 when it cannot be read)."""
    try:
        text = httpx.get(base_url + "/metrics", timeout=5).text
    except httpx.HTTPError:
        return 0.0
    lines = (line for line in text.splitlines() if line.startswith("vllm:request_success_total"))
    return sum(float(line.rsplit(" ", 1)[1]) for line in lines)


def kill_after_successes(server, n: int, timeout_s: float = 120.0) -> None:
    """Kill ``server`` (anything with ``base_url`` and ``process``) once it has finished ``n`` requests.

    A busy host is slow, so the moment is chosen by the server's progress, not by a timer.
    """
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and finished_requests(server.base_url) < n:
        time.sleep(0.02)
    server.process.kill()
