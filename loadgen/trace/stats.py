"""Trace statistics: duration, rates, burstiness (inter-arrival CV, index of dispersion), token tails.

Definitions (the same as ../shared/traces/SOURCES.md uses, so imported public traces can be checked
against their published figures): IAT CV = population std / mean of gaps between sorted arrivals;
IoD_w = population variance / mean of arrival counts in consecutive w-second windows starting at the
first arrival, the trailing partial window dropped; quantiles are linear-interpolation (numpy default,
the one rule in ``analysis.percentiles``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from loadgen.stats.percentiles import percentile_sorted

__all__ = ["TraceStats", "format_stats", "index_of_dispersion", "trace_stats"]

_NS = 1e9


def index_of_dispersion(times_s: np.ndarray, window_s: float) -> float | None:
    """Variance/mean of counts in ``window_s`` windows from the first arrival; None if < 2 windows."""
    if len(times_s) == 0:
        return None
    rel = times_s - times_s.min()
    n_windows = int(np.floor(rel.max() / window_s))
    if n_windows < 2:
        return None
    counts = np.bincount((rel // window_s).astype(np.int64), minlength=n_windows + 1)[:n_windows]
    m = counts.mean()
    return float(counts.var() / m) if m > 0 else None


def _q(values: np.ndarray) -> dict[str, float | None]:
    if len(values) == 0:
        return {"p50": None, "p95": None, "p99": None, "mean": None, "max": None}
    ordered = np.sort(values)
    p50, p95, p99 = (percentile_sorted(ordered, q) for q in (0.5, 0.95, 0.99))
    return {"p50": p50, "p95": p95, "p99": p99, "mean": float(values.mean()), "max": float(values.max())}


@dataclass
class TraceStats:
    requests: int
    duration_s: float
    mean_rate_rps: float | None
    iat_cv: float | None
    iod: dict[str, float | None]
    prompt_tokens: dict[str, float | None]
    output_tokens: dict[str, float | None]
    classes: dict[str, dict[str, Any]] = field(default_factory=dict)
    conversations: int = 0
    prefix_groups: int = 0
    cancellations: int = 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def trace_stats(table: pa.Table) -> TraceStats:
    """Statistics of a trace table (TRACE_SCHEMA)."""
    offsets = table.column("scheduled_offset_ns").to_numpy().astype(np.float64) / _NS
    offsets = np.sort(offsets)
    n = len(offsets)
    duration = float(offsets[-1] - offsets[0]) if n else 0.0
    gaps = np.diff(offsets)
    iat_cv = float(gaps.std() / gaps.mean()) if len(gaps) and gaps.mean() > 0 else None
    prompt = table.column("prompt_tokens").to_numpy()
    output = table.column("output_tokens").to_numpy()
    classes: dict[str, dict[str, Any]] = {}
    cls_col = np.asarray(table.column("request_class").to_pylist(), dtype=object)
    for name in sorted(set(cls_col.tolist())):
        mask = cls_col == name
        classes[name] = {
            "requests": int(mask.sum()),
            "share": float(mask.mean()),
            "prompt_tokens": _q(prompt[mask]),
            "output_tokens": _q(output[mask]),
        }
    conv = table.column("conversation_id")
    groups = table.column("prefix_group")
    return TraceStats(
        requests=n,
        duration_s=duration,
        mean_rate_rps=(n / duration) if duration > 0 else None,
        iat_cv=iat_cv,
        iod={f"{w}s": index_of_dispersion(offsets, w) for w in (1, 10, 60)},
        prompt_tokens=_q(prompt),
        output_tokens=_q(output),
        classes=classes,
        conversations=len({v for v in conv.to_pylist() if v is not None}),
        prefix_groups=len({v for v in groups.to_pylist() if v is not None}),
        cancellations=int(table.column("cancel_after_tokens").is_valid().to_numpy(zero_copy_only=False).sum()),
    )


def _fmt(v: float | None, digits: int = 3) -> str:
    return "-" if v is None else f"{v:.{digits}g}" if abs(v) < 1000 else f"{v:,.0f}"


def format_stats(stats: TraceStats, metadata: dict[str, Any] | None = None) -> str:
    """A compact human-readable summary."""
    lines = []
    if metadata:
        src = metadata.get("source") or metadata.get("scenario_name")
        lines.append(
            f"trace {metadata.get('trace_name', '-')} from {src} (seed {metadata.get('seed', '-')}, mode {metadata.get('mode', 'open')})"
        )
    lines.append(
        f"requests {stats.requests:,}  duration {stats.duration_s:,.1f} s  mean rate {_fmt(stats.mean_rate_rps, 4)} req/s  "
        f"IAT CV {_fmt(stats.iat_cv, 4)}  IoD 1s/10s/60s {_fmt(stats.iod['1s'])} / {_fmt(stats.iod['10s'])} / {_fmt(stats.iod['60s'])}"
    )
    for label, q in (("prompt tokens", stats.prompt_tokens), ("output tokens", stats.output_tokens)):
        lines.append(
            f"{label:14s} p50 {_fmt(q['p50'], 6)}  p95 {_fmt(q['p95'], 6)}  p99 {_fmt(q['p99'], 6)}  mean {_fmt(q['mean'], 5)}  max {_fmt(q['max'], 6)}"
        )
    for name, c in stats.classes.items():
        lines.append(
            f"  class {name:14s} n {c['requests']:>7,}  share {c['share']:.3f}  prompt p50/p99 {_fmt(c['prompt_tokens']['p50'], 6)}/{_fmt(c['prompt_tokens']['p99'], 6)}"
            f"  output p50/p99 {_fmt(c['output_tokens']['p50'], 6)}/{_fmt(c['output_tokens']['p99'], 6)}"
        )
    lines.append(
        f"conversations {stats.conversations:,}  prefix groups {stats.prefix_groups:,}  cancellations {stats.cancellations:,}"
    )
    return "\n".join(lines)
