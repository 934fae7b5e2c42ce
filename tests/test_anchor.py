"""Anchoring a calibrated cost model to one launch: the two-factor fit on its own, the scaled terms, and the
KEY check: a live simulated engine whose terms are known multiples of the TOML's is measured (real HTTP, the
calibration workload through the real driver) and the factors come out as those multiples."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from loadgen.calibration.anchor import PREFILL_TERMS, STEP_TERMS, Anchor, anchored, fit_anchor, measure_anchor
from loadgen.calibration.calibrate import TERMS, engine_limits
from loadgen.driver import RunSettings
from loadgen.sim import load_engine_config
from loadgen.util.errors import LoadgenError

TERMS_MS = {"fixed_ms": 20.0, "per_prefill_token_ms": 0.08, "per_decode_seq_ms": 1.5, "per_kv_token_ms": 0.004}


def _toml(path: Path, scale_step: float = 1.0, scale_prefill: float = 1.0, jitter: bool = False) -> Path:
    terms = {k: v * (scale_prefill if k in PREFILL_TERMS else scale_step) for k, v in TERMS_MS.items()}
    cost = "\n".join(f"{k} = {v}" for k, v in terms.items())
    if jitter:
        cost += "\nstep_jitter_ms = [-2.0, -1.0, -0.5, -0.1, 0.0, 0.1, 0.5, 1.0, 3.0]"
    path.write_text(
        f'name = "{path.stem}"\n[scheduler]\nmax_num_seqs = 16\nmax_num_batched_tokens = 512\nmax_model_len = 4096\n'
        f"[kv]\nblock_size = 16\nnum_kv_blocks = 4096\nenable_prefix_caching = false\n[cost]\n{cost}\n"
        '[calibration]\ncalibrated = true\nengine = "loadgen-sim (known terms)"\n'
    )
    return path


def _observations(cfg, step: float, prefill: float, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    rows = []
    for _ in range(120):
        if rng.random() < 0.4:
            p = int(rng.integers(16, 2048))
            rows.append([-(-p // 512), p, 0, p * 2, 1])
        else:
            b = int(rng.integers(1, 16))
            rows.append([1, 0, b, b * int(rng.integers(32, 2000)), 0])
    x = np.array(rows, dtype=float)
    beta = np.array([getattr(cfg.cost, t) for t in TERMS])
    scale = np.array([step if t in STEP_TERMS else prefill for t in TERMS])
    y = (x * beta * scale).sum(axis=1) * rng.normal(1.0, 0.03, len(x))
    return x, y


def test_fit_finds_each_groups_factor(tmp_path: Path):
    cfg = load_engine_config(_toml(tmp_path / "cal.toml"))
    for step, prefill in ((1.0, 1.0), (0.55, 0.8), (1.9, 1.3)):
        x, y = _observations(cfg, step, prefill, np.random.default_rng(1))
        got = fit_anchor(cfg, x, y)
        assert got == pytest.approx((step, prefill), rel=0.05), (step, prefill, got)


def test_a_factor_far_out_of_range_is_refused_in_one_line(tmp_path: Path):
    cfg = load_engine_config(_toml(tmp_path / "cal.toml"))
    x, y = _observations(cfg, 40.0, 1.0, np.random.default_rng(2))
    with pytest.raises(LoadgenError, match=r"^anchor: step factor .*: expected within 0\.2\.\.5") as err:
        fit_anchor(cfg, x, y)
    assert "\n" not in str(err.value)


def test_anchored_scales_each_group_and_keeps_the_jitter(tmp_path: Path):
    cfg = load_engine_config(_toml(tmp_path / "cal.toml", jitter=True))
    out = anchored(cfg, Anchor(0.5, 2.0, 10, []))
    for t in STEP_TERMS:
        assert getattr(out.cost, t) == pytest.approx(getattr(cfg.cost, t) * 0.5)
    for t in PREFILL_TERMS:
        assert getattr(out.cost, t) == pytest.approx(getattr(cfg.cost, t) * 2.0)
    assert out.cost.step_jitter_ms == cfg.cost.step_jitter_ms  # the host's noise, not compute
    assert out.scheduler == cfg.scheduler and out.name == "cal-anchored"
    assert cfg.cost.fixed_ms == TERMS_MS["fixed_ms"]  # the calibrated config is left as it was


@pytest.mark.slow
def test_measured_factors_are_the_live_engines_multiples(sim_server, tmp_path: Path):
    """KEY: the launch runs 1.5× slower steps and 0.7× prefill tokens than the TOML says; the anchor finds it."""
    cal = load_engine_config(_toml(tmp_path / "cal.toml"))
    sim = sim_server(str(_toml(tmp_path / "launch.toml", scale_step=1.5, scale_prefill=0.7)))
    limits = engine_limits(sim.base_url)
    anchor = measure_anchor(sim.base_url, limits, cal, tmp_path / "anchor", {}, RunSettings(tokenizer="cl100k_base"))
    # the prefill factor also carries the request overhead the live server really has (the TOML says 0 ms)
    assert anchor.step_factor == pytest.approx(1.5, rel=0.15), anchor
    assert anchor.prefill_factor == pytest.approx(0.7, rel=0.25), anchor
    assert anchor.observations > 20 and all(Path(d).is_dir() for d in anchor.run_dirs)
    # the line shows the factor as recorded (to_dict rounds to 4 places; 1.50051 is recorded 1.5005, shown 1.500)
    assert anchor.line().startswith(
        f"anchor: this launch ran the calibration workload with step terms ×{anchor.to_dict()['step_factor']:.3f}"
    )
