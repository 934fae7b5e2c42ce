"""Tool calls of a generated agent session (a class's ``thread.tool_calls``).

A step that is not its session's last (a sub-session's too) ends, with probability ``share``, in one tool call
of ``tokens`` output tokens, drawn on top of its answer: the row's ``output_tokens`` grows by them and its
``tool_call_tokens`` says how many of the last output tokens are the call. Every draw comes from the class's
own tool-call stream, in the order the steps are generated, so a scenario without ``tool_calls`` gives the
same trace as before.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from loadgen.workload.distributions import sample_tokens
from loadgen.workload.scenario import ToolCalls

__all__ = ["ToolCallDraws"]

_BLOCK = 4096  # draws taken from the stream at once


class ToolCallDraws:
    """One class's tool-call draws: per step, a uniform against ``share`` and a length, in blocks."""

    def __init__(self, tools: ToolCalls, rng: np.random.Generator, base_dir: Path) -> None:
        self.tools, self.rng, self.base_dir = tools, rng, base_dir
        self.u = np.empty(0)
        self.tokens = np.empty(0, np.int64)
        self.k = 0

    def next(self, final: bool) -> int | None:
        """The next step's tool-call tokens (None: its reply is text alone); a session's final step has none
        and takes no draw."""
        if final:
            return None
        if self.k == len(self.u):
            self.u = self.rng.random(_BLOCK)
            self.tokens = sample_tokens(self.tools.tokens, self.rng, _BLOCK, self.base_dir)
            self.k = 0
        u, tokens = float(self.u[self.k]), int(self.tokens[self.k])
        self.k += 1
        return tokens if u < self.tools.share else None
