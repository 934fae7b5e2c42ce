"""vLLM's own load balancer over the data-parallel ranks behind one API server, in virtual time.

A vLLM server started with ``--data-parallel-size N`` (one API server, N engine cores) routes each request
itself. vLLM 0.19 (read, not copied: ``vllm/v1/engine/core_client.py`` ``DPLBAsyncMPClient
.get_core_engine_for_request``, ``vllm/v1/engine/coordinator.py``):

- each engine core reports its scheduler's waiting and running counts when they change, as it schedules a
  step, numbered by the ranks' common step count (DP ranks step together, an idle one on dummy batches);
- the DP coordinator publishes the counts of the last step every rank completed to the API server, 100 ms after
  its last publication while they keep changing and, after a quiet spell, no sooner than 50 ms after the last
  report until it holds a complete step (its poll's least wait);
- a request goes to the rank with the lowest ``4 × waiting + running`` over the last published counts, the
  lowest rank winning a tie (one API server starts its scan at rank 0);
- between two publications the API server adds each request it routes to its rank's waiting count, so a burst
  spreads over the ranks instead of piling onto the one that looked least loaded.

Not conversation-sticky: vLLM 0.19's balancer knows nothing of prefixes. The coordinator is emulated from the
ranks' reports (``observe``): a rank reports as it schedules a step (vLLM's, a little later, after its engine
core's loop turn), with no messaging delay. The figures depend on the clock's timing: ``loadgen sim validate
--measured --sensitivity`` prints their spread as the coordinator's first wait after a quiet spell grows by
0-90 ms.

The client's replica routing (``loadgen.workload.routing``) is a different thing: N servers behind a client-side
policy. This is one server's internal routing; ``sim validate --measured`` uses it for a run with
``data_parallel_size`` > 1. A fleet of expert-parallel engines is both (``ServerRouter``): the client's policy
picks a server (one expert-parallel group of DP ranks), and that server's balancer picks the rank.
"""

from __future__ import annotations

from collections import deque
from typing import Final, Literal

from loadgen.workload.routing import RoutePolicy, Router

__all__ = [
    "FIRST_PUBLISH_NS",
    "PUBLISH_INTERVAL_NS",
    "WAITING_WEIGHT",
    "VLLM_DP",
    "SimRoutePolicy",
    "VllmDpBalancer",
    "ServerRouter",
    "dp_servers",
]

#: The worksheet's name for this routing, beside the client policies ``loadgen.workload.routing`` has.
VLLM_DP: Final = "vllm-dp"
#: What a simulated fleet can route by: a client policy over N servers, or vLLM's over one server's DP ranks.
SimRoutePolicy = Literal["round-robin", "least-in-flight", "vllm-dp"]

#: How often vLLM's DP coordinator publishes the ranks' counts (``min_stats_update_interval_ms`` 100).
PUBLISH_INTERVAL_NS = 100_000_000
#: Its first publication after an idle spell: the least wait of its poll (``min_timeout`` 50 ms).
FIRST_PUBLISH_NS = 50_000_000
#: A waiting request weighs this many running ones in the balancer's score (``waiting * 4 + running``).
WAITING_WEIGHT = 4


class VllmDpBalancer(Router):
    """Routes as vLLM 0.19's API server routes over its data-parallel ranks (module docstring), with its DP
    coordinator emulated from the ranks' reports (``observe``)."""

    def __init__(self, ranks: int, delay_ns: int = 0) -> None:
        super().__init__(ranks, "least-in-flight")
        # added to the coordinator's least wait after a quiet spell: how much of a replay's figures is the
        # publication clock's timing (``loadgen.calibration.sensitivity``); 0 in a replay
        self.delay_ns = delay_ns
        self.published: list[list[int]] = [[0, 0] for _ in range(ranks)]  # the API server's [waiting, running]
        self.publications = 0
        # the reports not yet taken by the coordinator, in time order: (ns, rank, step number, (waiting, running))
        self._reports: deque[tuple[int, int, int, tuple[int, int]]] = deque()
        self._step = 0  # the group's step number: vLLM's DP ranks count steps together (dummy batches when idle)
        self._step_ns: int | None = None
        self._said: list[tuple[int, int] | None] = [None] * ranks
        # the coordinator: its counts, the newest step reported, whether they changed since it published, the
        # counts of the last complete step (taken when a newer step's first report comes), when it published
        self._stats = [[0, 0] for _ in range(ranks)]
        self._last_step = 0
        self._changed = False
        self._step_counts: list[list[int]] | None = None
        self._last_report_ns = 0
        self._last_publish_ns: int | None = None

    def observe(self, rank: int, now_ns: int, counts: tuple[int, int]) -> None:
        """Rank ``rank`` scheduled a step at ``now_ns`` with ``counts``; its engine core reports them to the
        coordinator if they changed (``_maybe_publish_request_counts``)."""
        if now_ns != self._step_ns:
            self._step, self._step_ns = self._step + 1, now_ns
        if counts != self._said[rank]:
            self._said[rank] = counts
            self._reports.append((now_ns, rank, self._step, counts))

    def _due_ns(self) -> int | None:
        """When the coordinator publishes next, if no report comes first: 100 ms after its last publication,
        and at least 50 ms after the last report while it holds no complete step (its poll's timeouts)."""
        if not self._changed:
            return None
        last = self._last_publish_ns
        after_last = last + PUBLISH_INTERVAL_NS if last is not None else 0
        if self._step_counts is None:
            return max(self._last_report_ns + FIRST_PUBLISH_NS + self.delay_ns, after_last)
        return max(self._last_report_ns, after_last)

    def _advance(self, until_ns: int) -> None:
        """Run the coordinator up to ``until_ns``: its reports and publications, in time order."""
        reports = self._reports
        while True:
            due = self._due_ns()
            report = reports[0] if reports else None
            if due is not None and due <= until_ns and (report is None or due < report[0]):
                self._publish(due)
            elif report is not None and report[0] <= until_ns:
                self._take(reports.popleft())
            else:
                return

    def _take(self, report: tuple[int, int, int, tuple[int, int]]) -> None:
        at_ns, rank, step, (waiting, running) = report
        if step > self._last_step:
            if self._changed:
                self._step_counts = [list(c) for c in self._stats]
            self._last_step = step
        self._stats[rank] = [waiting, running]
        self._changed = True
        self._last_report_ns = at_ns

    def _publish(self, at_ns: int) -> None:
        if self._step_counts is not None:
            counts, self._step_counts = self._step_counts, None
        else:
            counts, self._changed = [list(c) for c in self._stats], False
        self.published = counts
        self._last_publish_ns = at_ns
        self.publications += 1

    def assign(self, conversation_id: str | None, now_ns: int | None = None) -> int:
        """The rank of a request routed at ``now_ns`` (conversations are not sticky in vLLM's balancer)."""
        self._advance(now_ns or 0)
        published = self.published
        index = min(range(self.n), key=lambda i: (WAITING_WEIGHT * published[i][0] + published[i][1], i))
        published[index][0] += 1
        self.in_flight[index] += 1
        self.routed[index] += 1
        return index


def dp_servers(engines: int, ep: int) -> int | None:
    """How many vLLM servers ``engines`` engines of an expert-parallel profile (``ep`` GPUs an MoE layer spreads
    its experts over) are, each ``ep`` DP ranks; None when they are not whole servers of DP ranks."""
    return engines // ep if ep > 1 and engines % ep == 0 else None


class ServerRouter(Router):
    """Servers of ``ranks_per_server`` DP ranks each (engines ``k × ranks .. k × ranks + ranks − 1`` are server
    k): the client's ``policy`` picks the server, as ``loadgen run --target A --target B`` does, and the server's
    own vLLM balancer picks the rank. Engine indices are global; ``routed`` counts per engine."""

    def __init__(self, servers: int, ranks_per_server: int, policy: RoutePolicy, delay_ns: int = 0) -> None:
        super().__init__(servers * ranks_per_server, policy)
        self.ranks = ranks_per_server
        self.client = Router(servers, policy)
        self.balancers = [VllmDpBalancer(ranks_per_server, delay_ns) for _ in range(servers)]

    def observe(self, engine: int, now_ns: int, counts: tuple[int, int]) -> None:
        """Engine ``engine`` scheduled a step: its server's balancer hears of it."""
        self.balancers[engine // self.ranks].observe(engine % self.ranks, now_ns, counts)

    def assign(self, conversation_id: str | None, now_ns: int | None = None) -> int:
        server = self.client.assign(conversation_id, now_ns)
        index = server * self.ranks + self.balancers[server].assign(None, now_ns)
        self.in_flight[index] += 1
        self.routed[index] += 1
        return index

    def finished(self, index: int, error_kind: str | None = None) -> None:
        self.in_flight[index] -= 1
        self.client.finished(index // self.ranks, error_kind)
        self.balancers[index // self.ranks].finished(index % self.ranks, error_kind)
