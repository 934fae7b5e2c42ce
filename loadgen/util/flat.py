"""Nested JSON documents as flat dotted keys: one flattening, for a run's identity and for what changed."""

from __future__ import annotations

from typing import Any

__all__ = ["flatten"]


def flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1, "c": [2]}}`` -> ``{"a.b": 1, "a.c": [2]}``: every leaf under its dotted key; a leaf is
    anything but a non-empty dict (a list stays one value, an empty dict too)."""
    if not (isinstance(value, dict) and value):
        return {prefix: value}
    out: dict[str, Any] = {}
    for key, sub in value.items():
        out.update(flatten(sub, f"{prefix}.{key}" if prefix else str(key)))
    return out
