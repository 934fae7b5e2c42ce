"""Sequence lengths a workload holds in KV: per-class p50/p99 of prompt + output tokens, by seeded sampling.

Mirrors how the trace generator builds requests (shared prefix + thread context + new input), so the
ledger's per-class concurrency is about the lengths that will actually be replayed, not only the max.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

import numpy as np

from loadgen.stats.percentiles import percentile_sorted
from loadgen.workload.distributions import sample_tokens
from loadgen.workload.scenario import Scenario

__all__ = ["ClassLengths", "class_lengths"]


@dataclass(frozen=True)
class ClassLengths:
    name: str
    samples: int
    prompt_p50: float
    prompt_p99: float
    output_p50: float
    output_p99: float
    total_p50: float  # prompt + output held in KV at the end of a request
    total_p99: float
    prefix_tokens_mean: float  # expected shared-prefix tokens per request (prefix groups × share)
    prefix_tokens: int  # tokens of the largest shared prefix this class uses (0 if none)
    prefix_share: float  # share of requests carrying that prefix


def class_lengths(scenario: Scenario, *, n: int = 20_000, seed: int | None = None) -> list[ClassLengths]:
    """Per-class length quantiles from ``n`` seeded samples per class (turns expanded for long-thread)."""
    base = scenario.base_dir()
    out: list[ClassLengths] = []
    root = scenario.seed if seed is None else seed
    for ci, (name, cls) in enumerate(scenario.classes.items()):
        rng = np.random.default_rng([root, 7331, ci])
        groups = [g for g in scenario.cache.prefix_groups if g.classes is None or name in g.classes]
        u = rng.random(n)
        prefix = np.zeros(n, np.int64)
        acc = 0.0
        for g in groups:
            hit = (u >= acc) & (u < acc + g.share)
            prefix[hit] = g.prefix_tokens
            acc += g.share
        if cls.thread is not None:
            turns = sample_tokens(cls.thread.turns, rng, n, base)
            total_turns = int(turns.sum())
            new_in = sample_tokens(cls.input_tokens, rng, total_turns, base)
            outs = sample_tokens(cls.output_tokens, rng, total_turns, base)
            conv = np.repeat(np.arange(n), turns)
            step = new_in + outs
            # context before turn k = cumulative (in + out) of earlier turns in the same conversation
            csum = np.cumsum(step)
            start = np.concatenate([[0], np.cumsum(turns)[:-1]])
            before = csum - step - np.where(start[conv] > 0, csum[start[conv] - 1], 0)
            prompts = prefix[conv] + before + new_in
        else:
            prompts = prefix + sample_tokens(cls.input_tokens, rng, n, base)
            outs = sample_tokens(cls.output_tokens, rng, n, base)
        totals = prompts + outs
        p_prompt, p_out, p_total = (_p50_p99(x) for x in (prompts, outs, totals))
        big = max((g for g in groups), key=lambda g: g.prefix_tokens, default=None)
        out.append(
            ClassLengths(
                name=name,
                samples=len(totals),
                prompt_p50=p_prompt[0],
                prompt_p99=p_prompt[1],
                output_p50=p_out[0],
                output_p99=p_out[1],
                total_p50=p_total[0],
                total_p99=p_total[1],
                prefix_tokens_mean=float(sum(g.share * g.prefix_tokens for g in groups)),
                prefix_tokens=int(big.prefix_tokens) if big else 0,
                prefix_share=float(big.share) if big else 0.0,
            )
        )
    return out


def _p50_p99(values: np.ndarray) -> tuple[float, float]:
    """(p50, p99) of a non-empty sample by the linear rule (``analysis.percentiles``)."""
    ordered = np.sort(values)
    # non-empty (the caller's contract), so never None
    return float(cast(float, percentile_sorted(ordered, 0.5))), float(cast(float, percentile_sorted(ordered, 0.99)))
