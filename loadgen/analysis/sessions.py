"""Agent sessions in a run: each session's makespan, and the sample a makespan budget is checked on.

A session is every request whose conversation id has the same root (``loadgen.workload.sessions.session_of``: a
sub-session's conversation is its parent's, ``/`` and a name). Its makespan is its last request's done instant
minus its first request's scheduled instant (first step scheduled -> last step done). A session with a request
that did not finish ok has no makespan; a makespan budget counts it as +inf.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from loadgen.stats.percentiles import summarize_sorted
from loadgen.workload.sessions import session_of

from . import metrics as M

__all__ = ["SessionMakespans", "session_makespans"]


class SessionMakespans:
    """The makespans (ms, ascending) of a group's complete sessions and the count of incomplete ones."""

    def __init__(self, makespans_ms: np.ndarray, n_incomplete: int) -> None:
        self.makespans_ms = makespans_ms
        self.n_incomplete = n_incomplete

    @property
    def n_sessions(self) -> int:
        return len(self.makespans_ms) + self.n_incomplete

    def budget_sample(self) -> np.ndarray:
        """Ascending: complete sessions' makespans, then +inf for each incomplete one."""
        return np.concatenate([self.makespans_ms, np.full(self.n_incomplete, np.inf)])

    def to_dict(self) -> dict[str, Any]:
        return {
            "n_sessions": self.n_sessions,
            "n_incomplete": self.n_incomplete,
            "makespan_ms": summarize_sorted(self.makespans_ms),
        }


def session_makespans(
    conversation_ids: np.ndarray, scheduled_ns: np.ndarray, done_ns: np.ndarray, ok: np.ndarray
) -> SessionMakespans | None:
    """Makespans of the sessions these rows make up (None: no row belongs to a conversation)."""
    first: dict[str, float] = {}
    last: dict[str, float] = {}
    complete: dict[str, bool] = {}
    for conv, sched, done, good in zip(conversation_ids, scheduled_ns, done_ns, ok, strict=True):
        if not isinstance(conv, str):
            continue
        key = session_of(conv)
        first[key] = min(first.get(key, np.inf), sched)
        last[key] = max(last.get(key, -np.inf), done if good else np.inf)
        complete[key] = complete.get(key, True) and bool(good) and not np.isnan(done)
    if not first:
        return None
    spans = [M.makespan_ms(first[k], last[k]) for k in first if complete[k]]
    return SessionMakespans(np.sort(np.asarray(spans, dtype=np.float64)), sum(1 for k in first if not complete[k]))
