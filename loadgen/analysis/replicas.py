"""Per-replica breakdown of a run with several target URLs (``loadgen run --target A --target B``).

Each request row names the replica it was routed to (``target_index``, in the manifest's ``targets``
order; null: never routed, or a run with one target). Over the same requests as the tables (scheduled
in the window, cold ones apart), each replica gets: requests routed, sent, completed (ok), failed (as
in the tables: error, timeout, never sent), its error kinds, TTFT and ITL p50/p99 with their 95%
intervals. The rows plus ``not_routed`` add up to the overall ``n_scheduled``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from loadgen.stats.percentiles import SortedParts, summarize_parts, summarize_sorted

__all__ = ["replica_codes", "replica_breakdown"]


def replica_codes(target_index: np.ndarray) -> tuple[np.ndarray, int]:
    """(per request: replica index, -1 when not routed; replica count) from the float column."""
    codes = np.where(np.isnan(target_index), -1, target_index).astype(np.int64)
    return codes, int(codes.max()) + 1 if len(codes) else 0


def _kinds(status: np.ndarray, kind: np.ndarray) -> dict[str, int]:
    labels = [str(k) if isinstance(k, str) else str(s) for s, k in zip(status, kind, strict=True)]
    out: dict[str, int] = {}
    for label in labels:
        out[label] = out.get(label, 0) + 1
    return dict(sorted(out.items()))


def replica_breakdown(
    codes: np.ndarray,
    urls: list[str],
    scope: np.ndarray,
    masks: dict[str, np.ndarray],
    cols: dict[str, np.ndarray],
    ttft_ms: np.ndarray,
    itl_sorted: list[SortedParts],
) -> dict[str, Any]:
    """The ``replicas`` section: one row per replica, and the requests of the scope routed nowhere.

    ``masks``: ``ok``, ``failed`` and ``counted`` (ok + abandoned: the TTFT sample) per request;
    ``itl_sorted``: per replica, the per-token gaps (ms) of its counted requests, as sorted parts.
    """
    n_rep = max(len(urls), len(itl_sorted), int(codes.max()) + 1 if len(codes) else 0)
    rows = []
    for r in range(n_rep):
        mine = scope & (codes == r)
        failed = mine & masks["failed"]
        ttft = ttft_ms[mine & masks["counted"]]
        itl = itl_sorted[r] if r < len(itl_sorted) else SortedParts([])
        rows.append(
            {
                "target_index": r,
                "base_url": urls[r] if r < len(urls) else None,
                "n_scheduled": int(mine.sum()),
                "sent": int((mine & ~np.isnan(cols["sent_ns"])).sum()),
                "completed": int((mine & masks["ok"]).sum()),
                "failed": int(failed.sum()),
                "error_kinds": _kinds(cols["status"][failed], cols["error_kind"][failed]),
                "ttft_ms": summarize_sorted(np.sort(ttft[~np.isnan(ttft)])),
                "itl_ms": summarize_parts(itl),
            }
        )
    return {"replicas": rows, "not_routed": int((scope & (codes < 0)).sum())}
