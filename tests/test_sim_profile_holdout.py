"""The held-out check of the profiled cost model: hand-made tables with errors computed by hand."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from loadgen.sim.config import PRESETS_DIR
from loadgen.sim.profile import _Attention, load_profile
from loadgen.sim.profile_holdout import (
    attention_leave_one_out,
    leave_one_out,
    profile_leave_one_out,
    summarize_errors,
    thin_profile,
)

PROFILES = PRESETS_DIR / "profiles"
RTX4090 = str(PROFILES / "RTX4090/meta-llama/Llama-3.1-8B/bf16")
LLAMA = str(PROFILES / "models/Llama-3.1-8B.json")


def test_a_linear_table_reads_back_every_interior_point_exactly() -> None:
    held = leave_one_out([1, 2, 4, 8, 16], [3.0 + 2.0 * k for k in (1, 2, 4, 8, 16)])
    assert [h.at for h in held] == [(2,), (4,), (8,)]  # the two ends are not interior
    assert [h.error_pct for h in held] == pytest.approx([0.0, 0.0, 0.0])


def test_a_convex_table_is_overestimated_by_the_chord() -> None:
    held = leave_one_out([1, 2, 3, 4], [1.0, 4.0, 9.0, 16.0])  # k squared
    # 2 from (1, 1) and (3, 9): 5, +25%; 3 from (2, 4) and (4, 16): 10, +11.1%
    assert [h.predicted_us for h in held] == pytest.approx([5.0, 10.0])
    assert [h.error_pct for h in held] == pytest.approx([25.0, 100.0 / 9.0])


def _decode_grid(time_us: Callable[[int, int], float]) -> _Attention:
    nd, kd = [1, 2, 4, 8], [16, 32, 64]
    return _Attention([0], [0], nd, kd, [[[[float(time_us(n, k)) for k in kd] for n in nd]]])


def test_attention_along_each_axis_of_a_bilinear_grid_is_exact() -> None:
    grid = _decode_grid(lambda n, k: 5.0 + 0.01 * n * k)
    along_decodes, along_kv = attention_leave_one_out(grid, 2), attention_leave_one_out(grid, 3)
    assert len(along_decodes) == 2 * 3 and len(along_kv) == 1 * 4  # interior values x the other axis' cells
    assert [h.error_pct for h in along_decodes + along_kv] == pytest.approx([0.0] * 10)
    assert attention_leave_one_out(grid, 0) == []  # a single-value axis has no interior point


def test_attention_convex_in_decodes_is_read_by_the_chord() -> None:
    held = attention_leave_one_out(_decode_grid(lambda n, k: float(n * n)), 2)
    # 2 decodes from 1 and 4: 1 + 15/3 = 6 against 4; 4 from 2 and 8: 4 + 60/3 = 24 against 16: +50% each
    assert {h.at: round(h.predicted_us, 9) for h in held if h.at[3] == 16} == {(0, 0, 2, 16): 6.0, (0, 0, 4, 16): 24.0}
    assert [h.error_pct for h in held] == pytest.approx([50.0] * 6)


def test_errors_are_summarised_by_the_linear_percentile_rule() -> None:
    s = summarize_errors([-10.0, 5.0, 0.0, 20.0])
    # |e| sorted 0, 5, 10, 20: median 7.5, p90 at index 2.7: 10 + 0.7 x 10 = 17; signed median (0 + 5) / 2
    assert (s.points, s.median_abs_pct, s.p90_abs_pct, s.max_abs_pct, s.median_signed_pct) == pytest.approx(
        (4, 7.5, 17.0, 20.0, 2.5)
    )


def test_a_shipped_profile_is_held_out_table_by_table_and_thinned_to_every_other_point() -> None:
    profile = load_profile(RTX4090, 1, LLAMA)
    tables = profile_leave_one_out(profile)
    keys, _ = profile.dense_us["qkv_proj"]
    assert len(tables["dense qkv_proj (tokens)"]) == len(keys) - 2
    assert len(tables["attention decode-only along n_decode"]) == (9 - 2) * 11  # 2..128 decodes x 11 KV lengths
    thinned = thin_profile(profile)
    assert thinned.decode_attention.nd == [1, 4, 16, 64, 256]  # every other, the last kept
    assert thinned.mixed_attention.kp[:3] == [0, 16, 64]  # 0 kept beside the first positive point
    thin_keys, _ = thinned.dense_us["qkv_proj"]
    assert thin_keys[:3] == [1, 3, 5] and thin_keys[-1] == 2048
    # one decode of 16 KV tokens sits on points thinning keeps: the same price
    assert thinned.step_us(0, 0, 1, 16, 1) == pytest.approx(profile.step_us(0, 0, 1, 16, 1))
    assert thinned.step_us(0, 0, 2, 32, 2) != pytest.approx(profile.step_us(0, 0, 2, 32, 2))
