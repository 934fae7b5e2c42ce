"""Face 1: replay a trace through the engine in virtual time and write a run directory.

The run directory has exactly the record schema of a measured run, so the analyzer cannot tell
them apart except through the manifest (``run_kind: simulated``, ``modelExecuted: false``). The
client side is ideal (no network, headers at send time) but honours the trace's concurrency
limit (``max_in_flight``, or ``concurrency`` for closed traces) as the driver does. Same trace +
engine config + seed = identical tables.

A fleet (``replicas`` > 1) is N independent engines of the same config behind the driver's routing
policy (``loadgen.workload.routing``: round-robin or least in flight, conversations sticky), one client and one
virtual clock: each request row names its engine (``target_index``) and each engine's server metrics
carry a ``target_index`` label, as a measured run against N replicas does.
"""

from __future__ import annotations

import heapq
from array import array
from collections import deque
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

import numpy as np
import pyarrow as pa

from loadgen.analysis.metrics import rate_window_s, tokens_per_s
from loadgen.rundir.identity import harness_identity, host_identity, sha256_file, utc_now_iso
from loadgen.rundir.io import RunWriter
from loadgen.rundir.manifest import Anchor, EngineIdentity, Manifest, TargetRef, TraceRef, WarmState, merge_manifest
from loadgen.rundir.rowtables import kind_column
from loadgen.rundir.schema import (
    CHUNKS_SCHEMA,
    REQUESTS_SCHEMA,
    SERVER_METRICS_SCHEMA,
    STATUS_CANCELLED,
    STATUS_ERROR,
    STATUS_OK,
    TRACE_SCHEMA,
    http_error_kind,
)
from loadgen.util.errors import EngineError, TraceError
from loadgen.workload.routing import RoutePolicy, Router
from loadgen.workload.scenario import Scenario, load_scenario, scenario_manifest
from loadgen.workload.sessions import ReplyWaits, reply_dependencies

from .. import __version__
from ..trace.io import read_trace, refuse_unreplayable
from .config import EngineConfig, load_engine_config
from .dp_balance import VLLM_DP, ServerRouter, SimRoutePolicy, VllmDpBalancer, dp_servers
from .engine import NEVER_NS, DecodeRun, Engine, Seq, StepResult
from .faults import FaultDecider, FaultPlan
from .metrics import (
    ITL_BUCKETS,
    STEP_METRICS,
    TTFT_BUCKETS,
    histogram_samples,
    metric_labels_json,
)
from .prefix_chain import engine_block_chain
from .profile import OperatorProfile
from .profile_grid import GridCoverage
from .protocol import StreamFormat, filler_bytes, request_id_for, token_bytes

__all__ = ["WorksheetResult", "run_worksheet", "simulate_trace"]

_NS = 1_000_000_000


def _read_trace(trace_path: Path) -> tuple[pa.Table, dict[str, Any]]:
    """The trace table and its metadata (run_worksheet's reader)."""
    return read_trace(trace_path)


class WorksheetResult:
    """Everything the simulation produced, as tables in the record schemas; written by run_worksheet."""

    def __init__(self) -> None:
        self.requests_table: pa.Table = REQUESTS_SCHEMA.empty_table()
        self.chunks: pa.Table = CHUNKS_SCHEMA.empty_table()
        self.metrics: pa.Table = SERVER_METRICS_SCHEMA.empty_table()
        self.notes: dict[str, Any] = {}

    @property
    def requests(self) -> list[dict[str, Any]]:
        """The request rows as dicts (every REQUESTS_SCHEMA column)."""
        return cast(list[dict[str, Any]], self.requests_table.to_pylist())


class _Client:
    """The ideal client: sends each request on schedule under the concurrency limit.

    A request the engine cannot take (too long, injected error or 429) is answered at once; the
    others become engine sequences (after a slow start, when one is injected). Holds the per-request
    outcome columns the run's rows are built from.
    """

    def __init__(
        self,
        cols: dict[str, list[Any]],
        engines: list[Engine],
        config: EngineConfig,
        plans: list[FaultPlan | None],
        stop_after: list[int | None],
        limit: int,
        router: Router | None = None,
    ) -> None:
        n = len(plans)
        self.cols = cols
        self.engines = engines
        self.router = router  # a fleet: which engine each request goes to (None: the one engine)
        self.target: list[int | None] = [None] * n  # engine of each request sent
        self.scheduler = config.scheduler  # the max_model_len rule (SchedulerConfig.output_tokens)
        self.overhead_ns = int(config.cost.request_overhead_ms * 1e6)  # before the request reaches the engine
        self.plans = plans
        self.stop_after = stop_after  # tokens after which the client stops reading
        self.limit = limit
        self.sent: list[int | None] = [None] * n
        self.done: list[int | None] = [None] * n
        self.status: list[str | None] = [None] * n
        self.error_kind: list[str | None] = [None] * n
        self.http_status: list[int | None] = [None] * n
        self.retry_after: list[float | None] = [None] * n
        self.seqs: list[Seq | None] = [None] * n
        self.queue: deque[int] = deque()
        self.delayed: list[tuple[int, int]] = []  # (engine arrival ns, index) after a slow start
        self.in_flight = 0
        # the schedule: trace offsets, except turns that wait for the reply (think_after_reply_ns), which
        # become due one think time after the previous turn of their conversation ended (``ready``)
        self.scheduled: list[int] = list(cols["scheduled_offset_ns"])
        self.ptr = 0
        self.ready: list[tuple[int, int]] = []  # (due ns, index) of reply-waiting rows whose replies ended
        self.waits = _reply_waits(cols)  # which rows wait for which replies (loadgen.workload.sessions)
        self.followers = bool(self.waits.deps)
        self.waiting = self.waits.waiting()  # not due at their offset (a row without waits is)
        self.service: list[int | None] = cols.get("service_ns") or [None] * n  # least reply time (ns)
        self.block_hash_tokens = 0  # tokens per prompt_block_hashes entry (the trace metadata's; 0: none)

    def release_due(self, t: int) -> None:
        """Every request due at or before t arrives: trace offsets in order, then reply-waiting turns."""
        offsets, n, waiting = self.scheduled, len(self.scheduled), self.waiting
        while self.ptr < n and offsets[self.ptr] <= t:
            if self.ptr not in waiting:
                self.arrive(self.ptr, offsets[self.ptr])
            self.ptr += 1
        while self.ready and self.ready[0][0] <= t:
            due, i = heapq.heappop(self.ready)
            self.arrive(i, due)

    def next_due(self) -> int | None:
        """When the next request is due (None: none left that is scheduled or ready)."""
        offsets, n = self.scheduled, len(self.scheduled)
        while self.ptr < n and self.ptr in self.waiting:
            self.ptr += 1  # reply-waiting turns are not due at their offset
        due = offsets[self.ptr] if self.ptr < n else None
        if self.ready and (due is None or self.ready[0][0] < due):
            due = self.ready[0][0]
        return due

    def _ended(self, i: int, t: int) -> None:
        """Request i's reply ended at t: each row it was the last wait of becomes due one think time later."""
        for due, nxt in self.waits.ended(i, t):
            self.scheduled[nxt] = due
            heapq.heappush(self.ready, (due, nxt))

    def arrive(self, i: int, t: int) -> None:
        """Request i is due at t: send it, or queue it while the client is at its limit."""
        if self.in_flight < self.limit:
            self.send(i, t)
        else:
            self.queue.append(i)

    def finish(self, i: int, t: int) -> None:
        """Request i ended at t: free its client slot and send queued requests (no recursion). A row with a
        ``service_ns`` ends no earlier than that long after it was sent (the live engine's SIM_SERVICE_FIELD)."""
        service = self.service[i]
        sent = self.sent[i]
        if service is not None and sent is not None:
            t = max(t, sent + int(service))
        self.done[i] = t
        self.in_flight -= 1
        if self.router is not None:
            self.router.finished(cast(int, self.target[i]))
        if self.followers:
            self._ended(i, t)
        while self.queue and self.in_flight < self.limit:
            self.send(self.queue.popleft(), t)

    def _chain(self, i: int, prompt: int, block_size: int) -> list[int] | None:
        """Request i's prefix-cache chain from the trace's ``prompt_block_hashes`` (None: the trace has none)."""
        hashes = self.cols.get("prompt_block_hashes")
        row = hashes[i] if hashes is not None else None
        if row is None or not self.block_hash_tokens:
            return None
        return engine_block_chain(row, self.block_hash_tokens, block_size, prompt)

    def _answer_now(self, i: int, t: int, code: int, retry_after_s: float | None = None) -> None:
        """Request i is answered at t with HTTP ``code`` and never reaches the engine."""
        self.status[i], self.error_kind[i], self.http_status[i] = STATUS_ERROR, http_error_kind(code), code
        self.retry_after[i] = retry_after_s
        self.done[i] = t
        if self.router is not None:
            self.router.finished(cast(int, self.target[i]))
        if self.followers:
            self._ended(i, t)

    def send(self, i: int, t: int) -> None:
        """Request i leaves the client at t; answered at once (errors) or handed to the engine."""
        self.sent[i] = t
        plan = self.plans[i]
        cols = self.cols
        conv = cols["conversation_id"][i]
        index = self.target[i] = self.router.assign(conv, now_ns=t) if self.router is not None else 0
        engine = self.engines[index]
        prompt = cols["prompt_tokens"][i]
        out = self.scheduler.output_tokens(prompt, cols["output_tokens"][i])
        if out is None or not engine.fits(prompt, out):
            self._answer_now(i, t, 400)
            return
        if plan is not None and plan.error_status is not None:
            self._answer_now(i, t, plan.error_status)
            return
        if plan is not None and plan.retry_after_s is not None:
            self._answer_now(i, t, 429, plan.retry_after_s)
            return
        self.in_flight += 1
        key = conv if conv is not None else cols["prefix_group"][i]
        cache_limit = None if conv is not None else cols["prefix_tokens"][i]
        chain = self._chain(i, prompt, engine.block_size)
        if chain is not None:  # the trace's block hashes: a hit wherever the prompts' blocks agree
            key, cache_limit = (chain[0] if chain else None), None
        arrive = t + self.overhead_ns + (int(plan.slow_start_s * _NS) if plan is not None else 0)
        seq = Seq(i, prompt, out, arrive, cache_key=key, cache_limit_tokens=cache_limit, chain=chain)
        seq.stop_after = self.stop_after[i]
        self.seqs[i] = seq
        if arrive > t:
            heapq.heappush(self.delayed, (arrive, i))
        else:
            engine.add(seq)


_SEGMENT = 11  # values per segment of steps in _Steps.segments


class _Steps:
    """What the engine did, step by step: who emitted (a chunk each), how many tokens, when; and the
    server state after each step (see ``state``): what changes every step in arrays, the rest in
    segments of steps that share it."""

    def __init__(self, spec: int, total_blocks: int) -> None:
        self.spec = spec
        self.total_blocks = total_blocks
        self.c_idx = array("i")  # request index of each emission (a chunk), in step order
        self.c_k = array("i")  # tokens per emission (only kept when a step can emit more than one)
        self.c_step_t = array("q")  # end time of each step that emitted ...
        self.c_step_n = array("i")  # ... and how many chunks it emitted
        self.t = array("q")  # per step: end time, duration (ns), KV blocks used
        self.duration = array("q")
        self.kv_blocks = array("q")
        # per segment of steps, _SEGMENT values: (steps, running, waiting, prefix queries, prefix hits,
        # preemptions, prompt tokens (total), prefill tokens, decode sequences, generation tokens (total)
        # after its first step, added per step)
        self.segments = array("q")

    def record_chunks(self, emitted: list[Seq], t_end: int) -> None:
        if emitted:
            self.c_idx.extend([s.idx for s in emitted])
            if self.spec > 1:
                self.c_k.extend([s.emitted for s in emitted])
            self.c_step_t.append(t_end)
            self.c_step_n.append(len(emitted))

    def record_state(self, engine: Engine, res: StepResult, t_end: int) -> None:
        self.t.append(t_end)
        self.duration.append(res.duration_ns)
        self.kv_blocks.append(engine.kv_blocks_used)
        self.segment(engine, 1, len(engine.running), len(engine.waiting), res.prefill_tokens, res.decode_seqs)

    def next_scheduled(self, engine: Engine, res: StepResult, t_start: int) -> None:
        """The engine has just scheduled a step at ``t_start`` (``res``). With asynchronous scheduling, vLLM makes
        the scheduler stats of the step that ended then (``Scheduler.make_stats``, in ``update_from_output``) only
        after it has scheduled this one (``EngineCore.step_with_batch_queue``). So that step's running, waiting
        and KV figures become the engine's now: this step's admissions and preemptions counted, the requests it
        will finish still running, those the last one finished released. An idle gap before it leaves them as
        they were."""
        if not engine.async_scheduling or not self.t or self.t[-1] != t_start:
            return
        at = len(self.segments) - _SEGMENT
        assert self.segments[at] == 1, "asynchronous scheduling takes its steps one by one"
        self.segments[at + 1] = len(engine.running) + len(res.finished)
        self.segments[at + 2] = len(engine.waiting)
        self.kv_blocks[-1] = engine.kv_blocks_used

    def segment(self, engine: Engine, steps: int, running: int, waiting: int, prefill: int, decode: int) -> None:
        self.segments.extend(
            (
                steps,
                running,
                waiting,
                engine.prefix_queries,
                engine.prefix_hits,
                engine.num_preemptions,
                engine.prompt_tokens_total,
                prefill,
                decode,
                engine.generation_tokens_total,
                0,
            )
        )

    def record_run(self, engine: Engine, run: DecodeRun) -> None:
        """A decode run's chunks (one per sequence and step, in ``run.seqs`` order) and state rows, but the
        last step's segment (``segment``, after the client's part): what a decode step leaves alone is the
        engine's now, and the last step's blocks are the engine's after its retirements."""
        m = len(run.ends_ns)
        b = len(run.seqs)
        self.c_idx.extend(run.idx * m)
        self.c_step_t.extend(run.ends_ns)
        self.c_step_n.extend(array("i", [b]) * m)
        self.t.extend(run.ends_ns)
        self.duration.extend(run.durations_ns)
        self.kv_blocks.extend(run.kv_blocks)
        self.kv_blocks[-1] = engine.kv_blocks_used
        if m > 1:  # generation tokens: b a step, up to the engine's count now after the last step
            self.segments.extend(
                (
                    m - 1,
                    b,
                    run.waiting,
                    engine.prefix_queries,
                    engine.prefix_hits,
                    engine.num_preemptions,
                    engine.prompt_tokens_total,
                    0,
                    b,
                    engine.generation_tokens_total - b * (m - 1),
                    b,
                )
            )

    def state(self) -> list[np.ndarray]:
        """The state after each step, a float64 column per STEP_METRICS value."""
        seg = np.frombuffer(self.segments, dtype=np.int64).reshape(-1, _SEGMENT)
        lengths = seg[:, 0]
        c = np.repeat(np.ascontiguousarray(seg[:, 1:].T), lengths, axis=1)  # a contiguous row per value
        within = np.arange(len(self.t), dtype=np.int64) - np.repeat(np.cumsum(lengths) - lengths, lengths)
        generated = c[8] + c[9] * within
        kv = np.frombuffer(self.kv_blocks, dtype=np.int64)
        duration = np.frombuffer(self.duration, dtype=np.int64)
        columns = [c[0], c[1], kv / self.total_blocks, *c[2:6], generated, c[6], c[7], duration / _NS, kv]
        return [x.astype(np.float64) for x in columns]


def _decide_faults(
    decider: FaultDecider, cancel_after: list[int | None]
) -> tuple[list[FaultPlan | None], list[int | None]]:
    """Each request's fault plan (in trace order) and the token count after which its client stops reading."""
    plans: list[FaultPlan | None] = []
    stop_after: list[int | None] = []
    for cancel in cancel_after:
        plan = decider.decide()
        plans.append(plan)
        stops = [x for x in (cancel, plan.disconnect_after if plan else None) if x is not None]
        stop_after.append(min(stops) if stops else None)
    return plans, stop_after


def _reply_waits(cols: dict[str, list[Any]]) -> ReplyWaits:
    """Which rows wait for which replies, by row index (none when the trace has no reply-waiting rows)."""
    think = cols.get("think_after_reply_ns") or [None] * len(cols["request_id"])
    deps = reply_dependencies(
        cols["request_id"], cols["conversation_id"], cols["turn_index"], think, cols.get("wait_for_ids")
    )
    return ReplyWaits(deps, think)


def _next_event(client: _Client, delayed: list[tuple[int, int]]) -> int | None:
    """The next due request or delayed engine arrival, if any."""
    due = client.next_due()
    if delayed and (due is None or delayed[0][0] < due):
        due = delayed[0][0]
    return due


def _run_fleet_virtual_time(engines: list[Engine], client: _Client) -> tuple[_Steps, list[_Steps]]:
    """The event loop of a fleet, in time order: step ends (their chunks, finished requests), sends and
    arrivals, then a new step on every idle engine with work. Returns the chunks of every engine
    (``_Steps`` in step-end order) and each engine's own state rows.

    Engines whose profile spreads an MoE model's experts over ``ep`` GPUs are data-parallel ranks of one
    expert-parallel group (engines 0..ep-1, ep..2ep-1, ...): as vLLM runs them, in lockstep, each step of the
    group starting together and ending with its slowest rank's."""
    steps = _Steps(engines[0].spec, engines[0].total_blocks)
    states = [_Steps(e.spec, e.total_blocks) for e in engines]
    delayed = client.delayed
    pending: list[tuple[int, StepResult] | None] = [None] * len(engines)  # (end, result) of a step under way
    profile = engines[0].profile
    ep = profile.ep if profile is not None else 1
    groups = [list(range(k, min(k + ep, len(engines)))) for k in range(0, len(engines), ep)]
    observe = client.router.observe if isinstance(client.router, VllmDpBalancer | ServerRouter) else None
    t = 0
    while True:
        for t_end, i in sorted((p[0], i) for i, p in enumerate(pending) if p is not None and p[0] <= t):
            res = cast(tuple[int, StepResult], pending[i])[1]
            pending[i] = None
            steps.record_chunks(res.emitted, t_end)
            for seq in res.finished:
                client.finish(seq.idx, t_end)
            states[i].record_state(engines[i], res, t_end)
        client.release_due(t)
        while delayed and delayed[0][0] <= t:
            idx = heapq.heappop(delayed)[1]
            engines[cast(int, client.target[idx])].add(cast(Seq, client.seqs[idx]))
        wake: list[int] = []
        for group in groups:
            if any(pending[i] is not None for i in group):
                continue  # a lockstep group starts its steps together
            started: list[int] = []
            for i in group:
                engine = engines[i]
                if pending[i] is not None or not engine.has_work:
                    continue
                hold = engine.hold_until_ns(t)
                if hold is not None:
                    wake.append(hold)
                    continue
                res = engine.step(t)
                if res.duration_ns == 0 and not res.emitted and not res.finished:
                    continue  # no progress until something else happens
                states[i].next_scheduled(engine, res, t)
                if observe is not None:
                    observe(i, t, engine.load_counts())
                pending[i] = (t + res.duration_ns, res)
                started.append(i)
            if len(group) > 1 and started:
                _lockstep(t, started, pending, profile, engines[0].graph_sizes)
        nxt = _next_event(client, delayed)
        times = [p[0] for p in pending if p is not None] + wake + ([nxt] if nxt is not None else [])
        if not times:
            if any(e.has_work for e in engines):
                raise _no_progress(next(e for e in engines if e.has_work))
            break
        t_next = min(times)
        if t_next <= t and not any(p is not None and p[0] <= t for p in pending):
            raise _no_progress(engines[0])
        t = max(t, t_next)
    return steps, states


def _lockstep(
    t: int,
    started: list[int],
    pending: list[tuple[int, StepResult] | None],
    profile: OperatorProfile | None,
    graph_sizes: Sequence[int],
) -> None:
    """The steps a lockstep group started at ``t``: each rank's experts run over the whole group's tokens (padded
    to the busiest rank's, at its CUDA-graph size, in a CUDA-graph step: ``dp_padded``), and every rank's step
    lasts as long as the slowest one's."""
    results = [cast(tuple[int, StepResult], pending[i])[1] for i in started]
    tokens = [r.prefill_tokens + r.decode_seqs for r in results]
    durations = [r.duration_ns for r in results]
    if profile is not None:
        total, busiest = sum(tokens), max(tokens)
        durations = [
            d + int(profile.group_delta_us(n, total, busiest, graph_sizes) * 1e3)
            for d, n in zip(durations, tokens, strict=True)
        ]
    end = t + max(durations)
    for i, res in zip(started, results, strict=True):
        pending[i] = (end, res)


def _no_progress(engine: Engine) -> EngineError:
    """A config whose engine cannot serve its queue (a step that admits nothing, and nothing else to wait for):
    one line, naming it and the limits that decide admission."""
    c = engine.config
    return EngineError(
        f"engine config {c.name!r}: the simulated engine made no progress with requests queued (max_num_seqs = "
        f"{c.scheduler.max_num_seqs}, max_num_batched_tokens = {c.scheduler.max_num_batched_tokens}, "
        f"num_kv_blocks = {engine.num_kv_blocks}): expected limits under which a step can admit a request"
    )


def _run_virtual_time(engine: Engine, client: _Client, fast: bool = True) -> _Steps:
    """The event loop: jump the clock to the next send, arrival, window opening or step end.

    ``fast``: while every running sequence decodes, their decodes are counted a run of steps at a time
    (``Engine.decode_run``: the very same steps as one by one, only quicker)."""
    steps = _Steps(engine.spec, engine.total_blocks)
    record = _Recorder(steps, engine, client)
    t = 0
    while True:
        nxt = _arrivals(engine, client, t)
        if not engine.has_work:
            if nxt == NEVER_NS:
                break
            t = max(t, nxt)
            continue
        hold = engine.hold_until_ns(t)
        if hold is not None:
            t = min(hold, nxt)
            continue
        if fast:
            end = engine.decode_run(t, nxt, record)
            if end is not None:
                t = end
                continue
        res = engine.step(t)
        if res.duration_ns == 0 and not res.emitted and not res.finished:
            if nxt == NEVER_NS or nxt <= t:
                raise _no_progress(engine)
            t = nxt
            continue
        steps.next_scheduled(engine, res, t)
        t += res.duration_ns
        record.step(res, t)
    return steps


class _Recorder:
    """What the event loop does after a step (the steps of a decode run too: ``Engine.decode_run``):
    record it as its steps one by one would be (chunks, finished requests, state), then let due
    requests arrive; each returns the next event."""

    def __init__(self, steps: _Steps, engine: Engine, client: _Client) -> None:
        self.steps, self.engine, self.client = steps, engine, client

    def decodes(self, run: DecodeRun) -> int:
        self.steps.record_run(self.engine, run)
        t_end = run.ends_ns[-1]
        for seq in run.finished:
            self.client.finish(seq.idx, t_end)
        engine = self.engine  # the last step's segment: the engine's now, after the client's part
        self.steps.segment(engine, 1, len(engine.running), len(engine.waiting), 0, len(run.seqs))
        return _arrivals(engine, self.client, t_end)

    def step(self, res: StepResult, end_ns: int) -> int:
        self.steps.record_chunks(res.emitted, end_ns)
        for seq in res.finished:
            self.client.finish(seq.idx, end_ns)
        self.steps.record_state(self.engine, res, end_ns)
        return _arrivals(self.engine, self.client, end_ns)


def _arrivals(engine: Engine, client: _Client, t: int) -> int:
    """Every request due at or before ``t`` reaches the client, and the engine when sent; the next event."""
    nxt = _next_event(client, client.delayed)
    if nxt is None or nxt > t:
        return NEVER_NS if nxt is None else nxt  # nothing due yet
    client.release_due(t)
    delayed = client.delayed
    while delayed and delayed[0][0] <= t:
        engine.add(cast(Seq, client.seqs[heapq.heappop(delayed)[1]]))  # arrive() stored it before queueing
    nxt = _next_event(client, delayed)
    return NEVER_NS if nxt is None else nxt


class _Chunks:
    """Per-chunk arrays grouped by request (stable: steps are time-ordered) and per-request counts."""

    def __init__(self, steps: _Steps, n: int, endpoint: str, model: str) -> None:
        idx = np.array(steps.c_idx, dtype=np.int32)
        ct = np.repeat(np.array(steps.c_step_t, dtype=np.int64), np.array(steps.c_step_n, dtype=np.int64))
        # a stable sort; on 16-bit keys numpy's is a radix sort, many times quicker on millions of chunks
        order = np.argsort(idx.astype(np.uint16) if n <= 1 << 16 else idx, kind="stable")
        self.idx, self.ct = idx[order], ct[order]
        idx = self.idx
        counts = np.bincount(idx, minlength=n) if len(idx) else np.zeros(n, np.int64)
        starts = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)
        self.counts, self.starts = counts, starts
        self.seqno = np.arange(len(idx), dtype=np.int64) - np.repeat(starts, counts)
        self.single = steps.spec == 1  # one token per chunk
        if self.single:
            self.ck = ck = np.ones(len(idx), dtype=np.int32)
            tok_before = self.seqno
            self.tokens_per_req = counts.astype(np.int64)
        else:
            self.ck = ck = np.array(steps.c_k, dtype=np.int32)[order]
            before_all = np.cumsum(ck, dtype=np.int64) - ck  # tokens before each chunk, whole run
            has = counts > 0
            tok_before = before_all - np.repeat(before_all[starts[has]], counts[has])  # ... within its request
            self.tokens_per_req = (
                np.bincount(idx, weights=ck, minlength=n).astype(np.int64) if len(idx) else np.zeros(n, np.int64)
            )
        created = 1_700_000_000
        fmt = StreamFormat(endpoint, request_id_for(endpoint, 0), created, model)
        text = token_bytes(tok_before) if self.single else filler_bytes(tok_before, ck.astype(np.int64))
        self.nbytes = fmt.content_overhead() + text
        self.tok_before = tok_before
        self.reasoning_extra_bytes = len(fmt.reasoning_head) - len(fmt.head)
        self.kind = np.zeros(len(idx), dtype=np.int64)  # CHUNK_KINDS codes: all answer until ``mark_reasoning``
        self.first_answer_ns: np.ndarray | None = None  # per request; None: the first token is the first answer

    def mark_reasoning(self, reasoning: np.ndarray) -> None:
        """The first ``reasoning[i]`` output tokens of request ``i`` are reasoning (as the live server streams
        them, ``SIM_REASONING_FIELD``): a chunk all of whose tokens are reasoning is a reasoning chunk; the first
        chunk carrying an answer token gives ``first_answer_ns`` (-1: none). A chunk that crosses into the
        answer counts as answer (the live server sends it as two events at the same instant)."""
        if not len(self.idx) or not reasoning.any():
            return
        limit = reasoning[self.idx]
        is_reasoning = self.tok_before + self.ck <= limit
        self.kind = is_reasoning.astype(np.int64)
        self.nbytes = self.nbytes + np.where(is_reasoning, self.reasoning_extra_bytes, 0)
        answer = np.flatnonzero(~is_reasoning)
        owners, first = np.unique(self.idx[answer], return_index=True)
        self.first_answer_ns = np.full(len(self.counts), -1, dtype=np.int64)
        self.first_answer_ns[owners] = self.ct[answer[first]]

    def apply_stalls(self, plans: list[FaultPlan | None], seqs: list[Seq | None], done: list[int | None]) -> None:
        """Chunks after a stall point arrive no earlier than the stall's end (and so does done)."""
        ct, ck, counts, starts = self.ct, self.ck, self.counts, self.starts
        for i, plan in enumerate(plans):
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

    def first_last(self) -> tuple[list[int], list[int]]:
        """Per request: when its first and its last chunk arrived (no meaning for one without chunks)."""
        if not len(self.ct):
            return [0] * len(self.counts), [0] * len(self.counts)
        top = len(self.ct) - 1
        first = np.clip(self.starts, 0, top)
        last = np.clip(self.starts + self.counts - 1, 0, top)
        return self.ct[first].tolist(), self.ct[last].tolist()

    def table(self, request_ids: list[str]) -> pa.Table:
        """The chunks table, grouped by request."""
        return pa.Table.from_arrays(
            [
                pa.array(request_ids, pa.string()).take(pa.array(self.idx)),
                pa.array(self.seqno.astype(np.int32)),
                pa.array(self.ct),
                pa.array(self.ck),
                pa.array(self.nbytes.astype(np.int32)),
                kind_column(self.kind),
            ],
            schema=CHUNKS_SCHEMA,
        )


def _stream_outcome(
    plan: FaultPlan | None, cancel: int | None, out_tokens: int, max_out: int, kind: str | None
) -> tuple[str, str | None]:
    """(status, error_kind) of a request the engine served: disconnect, client cancel, malformed, or ok."""
    if (
        plan is not None
        and plan.disconnect_after is not None
        and out_tokens < max_out
        and (cancel is None or plan.disconnect_after <= cancel)
    ):
        return STATUS_ERROR, "reset_mid_stream"
    if cancel is not None and out_tokens < max_out:
        return STATUS_CANCELLED, kind
    if plan is not None and plan.malformed_after is not None and out_tokens >= plan.malformed_after:
        return STATUS_ERROR, "malformed_sse"
    return STATUS_OK, kind


def _reasoning_tokens(cols: dict[str, list[Any]], endpoint: str, n: int) -> np.ndarray:
    """Per request, the reasoning tokens the trace asks for (0 when none; chat only, as the live server)."""
    asked = cols.get("reasoning_tokens")
    if endpoint != "chat" or asked is None:
        return np.zeros(n, dtype=np.int64)
    return np.array([r or 0 for r in asked], dtype=np.int64)


def _answer_instants(chunks: _Chunks, first: list[int | None]) -> list[int | None]:
    """Per request, its first answer token's instant (the first token's, without reasoning)."""
    if chunks.first_answer_ns is None:
        return list(first)
    answer = chunks.first_answer_ns.tolist()
    return [None if f is None or a < 0 else a for f, a in zip(first, answer)]


def _finish_reasons(
    cols: dict[str, list[Any]], ok: list[bool], out_tokens: list[int | None], chat: bool
) -> list[str | None]:
    """Per request, as the live server finishes it: "tool_calls" for a chat reply that ends in its whole tool
    call (``tool_call_tokens``), else "length"; None for one that did not end well."""
    tools = cols.get("tool_call_tokens") if chat else None
    if tools is None:
        return ["length" if f else None for f in ok]
    return [
        None if not f else "tool_calls" if tool and o == target else "length"
        for f, tool, o, target in zip(ok, tools, out_tokens, cols["output_tokens"], strict=True)
    ]


def _request_table(
    cols: dict[str, list[Any]], client: _Client, chunks: _Chunks, model: str, reasoning: np.ndarray, chat: bool
) -> tuple[pa.Table, list[float]]:
    """One record row per trace request, and the TTFT (s, from engine arrival) of each that streamed."""
    n = len(client.scheduled)
    status, kind = list(client.status), list(client.error_kind)
    first: list[int | None] = [None] * n
    last: list[int | None] = [None] * n
    out_tokens: list[int | None] = [None] * n
    chunk_count: list[int | None] = [None] * n
    ttft_s: list[float] = []
    counts, tokens = chunks.counts.tolist(), chunks.tokens_per_req.tolist()
    first_ns, last_ns = chunks.first_last()
    for i, seq in enumerate(client.seqs):
        if seq is None:
            continue
        out_tokens[i], chunk_count[i] = tokens[i], counts[i]
        if counts[i]:
            first[i], last[i] = first_ns[i], last_ns[i]
            ttft_s.append((first_ns[i] - seq.arrival_ns) / _NS)
        status[i], kind[i] = _stream_outcome(
            client.plans[i], cols["cancel_after_tokens"][i], tokens[i], seq.max_out, kind[i]
        )
    ok = [st == STATUS_OK or k == "malformed_sse" for st, k in zip(status, kind)]
    served = [seq is not None for seq in client.seqs]
    sent = client.sent
    columns: dict[str, list[Any]] = {
        "request_id": cols["request_id"],
        "request_class": cols["request_class"],
        "conversation_id": cols["conversation_id"],
        "turn_index": cols["turn_index"],
        "prefix_group": cols["prefix_group"],
        "target_index": client.target,
        "warm": [True] * n,
        "scheduled_ns": client.scheduled,  # trace offsets; a reply-waiting turn: when it became due
        "slot_acquired_ns": sent,
        "sent_ns": sent,
        "first_byte_ns": [
            None if t is None else t + (int(plan.slow_start_s * _NS) if plan else 0)
            for t, plan in zip(sent, client.plans)
        ],
        "first_token_ns": first,
        "first_answer_token_ns": _answer_instants(chunks, first),
        "last_token_ns": last,
        "done_ns": client.done,
        "server_queued_ns": [None if seq is None else seq.queued_ns for seq in client.seqs],
        "server_scheduled_ns": [None if seq is None else seq.scheduled_ns for seq in client.seqs],
        "target_prompt_tokens": cols["prompt_tokens"],
        "target_output_tokens": cols["output_tokens"],
        "server_prompt_tokens": [p if f else None for p, f in zip(cols["prompt_tokens"], ok)],
        "server_output_tokens": [o if f else None for o, f in zip(out_tokens, ok)],
        "client_output_tokens": out_tokens,
        "client_reasoning_tokens": [None if o is None else min(o, r) for o, r in zip(out_tokens, reasoning.tolist())],
        "server_reasoning_tokens": [
            min(o, r) if f and o is not None and r else None for o, r, f in zip(out_tokens, reasoning.tolist(), ok)
        ],
        "chunk_count": chunk_count,
        "cancel_after_tokens": cols["cancel_after_tokens"],
        "status": status,
        "error_kind": kind,
        "http_status": [h if h is not None else (200 if s else None) for h, s in zip(client.http_status, served)],
        "retry_after_s": client.retry_after,
        "finish_reason": _finish_reasons(cols, ok, out_tokens, chat),
        "response_model": [model if s else None for s in served],
    }
    arrays = [pa.array(columns[f.name], f.type) if f.name in columns else pa.nulls(n, f.type) for f in REQUESTS_SCHEMA]
    return pa.Table.from_arrays(arrays, schema=REQUESTS_SCHEMA), ttft_s


def _server_metrics(
    steps: _Steps, chunks: _Chunks, ttft_s: list[float], model: str, fleet: list[_Steps] | None = None
) -> pa.Table:
    """Per-step server state under vLLM names, then the final TTFT and ITL histograms.

    ``fleet``: the state rows of each engine of a fleet (labelled ``target_index``) instead of ``steps``';
    the histograms then cover the whole fleet."""
    if fleet is None:
        parts = [_state_metrics(steps, metric_labels_json(model))]
    else:
        parts = [
            _state_metrics(engine_steps, metric_labels_json(model, target_index=str(index)))
            for index, engine_steps in enumerate(fleet)
        ]
    t_final = max((s.t[-1] if len(s.t) else 0) for s in (fleet or [steps]))  # steps end in time order
    itl = _itl_seconds(chunks.idx, chunks.ct, None if chunks.single else chunks.ck)
    names: list[str] = []
    label_col: list[str] = []
    values: list[float] = []
    for name, buckets, data in (
        ("vllm:time_to_first_token_seconds", TTFT_BUCKETS, np.array(ttft_s)),
        ("vllm:inter_token_latency_seconds", ITL_BUCKETS, itl),
    ):
        for sample_name, sample_labels, value in histogram_samples(name, buckets, data, model):
            names.append(sample_name)
            label_col.append(sample_labels)
            values.append(value)
    hist = {"time_ns": [t_final] * len(names), "name": names, "labels": label_col, "value": values}
    parts.append(pa.Table.from_pydict(hist, schema=SERVER_METRICS_SCHEMA))
    return pa.concat_tables(parts)


def _state_metrics(steps: _Steps, labels: str) -> pa.Table:
    """The per-step server state of one engine: each STEP_METRICS name over all steps, in turn."""
    n_steps = len(steps.t)
    times = pa.array(np.frombuffer(steps.t, dtype=np.int64))
    label_col = _repeated(labels, n_steps)
    return pa.concat_tables(
        pa.Table.from_arrays(
            [times, _repeated(name, n_steps), label_col, pa.array(values)], schema=SERVER_METRICS_SCHEMA
        )
        for (name, _help), values in zip(STEP_METRICS, steps.state(), strict=True)
    )


_REPEAT_BLOCK = 1 << 16  # rows of the block a repeated string column is made of


def _repeated(value: str, n: int) -> pa.ChunkedArray:
    """A string column of ``value`` n times: one block of it, built from buffers (``pa.repeat`` is ten
    times slower), referenced as often as it takes (the same values, without n copies of the bytes)."""
    data = value.encode()
    k = min(n, _REPEAT_BLOCK)
    if k * len(data) >= 1 << 31:
        return pa.chunked_array([pa.repeat(value, n)])  # past 32-bit string offsets
    offsets = (np.arange(k + 1, dtype=np.int64) * len(data)).astype(np.int32)
    block = pa.StringArray.from_buffers(k, pa.py_buffer(offsets), pa.py_buffer(data * k))
    full, rest = divmod(n, k) if k else (0, 0)
    return pa.chunked_array([block] * full + ([block.slice(0, rest)] if rest else []), pa.string())


def _engine_notes(engine: Engine, steps: _Steps, chunks: _Chunks, plans: list[FaultPlan | None]) -> dict[str, Any]:
    """The manifest's engine notes: work done, virtual duration, cache and fault counts."""
    busy_s = engine.busy_ns / _NS
    out_total = int(chunks.tokens_per_req.sum())
    t_final = steps.t[-1] if steps.t else 0
    notes = {
        "simulated": True,
        "steps": engine.steps,
        "busy_s": busy_s,
        "virtual_duration_s": (t_final / _NS) if steps.t else 0.0,
        "output_tokens": out_total,
        "output_tokens_per_busy_s": tokens_per_s(out_total, rate_window_s(busy_s)),
        "prompt_tokens_computed": engine.prompt_tokens_total,
        "preemptions": engine.num_preemptions,
        "prefix_cache_queries": engine.prefix_queries,
        "prefix_cache_hits": engine.prefix_hits,
        "num_kv_blocks": engine.num_kv_blocks,
        "block_size": engine.block_size,
        "kv_cache_tokens": engine.num_kv_blocks * engine.block_size,
        "faults_injected": _count_faults(plans),
    }
    if engine.grid is not None:  # how much of it the profile's measured points priced (loadgen.sim.profile_grid)
        notes["profile_grid"] = engine.grid_coverage.to_dict(engine.grid)
    return notes


def simulate_trace(
    table: pa.Table,
    metadata: dict[str, Any],
    config: EngineConfig,
    seed: int = 0,
    endpoint: str = "completions",
    replicas: int = 1,
    route_policy: SimRoutePolicy = "round-robin",
    fast: bool = True,
    dp_delay_ns: int = 0,
) -> WorksheetResult:
    """Run the engine (``replicas`` > 1: a fleet of them behind ``route_policy``) over a trace table in
    virtual time (ns from trace start). ``fast`` = False: one engine step at a time, never a decode run
    at once (the same result, slower; the reference the fast path is tested against). ``dp_delay_ns``: behind
    vLLM's DP balancer, added to its coordinator's first wait after a quiet spell (a sensitivity; 0 as vLLM)."""
    # a reply-waiting turn (think_after_reply_ns) is due one think time after its previous turn ended; the
    # first reasoning_tokens of a request's output stream as reasoning; the last tool_call_tokens are a tool
    # call (answer tokens, timed as any other; the finish reason says "tool_calls")
    names = [
        *TRACE_SCHEMA.names,
        "think_after_reply_ns",
        "reasoning_tokens",
        "prompt_block_hashes",
        "wait_for_ids",
        "service_ns",
        "tool_call_tokens",
    ]
    cols = {name: table.column(name).to_pylist() for name in names if name in table.column_names}
    n = table.num_rows
    engines = [Engine(config, seed=seed + k) for k in range(replicas)]  # engine 0 is the single engine's
    plans, stop_after = _decide_faults(FaultDecider(config.faults, seed=seed), cols["cancel_after_tokens"])
    mode = metadata.get("mode", "open")
    limit = metadata.get("concurrency") if mode == "closed" else metadata.get("max_in_flight")
    router = _router(engines, route_policy, dp_delay_ns) if replicas > 1 else None
    client = _Client(cols, engines, config, plans, stop_after, int(limit) if limit else n + 1, router)
    client.block_hash_tokens = int(metadata.get("block_hash_tokens") or 0)
    fleet: list[_Steps] | None = None
    if router is None:
        steps = _run_virtual_time(engines[0], client, fast)
    else:
        steps, fleet = _run_fleet_virtual_time(engines, client)
    chunks = _Chunks(steps, n, endpoint, config.model)
    chunks.apply_stalls(plans, client.seqs, client.done)
    reasoning = _reasoning_tokens(cols, endpoint, n)
    chunks.mark_reasoning(reasoning)
    result = WorksheetResult()
    result.requests_table, ttft_s = _request_table(cols, client, chunks, config.model, reasoning, endpoint == "chat")
    result.chunks = chunks.table(cols["request_id"])
    result.metrics = _server_metrics(steps, chunks, ttft_s, config.model, fleet)
    if fleet is None:
        result.notes = _engine_notes(engines[0], steps, chunks, plans)
    else:
        result.notes = _fleet_notes(engines, fleet, chunks, plans, route_policy, cast(Router, router))
    return result


def _router(engines: list[Engine], route_policy: SimRoutePolicy, dp_delay_ns: int = 0) -> Router:
    """The fleet's routing: vLLM's own balancer over one server's DP ranks (``vllm-dp``); for engines whose
    profile spreads experts over ``ep`` GPUs, each ``ep`` of them one server (its DP ranks, its balancer) behind
    the client's policy; else the client's policy over N servers."""
    if route_policy == VLLM_DP:
        return VllmDpBalancer(len(engines), dp_delay_ns)
    profile = engines[0].profile
    ep = profile.ep if profile is not None else 1
    servers = dp_servers(len(engines), ep)
    if servers is not None:
        return ServerRouter(servers, ep, route_policy, dp_delay_ns)
    return Router(len(engines), route_policy)


def _fleet_notes(
    engines: list[Engine],
    fleet: list[_Steps],
    chunks: _Chunks,
    plans: list[FaultPlan | None],
    route_policy: str,
    router: Router,
) -> dict[str, Any]:
    """A fleet's engine notes: the sums over its engines (virtual duration: the latest), and each engine's."""
    per = [_engine_notes(e, s, chunks, plans) for e, s in zip(engines, fleet, strict=True)]
    notes = dict(per[0])
    for key in (
        "steps",
        "busy_s",
        "prompt_tokens_computed",
        "preemptions",
        "prefix_cache_queries",
        "prefix_cache_hits",
    ):
        notes[key] = sum(p[key] for p in per)
    for key in ("num_kv_blocks", "kv_cache_tokens"):
        notes[key] = sum(p[key] for p in per)
    notes["virtual_duration_s"] = max(p["virtual_duration_s"] for p in per)
    if "profile_grid" in notes:
        notes["profile_grid"] = GridCoverage.merge([p["profile_grid"] for p in per])
    busy = notes["busy_s"]
    notes["output_tokens_per_busy_s"] = tokens_per_s(notes["output_tokens"], rate_window_s(busy))
    notes["replicas"] = len(engines)
    notes["route_policy"] = route_policy
    if isinstance(router, ServerRouter):
        notes["route_policy"] = f"{route_policy} over {len(router.balancers)} servers, {VLLM_DP} within each"
    notes["routed"] = list(router.routed)
    notes["per_replica"] = [
        {k: p[k] for k in ("steps", "busy_s", "virtual_duration_s", "preemptions", "prefix_cache_hits")} for p in per
    ]
    return notes


def _itl_seconds(idx: np.ndarray, ct: np.ndarray, ck: np.ndarray | None) -> np.ndarray:
    """Per-token gaps: a chunk of k tokens Δ after the previous chunk gives k gaps of Δ/k (``ck`` None:
    every chunk one token)."""
    if len(idx) < 2:
        return np.zeros(0)
    same = idx[1:] == idx[:-1]
    gaps = (ct[1:] - ct[:-1])[same] / _NS
    if ck is None:
        return gaps
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


#: The worksheet's warm state: a virtual engine has nothing to load, compile or lose.
WORKSHEET_WARM_ACTION = "simulated engine: starts warm, nothing to load or compile"


def run_worksheet(
    trace_path: str | Path,
    engine: str | Path | EngineConfig,
    out_dir: str | Path,
    seed: int = 0,
    scenario: Scenario | str | Path | None = None,
    extra_manifest: dict[str, Any] | None = None,
    replicas: int = 1,
    route_policy: RoutePolicy = "round-robin",
    fast: bool = True,
) -> Path:
    """Simulate ``trace_path`` on ``engine`` (path, preset name or config); write ``out_dir``.

    ``extra_manifest`` (sections such as ``plan_cell`` or ``warm_state``) is merged into the manifest.
    ``replicas`` > 1: a fleet of that many engines behind ``route_policy`` (see the module docstring).
    ``fast`` = False: step by step only (``simulate_trace``); the same run directory, slower.
    """
    if replicas < 1:
        raise ValueError(f"replicas = {replicas}: expected at least 1")
    trace_path = Path(trace_path)
    config = engine if isinstance(engine, EngineConfig) else load_engine_config(engine)
    table, metadata = _read_trace(trace_path)
    if table.num_rows == 0:  # the same rule as a measured run
        raise TraceError(f"{trace_path}: trace has no requests: expected at least one row")
    refuse_unreplayable(table, trace_path)
    scen = scenario if scenario is None or isinstance(scenario, Scenario) else load_scenario(scenario)
    endpoint = "chat" if scen is not None and scen.endpoint == "chat" else "completions"
    options = {
        "engine": str(engine if not isinstance(engine, EngineConfig) else config.name),
        "seed": seed,
        "endpoint": endpoint,
        "face": "worksheet",
        "scenario": None if scenario is None else str(getattr(scenario, "source_path", None) or scenario),
    }
    manifest = _worksheet_manifest(trace_path, metadata, config, options, scen)
    if replicas > 1:
        ep = config.cost.profile.ep if config.cost.profile is not None else 1
        manifest = merge_manifest(manifest, _fleet_sections(manifest, replicas, route_policy, ep))
    if extra_manifest:
        manifest = merge_manifest(manifest, extra_manifest)
    result = simulate_trace(
        table, metadata, config, seed=seed, endpoint=endpoint, replicas=replicas, route_policy=route_policy, fast=fast
    )
    _write_worksheet(Path(out_dir), manifest, result, replicas)
    return Path(out_dir)


def _worksheet_manifest(
    trace_path: Path, metadata: dict[str, Any], config: EngineConfig, options: dict[str, Any], scen: Scenario | None
) -> Manifest:
    """A worksheet's manifest as its files open: the simulated engine as the target, virtual time as the clock."""
    started = utc_now_iso()
    engine_manifest = config.manifest()
    return Manifest(
        run_kind="simulated",
        harness=harness_identity(),
        host=host_identity(),
        target=TargetRef(
            kind="sim",
            base_url=None,
            model=config.model,
            version={"version": __version__, "engine": "loadgen-sim"},
            engine=EngineIdentity(name="loadgen-sim", version=__version__, config=engine_manifest),
        ),
        engine_config=engine_manifest,
        scenario=scenario_manifest(scen) if scen is not None else None,
        trace=TraceRef(
            path=str(trace_path),
            sha256=sha256_file(trace_path),
            name=metadata.get("trace_name"),
            seed=metadata.get("seed"),
            metadata=metadata,
        ),
        options=options,
        warm_state=WarmState(state="warm", actions=[WORKSHEET_WARM_ACTION]),
        started_utc=started,
        anchor=Anchor(perf_counter_ns=0, utc=started, clock="virtual: ns from trace start"),
        behavior_relevant={
            "truncation": None,
            "prefix_caching": config.kv.enable_prefix_caching,
            "quantization": None,
            "speculative_decoding": config.scheduler.decode_tokens_per_step > 1,
            "kv_cache_dtype": config.kv.kv_cache_dtype,
        },
    )


def _fleet_sections(manifest: Manifest, replicas: int, route_policy: RoutePolicy, ep: int = 1) -> dict[str, Any]:
    """A fleet's manifest sections: one target per engine, the routing, and the fleet options. Engines of an
    expert-parallel profile are DP ranks, ``ep`` to a server: the policy picks the server, vLLM's balancer the
    rank (``_router``)."""
    target = manifest.target.model_dump(mode="json")
    routing: dict[str, Any] = {"policy": route_policy, "sticky": "conversation", "down_after_connect_errors": 0}
    if (servers := dp_servers(replicas, ep)) is not None:
        routing |= {"servers": servers, "ranks_per_server": ep, "within_server": VLLM_DP}
    return {
        "targets": [{**target, "base_url": f"worksheet engine {k}"} for k in range(replicas)],
        "routing": routing,
        "options": {"replicas": replicas, "route_policy": route_policy},
    }


def _write_worksheet(out_dir: Path, manifest: Manifest, result: WorksheetResult, replicas: int) -> None:
    """The simulated tables as a run directory, a chunk part per 200,000 rows as a measured run flushes."""
    with RunWriter(out_dir, manifest, defer_parts=True) as writer:  # its tables are in memory anyway
        writer.add_request_table(result.requests_table)
        for start in range(0, result.chunks.num_rows, 200_000):
            writer.add_chunk_table(result.chunks.slice(start, 200_000))
            writer.flush_if_full()
        writer.add_metric_table(result.metrics)
        writer.close(
            {
                "ended_utc": utc_now_iso(),
                "duration_s": result.notes["virtual_duration_s"],
                "engine_notes": result.notes,
                **({"routing": {"routed": result.notes["routed"]}} if replicas > 1 else {}),
            }
        )
