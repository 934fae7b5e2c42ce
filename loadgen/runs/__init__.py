"""Runs over time: a catalog of every run and plan directory, and the diff of two runs (or groups of repeats).

- ``catalog``: ``loadgen runs index|list|show``: identity and headline figures per class of every run and plan
  directory found, in one local DuckDB file, indexed incrementally (pointers and summaries, never the Parquet);
- ``headline``: the per-class headline figures a catalog row holds, from a run's requests table;
- ``diff``: ``loadgen diff BASE CANDIDATE``: per class and metric, the change in p50/p95/p99 with a
  distribution-free interval on the difference, and a verdict (regressed, improved, no change, inconclusive).
"""

from __future__ import annotations

from .catalog import Catalog, default_catalog_path
from .diff import DiffResult, diff_runs

__all__ = ["Catalog", "DiffResult", "default_catalog_path", "diff_runs"]
