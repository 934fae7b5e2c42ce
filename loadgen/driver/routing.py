"""Several target URLs (replicas) in one run: which replica each request goes to.

One :class:`Router` per run. A request is routed when the scheduler dispatches it:

- ``round-robin``: the next live replica in turn;
- ``least-in-flight``: the live replica with the fewest requests routed and not yet finished (ties: the
  next in turn).

Conversations are sticky: every turn of a conversation goes to the replica its first turn went to,
unless that replica is down, when the turn (and the conversation from then on) moves to a live one.

A replica is *down* after ``down_after`` consecutive requests to it ended as ``error_kind`` ``connect``
(refused, unreachable, connect timeout, closed before any response), with either policy; any other
outcome of a request routed to it (a response, a stream error, a timeout) resets the count. Down is for the rest of the run (no probing back);
``down_after`` 0 never marks a replica down. When every replica is down, requests are routed as if none
were (they fail as ``connect``, and are counted). The payload of a request was encoded for replica 0;
routing it elsewhere swaps the request line and Host header for that replica's (``heads``).
"""

from __future__ import annotations

import time
from typing import Any, Literal

import httpx

from .jobs import Job

__all__ = ["ROUTE_POLICIES", "Router", "request_head"]

RoutePolicy = Literal["round-robin", "least-in-flight"]
#: The routing policies ``--route-policy`` accepts.
ROUTE_POLICIES: tuple[str, ...] = ("round-robin", "least-in-flight")


def request_head(url: httpx.URL) -> bytes:
    """The first bytes of every request to ``url``: the request line and the Host header
    (``RawHTTP11Transport.encode_request`` with Host first, as the run encodes them)."""
    return b"POST " + url.raw_path + b" HTTP/1.1\r\nhost: " + url.netloc + b"\r\n"


class Router:
    """Assigns each dispatched request a replica, and learns from each finished one."""

    def __init__(self, heads: list[bytes], policy: RoutePolicy, down_after: int) -> None:
        self.heads = heads  # per replica: request line + Host header, the start of every payload
        self.policy = policy
        self.down_after = down_after
        n = len(heads)
        self.in_flight = [0] * n
        self.routed = [0] * n
        self.connect_streak = [0] * n
        self.down_ns: list[int | None] = [None] * n  # perf_counter_ns when marked down
        self.rerouted = 0  # conversation turns moved off a down replica
        self._sticky: dict[str, int] = {}
        self._next = 0

    def _live(self) -> list[int]:
        live = [i for i, t in enumerate(self.down_ns) if t is None]
        return live or list(range(len(self.heads)))

    def _pick(self) -> int:
        live = self._live()
        n = len(self.heads)
        if self.policy == "least-in-flight":
            start = self._next
            choice = min(live, key=lambda i: (self.in_flight[i], (i - start) % n))
        else:
            choice = min(live, key=lambda i: (i - self._next) % n)
        self._next = (choice + 1) % n
        return choice

    def assign(self, job: Job) -> int:
        """Route ``job`` (sets ``job.target_index`` and its payload); returns the replica index."""
        conv = job.conversation_id
        index = self._sticky.get(conv) if conv is not None else None
        if index is not None and self.down_ns[index] is not None and len(self._live()) < len(self.heads):
            self.rerouted += 1
            index = None
        if index is None:
            index = self._pick()
            if conv is not None:
                self._sticky[conv] = index
        if index != 0:
            head0 = self.heads[0]
            job.payload = self.heads[index] + job.payload[len(head0) :]
        job.target_index = index
        self.in_flight[index] += 1
        self.routed[index] += 1
        return index

    def finished(self, job: Job, error_kind: str | None) -> None:
        """``job`` has its row: it no longer counts in flight; a connect failure counts toward down."""
        index = job.target_index
        if index is None:
            return
        self.in_flight[index] -= 1
        if error_kind == "connect":
            self.connect_streak[index] += 1
            if self.down_after and self.connect_streak[index] >= self.down_after and self.down_ns[index] is None:
                self.down_ns[index] = time.perf_counter_ns()
        elif error_kind not in ("run_interrupted", "client_queue_timeout"):  # those never reached it
            self.connect_streak[index] = 0

    def manifest(self, anchor_ns: int) -> dict[str, Any]:
        """What the routing did, for the manifest's ``routing`` section (instants on the run clock)."""
        return {
            "routed": list(self.routed),
            "down_ns": [t - anchor_ns if t is not None and anchor_ns else None for t in self.down_ns],
            "rerouted_turns": self.rerouted,
        }
