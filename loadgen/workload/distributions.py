"""Sampling the scenario's length/time distributions: one implementation for traces, ledger and plans."""

from __future__ import annotations

from collections.abc import Iterable
from functools import lru_cache
from pathlib import Path
from typing import cast

import numpy as np

from loadgen.stats.percentiles import percentile_sorted
from loadgen.util.errors import ScenarioError
from loadgen.util.inputfile import read_input_csv, read_input_text
from loadgen.util.limits import MAX_PARAM
from loadgen.workload.scenario import Empirical, Fixed, LogNormal, Mixture, Normal, Uniform

__all__ = ["mean", "quantiles", "sample", "sample_tokens"]

Dist = Fixed | Uniform | Normal | LogNormal | Empirical | Mixture


@lru_cache(maxsize=32)
def _empirical_values(path: str, column: str | None) -> np.ndarray:
    p = Path(path)
    values: list[float] = []
    rows: Iterable[str]
    if column:
        what = f"an empirical distribution: a CSV file with a column {column!r} of numbers"
        rows = (row[column] for row in read_input_csv(p, what, ScenarioError, (column,)))
    else:
        text = read_input_text(p, "an empirical distribution: a file of numbers, one a line", ScenarioError)
        rows = (line.strip() for line in text.splitlines() if line.strip() and not line.startswith("#"))
    for lineno, raw in enumerate(rows, start=1):
        try:
            values.append(float(raw))
        except ValueError:
            raise ScenarioError(f"{p}: value {raw!r} (row {lineno}): expected a number") from None
    if not values:
        raise ScenarioError(f"{p}: no values: expected at least one number")
    bad = next((v for v in values if not 0 <= v <= MAX_PARAM), None)  # NaN fails too
    if bad is not None:
        raise ScenarioError(f"{p}: value {bad!r}: expected a finite number in 0..{MAX_PARAM:g}")
    return np.asarray(values, dtype=np.float64)


def sample(dist: Dist, rng: np.random.Generator, size: int, base_dir: Path | None = None) -> np.ndarray:
    """``size`` float samples of ``dist`` with its min/max clamps applied."""
    if isinstance(dist, Fixed):
        out = np.full(size, dist.value, dtype=np.float64)
    elif isinstance(dist, Uniform):
        out = rng.uniform(dist.low, dist.high, size)
    elif isinstance(dist, Normal):
        out = rng.normal(dist.mean, dist.std, size)
    elif isinstance(dist, LogNormal):
        mu = np.log(dist.mean) - dist.sigma**2 / 2  # arithmetic mean of the log-normal = dist.mean
        out = rng.lognormal(mu, dist.sigma, size)
    elif isinstance(dist, Empirical):
        path = Path(dist.file) if base_dir is None else (base_dir / dist.file)
        values = _empirical_values(str(path), dist.column)
        out = rng.choice(values, size=size, replace=True)
    elif isinstance(dist, Mixture):
        out = _mixture(dist, rng, size, base_dir)
    else:  # pragma: no cover - the scenario schema admits no other kind
        raise TypeError(f"unknown distribution {dist!r}")
    lo = dist.min if dist.min is not None else -np.inf
    hi = dist.max if dist.max is not None else np.inf
    return np.clip(out, lo, hi)


def _mixture(dist: Mixture, rng: np.random.Generator, size: int, base_dir: Path | None) -> np.ndarray:
    """Pick each sample's component by weight (one uniform draw each), then draw every component's samples
    in one go, components in file order: the same rng state gives the same values."""
    weights = np.array([c.weight for c in dist.components], dtype=np.float64)
    which = np.searchsorted(np.cumsum(weights / weights.sum()), rng.random(size), side="right")
    which = which.clip(max=len(weights) - 1)
    out = np.empty(size, dtype=np.float64)
    for k, component in enumerate(dist.components):
        picked = which == k
        out[picked] = sample(component.of, rng, int(picked.sum()), base_dir)
    return out


def sample_tokens(dist: Dist, rng: np.random.Generator, size: int, base_dir: Path | None = None) -> np.ndarray:
    """Token counts: samples rounded to whole tokens, at least 1 (kept below 2^62 so the int cast cannot wrap)."""
    return np.clip(np.rint(sample(dist, rng, size, base_dir)), 1, 2.0**62).astype(np.int64)


def quantiles(
    dist: Dist, qs: list[float], base_dir: Path | None = None, n: int = 200_000, seed: int = 0
) -> list[float]:
    """Quantiles (0..1) of a token distribution by seeded sampling (exact for fixed)."""
    values = np.sort(sample_tokens(dist, np.random.default_rng(seed), n, base_dir))
    return [float(cast(float, percentile_sorted(values, q))) for q in qs]  # n samples: not empty


def mean(dist: Dist, base_dir: Path | None = None, n: int = 200_000, seed: int = 0) -> float:
    """Mean of a token distribution after clamping and rounding (by seeded sampling)."""
    return float(sample_tokens(dist, np.random.default_rng(seed), n, base_dir).mean())
