"""Held out: how well the profiled cost model's linear reading predicts the profile's own measured points.

The three measured runs exercise a small part of an operator profile (two models, TP 1, up to 128 or 256
decodes). This module checks the rest against the profile itself, with the very functions that price a step
(``loadgen.sim.profile``: ``interp_axis`` for the dense, per-sequence and MoE tables, ``_Attention.at`` for
the attention grid):

- **leave one out**: each interior measured point of a table (an axis value with profiled points on both
  sides) is removed and read back from the rest. Dense operators by tokens, per-sequence operators by
  sequences, the MoE kernel by tokens at each profiled expert count, and each attention grid (decode-only;
  with a prefill chunk) along each of its axes in turn: every grid cell at the removed axis value is one point.
- **thinned profile**: every table cut to every other profiled point (``thin_profile``); a step priced by it
  against the full profile is the error of a step whose coordinates fall between profiled points.

Errors are signed percentages of the measured time: 100 x (predicted - measured) / measured. They measure the
interpolation only: not the step model's composition (which operators, how many times), nor the scheduler.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from loadgen.stats.percentiles import percentile

from .profile import OperatorProfile, _Attention, interp_axis

__all__ = [
    "ATTENTION_AXES",
    "ErrorSummary",
    "HeldOut",
    "attention_leave_one_out",
    "leave_one_out",
    "profile_leave_one_out",
    "summarize_errors",
    "thin_profile",
]

#: The attention grid's axes, in ``_Attention`` order.
ATTENTION_AXES = ("prefill_chunk", "kv_prefill", "n_decode", "kv_decode")
#: Per axis: is 0 a point of its own (a positive value below the first positive point is held there)?
_ZERO_ALONE = (True, False, True, True)


@dataclass(frozen=True)
class HeldOut:
    """One measured point read back from its table without it (µs); ``at``: its coordinates on the table."""

    at: tuple[float, ...]
    measured_us: float
    predicted_us: float

    @property
    def error_pct(self) -> float:
        """Signed error of the prediction, % of the measured time."""
        return 100.0 * (self.predicted_us - self.measured_us) / self.measured_us


@dataclass(frozen=True)
class ErrorSummary:
    """Errors of a set of points (%): absolute median, p90 (numpy-linear), maximum; signed median."""

    points: int
    median_abs_pct: float
    p90_abs_pct: float
    max_abs_pct: float
    median_signed_pct: float


def summarize_errors(errors_pct: Sequence[float]) -> ErrorSummary:
    """The summary of signed % errors (all 0 for no points)."""
    if not errors_pct:
        return ErrorSummary(0, 0.0, 0.0, 0.0, 0.0)
    absolute = [abs(e) for e in errors_pct]
    return ErrorSummary(
        points=len(errors_pct),
        median_abs_pct=percentile(absolute, 0.5) or 0.0,
        p90_abs_pct=percentile(absolute, 0.9) or 0.0,
        max_abs_pct=max(absolute),
        median_signed_pct=percentile(errors_pct, 0.5) or 0.0,
    )


def leave_one_out(keys: Sequence[int], values: Sequence[float]) -> list[HeldOut]:
    """Each interior point of a one-axis table (sorted ``keys``, µs) read by ``interp_axis`` from the others."""
    out = []
    for i in range(1, len(keys) - 1):
        if values[i] <= 0:
            continue  # no relative error of a zero time
        rest_keys, rest_values = [*keys[:i], *keys[i + 1 :]], [*values[:i], *values[i + 1 :]]
        out.append(HeldOut((keys[i],), values[i], interp_axis(rest_keys, rest_values, keys[i])))
    return out


def _axes(grid: _Attention) -> list[list[int]]:
    return [grid.pc, grid.kp, grid.nd, grid.kd]


def _take(t: Any, depth: int, keep: Sequence[bool]) -> Any:
    """The nested list ``t`` with the entries at ``depth`` whose ``keep`` is False left out."""
    if depth == 0:
        return [row for row, kept in zip(t, keep, strict=True) if kept]
    return [_take(row, depth - 1, keep) for row in t]


def _subgrid(grid: _Attention, axis: int, keep: Sequence[bool]) -> _Attention:
    """The grid with the values of one axis whose ``keep`` is False left out."""
    axes = _axes(grid)
    axes[axis] = [v for v, kept in zip(axes[axis], keep, strict=True) if kept]
    return _Attention(axes[0], axes[1], axes[2], axes[3], _take(grid.t, axis, keep))


def _interior(axis: Sequence[int], zero_alone: bool) -> range:
    """Indices of an axis' values with a point on each side that a reading between them would use."""
    first = 1 if zero_alone and axis[0] == 0 else 0
    return range(first + 1, len(axis) - 1)


def attention_leave_one_out(grid: _Attention, axis: int) -> list[HeldOut]:
    """Along axis ``axis`` (index into ``ATTENTION_AXES``): each interior axis value removed, every grid cell at
    it read by ``_Attention.at`` from the grid without that value (``at``: the cell's four coordinates)."""
    axes = _axes(grid)
    out = []
    for i in _interior(axes[axis], _ZERO_ALONE[axis]):
        thinned = _subgrid(grid, axis, [j != i for j in range(len(axes[axis]))])
        for a, pc in enumerate(grid.pc):
            for b, kp in enumerate(grid.kp):
                for c, nd in enumerate(grid.nd):
                    for d, kd in enumerate(grid.kd):
                        value = grid.t[a][b][c][d]
                        if (a, b, c, d)[axis] != i or value is None or value <= 0:
                            continue
                        out.append(HeldOut((pc, kp, nd, kd), value, thinned.at(pc, kp, nd, kd)))
    return out


def profile_leave_one_out(profile: OperatorProfile) -> dict[str, list[HeldOut]]:
    """Every table of a profile, left one out: table name -> its held-out points."""
    tables: dict[str, list[HeldOut]] = {}
    for name, (keys, values) in profile.dense_us.items():
        tables[f"dense {name} (tokens)"] = leave_one_out(keys, values)
    for name, (keys, values) in profile.per_sequence_us.items():
        tables[f"per-sequence {name} (sequences)"] = leave_one_out(keys, values)
    for experts, (keys, values) in sorted(profile.moe_us.items()):
        tables[f"moe {experts} experts (tokens)"] = leave_one_out(keys, values)
    for kind, grid in (("decode-only", profile.decode_attention), ("with chunk", profile.mixed_attention)):
        for axis, name in enumerate(ATTENTION_AXES):
            points = attention_leave_one_out(grid, axis)
            if points:
                tables[f"attention {kind} along {name}"] = points
    return tables


def _thin_keep(axis: Sequence[int]) -> list[bool]:
    """Every other point of an axis: its 0 (if any), its first and last positive value, and every second
    positive value between."""
    positive = [i for i, v in enumerate(axis) if v > 0]
    kept = {i for n, i in enumerate(positive) if n % 2 == 0} | set(positive[-1:])
    return [v <= 0 or i in kept for i, v in enumerate(axis)]


def _thin_table(table: tuple[list[int], list[float]]) -> tuple[list[int], list[float]]:
    keys, values = table
    keep = _thin_keep(keys)
    return [k for k, kept in zip(keys, keep, strict=True) if kept], [
        v for v, kept in zip(values, keep, strict=True) if kept
    ]


def _thin_grid(grid: _Attention) -> _Attention:
    for axis in range(4):
        grid = _subgrid(grid, axis, _thin_keep(_axes(grid)[axis]))
    return grid


def thin_profile(profile: OperatorProfile) -> OperatorProfile:
    """The profile with every table cut to every other profiled point (``_thin_keep`` on each axis; the MoE
    expert counts kept): what the cost model would read had the profiler swept half as densely."""
    return dataclasses.replace(
        profile,
        dense_us={name: _thin_table(t) for name, t in profile.dense_us.items()},
        per_sequence_us={name: _thin_table(t) for name, t in profile.per_sequence_us.items()},
        moe_us={experts: _thin_table(t) for experts, t in profile.moe_us.items()},
        decode_attention=_thin_grid(profile.decode_attention),
        mixed_attention=_thin_grid(profile.mixed_attention),
        mixed_wide=_thin_grid(profile.mixed_wide) if profile.mixed_wide is not None else None,
        _group_delta={},
    )
