"""One replay through the real driver, and the fixed warm-up set every live target uses."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from loadgen.rundir.manifest import read_manifest

from ..driver import RunSettings, run_trace_sync
from .base import StateResult

__all__ = ["run_driver", "warm_up"]


def run_driver(
    trace_path: Path,
    target_url: str,
    out_dir: Path,
    *,
    model: str | None,
    scenario_path: Path | None,
    state: StateResult | None = None,
    extra_manifest: dict[str, Any] | None = None,
    settings: RunSettings | None = None,
) -> Path:
    """Replay ``trace_path`` against ``target_url`` (``loadgen.driver``); returns the run directory.

    ``state`` becomes the manifest's warm state; ``settings`` the other driver options (order_index, repeat,
    plan_cell, deadline_s, api_key_env, tokenizer, endpoint, ...; progress off unless they say).
    """
    options = (
        RunSettings(progress="off")
        .over(settings)
        .options(
            trace_path=trace_path,
            target_url=target_url,
            out_dir=out_dir,
            model=model,
            scenario_path=scenario_path,
            warm_state=state.label if state else "unknown",
            warm_actions=(state.actions if state else []),
            extra_manifest={**(state.manifest_extra() if state else {}), **(extra_manifest or {})},
        )
    )
    return Path(run_trace_sync(options))


def warm_up(
    url: str,
    model: str | None,
    warmup_trace: Path | None,
    work_dir: Path,
    scenario_path: Path | None,
    api_key_env: str | None = None,
) -> list[str]:
    """Send the fixed warm-up set through the driver; returns what was done, as one action line."""
    if warmup_trace is None:
        return ["warm-up set empty (warmup.requests = 0): no requests sent"]
    if work_dir.exists():
        shutil.rmtree(work_dir)
    run_dir = run_driver(
        warmup_trace,
        url,
        work_dir,
        model=model,
        scenario_path=scenario_path,
        state=StateResult("unknown", False, ["warm-up run"]),
        settings=RunSettings(api_key_env=api_key_env),
    )
    counts = read_manifest(run_dir).status_counts
    total = sum(counts.values())
    return [
        f"warm-up: {total} requests from the cell's own trace (shared prefixes primed) at a fixed rate; "
        f"{counts.get('ok', 0)} ok (run dir {run_dir.name})"
    ]
