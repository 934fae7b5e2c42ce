"""Agent sessions: which requests wait for which replies, and when a waiting request becomes due.

One rule, used by the driver (real time) and the worksheet (virtual time): a request that waits for replies
(``think_after_reply_ns`` set) becomes due one think (tool) time after the *last* of its predecessors' replies
ended. Its predecessors are the trace's ``wait_for_ids`` when the row has them (a step after a fan-out waits for
its previous step and every sub-session's last step), else the previous turn of its conversation (a
``thread.wait_for_reply`` turn).

A session is every conversation whose id starts with the same root: a sub-session's conversation id is its
parent's, ``/`` and a name (``session_of``), so the run keeps a session on one worker and the analysis measures
its makespan from its first scheduled step to its last finished one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

__all__ = ["SUB_SESSION_SEP", "ReplyWaits", "reply_dependencies", "session_of", "sub_session_id"]

#: Between a session's id and a sub-session's name in a conversation id.
SUB_SESSION_SEP = "/"


def session_of(conversation_id: str) -> str:
    """The session a conversation belongs to: its id up to the first ``SUB_SESSION_SEP``."""
    return conversation_id.split(SUB_SESSION_SEP, 1)[0]


def sub_session_id(parent_conversation: str, name: str) -> str:
    """A sub-session's conversation id under its parent's session."""
    return f"{parent_conversation}{SUB_SESSION_SEP}{name}"


def reply_dependencies(
    request_ids: Sequence[str],
    conversation_ids: Sequence[str | None],
    turn_indexes: Sequence[int | None],
    think_after_reply_ns: Sequence[int | None],
    wait_for_ids: Sequence[Sequence[str] | None] | None,
) -> dict[int, list[int]]:
    """Per waiting row (position), the positions of the requests whose replies it waits for.

    An id in ``wait_for_ids`` that is not among these rows (another worker's, or cut off the trace) is not
    waited for; a waiting row left with no predecessor is due at its offset, as an unwaiting one."""
    position = {rid: i for i, rid in enumerate(request_ids)}
    turns: dict[tuple[str | None, int | None], int] = {
        (c, k): i for i, (c, k) in enumerate(zip(conversation_ids, turn_indexes, strict=True)) if c is not None
    }
    deps: dict[int, list[int]] = {}
    for i, think in enumerate(think_after_reply_ns):
        if think is None:
            continue
        named = wait_for_ids[i] if wait_for_ids is not None else None
        if named is not None:
            found = [position[r] for r in named if r in position]
        else:
            prev = turns.get((conversation_ids[i], (turn_indexes[i] or 0) - 1))
            found = [prev] if prev is not None and turn_indexes[i] else []
        if found:
            deps[i] = found
    return deps


@dataclass
class ReplyWaits:
    """Which waiting requests a finished reply releases, and when they are due."""

    deps: dict[int, list[int]]
    think_ns: Sequence[int | None]
    _left: dict[int, int] = field(init=False)
    _last_end: dict[int, int] = field(init=False)
    _dependents: dict[int, list[int]] = field(init=False)

    def __post_init__(self) -> None:
        self._left = {j: len(d) for j, d in self.deps.items()}
        self._last_end = {}
        self._dependents = {}
        for j, preds in self.deps.items():
            for i in preds:
                self._dependents.setdefault(i, []).append(j)

    def waiting(self) -> set[int]:
        """Rows not due at their offset (they wait for replies)."""
        return set(self.deps)

    def has_dependents(self, i: int) -> bool:
        return i in self._dependents

    def ended(self, i: int, t_ns: int) -> list[tuple[int, int]]:
        """Row i's reply ended at ``t_ns``: ``(due ns, row)`` of every row this was the last wait of."""
        out = []
        for j in self._dependents.get(i, ()):
            self._left[j] -= 1
            self._last_end[j] = max(self._last_end.get(j, t_ns), t_ns)
            if self._left[j] == 0:
                out.append((self._last_end[j] + int(self.think_ns[j] or 0), j))
        return out
