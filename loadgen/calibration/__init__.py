"""Calibration of the simulated engine against a real one: measure → fit → predict → verify.

``calibrate`` runs a workload that separates the cost terms against a live engine (or refits existing run
directories), reads the engine's own scheduler limits, fits the cost model robustly and writes an engine
TOML with its provenance. ``validate`` replays held-out traces on the real target and on the worksheet and
writes the fidelity table. The package sits above ``sim`` and ``targets``: it runs workloads through the
target layer and compares the worksheet's predictions with what was measured.
"""

from __future__ import annotations

from .calibrate import TERMS, EngineLimits, Fit, calibrate, engine_limits, fit_cost_model
from .validate import format_table, validate

__all__ = ["TERMS", "EngineLimits", "Fit", "calibrate", "engine_limits", "fit_cost_model", "format_table", "validate"]
