"""Face 1: replay a trace through the engine in virtual time and write a run directory.

The run directory has exactly the record schema of a measured run, so the analyzer cannot tell
them apart except through the manifest (``run_kind: simulated``, ``modelExecuted: false``). The
client side is ideal (no network, headers at send time) but honours the trace's concurrency
limit (``max_in_flight``, or ``concurrency`` for closed traces) as the driver does. Same trace +
engine config + seed = identical tables.
"""

from __future__ import annotations

import heapq
import json
from array import array
from collections import deque
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq

from .. import __version__
from ..errors import TraceError
from ..identity import harness_identity, host_identity, sha256_file, utc_now_iso
from ..records import STATUS_CANCELLED, STATUS_ERROR, STATUS_OK, TRACE_SCHEMA, empty_request_row
from ..rundir import RunWriter
from .config import EngineConfig, load_engine_config
from .engine import Engine, Seq
from .faults import FaultDecider, FaultPlan
from .metrics import (
    ITL_BUCKETS,
    TTFT_BUCKETS,
    STEP_METRICS,
    histogram_samples,
    metric_labels_json,
)
from .protocol import StreamFormat, filler_bytes, request_id_for

__all__ = ["run_worksheet", "simulate_trace", "WorksheetResult"]

_NS = 1_000_000_000


def _read_trace(trace_path: Path) -> tuple[Any, dict[str, Any]]:
    try:
        from ..trace.io import read_trace
    except ImportError:  # pragma: no cover - the lead's reader is part of the package
        read_trace = None
    if read_trace is not None:
        return read_trace(trace_path)
    if not Path(trace_path).is_file():
        raise TraceError(f"{trace_path}: no such file: expected a trace Parquet file")
    table = pq.read_table(trace_path)
    raw = (table.schema.metadata or {}).get(b"loadgen.trace")
    return table.select(TRACE_SCHEMA.names).cast(TRACE_SCHEMA), (json.loads(raw) if raw else {})


class WorksheetResult:
    """Everything the simulation produced, as columns; written by run_worksheet."""

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self.chunks: dict[str, list[Any]] = {}
        self.metrics: dict[str, list[Any]] = {}
        self.notes: dict[str, Any] = {}


def simulate_trace(
    table: Any,
    metadata: dict[str, Any],
    config: EngineConfig,
    seed: int = 0,
    endpoint: str = "completions",
) -> WorksheetResult:
    """Run the engine over a trace table in virtual time (ns from trace start)."""
    cols = {name: table.column(name).to_pylist() for name in TRACE_SCHEMA.names}
    n = table.num_rows
    offsets = cols["scheduled_offset_ns"]
    engine = Engine(config, seed=seed)
    decider = FaultDecider(config.faults, seed=seed)
    bs = engine.block_size
    max_len = config.scheduler.max_model_len
    mode = metadata.get("mode", "open")
    limit = metadata.get("concurrency") if mode == "closed" else metadata.get("max_in_flight")
    limit = int(limit) if limit else n + 1

    sent = [None] * n
    done = [None] * n
    status: list[str | None] = [None] * n
    error_kind: list[str | None] = [None] * n
    http_status: list[int | None] = [None] * n
    retry_after: list[float | None] = [None] * n
    plans: list[FaultPlan | None] = [None] * n
    seqs: list[Seq | None] = [None] * n
    stop_after: list[int | None] = [None] * n  # tokens after which the client stops reading
    for i in range(n):
        plan = decider.decide()
        plans[i] = plan
        stops = [x for x in (cols["cancel_after_tokens"][i], plan.disconnect_after if plan else None) if x is not None]
        stop_after[i] = min(stops) if stops else None

    client_queue: deque[int] = deque()
    delayed: list[tuple[int, int]] = []  # (engine arrival ns, index) after a slow start
    in_flight = 0
    ptr = 0
    spec = config.scheduler.decode_tokens_per_step
    c_idx = array("i")  # request index of each emission (a chunk), in step order
    c_k = array("i")  # tokens per emission (only kept when a step can emit more than one)
    c_step_t = array("q")  # end time of each step that emitted ...
    c_step_n = array("i")  # ... and how many chunks it emitted
    m_rows: list[tuple] = []  # per-step state, one tuple per step (STEP_METRICS order after time)

    def finish(i: int, t: int) -> None:
        """Request i ended at t: free its client slot and send queued requests (no recursion)."""
        nonlocal in_flight
        done[i] = t
        in_flight -= 1
        while client_queue and in_flight < limit:
            send(client_queue.popleft(), t)

    def send(i: int, t: int) -> None:
        """Request i leaves the client at t; answered at once (errors) or handed to the engine."""
        nonlocal in_flight
        sent[i] = t
        plan = plans[i]
        prompt, out = cols["prompt_tokens"][i], cols["output_tokens"][i]
        if prompt + out > max_len or -(-(prompt + out) // bs) > engine.total_blocks or out < 1:
            status[i], error_kind[i], http_status[i] = STATUS_ERROR, "http_4xx", 400
            done[i] = t
            return
        if plan is not None and plan.error_status is not None:
            status[i], http_status[i] = STATUS_ERROR, plan.error_status
            error_kind[i] = "http_5xx" if plan.error_status >= 500 else ("http_429" if plan.error_status == 429 else "http_4xx")
            done[i] = t
            return
        if plan is not None and plan.retry_after_s is not None:
            status[i], error_kind[i], http_status[i], retry_after[i] = STATUS_ERROR, "http_429", 429, plan.retry_after_s
            done[i] = t
            return
        in_flight += 1
        conv = cols["conversation_id"][i]
        group = cols["prefix_group"][i]
        key = conv if conv is not None else group
        cache_limit = None if conv is not None else cols["prefix_tokens"][i]
        arrive = t + (int(plan.slow_start_s * _NS) if plan is not None else 0)
        seq = Seq(i, prompt, out, arrive, cache_key=key, cache_limit_tokens=cache_limit)
        seq.stop_after = stop_after[i]
        seqs[i] = seq
        if arrive > t:
            heapq.heappush(delayed, (arrive, i))
        else:
            engine.add(seq)

    def next_event() -> int | None:
        cands = []
        if ptr < n:
            cands.append(offsets[ptr])
        if delayed:
            cands.append(delayed[0][0])
        return min(cands) if cands else None

    t = 0
    while True:
        while ptr < n and offsets[ptr] <= t:
            if in_flight < limit:
                send(ptr, offsets[ptr])
            else:
                client_queue.append(ptr)
            ptr += 1
        while delayed and delayed[0][0] <= t:
            engine.add(seqs[heapq.heappop(delayed)[1]])
        if not engine.has_work:
            nxt = next_event()
            if nxt is None:
                break
            t = max(t, nxt)
            continue
        hold = engine.hold_until_ns(t)
        if hold is not None:
            nxt = next_event()
            t = hold if nxt is None else min(hold, nxt)
            continue
        res = engine.step(t)
        if res.duration_ns == 0 and not res.emitted and not res.finished:
            nxt = next_event()
            if nxt is None or nxt <= t:
                raise RuntimeError("simulated engine made no progress (config cannot serve its queue)")
            t = nxt
            continue
        t_end = t + res.duration_ns
        emitted = res.emitted
        if emitted:
            c_idx.extend([s.idx for s in emitted])
            if spec > 1:
                c_k.extend([s.emitted for s in emitted])
            c_step_t.append(t_end)
            c_step_n.append(len(emitted))
        for seq in res.finished:
            finish(seq.idx, t_end)
        m_rows.append((
            t_end, len(engine.running), len(engine.waiting), engine.kv_usage,
            engine.prefix_queries, engine.prefix_hits, engine.num_preemptions,
            engine.prompt_tokens_total, engine.generation_tokens_total,
            res.prefill_tokens, res.decode_seqs, res.duration_ns / _NS,
            engine.used_private + engine.cached_pinned,
        ))
        t = t_end

    result = WorksheetResult()
    # --- chunks: group the per-step emissions by request (stable: steps are time-ordered) ---
    idx = np.array(c_idx, dtype=np.int32)
    ct = np.repeat(np.array(c_step_t, dtype=np.int64), np.array(c_step_n, dtype=np.int64))
    ck = np.array(c_k, dtype=np.int32) if spec > 1 else np.ones(len(idx), dtype=np.int32)
    order = np.argsort(idx, kind="stable")
    idx, ct, ck = idx[order], ct[order], ck[order]
    counts = np.bincount(idx, minlength=n) if len(idx) else np.zeros(n, np.int64)
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)
    seqno = np.arange(len(idx), dtype=np.int64) - np.repeat(starts, counts)
    before_all = np.cumsum(ck, dtype=np.int64) - ck  # tokens before each chunk, whole run
    has = counts > 0
    tok_before = before_all - np.repeat(before_all[starts[has]], counts[has])  # ... within its request
    created = 1_700_000_000
    fmt = StreamFormat(endpoint, request_id_for(endpoint, 0), created, config.model)
    overhead = fmt.content_overhead()
    nbytes = overhead + filler_bytes(tok_before, ck.astype(np.int64))

    # stalls: chunks after the stall point arrive no earlier than the stall's end
    for i in range(n):
        plan = plans[i]
        if plan is None or plan.stall_s <= 0 or seqs[i] is None or counts[i] == 0:
            continue
        a, b = starts[i], starts[i] + counts[i]
        cum = np.cumsum(ck[a:b])
        hit = np.nonzero(cum >= max(plan.stall_after, 1))[0]
        if len(hit) == 0:
            continue
        j = a + hit[0]
        release = ct[j] + int(plan.stall_s * _NS)
        if plan.stall_after == 0:
            j -= 1
        later = slice(j + 1, b)
        ct[later] = np.maximum(ct[later], release)
        done[i] = max(done[i] or 0, int(ct[b - 1]))

    # --- request rows ---
    rids = cols["request_id"]
    tokens_per_req = np.bincount(idx, weights=ck, minlength=n).astype(np.int64) if len(idx) else np.zeros(n, np.int64)
    ttft_s: list[float] = []
    for i in range(n):
        seq = seqs[i]
        plan = plans[i]
        row_status = status[i]
        kind = error_kind[i]
        first = last = None
        out_tokens = None
        chunk_count = int(counts[i])
        if seq is not None:
            out_tokens = int(tokens_per_req[i])
            if chunk_count:
                first = int(ct[starts[i]])
                last = int(ct[starts[i] + chunk_count - 1])
                ttft_s.append((first - seq.arrival_ns) / _NS)
            cancel = cols["cancel_after_tokens"][i]
            if plan is not None and plan.disconnect_after is not None and out_tokens < seq.max_out and (
                cancel is None or plan.disconnect_after <= cancel
            ):
                row_status, kind = STATUS_ERROR, "reset_mid_stream"
            elif cancel is not None and out_tokens < seq.max_out:
                row_status = STATUS_CANCELLED
            elif plan is not None and plan.malformed_after is not None and out_tokens >= plan.malformed_after:
                row_status, kind = STATUS_ERROR, "malformed_sse"
            else:
                row_status = STATUS_OK
        finished_ok = row_status == STATUS_OK or kind == "malformed_sse"
        result.requests.append(
            empty_request_row(
                request_id=rids[i],
                request_class=cols["request_class"][i],
                conversation_id=cols["conversation_id"][i],
                turn_index=cols["turn_index"][i],
                prefix_group=cols["prefix_group"][i],
                warm=True,
                scheduled_ns=offsets[i],
                slot_acquired_ns=sent[i],
                sent_ns=sent[i],
                first_byte_ns=(sent[i] + (int(plan.slow_start_s * _NS) if plan else 0)) if sent[i] is not None else None,
                first_token_ns=first,
                last_token_ns=last,
                done_ns=done[i],
                target_prompt_tokens=cols["prompt_tokens"][i],
                target_output_tokens=cols["output_tokens"][i],
                server_prompt_tokens=cols["prompt_tokens"][i] if finished_ok else None,
                server_output_tokens=out_tokens if finished_ok else None,
                client_output_tokens=out_tokens,
                chunk_count=chunk_count if seq is not None else None,
                cancel_after_tokens=cols["cancel_after_tokens"][i],
                status=row_status,
                error_kind=kind,
                http_status=http_status[i] if http_status[i] is not None else (200 if seq is not None else None),
                retry_after_s=retry_after[i],
                finish_reason="length" if finished_ok else None,
                response_model=config.model if seq is not None else None,
            )
        )

    rid_arr = np.array(rids, dtype=object)
    result.chunks = {
        "request_id": rid_arr[idx].tolist(),
        "seq": seqno.tolist(),
        "arrival_ns": ct.tolist(),
        "tokens": ck.tolist(),
        "bytes": nbytes.tolist(),
    }

    # --- per-step server metrics under vLLM names, then final histograms ---
    labels = metric_labels_json(config.model)
    steps = len(m_rows)
    names: list[str] = []
    times: list[int] = []
    values: list[float] = []
    tlist = [row[0] for row in m_rows]
    state = np.array([row[1:] for row in m_rows], dtype=np.float64).reshape(steps, len(STEP_METRICS))
    for j, (name, _help) in enumerate(STEP_METRICS):
        names.extend([name] * steps)
        times.extend(tlist)
        values.extend(state[:, j].tolist())
    t_final = tlist[-1] if tlist else 0
    label_col = [labels] * (steps * len(STEP_METRICS))
    itl = _itl_seconds(idx, ct, ck)
    for name, buckets, data in (
        ("vllm:time_to_first_token_seconds", TTFT_BUCKETS, np.array(ttft_s)),
        ("vllm:inter_token_latency_seconds", ITL_BUCKETS, itl),
    ):
        for sample_name, sample_labels, value in histogram_samples(name, buckets, data, config.model):
            names.append(sample_name)
            times.append(t_final)
            values.append(value)
            label_col.append(sample_labels)
    result.metrics = {"time_ns": times, "name": names, "labels": label_col, "value": values}

    busy_s = engine.busy_ns / _NS
    out_total = int(tokens_per_req.sum())
    result.notes = {
        "simulated": True,
        "steps": engine.steps,
        "busy_s": busy_s,
        "virtual_duration_s": (t_final / _NS) if steps else 0.0,
        "output_tokens": out_total,
        "output_tokens_per_busy_s": (out_total / busy_s) if busy_s else None,
        "prompt_tokens_computed": engine.prompt_tokens_total,
        "preemptions": engine.num_preemptions,
        "prefix_cache_queries": engine.prefix_queries,
        "prefix_cache_hits": engine.prefix_hits,
        "num_kv_blocks": engine.total_blocks,
        "block_size": bs,
        "kv_cache_tokens": engine.total_blocks * bs,
        "faults_injected": _count_faults(plans),
    }
    return result


def _itl_seconds(idx: np.ndarray, ct: np.ndarray, ck: np.ndarray) -> np.ndarray:
    """Per-token gaps: a chunk of k tokens Δ after the previous chunk gives k gaps of Δ/k."""
    if len(idx) < 2:
        return np.zeros(0)
    same = idx[1:] == idx[:-1]
    gaps = (ct[1:] - ct[:-1])[same] / _NS
    k = ck[1:][same]
    return np.repeat(gaps / k, k)


def _count_faults(plans: list[FaultPlan | None]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for plan in plans:
        if plan is None:
            continue
        for kind, _params in plan.items():
            counts[kind] = counts.get(kind, 0) + 1
    return counts


def run_worksheet(
    trace_path: str | Path,
    engine: str | Path | EngineConfig,
    out_dir: str | Path,
    seed: int = 0,
    scenario: Any = None,
) -> Path:
    """Simulate ``trace_path`` on ``engine`` (path, preset name or config); write ``out_dir``."""
    trace_path = Path(trace_path)
    config = engine if isinstance(engine, EngineConfig) else load_engine_config(engine)
    table, metadata = _read_trace(trace_path)
    if table.num_rows == 0:  # the same rule as a measured run
        raise TraceError(f"{trace_path}: trace has no requests: expected at least one row")
    scen_manifest = None
    endpoint = "completions"
    if scenario is not None:
        from ..scenario import Scenario, load_scenario, scenario_manifest

        scen = scenario if isinstance(scenario, Scenario) else load_scenario(scenario)
        scen_manifest = scenario_manifest(scen)
        endpoint = "chat" if scen.endpoint == "chat" else "completions"
    started = utc_now_iso()
    engine_manifest = config.manifest()
    manifest: dict[str, Any] = {
        "run_kind": "simulated",
        "harness": harness_identity(),
        "host": host_identity(),
        "target": {
            "kind": "sim",
            "base_url": None,
            "model": config.model,
            "version": {"version": __version__, "engine": "loadgen-sim"},
            "engine": {"name": "loadgen-sim", "version": __version__, "config": engine_manifest},
        },
        "engine_config": engine_manifest,
        "scenario": scen_manifest,
        "trace": {
            "path": str(trace_path),
            "sha256": sha256_file(trace_path),
            "name": metadata.get("trace_name"),
            "seed": metadata.get("seed"),
            "metadata": metadata,
        },
        "options": {"engine": str(engine if not isinstance(engine, EngineConfig) else config.name), "seed": seed,
                    "endpoint": endpoint, "face": "worksheet",
                    "scenario": None if scenario is None else str(getattr(scenario, "source_path", None) or scenario)},
        "warm_state": {"state": "warm", "actions": ["simulated engine: starts warm, nothing to load or compile"]},
        "order_index": None,
        "repeat": None,
        "plan_cell": None,
        "started_utc": started,
        "anchor": {"perf_counter_ns": 0, "utc": started, "clock": "virtual: ns from trace start"},
        "modelExecuted": False,
        "benchmarkExecuted": False,
        "behavior_relevant": {
            "truncation": None,
            "prefix_caching": config.kv.enable_prefix_caching,
            "quantization": None,
            "speculative_decoding": config.scheduler.decode_tokens_per_step > 1,
            "kv_cache_dtype": config.kv.kv_cache_dtype,
        },
    }
    result = simulate_trace(table, metadata, config, seed=seed, endpoint=endpoint)
    with RunWriter(Path(out_dir), manifest) as writer:
        for row in result.requests:
            writer.add_request(row)
        _add_in_batches(writer.add_chunks, result.chunks, 200_000)
        _add_in_batches(writer.add_metrics, result.metrics, 200_000)
        writer.close(
            ended_utc=utc_now_iso(),
            duration_s=result.notes["virtual_duration_s"],
            engine_notes=result.notes,
        )
    return Path(out_dir)


def _add_in_batches(add: Any, columns: dict[str, list[Any]], size: int) -> None:
    if not columns:
        return
    total = len(next(iter(columns.values())))
    for a in range(0, total, size):
        add({k: v[a : a + size] for k, v in columns.items()})
