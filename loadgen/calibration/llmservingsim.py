"""LLMServingSim bench runs (real vLLM, ``python -m bench run``) → run directories (``run_kind: imported``).

A run folder holds ``meta.json`` (engine arguments; what vLLM resolved), ``requests.jsonl`` (per request:
``arrival_time`` on the frontend's wall clock, ``queued_ts``, ``scheduled_ts``, ``first_token_ts``,
``last_token_ts`` on the engine core's ``time.monotonic()``) and ``timeseries.csv`` (per tick: running, waiting,
KV use, prompt and generation throughput). Beside it: ``validation/summary.txt`` (the published simulator's
own errors; ``bench/results/<run>/`` keeps it inside the run folder, as ``validation/<gpu>_summary.txt``)
and the workload the run replayed (``dataset_path``, checked against ``dataset_hash``).

**The two clocks.** The engine clock is the wall clock plus ``offset = min(queued_ts - arrival_time)``: the
request the frontend passed on fastest defines it, so every other request's frontend delay (queued - mapped
arrival) is >= 0. The run clock's zero is the workload's zero: ``W0 = median(arrival_time - the workload's
arrival offset)`` on the wall clock (the first arrival when the workload is absent), i.e. ``E0 = W0 + offset`` on
the engine clock. ``scheduled_ns`` = ``sent_ns`` is the frontend's arrival; ``server_queued_ns`` and
``server_scheduled_ns`` are the engine's; first and last token and ``done_ns`` (= last token) are the engine's
instants. The timeseries' ``t`` counts seconds from the bench start, taken as the workload's zero. Both
mappings are named in the manifest's ``synthesized``. There are no per-token instants: no chunks.

**A run without its workload** (a published run whose workload file was not published): the lengths and arrival
instants are requests.jsonl's own (``input_toks``, ``output_toks``, ``arrival_time``), so a replay still offers the
same load; the prompt token ids are unknown, so no prompt block hashes are kept and no prefix sharing can be
replayed. The manifest's ``synthesized["workload"]`` says so.

The per-second series become server metrics under vLLM's names (``vllm:num_requests_running``,
``vllm:num_requests_waiting``, ``vllm:kv_cache_usage_perc`` as a 0..1 share, and the two logged throughputs);
an all-zero KV column (an upstream bug in some runs) is left out and said so. The workload, when found, is
imported beside the records as ``workload.parquet`` (``loadgen.trace.importers``, prompt block hashes kept).
"""

from __future__ import annotations

import csv
import json
import shutil
import statistics
import tempfile
from pathlib import Path
from typing import Any

from loadgen.rundir.foreign_input import read_llmservingsim_meta, read_llmservingsim_ticks
from loadgen.rundir.identity import harness_identity, sha256_file
from loadgen.rundir.io import RunWriter
from loadgen.rundir.manifest import Anchor, EngineIdentity, Host, Manifest, TargetRef, TraceRef
from loadgen.rundir.plausible import checked_row
from loadgen.rundir.schema import empty_request_row
from loadgen.sim.metrics import metric_labels_json
from loadgen.trace.importers import import_trace
from loadgen.trace.io import read_trace
from loadgen.util.errors import LoadgenError, RunDirError, TraceError
from loadgen.util.jsonfile import read_json, read_json_object

__all__ = ["TIMESERIES_METRICS", "WORKLOAD_FILE", "find_run_folder", "import_llmservingsim_run"]

NS = 1_000_000_000
#: The imported workload's file name inside the run directory.
WORKLOAD_FILE = "workload.parquet"
#: timeseries.csv column → (server metric name, scale to the metric's unit).
TIMESERIES_METRICS = {
    "running": ("vllm:num_requests_running", 1.0),
    "waiting": ("vllm:num_requests_waiting", 1.0),
    "kv_cache_pct": ("vllm:kv_cache_usage_perc", 0.01),
    "prompt_throughput": ("vllm:avg_prompt_throughput_toks_per_s", 1.0),
    "gen_throughput": ("vllm:avg_generation_throughput_toks_per_s", 1.0),
}
_REQUEST_FIELDS = ("request_id", "input_toks", "output_toks", "arrival_time", "queued_ts", "scheduled_ts")
_ENGINE_INSTANTS = ("queued_ts", "scheduled_ts", "first_token_ts", "last_token_ts")


def find_run_folder(path: Path | str) -> Path:
    """The folder holding meta.json and requests.jsonl: ``path`` itself or its ``vllm/``."""
    path = Path(path)
    for cand in (path, path / "vllm"):
        if (cand / "meta.json").is_file() and (cand / "requests.jsonl").is_file():
            return cand
    raise RunDirError(f"{path}: no meta.json and requests.jsonl (nor in vllm/): expected an LLMServingSim bench run")


def _number(path: Path, line_no: int, rec: dict[str, Any], key: str) -> float:
    value = rec.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 1e12:  # NaN fails too
        raise RunDirError(f"{path}: line {line_no}: {key} = {value!r}: expected a finite number of seconds >= 0")
    return float(value)


def _request_id(path: Path, line_no: int, value: Any, seen: dict[str, int]) -> None:
    """The bench's request id: a string (``bench-<i>``), each once; else one RunDirError line."""
    if not isinstance(value, str) or not value:
        raise RunDirError(
            f"{path}: line {line_no}: request_id = {repr(value)[:40]}: expected the bench's id (bench-<i>)"
        )
    if value in seen:
        raise RunDirError(
            f"{path}: line {line_no}: request_id = {value!r}: also on line {seen[value]}: expected each request once"
        )
    seen[value] = line_no


def _read_requests(path: Path) -> list[dict[str, Any]]:
    """The request records, each checked: the fields present, instants finite and in order, counts >= 1."""
    rows = []
    seen: dict[str, int] = {}
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise RunDirError(f"{path}: cannot read ({getattr(exc, 'strerror', None) or exc})") from None
    for line_no, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except (ValueError, RecursionError):
            raise RunDirError(f"{path}: line {line_no}: invalid JSON: expected a bench request record") from None
        missing = [
            k
            for k in (*_REQUEST_FIELDS, "first_token_ts", "last_token_ts")
            if not isinstance(rec, dict) or k not in rec
        ]
        if missing:
            raise RunDirError(f"{path}: line {line_no}: missing {missing}: expected a bench request record")
        _request_id(path, line_no, rec["request_id"], seen)
        for key in ("input_toks", "output_toks"):
            if isinstance(rec[key], bool) or not isinstance(rec[key], int) or not 1 <= rec[key] <= 10_000_000:
                raise RunDirError(f"{path}: line {line_no}: {key} = {rec[key]!r}: expected a token count >= 1")
        times = [_number(path, line_no, rec, key) for key in ("arrival_time", *_ENGINE_INSTANTS)]
        if not times[1] <= times[2] <= times[3] <= times[4]:
            raise RunDirError(
                f"{path}: line {line_no}: engine instants {times[1:]}: expected queued <= scheduled <= first <= last token"
            )
        rows.append(rec)
    if not rows:
        raise RunDirError(f"{path}: no requests: expected at least one record")
    return rows


def _workload(folder: Path, meta: dict[str, Any], workload: Path | None) -> Path | None:
    """The workload file the run replayed: ``workload`` (checked), or the one named by ``dataset_path``
    under an ancestor's ``workloads/``; None when none is found."""
    name = Path(str(meta.get("dataset_path") or "")).name
    if workload is None and name:
        for parent in folder.parents:
            cand = parent / "workloads" / name
            if cand.is_file():
                workload = cand
                break
    if workload is None:
        return None
    expected = meta.get("dataset_hash")
    if not workload.is_file():
        raise RunDirError(f"{workload}: no such file: expected the workload the run replayed ({name})")
    if expected and sha256_file(workload) != expected:
        raise RunDirError(
            f"{workload}: sha256 differs from meta.json dataset_hash {expected}: expected the same workload"
        )
    return workload


class _Clock:
    """The run clock from the frontend's wall clock and the engine's monotonic clock (module docstring)."""

    def __init__(self, rows: list[dict[str, Any]], workload_offsets_s: list[float] | None) -> None:
        self.offset_s = min(r["queued_ts"] - r["arrival_time"] for r in rows)
        self.from_workload = workload_offsets_s is not None
        if workload_offsets_s is not None:
            self.w0 = statistics.median(r["arrival_time"] - w for r, w in zip(rows, workload_offsets_s, strict=True))
        else:
            self.w0 = min(r["arrival_time"] for r in rows)
        self.e0 = self.w0 + self.offset_s

    def wall(self, t: float) -> int:
        return round((t - self.w0) * NS)

    def engine(self, t: float) -> int:
        return round((t - self.e0) * NS)

    def frontend_delays_ms(self, rows: list[dict[str, Any]]) -> list[float]:
        return sorted((r["queued_ts"] - r["arrival_time"] - self.offset_s) * 1e3 for r in rows)


def _request_row(rec: dict[str, Any], clock: _Clock, request_class: str) -> dict[str, Any]:
    arrival = clock.wall(rec["arrival_time"])
    last = clock.engine(rec["last_token_ts"])
    return empty_request_row(
        request_id=str(rec["request_id"]),
        request_class=request_class,
        warm=True,
        scheduled_ns=arrival,
        slot_acquired_ns=arrival,
        sent_ns=arrival,
        server_queued_ns=clock.engine(rec["queued_ts"]),
        server_scheduled_ns=clock.engine(rec["scheduled_ts"]),
        first_token_ns=clock.engine(rec["first_token_ts"]),
        last_token_ns=last,
        done_ns=last,
        target_prompt_tokens=rec["input_toks"],
        target_output_tokens=rec["output_toks"],
        server_prompt_tokens=rec["input_toks"],
        server_output_tokens=rec["output_toks"],
        status="ok",
        finish_reason="length",  # min_tokens = max_tokens = output_toks, ignore_eos
    )


def _timeseries(path: Path, model: str) -> tuple[dict[str, list[Any]], list[str]]:
    """Server-metric columns from timeseries.csv (t seconds from the workload's zero), and notes."""
    if not path.is_file():
        return {}, [f"{path.name}: absent, no server metrics"]
    try:
        with open(path, encoding="utf-8", newline="") as handle:
            records = list(csv.DictReader(handle))
    except (ValueError, OSError) as exc:  # not UTF-8, a NUL byte, unreadable
        raise RunDirError(
            f"{path}: unreadable ({exc!r:.80}): expected columns t, {', '.join(TIMESERIES_METRICS)}"
        ) from None
    if not records:  # every column would be empty, and the all-zero KV note would call it an upstream bug
        raise RunDirError(
            f"{path}: no ticks: expected columns t, {', '.join(TIMESERIES_METRICS)} and a row per tick "
            "(or no file: the run is imported without server metrics)"
        )
    rows = read_llmservingsim_ticks(path, records)
    ticks = [r.t for r in rows]
    values = {col: [float(getattr(r, col)) for r in rows] for col in TIMESERIES_METRICS}
    notes = []
    columns: dict[str, list[Any]] = {"time_ns": [], "name": [], "labels": [], "value": []}
    labels = metric_labels_json(model)
    for col, (name, scale) in TIMESERIES_METRICS.items():
        if col == "kv_cache_pct" and not any(values[col]):
            notes.append("kv_cache_pct is 0.0 in every tick (an upstream bug in this run): not imported")
            continue
        columns["time_ns"] += [round(t * NS) for t in ticks]
        columns["name"] += [name] * len(ticks)
        columns["labels"] += [labels] * len(ticks)
        columns["value"] += [v * scale for v in values[col]]
    return columns, notes


def _engine_config(meta: dict[str, Any]) -> dict[str, Any]:
    """The engine settings the run records: arguments, resolved KV cache and scheduler (when logged)."""
    resolved = meta.get("resolved_config") or {}
    scheduler = resolved.get("scheduler_config") if isinstance(resolved, dict) else None
    cache = resolved.get("cache_config") if isinstance(resolved, dict) else None
    return {
        "engine_kwargs": meta.get("engine_kwargs"),
        "kv_cache": meta.get("kv_cache"),
        "scheduler_config": scheduler,
        "cache_config": cache,
    }


def _cluster_hardware(path: Path) -> list[str] | None:
    """The hardware tags (``RTX4090``, ``RTXPRO6000``) of the LLMServingSim cluster config beside a run, if any
    (None too for a config that is unreadable or not shaped as ``{"nodes": [{"instances": [{"hardware"}]}]}``)."""
    try:
        cluster = read_json(path, "an LLMServingSim cluster config")
    except LoadgenError:
        return None
    nodes = cluster.get("nodes") if isinstance(cluster, dict) else None
    tags = {
        str(instance.get("hardware"))
        for node in (nodes if isinstance(nodes, list) else [])
        if isinstance(node, dict) and isinstance(node.get("instances"), list)
        for instance in node["instances"]
        if isinstance(instance, dict) and instance.get("hardware")
    }
    return sorted(tags) or None


def _published_summary(folder: Path) -> Path | None:
    """The published simulator's summary of the run: ``validation/summary.txt`` beside the run's ``vllm/``
    (``bench/examples``), or ``validation/*summary.txt`` inside the run folder (``bench/results``); None if none."""
    for validation in (folder.parent / "validation", folder / "validation"):
        if (validation / "summary.txt").is_file():
            return validation / "summary.txt"
        found = sorted(validation.glob("*summary.txt")) if validation.is_dir() else []
        if found:
            return found[0]
    return None


def _workload_statement(meta: dict[str, Any], source: Path | None) -> str:
    """What the manifest says of the workload the run replayed."""
    if source is not None:
        return f"imported from {source} ({WORKLOAD_FILE}; sha256 checked against meta.json dataset_hash)"
    return (
        f"absent ({meta.get('dataset_path') or 'no dataset_path'} not found): prompt and output lengths and arrival "
        "instants are requests.jsonl's own (input_toks, output_toks, arrival_time); the prompt token ids are "
        "unknown, so no prompt block hashes are kept and a replay shares no prefixes"
    )


def _manifest(
    folder: Path, meta: dict[str, Any], clock: _Clock, delays: list[float], notes: list[str], workload: str
) -> Manifest:
    version = meta.get("vllm_version")
    hardware = meta.get("hardware")
    summary = _published_summary(folder)
    p50 = delays[len(delays) // 2]
    zero = (
        f"run zero = the workload's zero, wall {clock.w0:.6f} (median(arrival_time - workload offset))"
        if clock.from_workload
        else f"run zero = the first arrival, wall {clock.w0:.6f} (no workload)"
    )
    return Manifest(
        run_kind="imported",
        harness=harness_identity(),
        host=Host(gpus=[hardware]) if isinstance(hardware, dict) else None,
        target=TargetRef(
            kind="vllm",
            model=meta.get("model"),
            version={"version": version},
            engine=EngineIdentity(name="vllm", version=version, config=_engine_config(meta)),
        ),
        options={"importer": "llmservingsim-bench", "tick_seconds": meta.get("tick_seconds")},
        started_utc=meta.get("started_at"),
        ended_utc=meta.get("finished_at"),
        anchor=Anchor(
            perf_counter_ns=0, utc=meta.get("started_at"), clock="ns from the workload's zero (see synthesized)"
        ),
        model_executed=True,  # a real vLLM on a GPU (in-process AsyncLLM: no HTTP, so no benchmarkExecuted)
        source={
            "tool": "llmservingsim-bench",
            "path": str(folder),
            "requests_sha256": sha256_file(folder / "requests.jsonl"),
            "meta_sha256": sha256_file(folder / "meta.json"),
            "dataset_path": meta.get("dataset_path"),
            "dataset_hash": meta.get("dataset_hash"),
            "validation_summary": str(summary) if summary is not None else None,
            "cluster_hardware": _cluster_hardware(folder.parent / "config.json"),
        },
        synthesized={
            "timing": False,
            "clocks": (
                f"engine = wall + {clock.offset_s:.6f} s (min(queued_ts - arrival_time)); {zero}; frontend delay "
                f"after the mapping p50 {p50:.1f} ms, max {delays[-1]:.1f} ms"
            ),
            "workload": workload,
            "derived": ["scheduled_ns = sent_ns = arrival_time mapped", "done_ns = last_token_ns"],
            "timeseries": "t seconds from the bench start, taken as the workload's zero",
            "chunks": False,
            "notes": notes,
        },
    )


def import_llmservingsim_run(
    path: Path | str, out_dir: Path | str, *, workload: Path | str | None = None, request_class: str = "imported"
) -> Path:
    """An LLMServingSim bench run folder (or its parent) → a run directory at ``out_dir``; returns it."""
    folder = find_run_folder(path)
    meta_path = folder / "meta.json"
    meta = read_llmservingsim_meta(meta_path, read_json_object(meta_path, "an LLMServingSim meta.json", RunDirError))
    rows = _read_requests(folder / "requests.jsonl")
    rows.sort(key=lambda r: r["arrival_time"])
    source = _workload(folder, meta, Path(workload) if workload else None)
    model = str(meta.get("model") or "unknown")
    metrics, series_notes = _timeseries(folder / "timeseries.csv", model)
    notes: list[str] = []
    # the workload is imported aside and moved in once the run directory is begun: a refused file writes nothing
    with tempfile.TemporaryDirectory(prefix="loadgen-workload-") as staging:
        offsets = trace_ref = staged = None
        if source is not None:
            offsets, trace_ref, staged = _import_workload(source, Path(staging), rows, folder / "requests.jsonl")
        else:
            notes.append("workload not found: run zero = the first arrival; no prompt block hashes")
        clock = _Clock(rows, offsets)
        manifest = _manifest(
            folder, meta, clock, clock.frontend_delays_ms(rows), notes + series_notes, _workload_statement(meta, source)
        )
        if trace_ref is not None:
            manifest.trace = trace_ref
        requests_path = folder / "requests.jsonl"
        requests = [checked_row(requests_path, _request_row(rec, clock, request_class)) for rec in rows]
        with RunWriter(Path(out_dir), manifest) as writer:
            if staged is not None:
                shutil.move(staged, Path(out_dir) / WORKLOAD_FILE)
            for row in requests:
                writer.add_request(row)
            writer.add_metrics(metrics)
            end = max(r["last_token_ts"] for r in rows)
            writer.close({"duration_s": clock.engine(end) / NS})
    return Path(out_dir)


def _import_workload(
    source: Path, staging: Path, rows: list[dict[str, Any]], requests_path: Path
) -> tuple[list[float], TraceRef, Path]:
    """Import the workload into ``staging``; its arrival offsets (s) in the order of ``rows`` (by request index),
    its trace reference and the staged file."""
    try:
        trace_path = import_trace("llmservingsim", source, staging / WORKLOAD_FILE, request_class="imported")
        table, meta = read_trace(trace_path)
    except TraceError as exc:
        raise RunDirError(str(exc)) from None
    offsets = table.column("scheduled_offset_ns").to_pylist()
    indexes = [_request_index(requests_path, r["request_id"], len(offsets)) for r in rows]
    trace = TraceRef(path=WORKLOAD_FILE, sha256=sha256_file(trace_path), name=meta.get("trace_name"), metadata=meta)
    return [offsets[i] / NS for i in indexes], trace, trace_path


def _request_index(path: Path, request_id: str, n: int) -> int:
    """``bench-<i>``: line i of the workload (the bench numbers requests in workload order)."""
    head, _, tail = request_id.rpartition("-")
    if not tail.isdigit() or not 0 <= int(tail) < n:
        raise RunDirError(f"{path}: request_id {request_id!r}: expected bench-<i> with i < {n} (the workload's line)")
    return int(tail)
