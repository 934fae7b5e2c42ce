"""Sub-sessions of a generated agent session (a class's ``thread.fanout``).

After a parent step, with probability ``share``, ``width`` sub-sessions start. Each is a chain of ``turns``
steps like the parent's: its first step waits for the parent step's reply, each later one for its previous
step, each one tool time (the class's ``think_time_s``) after the reply; its first prompt is a fresh input
draw and its context grows as the parent's does. The parent's next step waits for its previous step and the
last step of each sub-session. Every draw comes from the class's own fan-out stream, so a scenario without
``fanout`` gives the same trace as before.

Rows are tuples in ``generate``'s layout; a row's key is ``(conversation id, turn)`` and its waits are the
keys it waits for (``generate`` turns both into request ids once the trace is ordered).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from loadgen.util.errors import TraceError
from loadgen.util.limits import MAX_TOKENS
from loadgen.workload.distributions import mean, sample, sample_tokens
from loadgen.workload.scenario import RequestClass, Thread
from loadgen.workload.sessions import sub_session_id

from .toolcalls import ToolCallDraws

__all__ = ["FanoutDraws", "requests_per_session"]

_NS = 1_000_000_000
Key = tuple[str, int]


def requests_per_session(thread: Thread | None, base_dir: Path) -> float:
    """Expected requests of one session: its turns, plus the sub-sessions' steps after each but the last."""
    if thread is None:
        return 1.0
    turns = mean(thread.turns, base_dir)
    fan = thread.fanout
    if fan is None:
        return turns
    return turns + max(turns - 1.0, 0.0) * fan.share * mean(fan.width, base_dir) * mean(fan.turns, base_dir)


class FanoutDraws:
    """A class's fan-out: whether a step fans out, and the sub-sessions' rows."""

    def __init__(
        self,
        cname: str,
        cls: RequestClass,
        rng: np.random.Generator,
        base_dir: Path,
        where: str,
        tools: ToolCallDraws | None = None,
    ) -> None:
        assert cls.thread is not None and cls.thread.fanout is not None
        self.cname, self.cls, self.rng, self.base_dir, self.where = cname, cls, rng, base_dir, where
        self.tools = tools  # the class's tool calls (a sub-session's steps but its last may end in one)
        self.fan = cls.thread.fanout
        self.think = cls.thread.think_time_s

    def _draw(self, dist, n: int) -> np.ndarray:
        return sample_tokens(dist, self.rng, n, self.base_dir)

    def spawn(self, parent: Key, t_s: float, arrival: int) -> tuple[list[tuple], list[Key], float]:
        """Sub-sessions after parent step ``parent`` (its open-loop instant ``t_s``): their rows, the keys of
        their last steps and the latest of their open-loop instants (``t_s`` when none starts)."""
        if self.rng.random() >= self.fan.share:
            return [], [], t_s
        width = int(self._draw(self.fan.width, 1)[0])
        rows: list[tuple] = []
        lasts: list[Key] = []
        latest = t_s
        for b in range(width):
            conv = sub_session_id(parent[0], f"f{parent[1]}.{b}")
            sub_rows, end_s = self._sub_session(conv, parent, t_s, arrival)
            rows.extend(sub_rows)
            lasts.append((conv, len(sub_rows) - 1))
            latest = max(latest, end_s)
        return rows, lasts, latest

    def _sub_session(self, conv: str, parent: Key, t_s: float, arrival: int) -> tuple[list[tuple], float]:
        n = int(self._draw(self.fan.turns, 1)[0])
        new_in, outs = self._draw(self.cls.input_tokens, n), self._draw(self.cls.output_tokens, n)
        think = sample(self.think, self.rng, n, self.base_dir)
        rows: list[tuple] = []
        context = 0
        waits: Key = parent
        for k in range(n):
            t_s += float(think[k])
            prompt = context + int(new_in[k])
            if prompt > MAX_TOKENS:
                raise TraceError(
                    f"{self.where}: a sub-session's prompt reaches {prompt} tokens: expected at most {MAX_TOKENS} "
                    "(lower fanout.turns or token lengths)"
                )
            tool = self.tools.next(k + 1 == n) if self.tools is not None else None
            out = int(outs[k]) + (tool or 0)
            if out > MAX_TOKENS:
                raise TraceError(
                    f"{self.where}: a sub-session's answer and tool call reach {out} output tokens: expected at "
                    f"most {MAX_TOKENS} (lower output_tokens or tool_calls.tokens)"
                )
            think_ns = round(float(think[k]) * _NS)
            rows.append(
                (round(t_s * _NS), arrival, k, self.cname, prompt, out, None, None, conv, k, None, think_ns, None)
                + ((conv, k), [waits], tool)
            )
            context, waits = prompt + out, (conv, k)
        return rows, t_s
