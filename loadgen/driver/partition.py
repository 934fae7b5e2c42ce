"""How a run is split over workers: which requests a worker replays, and what it is told about the start.

A request goes to the worker ``hash(session of conversation_id, or request_id) mod N`` (BLAKE2b, so the same
trace gives the same split on every host and Python). A conversation, and an agent session with its
sub-sessions (``loadgen.workload.sessions.session_of``), therefore stays on one worker (its steps may wait for
each other's replies), and every worker replays a thinned copy of the same arrival process:
its requests keep their scheduled offsets from the one shared start instant.

A concurrency bound (closed loop, or the open loop's ``max_in_flight``) and a client-side rate cap are
divided between the workers, so together they apply the bound the run asked for.
"""

from __future__ import annotations

import hashlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

from loadgen.workload.sessions import session_of

if TYPE_CHECKING:
    from .client import RunContext

__all__ = ["Shard", "shard_index", "shard_of", "shard_sizes", "split_bound", "worker_name"]


def worker_name(worker_id: int) -> str:
    """The shard prefix of worker ``worker_id``: its part files are ``part-w0-*.parquet``."""
    return f"w{worker_id}"


def shard_of(key: str, workers: int) -> int:
    """The worker (0 ... workers-1) that replays the requests keyed ``key``."""
    digest = hashlib.blake2b(key.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") % workers


def shard_index(table: pa.Table, workers: int) -> np.ndarray:
    """Per trace row, its worker: by session (when the row has a conversation), else by request id."""
    ids = table.column("request_id").to_pylist()
    convs = (
        table.column("conversation_id").to_pylist() if "conversation_id" in table.column_names else [None] * len(ids)
    )
    # a conversation id and a request id that happen to be equal still key the same worker: harmless
    return np.fromiter(
        (shard_of(session_of(c) if c is not None else r, workers) for r, c in zip(ids, convs, strict=True)),
        dtype=np.int32,
        count=len(ids),
    )


def shard_sizes(table: pa.Table, workers: int) -> list[int]:
    """Requests per worker."""
    return np.bincount(shard_index(table, workers), minlength=workers).astype(int).tolist()


def split_bound(total: int | None, workers: int, worker_id: int) -> int | None:
    """Worker ``worker_id``'s part of a bound of ``total`` (the parts add up to it; None stays None)."""
    if total is None:
        return None
    return total // workers + (1 if worker_id < total % workers else 0)


@dataclass
class Shard:
    """What ``run_trace`` needs to replay one worker's part of a run.

    ``start_gate`` is awaited once everything is ready to send (files open, connections up); it returns
    the run's anchor on this process's ``perf_counter_ns`` clock: the shared start instant, corrected
    for this worker's clock offset. ``live`` is set by ``run_trace`` before the gate: the replay's
    RunContext, whose live counters the worker reports to the coordinator's progress line. ``lag_ns`` is
    filled by ``run_trace`` at the end: the raw send lags, so the coordinator can give exact percentiles
    over every worker.
    """

    worker_id: int
    workers: int
    start_gate: Callable[[], Awaitable[int]]
    live: RunContext | None = None
    lag_ns: list[int] = field(default_factory=list)
    dispatched: int = 0

    @property
    def name(self) -> str:
        return worker_name(self.worker_id)

    def select(self, table: pa.Table) -> pa.Table:
        """This worker's rows of the trace, in trace order."""
        return table.filter(pa.array(shard_index(table, self.workers) == self.worker_id))
