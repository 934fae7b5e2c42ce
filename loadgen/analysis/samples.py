"""The samples behind a run's per-class latency tables, for comparing runs (``loadgen diff``).

``class_samples`` opens a run as ``analyze_run`` does (same window, same cold-start rule, same masks) and yields,
per class, the ascending samples of each metric as ``SortedParts``: TTFT and TPOT over requests that produced
tokens (ok or abandoned), E2E over ok requests, ITL over every token gap; and the per-request metrics again in
the order the requests were scheduled (``ordered``), for judging how dependent neighbouring requests are.
Per-token ITL samples may be spilled to disk; they stay readable until the block ends.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from loadgen.rundir.io import read_run_manifest
from loadgen.stats.percentiles import SortedParts
from loadgen.workload.scenario import scenario_from_manifest

from .analyze import _Run, _sorted, _sorted_parts

__all__ = ["SAMPLE_METRICS", "RunSamples", "class_samples", "union"]

#: The metrics ``class_samples`` yields (ms); all but ``itl_ms`` hold one value per request.
SAMPLE_METRICS = ("ttft_ms", "tpot_ms", "e2e_ms", "itl_ms")


@dataclass
class RunSamples:
    """``sorted[class][metric]``: ascending samples; ``ordered[class][metric]``: per-request values in scheduled
    order (TTFT, TPOT, E2E)."""

    sorted: dict[str, dict[str, SortedParts]] = field(default_factory=dict)
    ordered: dict[str, dict[str, np.ndarray]] = field(default_factory=dict)
    #: per class: 1.0 for each failed request in scope, 0.0 for the others, in scheduled order ("failed" as the
    #: analysis' error share: not ok and not a planned abandonment; a planned abandonment counts, as not failed)
    failed_ordered: dict[str, np.ndarray] = field(default_factory=dict)


@contextmanager
def class_samples(run_dir: Path | str, *, window: Any = None, include_cold: bool = False) -> Iterator[RunSamples]:
    """The samples of one run, valid inside the block."""
    run_dir = Path(run_dir)
    manifest = read_run_manifest(run_dir)
    run = _Run(run_dir, manifest, scenario_from_manifest(manifest), window, include_cold)
    try:
        out = RunSamples()
        order = np.argsort(run.c["scheduled_ns"], kind="stable")
        for i, name in enumerate(run.class_names):
            sel = run.scope & (run.cls == i)
            produced, ok = sel & (run.ok | run.abandoned), sel & run.ok
            masks = {"ttft_ms": produced, "tpot_ms": produced, "e2e_ms": ok}
            ordered = {m: run.values[m][order][mask[order]] for m, mask in masks.items()}
            ordered = {m: v[~np.isnan(v)] for m, v in ordered.items()}
            out.ordered[name] = ordered
            out.sorted[name] = {m: SortedParts([_sorted(v)]) for m, v in ordered.items()}
            out.sorted[name]["itl_ms"] = _sorted_parts([run.itl_desc[i]])
            out.failed_ordered[name] = run.failed[order][sel[order]].astype(np.float64)
        yield out
    finally:
        run.gap_sink.close()


def union(parts: list[SortedParts]) -> SortedParts:
    """Several runs' samples of one metric as one sample (repeats pooled)."""
    return SortedParts([p for sp in parts for p in sp.parts], parts[0].unit if parts else 1.0)
