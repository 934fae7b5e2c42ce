"""Where the shared public data lies (../shared beside the repo); tests skip when it is absent."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"
TRACES = SHARED / "traces"


def shared_trace(relative: str) -> Path:
    """Path of a file under ../shared/traces, or skip the test with the reason."""
    path = TRACES / relative
    if not path.exists():
        pytest.skip(f"shared data not present: {path} (the repo's ../shared/traces is absent here)")
    return path
