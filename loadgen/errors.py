"""One error tree for loadgen; every message is one line naming file, field, value and expectation.

    LoadgenError
    ├── ScenarioError      a scenario or plan file is invalid
    ├── TraceError         a trace file cannot be generated, imported or read
    ├── LedgerError        a model config or engine setting cannot be turned into a ledger
    ├── TargetError        the target endpoint cannot be used at all (run-level, not per request)
    ├── RunDirError        a run directory is missing, incomplete or inconsistent
    ├── EngineError        a real engine could not be set up, launched or identified
    └── PlanError          a load plan or comparison cannot proceed

A failed *request* is never an exception: it is a row with a status and an error kind.
The CLI catches LoadgenError once, prints the message, exits 2.
"""

from __future__ import annotations

__all__ = [
    "LoadgenError",
    "ScenarioError",
    "TraceError",
    "LedgerError",
    "TargetError",
    "RunDirError",
    "EngineError",
    "PlanError",
]


class LoadgenError(Exception):
    """Base of every error loadgen raises on purpose."""


class ScenarioError(LoadgenError):
    """A scenario (or plan/engine config) file is invalid."""


class TraceError(LoadgenError):
    """A trace cannot be generated, imported or read."""


class LedgerError(LoadgenError):
    """A model config or engine setting cannot be turned into a memory ledger."""


class TargetError(LoadgenError):
    """The target cannot be used at all (bad URL, missing API key, unreachable before the run)."""


class RunDirError(LoadgenError):
    """A run directory is missing, incomplete or inconsistent."""


class EngineError(LoadgenError):
    """A real engine (vLLM) could not be set up, launched or identified."""


class PlanError(LoadgenError):
    """A load plan or candidate comparison cannot proceed."""
