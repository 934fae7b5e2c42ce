"""Several target URLs (replicas) in one run: which replica each request goes to.

One :class:`Router` per run, shared by the driver (``loadgen run --target A --target B``) and the
worksheet's fleet (N simulated engines in virtual time). A request is routed when it is dispatched:

- ``round-robin``: the next live replica in turn;
- ``least-in-flight``: the live replica with the fewest requests routed and not yet finished (ties: the
  next in turn).

Conversations are sticky: every turn of a conversation goes to the replica its first turn went to,
unless that replica is down, when the turn (and the conversation from then on) moves to a live one.

A replica is *down* after ``down_after`` consecutive requests to it ended as ``error_kind`` ``connect``
(refused, unreachable, connect timeout, closed before any response), with either policy; any other
outcome of a request routed to it (a response, a stream error, a timeout) resets the count. Down is for the rest of the run (no probing back);
``down_after`` 0 never marks a replica down. When every replica is down, requests are routed as if none
were (they fail as ``connect``, and are counted).
"""

from __future__ import annotations

import time
from typing import Any, Literal

__all__ = ["ROUTE_POLICIES", "RoutePolicy", "Router"]

RoutePolicy = Literal["round-robin", "least-in-flight"]
#: The routing policies ``--route-policy`` accepts.
ROUTE_POLICIES: tuple[str, ...] = ("round-robin", "least-in-flight")


class Router:
    """Assigns each dispatched request a replica, and learns from each finished one."""

    def __init__(self, replicas: int, policy: RoutePolicy, down_after: int = 0) -> None:
        self.n = n = replicas
        self.policy = policy
        self.down_after = down_after
        self.in_flight = [0] * n
        self.routed = [0] * n
        self.connect_streak = [0] * n
        self.down_ns: list[int | None] = [None] * n  # perf_counter_ns when marked down
        self.rerouted = 0  # conversation turns moved off a down replica
        self._sticky: dict[str, int] = {}
        self._next = 0

    def _live(self) -> list[int]:
        live = [i for i, t in enumerate(self.down_ns) if t is None]
        return live or list(range(self.n))

    def _pick(self) -> int:
        live = self._live()
        n = self.n
        if self.policy == "least-in-flight":
            start = self._next
            choice = min(live, key=lambda i: (self.in_flight[i], (i - start) % n))
        else:
            choice = min(live, key=lambda i: (i - self._next) % n)
        self._next = (choice + 1) % n
        return choice

    def assign(self, conversation_id: str | None, now_ns: int | None = None) -> int:
        """The replica of a request being dispatched (of conversation ``conversation_id``, if any). ``now_ns``,
        the dispatch instant, is for policies that read the replicas' state over time; these two do not."""
        conv = conversation_id
        index = self._sticky.get(conv) if conv is not None else None
        if index is not None and self.down_ns[index] is not None and len(self._live()) < self.n:
            self.rerouted += 1
            index = None
        if index is None:
            index = self._pick()
            if conv is not None:
                self._sticky[conv] = index
        self.in_flight[index] += 1
        self.routed[index] += 1
        return index

    def finished(self, index: int, error_kind: str | None = None) -> None:
        """A request routed to ``index`` ended: it no longer counts in flight; a connect failure counts
        toward down."""
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
