"""One error tree for loadgen; every message is one line naming file, field, value and expectation.

    LoadgenError
    ├── ScenarioError      a scenario or plan file is invalid
    ├── TraceError         a trace file cannot be generated, imported or read
    ├── LedgerError        a model config or engine setting cannot be turned into a ledger
    ├── TargetError        the target endpoint cannot be used at all (run-level, not per request)
    ├── RunDirError        a run directory is missing, incomplete or inconsistent
    │   └── RecordWriteError   records could not be written (disk full, I/O error, read-only)
    ├── EngineError        a real engine could not be set up, launched or identified
    └── PlanError          a load plan or comparison cannot proceed

A failed *request* is never an exception: it is a row with a status and an error kind.
The CLI catches LoadgenError once, prints the message, exits 2.
"""

from __future__ import annotations

__all__ = [
    "EngineError",
    "LedgerError",
    "LoadgenError",
    "PlanError",
    "RecordWriteError",
    "RunDirError",
    "ScenarioError",
    "TargetError",
    "TraceError",
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


class RecordWriteError(RunDirError):
    """Writing a run's records failed (ENOSPC, EIO, read-only): the run stops, what was flushed stays readable."""

    def __init__(self, path: object, reason: str) -> None:
        self.path = str(path)
        self.reason = reason
        super().__init__(f"{path}: cannot write: {reason}; the run stopped, records flushed before it are kept")

    @property
    def short(self) -> str:
        """``write error: PATH: REASON`` (for a manifest's ``interrupted_by``)."""
        return f"write error: {self.path}: {self.reason}"


class EngineError(LoadgenError):
    """A real engine (vLLM) could not be set up, launched or identified."""


class PlanError(LoadgenError):
    """A load plan or candidate comparison cannot proceed."""
