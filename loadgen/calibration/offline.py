"""Offline validation: an engine TOML replayed through the worksheet beside measured (imported) runs.

``sim validate --measured RUN_DIR... --engine ENGINE.toml``. Each run directory is a real engine's run that
carries the engine's own instants (``server_queued_ns``, ``server_scheduled_ns``; ``loadgen import
llmservingsim``). The worksheet replays the run's workload with the run's scheduler settings (``max_num_seqs``,
``max_num_batched_tokens``, data-parallel replicas, and the KV blocks and ``scheduler_reserve_full_isl`` when
the run logged them) over the engine TOML's costs. Where each replayed request arrives, and where both sides'
latencies start, is the anchoring (``ANCHORS``):

* ``workload`` (the default): the imported workload's own arrival instants, as users arrive. The measured side
  starts at each request's frontend arrival on the run clock (``scheduled_ns``: the importer maps the
  frontend's clock onto the engine's by the smallest queued - arrival offset, so the frontend's delay beyond
  that smallest one stays in the measured latency);
* ``queued``: each request arrives when the measured engine queued it, and each side starts at its own engine's
  queued instant (no frontend delay at all). vLLM queues a request between two steps, so a replayed arrival at
  that instant lands inside a simulated step; the replay queues it when that step ends, as vLLM would have
  (``Engine._reveal``), so the request joins the queue later than it did in vLLM by the rest of that step.

Both sides are measured the same way, from the anchor instant (arrival, or queued):

* TTFT = first token - anchor; TPOT = (last - first token) / (output tokens - 1) per request; E2E = last token
  - anchor; queue time = first scheduled - queued (the engine's own, under either anchoring): mean, p50, p90,
  p99 (``loadgen.stats`` linear rule);
* completed throughput = requests / (last token - first anchor), requests per second.

Error per figure: signed ``(predicted - measured) / measured x 100`` and absolute; MPE and MAPE over the figures
(BLIS's layout). A figure measured under 1 ms has no percentage (its difference is shown in ms). The published
simulator's own errors (a run's ``validation/summary.txt``) are printed beside ours, labelled as theirs. The
running / waiting / KV-use series of both sides are set over time (HTML: one plot per run).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from loadgen.rundir.io import load_run
from loadgen.rundir.manifest import Manifest
from loadgen.rundir.schema import TRACE_FULL_SCHEMA
from loadgen.sim.config import EngineConfig, load_engine_config
from loadgen.sim.worksheet import simulate_trace
from loadgen.stats.percentiles import percentile
from loadgen.trace.io import read_trace
from loadgen.util.errors import RunDirError
from loadgen.util.tomlfile import dumps_toml, read_toml

from .engine_match import engine_mismatches, measured_engine_config

__all__ = [
    "ANCHORS",
    "FIGURES",
    "MIN_PCT_BASE_MS",
    "RunComparison",
    "compare_run",
    "published_errors",
    "record_validated_error",
    "replay_table",
    "request_figures",
    "validate_measured",
]

NS = 1_000_000_000
#: A figure measured below this (ms) gets no percentage error: its difference in ms is shown instead.
MIN_PCT_BASE_MS = 1.0
_STATS = {"mean": None, "p50": 0.50, "p90": 0.90, "p99": 0.99}
_LATENCIES = ("ttft", "tpot", "e2e", "queue")
#: Every figure compared, in order: latencies (ms) at each statistic, then completed throughput (req/s).
FIGURES = tuple(f"{m}_{s}" for m in _LATENCIES for s in _STATS) + ("throughput_rps",)
#: Series set side by side over time: (name in our output, server metric, how a fleet combines).
_SERIES = (
    ("running", "vllm:num_requests_running", "sum"),
    ("waiting", "vllm:num_requests_waiting", "sum"),
    ("kv_use", "vllm:kv_cache_usage_perc", "mean"),
)
#: Anchorings (module docstring) -> the request column each latency starts from, and what it means.
ANCHORS = {
    "workload": (
        "scheduled_ns",
        "the workload's own arrival instants (users arrive at random within a step); latencies from the "
        "arrival, the frontend's clock mapped onto the engine's by the smallest queued - arrival offset",
    ),
    "queued": (
        "server_queued_ns",
        "each request arrives at the measured engine-queued instant; latencies from each engine's own queued "
        "instant (no frontend delay; a replayed arrival lands inside a step and is queued when that step ends)",
    ),
}
_PUBLISHED = re.compile(r"^(TTFT|TPOT|Latency) (Mean|Median|P90|P95|P99)\s+([-\d.]+)\s+([-\d.]+)\s+([-+\d.]+)%")
_PUBLISHED_NAMES = {"TTFT": "ttft", "TPOT": "tpot", "Latency": "e2e"}
_PUBLISHED_STATS = {"Mean": "mean", "Median": "p50", "P90": "p90", "P95": "p95", "P99": "p99"}


def request_figures(cols: dict[str, list[Any]], anchor: str = "workload") -> dict[str, float | None]:
    """Every figure of ``FIGURES`` from request columns (completed requests: first and last token set), the
    latencies from the ``anchor``'s instant (``ANCHORS``)."""
    a = np.array(cols[ANCHORS[anchor][0]], dtype=float)
    q = np.array(cols["server_queued_ns"], dtype=float)
    s = np.array(cols["server_scheduled_ns"], dtype=float)
    f = np.array([np.nan if v is None else v for v in cols["first_token_ns"]], dtype=float)
    last = np.array([np.nan if v is None else v for v in cols["last_token_ns"]], dtype=float)
    out_tokens = np.array(cols["target_output_tokens"], dtype=float)
    done = ~np.isnan(f) & ~np.isnan(last)
    per_request = {
        "ttft": (f - a) / 1e6,
        "tpot": (last - f) / np.maximum(1.0, out_tokens - 1) / 1e6,
        "e2e": (last - a) / 1e6,
        "queue": (s - q) / 1e6,
    }
    figures: dict[str, float | None] = {}
    for metric, values in per_request.items():
        kept = values[done & ~np.isnan(values)]
        for stat, quantile in _STATS.items():
            if not len(kept):
                figures[f"{metric}_{stat}"] = None
            else:
                figures[f"{metric}_{stat}"] = float(kept.mean()) if quantile is None else percentile(kept, quantile)
    span_s = (np.nanmax(last[done]) - np.nanmin(a)) / NS if done.any() else 0.0
    figures["throughput_rps"] = float(done.sum() / span_s) if span_s > 0 else None
    return figures


def _error(measured: float | None, predicted: float | None, name: str) -> dict[str, Any]:
    """One figure's row: both values, the difference, and the signed / absolute % (None under the floor)."""
    row: dict[str, Any] = {"figure": name, "measured": measured, "predicted": predicted, "diff": None}
    row["signed_pct"] = row["abs_pct"] = None
    if measured is None or predicted is None:
        return row
    row["diff"] = predicted - measured
    floor = MIN_PCT_BASE_MS if name != "throughput_rps" else 0.0
    if abs(measured) > floor:
        row["signed_pct"] = (predicted - measured) / measured * 100
        row["abs_pct"] = abs(row["signed_pct"])
    return row


@dataclass
class RunComparison:
    """One measured run beside its replay: the figures' errors, MPE / MAPE, the series, what was assumed."""

    name: str
    run_dir: str
    rows: list[dict[str, Any]]
    mpe_pct: float | None
    mape_pct: float | None
    worst: dict[str, Any] | None
    settings: dict[str, Any]
    series: dict[str, dict[str, list[float]]] = field(default_factory=dict)
    published: dict[str, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    engine_notes: dict[str, Any] = field(default_factory=dict)
    #: How the engine differs from the deployment the run ran (``engine_match``); empty when it models it.
    mismatches: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def _summarize(rows: list[dict[str, Any]]) -> tuple[float | None, float | None, dict[str, Any] | None]:
    pcts = [r for r in rows if r["signed_pct"] is not None]
    if not pcts:
        return None, None, None
    worst = max(pcts, key=lambda r: r["abs_pct"])
    mpe = float(np.mean([r["signed_pct"] for r in pcts]))
    mape = float(np.mean([r["abs_pct"] for r in pcts]))
    return mpe, mape, {"figure": worst["figure"], "signed_pct": worst["signed_pct"]}


def published_errors(summary: Path | None) -> dict[str, float]:
    """The published simulator's own signed errors (%) from a ``validation/summary.txt``, by our figure names."""
    if summary is None or not summary.is_file():
        return {}
    out = {}
    for line in summary.read_text(encoding="utf-8", errors="replace").splitlines():
        m = _PUBLISHED.match(line.strip())
        if m:
            out[f"{_PUBLISHED_NAMES[m.group(1)]}_{_PUBLISHED_STATS[m.group(2)]}"] = float(m.group(5))
    return out


def _run_settings(manifest: Manifest) -> dict[str, Any]:
    """The scheduler settings the measured engine ran with, and where each came from."""
    config = measured_engine_config(manifest)
    kwargs = config.get("engine_kwargs") or {}
    kv = config.get("kv_cache") or {}
    scheduler = config.get("scheduler_config") or {}
    settings: dict[str, Any] = {"source": {}}
    for key, value, where in (
        ("max_num_seqs", kwargs.get("max_num_seqs"), "engine argument"),
        ("max_num_batched_tokens", kwargs.get("max_num_batched_tokens"), "engine argument"),
        ("data_parallel_size", kwargs.get("data_parallel_size"), "engine argument"),
        ("num_kv_blocks", kv.get("num_gpu_blocks"), "logged by vLLM"),
        ("enable_prefix_caching", kv.get("enable_prefix_caching"), "logged by vLLM"),
        ("max_model_len", (config.get("cache_config") or {}).get("max_model_len") or None, "logged by vLLM"),
        ("chunked_prefill", scheduler.get("enable_chunked_prefill"), "logged by vLLM"),
        ("reserve_full_isl", scheduler.get("scheduler_reserve_full_isl"), "logged by vLLM"),
    ):
        if value is not None:
            settings[key] = value
            settings["source"][key] = where
    return settings


def _engine_for(config: EngineConfig, settings: dict[str, Any]) -> EngineConfig:
    """The engine TOML's costs under the measured run's scheduler settings (those it recorded)."""
    keys = ("max_num_seqs", "max_num_batched_tokens", "chunked_prefill", "reserve_full_isl")
    sched: dict[str, Any] = {k: settings[k] for k in keys if k in settings}
    kv: dict[str, Any] = {}
    if "num_kv_blocks" in settings:
        kv["num_kv_blocks"] = int(settings["num_kv_blocks"])
    if "enable_prefix_caching" in settings:
        kv["enable_prefix_caching"] = bool(settings["enable_prefix_caching"])
    return config.model_copy(
        update={"scheduler": config.scheduler.model_copy(update=sched), "kv": config.kv.model_copy(update=kv)}
    )


def replay_table(
    run_dir: Path, manifest: Manifest, cols: dict[str, list[Any]], anchor: str = "workload"
) -> tuple[pa.Table, dict[str, Any], list[str]]:
    """The trace the worksheet replays under ``anchor`` (``ANCHORS``), its metadata, and notes on it.

    ``workload``: the imported workload itself (its arrival instants, lengths and block hashes), or, when the
    run has none, the run's frontend arrivals. ``queued``: each request at its measured engine-queued instant."""
    workload = manifest.trace.path if manifest.trace is not None else None
    if anchor == "workload" and workload:
        trace, trace_meta = read_trace(run_dir / workload)
        return trace, trace_meta, []
    column = "server_queued_ns" if anchor == "queued" else "scheduled_ns"
    n = len(cols["request_id"])
    hashes: list[Any] = [None] * n
    meta: dict[str, Any] = {"mode": "open"}
    notes = [] if workload or anchor == "queued" else ["no imported workload: replayed at the run's frontend arrivals"]
    if workload:
        trace, wmeta = read_trace(run_dir / workload)
        by_index = trace.column("prompt_block_hashes").to_pylist()
        hashes = [by_index[_workload_index(rid, len(by_index), run_dir)] for rid in cols["request_id"]]
        meta["block_hash_tokens"] = wmeta.get("block_hash_tokens")
    offsets = [max(0, int(v)) for v in cols[column]]
    order = sorted(range(n), key=lambda i: (offsets[i], i))
    table = pa.Table.from_pylist(
        [
            {
                "request_id": cols["request_id"][i],
                "request_class": cols["request_class"][i],
                "scheduled_offset_ns": offsets[i],
                "prompt_tokens": cols["target_prompt_tokens"][i],
                "output_tokens": cols["target_output_tokens"][i],
                "prompt_block_hashes": hashes[i],
            }
            for i in order
        ],
        schema=TRACE_FULL_SCHEMA,
    )
    meta["requests"] = n
    return table, meta, notes


def _workload_index(request_id: Any, n: int, run_dir: Path) -> int:
    """The workload line of a request (``bench-<i>``), else one RunDirError line."""
    tail = str(request_id).rpartition("-")[2]
    if not tail.isdigit() or int(tail) >= n:
        raise RunDirError(f"{run_dir}: request_id {request_id!r}: expected bench-<i> with i < {n} (a workload line)")
    return int(tail)


def _series_at(metrics: pa.Table | None, ticks_s: np.ndarray, name: str, how: str) -> list[float] | None:
    """A server metric's value at each tick (the last sample at or before it; a fleet's engines combined)."""
    if metrics is None:
        return None
    rows = metrics.filter(pa.compute.equal(metrics.column("name"), name)).to_pydict()
    if not rows["time_ns"]:
        return None
    per_label: dict[str, tuple[list[int], list[float]]] = {}
    for t, label, value in zip(rows["time_ns"], rows["labels"], rows["value"], strict=True):
        times, values = per_label.setdefault(label, ([], []))
        times.append(t)
        values.append(value)
    sampled = []
    for times, values in per_label.values():
        order = np.argsort(times, kind="stable")
        t_sorted, v_sorted = np.asarray(times)[order], np.asarray(values)[order]
        at = np.searchsorted(t_sorted, ticks_s * NS, side="right") - 1
        sampled.append(np.where(at >= 0, v_sorted[np.maximum(at, 0)], 0.0))
    combined = np.sum(sampled, axis=0) if how == "sum" else np.mean(sampled, axis=0)
    return [float(v) for v in combined]


def _series(measured: pa.Table | None, predicted: pa.Table | None) -> dict[str, dict[str, list[float]]]:
    """Measured series at their own ticks, and the prediction sampled at the same ticks."""
    if measured is None:
        return {}
    running = measured.filter(pa.compute.equal(measured.column("name"), _SERIES[0][1]))
    ticks = np.sort(np.asarray(running.column("time_ns").to_pylist(), dtype=float)) / NS
    out: dict[str, dict[str, list[float]]] = {}
    for label, name, how in _SERIES:
        got = _series_at(measured, ticks, name, how)
        if got is None:
            continue
        out[label] = {
            "t_s": [float(t) for t in ticks],
            "measured": got,
            "predicted": _series_at(predicted, ticks, name, how) or [],
        }
    return out


def compare_run(run_dir: Path | str, config: EngineConfig, anchor: str = "workload") -> RunComparison:
    """One measured run beside the worksheet's replay of its workload on ``config``, anchored by ``anchor``
    (``ANCHORS``; module docstring)."""
    run_dir = Path(run_dir)
    data = load_run(run_dir, chunks=False)
    cols = data.requests.to_pydict()
    if not cols["request_id"] or any(v is None for v in cols["server_queued_ns"] + cols["server_scheduled_ns"]):
        raise RunDirError(
            f"{run_dir}: requests without server_queued_ns / server_scheduled_ns: expected a run that records the "
            "engine's own instants (loadgen import llmservingsim)"
        )
    settings = _run_settings(data.manifest)
    engine = _engine_for(config, settings)
    table, meta, notes = replay_table(run_dir, data.manifest, cols, anchor)
    replicas = int(settings.get("data_parallel_size") or 1)
    result = simulate_trace(
        table, meta, engine, replicas=replicas, route_policy="least-in-flight" if replicas > 1 else "round-robin"
    )
    predicted = request_figures(result.requests_table.to_pydict(), anchor)
    measured = request_figures(cols, anchor)
    rows = [_error(measured[name], predicted[name], name) for name in FIGURES]
    mpe, mape, worst = _summarize(rows)
    source = data.manifest.source or {}
    summary = source.get("validation_summary")
    if not meta.get("block_hash_tokens"):
        notes.append("no workload block hashes: prefix caching not replayed")
    profile = config.cost.profile
    ran = data.manifest.target.engine.version if data.manifest.target.engine else None
    if profile is not None and ran and str(ran) != profile.vllm_version:
        notes.append(
            f"vLLM {ran} ran; the engine's profile is vLLM {profile.vllm_version}'s (a version it did not measure)"
        )
    if replicas > 1:
        notes.append(f"{replicas} data-parallel engines behind least-in-flight routing; series summed (KV: mean)")
    # the pool replayed: the run's logged one where it logged one, else the engine TOML's
    sources = settings["source"] | {"num_kv_blocks_used": settings["source"].get("num_kv_blocks", "engine TOML")}
    return RunComparison(
        name=run_dir.name,
        run_dir=str(run_dir),
        rows=rows,
        mpe_pct=mpe,
        mape_pct=mape,
        worst=worst,
        settings=settings | {"num_kv_blocks_used": engine.num_kv_blocks, "source": sources},
        series=_series(data.server_metrics, result.metrics),
        published=published_errors(Path(summary) if summary else None),
        notes=notes,
        engine_notes={k: v for k, v in result.notes.items() if not isinstance(v, dict | list)},
        mismatches=engine_mismatches(config, data.manifest),
    )


def validate_measured(run_dirs: list[Path], engine: Path | str, anchor: str = "workload") -> dict[str, Any]:
    """Every run beside the engine's replay under ``anchor`` (``ANCHORS``); the result document (JSON-ready)."""
    config = load_engine_config(engine)
    runs = [compare_run(run_dir, config, anchor) for run_dir in run_dirs]
    worst = max(
        ((abs(r.worst["signed_pct"]), r) for r in runs if r.worst is not None), key=lambda x: x[0], default=None
    )
    return {
        "engine": config.manifest() | {"config": None},
        "engine_label": config.calibration_label(),
        "definitions": __doc__.split("\n\n")[4] if __doc__ else "",
        "anchor": {"name": anchor, "means": ANCHORS[anchor][1]},
        "runs": [r.to_dict() for r in runs],
        "worst": None
        if worst is None
        else {"run": worst[1].name, "run_dir": worst[1].run_dir, **(worst[1].worst or {})},
    }


#: The block ``record_validated_error`` appends to an engine TOML (and replaces on the next run).
_RECORD_MARK = "# --- loadgen sim validate --measured: the runs validated against (replaced on each run) ---"


def record_validated_error(engine_toml: Path, result: dict[str, Any]) -> str | None:
    """Write the worst error over the runs into the engine TOML (``[calibration] validated_error``, with the
    runs it was validated against under ``[calibration.measured_validations]``); returns the line written, or
    None (nothing written) when there is no error or the engine does not model a run's deployment.

    The file is edited, not rewritten: its comments (each setting's provenance) and layout stay. The
    ``validated_error`` line is replaced in place (or added under ``[calibration]``), and the runs go in one
    marked block at the end, replaced on the next run."""
    worst = result.get("worst")
    if worst is None or any(run.get("mismatches") for run in result["runs"]):
        return None
    read_toml(engine_toml, "engine TOML")  # a damaged file is refused in one line before it is touched
    anchor = (result.get("anchor") or {}).get("name", "workload")
    line = (
        f"worst {worst['figure']} {worst['signed_pct']:+.1f}% against {worst['run']} "
        f"(sim validate --measured, {anchor} arrivals)"
    )
    entries = {
        run["name"]: {
            "run_dir": run["run_dir"],
            "anchor": anchor,
            "mpe_pct": run["mpe_pct"],
            "mape_pct": run["mape_pct"],
            "worst_figure": (run["worst"] or {}).get("figure"),
            "worst_signed_pct": (run["worst"] or {}).get("signed_pct"),
        }
        for run in result["runs"]
    }
    lines = engine_toml.read_text().splitlines()
    if _RECORD_MARK in lines:
        lines = lines[: lines.index(_RECORD_MARK)]
    lines = _set_validated_error(lines, dumps_toml({"validated_error": line}, what=str(engine_toml)).strip())
    block = dumps_toml({"calibration": {"measured_validations": entries}}, what=str(engine_toml))
    text = "\n".join(lines).rstrip() + f"\n\n{_RECORD_MARK}\n{block}"
    engine_toml.write_text(text if text.endswith("\n") else text + "\n")
    read_toml(engine_toml, "engine TOML")  # what was written reads back
    return line


def _set_validated_error(lines: list[str], assignment: str) -> list[str]:
    """``lines`` with ``validated_error`` set in the ``[calibration]`` table (added, with the table, if absent)."""
    header = next((i for i, text in enumerate(lines) if text.strip() == "[calibration]"), None)
    if header is None:
        return [*lines, "", "[calibration]", assignment]
    end = next((i for i in range(header + 1, len(lines)) if lines[i].lstrip().startswith("[")), len(lines))
    for i in range(header + 1, end):
        if re.match(r"\s*validated_error\s*=", lines[i]):
            return [*lines[:i], assignment, *lines[i + 1 :]]
    return [*lines[: header + 1], assignment, *lines[header + 1 :]]
