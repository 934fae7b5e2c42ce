"""The samples behind a run's per-class latency tables, for comparing runs (``loadgen diff``).

``class_samples`` opens a run as ``analyze_run`` does (same window, same cold-start rule, same masks) and yields,
per class, the ascending samples of each metric as ``SortedParts``: TTFT and TPOT over requests that produced
tokens (ok or abandoned), E2E over ok requests, ITL over every token gap. Per-token ITL samples may be spilled
to disk; they stay readable until the block ends.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from loadgen.rundir.io import read_run_manifest
from loadgen.stats.percentiles import SortedParts
from loadgen.workload.scenario import scenario_from_manifest

from .analyze import _Run, _sorted, _sorted_parts

__all__ = ["SAMPLE_METRICS", "class_samples", "union"]

#: The metrics ``class_samples`` yields (ms); all but ``itl_ms`` hold one value per request.
SAMPLE_METRICS = ("ttft_ms", "tpot_ms", "e2e_ms", "itl_ms")


@contextmanager
def class_samples(
    run_dir: Path | str, *, window: Any = None, include_cold: bool = False
) -> Iterator[dict[str, dict[str, SortedParts]]]:
    """``{class: {metric: SortedParts}}`` of one run, valid inside the block."""
    run_dir = Path(run_dir)
    manifest = read_run_manifest(run_dir)
    run = _Run(run_dir, manifest, scenario_from_manifest(manifest), window, include_cold)
    try:
        out: dict[str, dict[str, SortedParts]] = {}
        for i, name in enumerate(run.class_names):
            sel = run.scope & (run.cls == i)
            produced, ok = sel & (run.ok | run.abandoned), sel & run.ok
            out[name] = {
                "ttft_ms": SortedParts([_sorted(run.values["ttft_ms"][produced])]),
                "tpot_ms": SortedParts([_sorted(run.values["tpot_ms"][produced])]),
                "e2e_ms": SortedParts([_sorted(run.values["e2e_ms"][ok])]),
                "itl_ms": _sorted_parts([run.itl_desc[i]]),
            }
        yield out
    finally:
        run.gap_sink.close()


def union(parts: list[SortedParts]) -> SortedParts:
    """Several runs' samples of one metric as one sample (repeats pooled)."""
    return SortedParts([p for sp in parts for p in sp.parts], parts[0].scale if parts else 1.0)
