"""The real command in a subprocess, as a user runs it: ``python -m loadgen ARGS`` with this checkout's code."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def run_loadgen(args: list[object], cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """``loadgen ARGS`` in ``cwd`` (120 s at most), its output captured as text; ``env`` adds variables."""
    return subprocess.run(
        [sys.executable, "-m", "loadgen", *map(str, args)],
        cwd=cwd,
        capture_output=True,
        text=True,
        errors="replace",
        timeout=120,
        check=False,
        env={**os.environ, "PYTHONPATH": str(REPO), **env},
    )
