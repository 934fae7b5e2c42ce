"""Reading a sampled curve: the one piecewise-linear rule the operator profiles and the measured link share."""

from __future__ import annotations

import bisect
from collections.abc import Sequence

__all__ = ["interp_axis"]


def interp_axis(keys: Sequence[float], values: Sequence[float], x: float) -> float:
    """``values`` at ``x`` on sorted ``keys``: linear between points, the first value below the first key,
    linear from the last two points above the last key."""
    if x <= keys[0] or len(keys) == 1:
        return float(values[0])
    i = bisect.bisect_right(keys, x)
    if i >= len(keys):
        i = len(keys) - 1
    x0, x1 = keys[i - 1], keys[i]
    return values[i - 1] + (x - x0) / (x1 - x0) * (values[i] - values[i - 1])
