"""How much of a replay's figures is chance: the same comparison under perturbations the replay cannot know.

``compare_run`` replays a measured run once. Two things the run does not pin down can move its figures far more
than the step costs do, and a single replay hides by how much:

- **the KV pool** (a run bound by its pool preempts): a block more or fewer changes which request is preempted
  when, and so the tail. The run is replayed on every pool within ``POOL_BLOCKS`` of the one it used (its
  logged pool, or the engine's);
- **the timing of vLLM's DP balancer** (a run with ``data_parallel_size`` > 1): which rank a request of a burst
  lands on depends on when the DP coordinator last published the ranks' counts, which no run logs. The run is
  replayed with the coordinator's first publication after a quiet spell delayed by each of
  ``BALANCER_DELAYS_MS`` (``loadgen.sim.dp_balance``).

Each perturbation gives the worst |error| and the MAPE of every replay, and their range. Nothing is fitted: the
figures of ``compare_run`` itself are the unperturbed replay's. ``loadgen sim validate --measured
--sensitivity`` prints them under each run's table.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from loadgen.sim.config import EngineConfig, load_engine_config

from .offline import RunComparison, compare_run

__all__ = ["POOL_BLOCKS", "BALANCER_DELAYS_MS", "Spread", "run_sensitivity", "add_sensitivity"]

#: KV blocks either side of the replayed pool.
POOL_BLOCKS = 4
#: Delays (ms) added to the DP coordinator's first publication after a quiet spell.
BALANCER_DELAYS_MS = tuple(range(0, 100, 10))


@dataclass
class Spread:
    """One perturbation's replays: each setting's worst figure and MAPE, and their range."""

    perturbation: str  # what was varied, in words
    settings: list[int]  # the values it took (blocks, or ms)
    worst_figures: list[str | None]
    worst_abs_pct: list[float]
    mape_pct: list[float]

    def summary(self) -> str:
        """One line: the worst |error|'s range and median, and the MAPE's range and mean."""
        worst, mape = sorted(self.worst_abs_pct), self.mape_pct
        return (
            f"{self.perturbation} {self.settings[0]:,}-{self.settings[-1]:,}: worst |error| {worst[0]:.1f}-"
            f"{worst[-1]:.1f}% (median {worst[len(worst) // 2]:.1f}%), MAPE {min(mape):.1f}-{max(mape):.1f}% "
            f"(mean {sum(mape) / len(mape):.2f}%) over {len(worst)} replays"
        )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self) | {"summary": self.summary()}


def _spread(perturbation: str, settings: list[int], runs: list[RunComparison]) -> Spread:
    worst = [run.worst or {} for run in runs]
    return Spread(
        perturbation,
        settings,
        [w.get("figure") for w in worst],
        [abs(w.get("signed_pct") or 0.0) for w in worst],
        [run.mape_pct or 0.0 for run in runs],
    )


def run_sensitivity(run_dir: Path | str, config: EngineConfig, anchor: str, settings: dict[str, Any]) -> list[Spread]:
    """The perturbations that apply to ``run_dir`` replayed under ``settings`` (its unperturbed comparison's:
    ``RunComparison.settings``)."""
    spreads = []
    pool = settings.get("num_kv_blocks_used")
    if pool is not None:
        pools = list(range(max(1, int(pool) - POOL_BLOCKS), int(pool) + POOL_BLOCKS + 1))
        runs = [compare_run(run_dir, config, anchor, pool_blocks=blocks) for blocks in pools]
        spreads.append(_spread("KV pool (blocks)", pools, runs))
    if int(settings.get("data_parallel_size") or 1) > 1:
        delays = list(BALANCER_DELAYS_MS)
        runs = [compare_run(run_dir, config, anchor, dp_delay_ns=ms * 1_000_000) for ms in delays]
        spreads.append(_spread("DP balancer's first publication delayed (ms)", delays, runs))
    return spreads


def add_sensitivity(result: dict[str, Any], engine: Path | str, anchor: str) -> dict[str, Any]:
    """``validate_measured``'s result with each run's ``sensitivity`` (its spreads, JSON-ready) added."""
    config = load_engine_config(engine)
    for run in result["runs"]:
        spreads = run_sensitivity(run["run_dir"], config, anchor, run["settings"])
        run["sensitivity"] = [spread.to_dict() for spread in spreads]
    return result
