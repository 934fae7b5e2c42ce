"""``analyze_run``: a run directory (measured, simulated or imported) → an ``Analysis``.

Requests are read whole (one row per scheduled request, a few columns); chunks are streamed
(``chunks.read_chunk_gaps``); every formula comes from ``metrics``, every quantile from
``percentiles``, every budget rule from ``budgets``. The measurement window selects requests by
their scheduled instant; rates divide counts inside it by its length (see ``DEFINITIONS`` for which
instant each rate counts by). A stopped run (interrupted, failed, killed, stopped by its deadline) is
analysed up to its stop: for a killed run, the instant up to which every scheduled request has its
row. Requests that were not due when the run stopped (``not_due``) are neither offered nor failed.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Iterator
from pathlib import Path
from typing import Any, cast

import numpy as np
import pandas as pd
import pyarrow as pa

from loadgen.analysis.server_metrics import summarize_server_metrics
from loadgen.rundir.io import read_run_manifest, read_run_table, run_table_files
from loadgen.rundir.manifest import Manifest, version_notes
from loadgen.rundir.plausible import refuse_implausible_requests
from loadgen.rundir.schema import (
    CHUNKS_FILE,
    CUT_ERROR_KINDS,
    REQUESTS_FILE,
    REQUESTS_SCHEMA,
    SERVER_METRICS_FILE,
    STATUSES,
)
from loadgen.stats.confidence import ESTIMATOR_RULE, INTERVAL_RULE, SHARE_RULE, wilson_interval
from loadgen.stats.percentiles import PERCENTILE_RULE, SortedParts, summarize_parts, summarize_sorted
from loadgen.util.errors import RunDirError
from loadgen.workload.scenario import Scenario, scenario_from_manifest

from . import metrics as M
from .budgets import (
    BUDGET_METRICS,
    FAILURE_POLICY,
    Check,
    budget_checks,
    client_lag_line,
    error_share_check,
    prompt_tokens_line,
    request_limit,
)
from .chunks import ChunkGaps, read_chunk_gaps
from .model import METRICS, Analysis, GroupSummary
from .replicas import replica_breakdown, replica_codes
from .sessions import SessionMakespans, session_makespans
from .spill import SortedRuns, SpillConfig
from .stability import assess_stability, in_system_at

__all__ = ["DEFINITIONS", "analyze_run", "parse_window", "request_summaries"]

_REQ_COLUMNS = [
    "request_id",
    "request_class",
    "warm",
    "scheduled_ns",
    "slot_acquired_ns",
    "sent_ns",
    "first_token_ns",
    "first_answer_token_ns",
    "last_token_ns",
    "done_ns",
    "target_prompt_tokens",
    "target_output_tokens",
    "client_prompt_tokens",
    "server_prompt_tokens",
    "server_output_tokens",
    "client_output_tokens",
    "client_reasoning_tokens",
    "server_reasoning_tokens",
    "cancel_after_tokens",
    "status",
    "error_kind",
    "http_status",
    "chunk_count",
    "turn_index",
    "conversation_id",
    "target_index",
]
_INSTANTS = ("scheduled_ns", "slot_acquired_ns", "sent_ns", "first_token_ns", "last_token_ns", "done_ns")
_CDF_POINTS = 400
#: A batch's rows are split by code with one mask per code up to this many codes, else by one sort.
_MASKED_CODES = 16
#: TTFT by turn index reports turns 0..8 apart and the 10th turn on together ("9+").
MAX_TURN_SHOWN = 9

DEFINITIONS = {
    "ttft_ms": (
        "first_token - scheduled (client queue + network + server queue + prefill); the first token of either "
        "kind, reasoning or answer"
    ),
    "ttfat_ms": (
        "first_answer_token - scheduled: time to the first answer token (content, refusal or tool call) after "
        "any reasoning; equals TTFT for a model that does not reason; none for a run recorded before schema 3"
    ),
    "client_queue_ms": (
        "sent - scheduled: waiting for a slot, plus the connect when a new connection was opened "
        "(connect_start_ns..connect_end_ns); sent is when the request bytes reached the socket"
    ),
    "server_ttft_ms": "first_token - sent (no connection set-up in it)",
    "itl_ms": (
        "per-token gaps: a content chunk of k tokens arriving D after the previous content chunk gives k "
        "gaps of D/k; the first content chunk gives k-1 gaps of 0; a request's gaps sum to last - first token"
    ),
    "inter_chunk_ms": "raw gaps between consecutive content chunks (user-visible stalls)",
    "tpot_ms": "(last_token - first_token) / (output_tokens - 1); none for one token",
    "e2e_ms": "done - scheduled",
    "samples": (
        "latency tables: ok and planned-abandoned requests (E2E: ok only); failures are counted by status "
        "and enter budget checks as +inf"
    ),
    "offered_rps": "requests scheduled in the window (by scheduled instant) / window length",
    "send_rps": "requests whose bytes reached a socket in the window (by sent instant) / window length",
    "completed_rps": (
        "ok requests done in the window (by completion instant) / window length (tokens: of those requests)"
    ),
    "window": (
        "default: first scheduled instant to one mean inter-arrival gap after the last, so N arrivals at a "
        "constant gap g give offered load 1/g (all scheduled at one instant: to the last done, inclusive), "
        "ending at the stop for a stopped run; latency tables, budgets, attainment and the error share take the "
        "requests scheduled in the window"
    ),
    "rates_unmeasured": (
        "every rate (offered, sent, completed, tokens, goodput, time series) is null, and window.rates_unmeasured "
        "says why, when the window is shorter than 1 ms or the default window is set by one request (its rate "
        "would be 1/latency)"
    ),
    "not_due": "requests the run stopped before they were due: neither offered nor failed, counted apart",
    "percentiles": PERCENTILE_RULE + "; p99 from fewer than 100 samples is flagged",
    "confidence": (
        INTERVAL_RULE + "; attainment and error share: " + SHARE_RULE + "; a budget verdict is pass (interval "
        "at or below the limit), fail (above it) or inconclusive (straddles it); " + ESTIMATOR_RULE
    ),
    "budgets": FAILURE_POLICY,
    "goodput_rps": (
        "ok requests done in the window (by completion instant, as completed_rps) that met every hard "
        "budget / window length, so goodput <= completed"
    ),
    "attainment": (
        "of the requests scheduled in the window that count (all but planned abandonments and cold "
        "starts), the share that finished ok and met every hard budget"
    ),
    "sessions": (
        "agent sessions (every conversation with the same root before '/'): makespan = last step done - first "
        "step scheduled, over sessions whose every request in the window finished ok (n_incomplete others; a "
        "makespan budget counts them as +inf)"
    ),
    "ttft_by_turn": (
        "TTFT (first token - scheduled) of ok and abandoned requests per conversation turn index; a turn "
        "that waits for the reply is scheduled when it became ready (previous reply ended + think time)"
    ),
}


def parse_window(text: str | None) -> tuple[float | None, float | None] | None:
    """``"start:end"`` in seconds on the run clock (either side may be empty) → (start_s, end_s)."""
    if text is None or text == "":
        return None
    if ":" not in text:
        raise RunDirError(f"--window {text!r}: expected start:end in seconds on the run clock (e.g. 10:70)")
    a, b = text.split(":", 1)
    try:
        lo = float(a) if a.strip() else None
        hi = float(b) if b.strip() else None
    except ValueError:
        raise RunDirError(f"--window {text!r}: expected numbers, start:end in seconds") from None
    if any(v is not None and not math.isfinite(v) for v in (lo, hi)):
        raise RunDirError(f"--window {text!r}: expected finite numbers, start:end in seconds")
    if lo is not None and hi is not None and hi <= lo:
        raise RunDirError(f"--window {text!r}: end must be after start")
    return lo, hi


def _as_float(col: pa.ChunkedArray, name: str, run_dir: Path) -> np.ndarray:
    """``col`` as float64 with NaN for null; an integer a double cannot hold exactly (beyond 2**53, an instant
    104 days past the run's anchor) is one RunDirError line naming the column and the value, not a guess."""
    try:
        return col.cast(pa.float64()).to_numpy(zero_copy_only=False)
    except pa.ArrowInvalid as exc:
        detail = str(exc).splitlines()[0][:160]
        raise RunDirError(
            f"{run_dir / REQUESTS_FILE}: {name}: {detail}: expected a value within 2**53 (for an instant: "
            "104 days of the run's anchor)"
        ) from None


def _load_requests(run_dir: Path) -> tuple[pa.Array, dict[str, np.ndarray]]:
    table = read_run_table(run_dir, REQUESTS_FILE, _REQ_COLUMNS)
    if table is None:
        raise RunDirError(f"{run_dir}: no {REQUESTS_FILE}: expected a loadgen run directory")
    cols: dict[str, np.ndarray] = {}
    for name in _REQ_COLUMNS:
        col = table.column(name)
        target = REQUESTS_SCHEMA.field(name).type
        if name in ("request_id",):
            continue
        if pa.types.is_string(target):
            cols[name] = np.asarray(col.to_numpy(zero_copy_only=False), dtype=object)
        else:  # booleans as 1/0/NaN, everything else as float with NaN for null
            cols[name] = _as_float(col, name, run_dir)
    ids = table.column("request_id").combine_chunks()
    bad = set(pd.unique(cols["status"]).tolist()) - set(STATUSES)
    if bad:
        raise RunDirError(
            f"{run_dir / REQUESTS_FILE}: status value(s) {sorted(bad, key=str)}: expected one of {', '.join(STATUSES)}"
        )
    return ids, cols


def _refuse_foreign_rows(run_dir: Path, n_rows: int, recorded: int | None) -> None:
    """More rows than the run recorded: parts of another run were copied in (they would be counted)."""
    if recorded is not None and n_rows > recorded:
        raise RunDirError(
            f"{run_dir / REQUESTS_FILE}: {n_rows} rows: expected at most {recorded} (manifest.json "
            f"requests_recorded): rows from another run were added; remove the part files this run did not write"
        )


def _drop_not_due(ids: pa.Array, cols: dict[str, np.ndarray]) -> tuple[pa.Array, dict[str, np.ndarray], int]:
    """Requests the run stopped before they were due leave the analysis (counted apart)."""
    not_due = (cols["status"] == "not_sent") & (cols["error_kind"] == "not_due")
    n = int(not_due.sum())
    if not n:
        return ids, cols, 0
    keep = ~not_due
    return ids.filter(pa.array(keep)), {k: v[keep] for k, v in cols.items()}, n


def _covered_end(
    manifest: Manifest, sched: np.ndarray, cut: np.ndarray, n_rows: int
) -> tuple[float | None, float | None]:
    """(stop, covered end) on the run clock, both None for a run that was not stopped.

    A stopped run is analysed up to the instant it covered: the stop; for a run stopped from outside
    (a signal, a write error, a kill) no later than the first request the stop cut short (in flight or
    queued: its outcome is unknown, and so would be that of any later one), and no later than the last
    flush's covered instant when rows are missing (killed, write error). A deadline is part of the
    measurement: requests it cut count as failures, up to the stop.
    """
    if not (manifest.state in ("interrupted", "failed", "killed", "running") or manifest.stopped_by_deadline):
        return None, None
    flush = manifest.last_flush
    covered = flush.covered_until_ns if flush is not None else None
    stop = manifest.stopped_ns if manifest.stopped_ns is not None else covered
    ends = [float(stop)] if stop is not None else []
    scheduled = manifest.scheduled_requests
    if covered is not None and scheduled is not None and n_rows < scheduled:
        ends.append(float(covered))
    if manifest.state != "complete" and cut.any():
        ends.append(float(sched[cut].min()))
    return (float(stop) if stop is not None else None), (min(ends) if ends else None)


def _default_window(sched: np.ndarray, done: np.ndarray) -> tuple[float, float]:
    if len(sched) == 0:
        return 0.0, 0.0
    lo, last = float(sched.min()), float(sched.max())
    n = len(sched)
    if n >= 2 and last > lo:
        return lo, last + (last - lo) / (n - 1)
    # one scheduled instant: to the last done, inclusive (1 ns past it: the window is half-open), so every
    # completion counts; a window this sets is held to ``metrics.unmeasurable_rate`` like any other
    end = np.nanmax(done) if np.isfinite(done).any() else last
    return lo, max(float(end), lo) + 1.0


def _sorted(values: np.ndarray) -> np.ndarray:
    v = values[~np.isnan(values)]
    v.sort()
    return v


def _cdf(sorted_values: np.ndarray) -> dict[str, list[float]] | None:
    n = len(sorted_values)
    if n == 0:
        return None
    finite = sorted_values[np.isfinite(sorted_values)]
    if len(finite) == 0:
        return None
    idx = np.unique(np.linspace(0, len(finite) - 1, min(_CDF_POINTS, len(finite))).astype(np.int64))
    return {"x": finite[idx].tolist(), "y": ((idx + 1) / n).tolist()}


def _nice_bin(span_s: float) -> float:
    raw = max(span_s / 100.0, 1e-3)
    exp = 10 ** math.floor(math.log10(raw))
    for m in (1, 2, 5, 10):
        if m * exp >= raw:
            return m * exp
    return 10 * exp


def _unique_str(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(values.astype(str), return_inverse=True)`` for an object array, by hashing (pandas)
    instead of sorting every object: 10-20x less at 10^6 rows."""
    codes, uniques = pd.factorize(values)  # nulls → −1: their text is taken as astype(str) gives it
    names = [str(u) for u in uniques]
    na = codes < 0
    if na.any():
        na_names, na_codes = np.unique(values[na].astype(str), return_inverse=True)
        codes[na] = len(names) + na_codes
        names += na_names.tolist()
    keys, remap = np.unique(np.asarray(names, dtype=str), return_inverse=True)
    return keys, remap[codes].reshape(-1)


def _counts(values: np.ndarray, labels: tuple[str, ...] | None = None) -> dict[str, int]:
    keys, codes = _unique_str(values)
    counts = np.bincount(codes, minlength=len(keys))
    out = {str(k): int(c) for k, c in zip(keys, counts)}
    if labels is not None:
        out = {k: out.get(k, 0) for k in labels} | {k: v for k, v in out.items() if k not in labels}
    return out


#: One sample as (ascending parts, their sums or None when it is one in-memory array); see ``spill``.
Sample = tuple[list[np.ndarray], list[float] | None]


def _sorted_parts(samples: list[Sample], unit: float = 1.0) -> SortedParts:
    """The union of samples; sums only when one of them was spilled (else summed as before)."""
    parts = [p for ps, _ in samples for p in ps]
    if all(sums is None for _, sums in samples):
        return SortedParts(parts, unit)
    sums = [
        x for ps, ss in samples for x in (ss if ss is not None else [float(np.sum(p, dtype=np.float64)) for p in ps])
    ]
    return SortedParts(parts, unit, sums)


def _cdf_sample(sample: Sample) -> dict[str, list[float]] | None:
    """``_cdf`` of a sample; of spilled parts, the same points by exact order statistics."""
    parts, _ = sample
    if len(parts) == 1 and isinstance(parts[0], np.ndarray):
        return _cdf(parts[0])
    sp = SortedParts(parts)
    if sp.n == 0:
        return None
    idx = np.unique(np.linspace(0, sp.n - 1, min(_CDF_POINTS, sp.n)).astype(np.int64))
    return {"x": sp.kth_many(idx).astype(np.float64).tolist(), "y": ((idx + 1) / sp.n).tolist()}


class _GapSink:
    """Per class: per-token gaps of counted requests (ok + abandoned) and of failed ones, raw
    inter-chunk gaps (ns); per request: gaps and gaps above the class's hard ITL limit (goodput)."""

    def __init__(self, run: _Run) -> None:
        self.run = run
        n_cls = len(run.class_names)
        # code = class * 4 + in scope * 2 + counted (ok or abandoned); int64, so gathers need no index cast
        self.req_code = run.cls.astype(np.int64) * 4 + run.scope * 2 + (run.ok | run.abandoned)
        self.lim = np.full(n_cls, np.inf)
        self.itl_q = np.full(run.n, np.nan)
        for c, name in enumerate(run.class_names):
            limit = run.itl_limit(name)
            if limit is not None:
                self.lim[c] = limit[1]
                self.itl_q[run.cls == c] = limit[0]
        self.lim_by_code = np.repeat(self.lim, 4)
        self.n_cls = n_cls
        self.replica, n_routed = replica_codes(run.c["target_index"])  # several target URLs
        self.n_replicas = max(n_routed, len(getattr(run.manifest, "targets", None) or []))
        self.store: SortedRuns | None = None
        self.reset()

    def reset(self) -> None:
        if self.store is not None:
            self.store.close()
        kinds = {"desc": np.float64, "inter": np.int64, "fail": np.float64}
        keys: dict[Hashable, Any] = {(kind, c): t for kind, t in kinds.items() for c in range(self.n_cls)}
        keys.update({("replica", r): np.float64 for r in range(self.n_replicas if self.n_replicas > 1 else 0)})
        self.store = SortedRuns(self.run.spill, keys)
        self.n_gaps = np.zeros(self.run.n)
        self.n_over = np.zeros(self.run.n)

    def add(self, req_idx: np.ndarray, delta_ns: np.ndarray, tokens: np.ndarray) -> None:
        code = self.req_code[req_idx]
        first = delta_ns < 0
        value, weight = M.token_gaps_ms(delta_ns, tokens, first)
        # rows come grouped by request: one code per run of rows
        starts = np.flatnonzero(np.concatenate(([True], req_idx[1:] != req_idx[:-1])))
        if np.isfinite(self.lim).any():
            # goodput's per-request ITL check: every counted request, in the window or not (one scheduled
            # before the window start can complete in it and count toward goodput)
            w_desc = np.where((code & 1) == 1, weight, 0)
            over = np.where(value > np.take(self.lim_by_code, code), w_desc, 0)
            np.add.at(self.n_gaps, req_idx[starts], np.add.reduceat(w_desc, starts))
            np.add.at(self.n_over, req_idx[starts], np.add.reduceat(over, starts))
        if self.n_replicas > 1:  # per replica: the per-token gaps of counted requests in scope
            rows = (code & 3) == 3
            where = self.replica[req_idx[rows]]
            for r in range(self.n_replicas):
                mine = where == r
                if mine.any():
                    cast(SortedRuns, self.store).add(("replica", r), np.repeat(value[rows][mine], weight[rows][mine]))
        store = cast(SortedRuns, self.store)
        # per class: counted (3) before failed (2), the order the samples have always been added in
        present = np.unique(code[starts])
        for key, rows in self._partition(code, present[np.lexsort((-(present & 3), present >> 2))]):
            c, counted = divmod(int(key), 4)
            if counted == 3:  # in scope, counted: per-token gaps (a multiset) and raw inter-chunk gaps
                store.add(("desc", c), np.repeat(value[rows], weight[rows]))
                store.add(("inter", c), delta_ns[rows][~first[rows]])
            elif counted == 2:  # in scope, failed
                store.add(("fail", c), np.repeat(value[rows], weight[rows]))

    @staticmethod
    def _partition(code: np.ndarray, present: np.ndarray) -> Iterator[tuple[int, Any]]:
        """(code, rows) for every code of a batch: a mask per code where few are present (one pass each),
        else slices of one stable sort."""
        if len(present) <= _MASKED_CODES:
            for key in present:
                yield int(key), code == key
            return
        order = np.argsort(code, kind="stable")
        ordered = code[order]
        for key in present:
            yield int(key), order[np.searchsorted(ordered, key) : np.searchsorted(ordered, key, side="right")]

    def finish(self) -> tuple[list[Sample], list[Sample], list[Sample]]:
        store = cast(SortedRuns, self.store)
        return tuple(  # type: ignore[return-value]
            [store.finish((kind, c)) for c in range(self.n_cls)] for kind in ("desc", "fail", "inter")
        )

    def finish_replicas(self) -> list[SortedParts]:
        """Per replica, its per-token gaps (empty without several target URLs)."""
        store = cast(SortedRuns, self.store)
        n = self.n_replicas if self.n_replicas > 1 else 0
        return [_sorted_parts([store.finish(("replica", r))]) for r in range(n)]

    def close(self) -> None:
        if self.store is not None:
            self.store.close()


class _Run:
    """Arrays of one run plus the masks every group summary slices with."""

    def __init__(
        self,
        run_dir: Path,
        manifest: Manifest,
        scenario: Scenario | None,
        window: Any,
        include_cold: bool,
        spill: SpillConfig | None = None,
        *,
        read_gaps: bool = True,
    ):
        self.run_dir = run_dir
        self.spill = spill if spill is not None else SpillConfig.resolve()
        self.manifest = manifest
        self.scenario = scenario
        self.notes: list[str] = version_notes(manifest)
        ids, c = _load_requests(run_dir)
        self.ids, c, self.not_due = _drop_not_due(ids, c)
        self.c = c
        self.n = len(c["status"])
        recorded = manifest.requests_recorded
        _refuse_foreign_rows(run_dir, self.n + self.not_due, recorded)
        refuse_implausible_requests(run_dir / REQUESTS_FILE, self.ids, c)
        if recorded is not None and self.n + self.not_due < recorded:  # not-due rows are recorded rows, too
            if self.n == 0:  # nothing left to analyse: never report "0 scheduled" for a run that recorded some
                raise RunDirError(
                    f"{run_dir / REQUESTS_FILE}: 0 rows: expected {recorded} (manifest.json "
                    f"requests_recorded): the file was truncated or replaced"
                )
            self.notes.append(
                f"records missing: {REQUESTS_FILE} holds {self.n + self.not_due} of the {recorded} requests the manifest "
                f"says were recorded (truncated or replaced file): every count below undercounts"
            )
        sched, done = c["scheduled_ns"], c["done_ns"]
        dlo, dhi = _default_window(sched, done)
        if isinstance(window, str):
            window = parse_window(window)
        lo_s, hi_s = window if window else (None, None)
        # in flight or queued when the run stopped, or held by a worker that died
        self.cut = np.isin(c["error_kind"], CUT_ERROR_KINDS)
        self.stop_ns, self.covered_ns = _covered_end(manifest, sched, self.cut, self.n + self.not_due)
        if hi_s is None and self.covered_ns is not None and self.covered_ns < dhi:
            dhi = self.covered_ns  # a stopped run covers its schedule up to the stop, not the whole of it
        self.lo = float(lo_s * M.NS_PER_S) if lo_s is not None else dlo
        self.hi = float(hi_s * M.NS_PER_S) if hi_s is not None else max(dhi, self.lo)
        self.window_s = (self.hi - self.lo) / M.NS_PER_S
        self.window_default = window is None or window == (None, None)
        # every rate divides by rate_window_s: None (each rate None, said in a note) when not measurable
        self.rate_unmeasured = M.unmeasurable_rate(self.window_s, self.n if self.window_default else None)
        self.rate_window_s = M.rate_window_s(self.window_s, self.n if self.window_default else None)
        if self.rate_unmeasured is not None and self.n:
            self.notes.append(f"rates not measured: {self.rate_unmeasured}")
        st = c["status"]
        self.ok = st == "ok"
        self.abandoned = (
            (st == "cancelled") & ~np.isnan(c["cancel_after_tokens"]) & ~np.isnan(c["first_token_ns"]) & ~self.cut
        )
        self.failed = ~self.ok & ~self.abandoned
        self.in_window = (sched >= self.lo) & (sched < self.hi)
        # completed throughput and goodput count by completion instant: ok requests done in the window
        self.completed_in_window = (done >= self.lo) & (done < self.hi) & self.ok
        self.cold, self.cold_rule = self._cold()
        self.scope = self.in_window & (~self.cold if not include_cold else True)
        self.include_cold = include_cold
        names: np.ndarray | list[Any]
        names, codes = _unique_str(c["request_class"]) if self.n else ([], np.empty(0, int))
        self.class_names = [str(x) for x in names]
        self.cls = codes.astype(np.int32)
        out_client, out_server = c["client_output_tokens"], c["server_output_tokens"]
        self.out_tokens = np.where(np.isnan(out_client), out_server, out_client)
        self.out_best = np.where(np.isnan(out_server), out_client, out_server)
        pr = c["server_prompt_tokens"]
        pr = np.where(np.isnan(pr), c["client_prompt_tokens"], pr)
        self.prompt_best = np.where(np.isnan(pr), c["target_prompt_tokens"], pr)
        self.values = {
            "ttft_ms": M.ttft_ms(sched, c["first_token_ns"]),
            "ttfat_ms": M.ttfat_ms(sched, c["first_answer_token_ns"]),
            "client_queue_ms": M.client_queue_ms(sched, c["sent_ns"]),
            "server_ttft_ms": M.server_ttft_ms(c["sent_ns"], c["first_token_ns"]),
            "tpot_ms": M.tpot_ms(c["first_token_ns"], c["last_token_ns"], self.out_tokens),
            "e2e_ms": M.e2e_ms(sched, done),
        }
        self.gap_sink = _GapSink(self)
        self.gaps = ChunkGaps(notes=["chunks not read: per-token metrics unavailable"])
        if read_gaps:
            self._read_gaps()
        self.itl_desc, self.itl_fail, self.inter_ns = self.gap_sink.finish()
        self.itl_by_replica = self.gap_sink.finish_replicas()
        self.n_gaps, self.n_over, self.itl_q = self.gap_sink.n_gaps, self.gap_sink.n_over, self.gap_sink.itl_q

    def _read_gaps(self) -> None:
        """One pass over the chunk table into the gap sink (per-token gaps, inter-chunk gaps, ITL checks)."""
        try:
            self.gaps = read_chunk_gaps(run_table_files(self.run_dir, CHUNKS_FILE), self.ids, self.gap_sink)
        except BaseException:
            self.gap_sink.close()  # no spilled run outlives a failed read
            raise
        self.notes += self.gaps.notes
        if self.gaps.orphan_rows:
            why = (
                " (written at the last flush of a killed run, before their requests' rows)"
                if self.manifest.state == "killed"
                else ""
            )
            self.notes.append(f"{self.gaps.orphan_rows} chunk row(s) name no request of requests.parquet{why}; ignored")

    def itl_limit(self, cname: str) -> tuple[float, float] | None:
        cls = self.scenario.classes.get(cname) if self.scenario is not None else None
        budget = cls.budgets.itl_ms if cls is not None else None
        return request_limit(budget) if budget is not None and budget.hard else None

    def _cold(self) -> tuple[np.ndarray, str]:
        # only requests that reached the server can have met it cold; never-sent ones stay in the budgets
        warm, sent = self.c["warm"], ~np.isnan(self.c["sent_ns"])
        explicit = (warm == 0.0) & sent
        state = self.manifest.warm_state.state
        if explicit.any():
            return explicit, "sent requests flagged warm=false by the run"
        if state == "cold" and self.n:
            first_ok = np.nanmin(np.where(self.ok, self.c["done_ns"], np.nan)) if self.ok.any() else np.inf
            cold = sent & (self.c["sent_ns"] < first_ok)
            return cold, "run began cold: requests sent before the first successful completion"
        return np.zeros(self.n, dtype=bool), "none (run not cold)"

    def group(self, name: str, class_idx: list[int], plot: dict[str, Any]) -> GroupSummary:
        sel = np.isin(self.cls, class_idx) if len(class_idx) != len(self.class_names) else np.ones(self.n, bool)
        if not class_idx:
            sel = np.zeros(self.n, bool)
        c = self.c
        scope = self.scope & sel
        desc = scope & (self.ok | self.abandoned)
        metrics: dict[str, dict[str, Any]] = {}
        cdfs: dict[str, Any] = {}
        for metric in ("ttft_ms", "ttfat_ms", "client_queue_ms", "server_ttft_ms", "tpot_ms", "e2e_ms"):
            mask = scope & self.ok if metric == "e2e_ms" else desc
            s = _sorted(self.values[metric][mask])
            metrics[metric] = summarize_sorted(s)
            if metric in ("ttft_ms", "ttfat_ms", "e2e_ms"):
                cdfs[metric] = _cdf(s)
        metrics["itl_ms"] = summarize_parts(_sorted_parts([self.itl_desc[k] for k in class_idx]))
        metrics["inter_chunk_ms"] = summarize_parts(_sorted_parts([self.inter_ns[k] for k in class_idx], M.NS_PER_MS))
        if len(class_idx) == 1:
            cdfs["itl_ms"] = _cdf_sample(self.itl_desc[class_idx[0]])
        metrics = {m: metrics[m] for m in METRICS}
        plot.setdefault("cdf", {})[name] = cdfs
        win = self.in_window & sel
        done_in = self.completed_in_window & sel
        sent_in = (c["sent_ns"] >= self.lo) & (c["sent_ns"] < self.hi) & sel
        st = c["status"][scope]
        failed_kinds = np.where(
            pd_isnull(c["error_kind"][scope & self.failed]),
            c["status"][scope & self.failed],
            c["error_kind"][scope & self.failed],
        )
        w = self.rate_window_s
        return GroupSummary(
            name=name,
            n_scheduled=int(scope.sum()),
            status_counts=_counts(st, STATUSES),
            error_kinds=_counts(failed_kinds),
            abandoned=int((scope & self.abandoned).sum()),
            metrics=metrics,
            offered_rps=M.offered_rps(int(win.sum()), w),
            send_rps=M.send_rps(int(sent_in.sum()), w),
            completed_rps=M.completed_rps(int(done_in.sum()), w),
            prompt_tok_s=M.tokens_per_s(float(np.nansum(self.prompt_best[done_in])), w),
            output_tok_s=M.tokens_per_s(float(np.nansum(self.out_best[done_in])), w),
            tokens=self._tokens(scope & self.ok),
            ttft_by_turn=self._ttft_by_turn(desc),
            sessions=self._sessions(scope),
        )

    def _sessions(self, scope: np.ndarray) -> dict[str, Any] | None:
        """Session count and makespan summary of the group's requests in scope (None: no conversations)."""
        spans = self.makespans(scope)
        return spans.to_dict() if spans is not None else None

    def makespans(self, scope: np.ndarray) -> SessionMakespans | None:
        c = self.c
        return session_makespans(
            c["conversation_id"][scope], c["scheduled_ns"][scope], c["done_ns"][scope], self.ok[scope]
        )

    def _ttft_by_turn(self, desc: np.ndarray) -> dict[str, dict[str, Any]]:
        """TTFT summaries per conversation turn index ("0", "1", ...; turns from the 10th on as "9+");
        empty when the group has no conversation turns."""
        turns = self.c["turn_index"][desc]
        known = ~np.isnan(turns)
        if not known.any():
            return {}
        ttft = self.values["ttft_ms"][desc][known]
        turns = np.minimum(turns[known], MAX_TURN_SHOWN).astype(int)
        return {
            (f"{t}+" if t == MAX_TURN_SHOWN else str(t)): summarize_sorted(_sorted(ttft[turns == t]))
            for t in np.unique(turns)
        }

    def _tokens(self, mask: np.ndarray) -> dict[str, Any]:
        c = self.c
        out: dict[str, Any] = {"n_requests": int(mask.sum())}
        for kind in ("prompt", "output"):
            target = c[f"target_{kind}_tokens"][mask]
            client = c[f"client_{kind}_tokens"][mask]
            server = c[f"server_{kind}_tokens"][mask]
            both = ~np.isnan(client) & ~np.isnan(server)

            def total(a: np.ndarray) -> float | None:
                return float(np.nansum(a)) if (~np.isnan(a)).any() else None

            def diff(a: np.ndarray, b: np.ndarray) -> float | None:
                m = ~np.isnan(a) & ~np.isnan(b)
                return float((a[m] - b[m]).sum()) if m.any() else None

            out[kind] = {
                "target": total(target),
                "client": total(client),
                "server": total(server),
                "server_minus_client": diff(server, client),
                "server_minus_target": diff(server, target),
                "client_minus_target": diff(client, target),
                "n_server_missing": int(np.isnan(server).sum()),
                "n_client_missing": int(np.isnan(client).sum()),
                "n_server_client_mismatch": int((server[both] != client[both]).sum()),
                "n_server_target_mismatch": int(((server != target) & ~np.isnan(server)).sum()),
            }
        out["reasoning"] = self._reasoning_tokens(mask)
        return out

    def _reasoning_tokens(self, mask: np.ndarray) -> dict[str, Any]:
        """Output tokens split into reasoning and answer (client-counted), and the server's reasoning count."""
        c = self.c
        client, reasoning = c["client_output_tokens"][mask], c["client_reasoning_tokens"][mask]
        server = c["server_reasoning_tokens"][mask]
        known = ~np.isnan(client) & ~np.isnan(reasoning)
        return {
            "client_reasoning": float(reasoning[known].sum()) if known.any() else None,
            "client_answer": float((client[known] - reasoning[known]).sum()) if known.any() else None,
            "server_reasoning": float(np.nansum(server)) if (~np.isnan(server)).any() else None,
            "n_requests_with_reasoning": int((reasoning[known] > 0).sum()),
        }


def pd_isnull(values: np.ndarray) -> np.ndarray:
    """Null test for object arrays of strings/None."""
    return (
        np.array([v is None or (isinstance(v, float) and math.isnan(v)) for v in values], dtype=bool)
        if values.dtype == object
        else np.isnan(values)
    )


def _budgets_and_goodput(run: _Run, groups: dict[str, GroupSummary], overall: GroupSummary) -> list[Check]:
    scenario = cast(Scenario, run.scenario)  # called only for a run with a scenario (see analyze)
    checks: list[Check] = []
    n = run.n
    good_latency = np.ones(n, dtype=bool)  # every hard TTFT, TTFAT and E2E budget met by the request
    for ci, cname in enumerate(run.class_names):
        cls = scenario.classes.get(cname)
        if cls is None:
            continue
        for metric in ("ttft_ms", "ttfat_ms", "e2e_ms"):
            budget = getattr(cls.budgets, metric)
            rl = request_limit(budget) if budget is not None and budget.hard else None
            if rl is not None:
                sel = run.cls == ci
                ok_v = np.nan_to_num(run.values[metric], nan=np.inf)
                good_latency[sel & ~(ok_v <= rl[1])] = False
    allowed = np.floor((1.0 - np.nan_to_num(run.itl_q, nan=1.0)) * run.n_gaps + 1e-9)
    good_itl = run.n_over <= allowed
    good = run.ok & good_latency & good_itl
    eligible = run.scope & ~run.abandoned
    budgeted = [i for i, c in enumerate(run.class_names) if c in scenario.classes]
    for name, classes in [(c, [i]) for i, c in enumerate(run.class_names) if c in scenario.classes] + [
        ("overall", budgeted)
    ]:
        g = overall if name == "overall" else groups[name]
        in_class = np.isin(run.cls, classes)
        sel = eligible & in_class
        # attainment: over requests scheduled in the window; goodput: over the completions completed_rps counts
        g.n_good = int((good & sel).sum())
        g.n_eligible = int(sel.sum())
        g.attainment = M.attainment(g.n_good, g.n_eligible)
        g.attainment_ci = _share_ci(g.n_good, g.n_eligible)
        g.n_good_completed = int((good & run.completed_in_window & in_class).sum())
        g.goodput_rps = M.goodput_rps(g.n_good_completed, run.rate_window_s)
    # percentile checks
    for cname, cls in scenario.classes.items():
        ci = run.class_names.index(cname) if cname in run.class_names else -1
        sel = run.scope & (run.cls == ci) if ci >= 0 else np.zeros(n, dtype=bool)
        n_fail = int((sel & run.failed).sum())
        n_requests = int(sel.sum())
        for metric in BUDGET_METRICS:
            budget = getattr(cls.budgets, metric)
            if budget is None or not budget.limits():
                continue
            sample: np.ndarray | SortedParts
            if metric == "itl_ms":
                sample = _sorted_parts([run.itl_desc[ci], run.itl_fail[ci]] if ci >= 0 else [])
                n_inf = 0
            else:
                keep = _budget_sample(run, sel, metric)
                vals = run.values[metric][keep]
                vals = np.nan_to_num(vals, nan=np.inf)  # an ok row missing an instant is not good either
                sample = np.concatenate([vals, np.full(n_fail, np.inf)])
                sample.sort()
                n_inf = n_fail
            checks.extend(budget_checks(cname, metric, budget, sample, n_inf, n_requests))
        checks.extend(_makespan_checks(run, cname, cls, sel))
    return checks


def _makespan_checks(run: _Run, cname: str, cls: Any, sel: np.ndarray) -> list[Check]:
    """A class's session makespan budget over its sessions (incomplete ones as +inf)."""
    budget = cls.budgets.makespan_ms
    if budget is None or not budget.limits():
        return []
    spans = run.makespans(sel)
    if spans is None:
        return budget_checks(cname, "makespan_ms", budget, np.array([]), 0, 0)
    return budget_checks(cname, "makespan_ms", budget, spans.budget_sample(), spans.n_incomplete, spans.n_sessions)


def _budget_sample(run: _Run, sel: np.ndarray, metric: str) -> np.ndarray:
    """The requests a TTFT, TTFAT or E2E budget takes its sample from: ok ones, and for TTFT the planned
    abandonments (they had a first token); for TTFAT those abandoned after their first answer token."""
    if metric == "ttft_ms":
        return sel & (run.ok | run.abandoned)
    if metric == "ttfat_ms":
        return sel & (run.ok | (run.abandoned & ~np.isnan(run.c["first_answer_token_ns"])))
    return sel & run.ok


def _share_ci(k: int, n: int) -> list[float] | None:
    ci = wilson_interval(k, n)
    return list(ci) if ci is not None else None


def _timeseries(run: _Run, plot: dict[str, Any]) -> dict[str, Any]:
    c = run.c
    sched, done, sent = c["scheduled_ns"], c["done_ns"], c["sent_ns"]
    if run.n == 0 or run.rate_unmeasured is not None:  # rates per bin would be as absurd as the window's
        return {}
    t0 = float(sched.min())
    t1 = float(np.nanmax(np.concatenate([sched, done[~np.isnan(done)]])))
    bin_s = _nice_bin((t1 - t0) / M.NS_PER_S)
    edges = np.arange(t0, t1 + bin_s * M.NS_PER_S, bin_s * M.NS_PER_S)
    if len(edges) < 2:
        edges = np.array([t0, t0 + bin_s * M.NS_PER_S])

    def rate(values: np.ndarray, weights: np.ndarray | None = None) -> list[float]:
        v = ~np.isnan(values)
        h, _ = np.histogram(values[v], bins=edges, weights=None if weights is None else weights[v])
        return (h / bin_s).tolist()

    ok_done = np.where(run.ok, done, np.nan)
    fail_done = np.where(run.failed, np.where(np.isnan(done), sched, done), np.nan)
    mids = (edges[:-1] + edges[1:]) / 2
    ts = {
        "bin_s": bin_s,
        "t_s": (edges[:-1] / M.NS_PER_S).tolist(),
        "offered_rps": rate(sched),
        "send_rps": rate(sent),
        "completed_rps": rate(ok_done),
        "failed_rps": rate(fail_done),
        "output_tok_s": rate(ok_done, np.nan_to_num(run.out_best)),
        "in_flight": in_system_at(sched, done, mids).tolist(),
    }
    # TTFT scatter (at most ~4000 points, evenly strided), failures marked
    idx = np.arange(run.n)
    stride = max(1, len(idx) // 4000)
    idx = idx[::stride]
    plot["scatter"] = {
        "t_s": (sched[idx] / M.NS_PER_S).tolist(),
        "ttft_ms": [None if math.isnan(v) else float(v) for v in run.values["ttft_ms"][idx]],
        "failed": run.failed[idx].tolist(),
        "class": [run.class_names[i] for i in run.cls[idx]],
    }
    return ts


def _stop_info(run: _Run) -> dict[str, Any]:
    """How the run ended, for the top of every report: state, what stopped it, when, what was not due."""
    m = run.manifest
    flush = m.last_flush
    out: dict[str, Any] = {
        "state": m.state,
        "stopped_by": m.interrupted_by or ("its deadline (--deadline-s)" if m.stopped_by_deadline else None),
        "stopped_at_s": run.stop_ns / M.NS_PER_S if run.stop_ns is not None else None,
        "covered_until_s": run.covered_ns / M.NS_PER_S if run.covered_ns is not None else None,
        "cut_by_stop": int((run.cut & ~run.in_window).sum()),
        "not_due": run.not_due,
        "last_flush_utc": flush.utc if flush is not None else None,
        "last_flush_s": flush.ns / M.NS_PER_S if flush is not None and flush.ns is not None else None,
    }
    if m.recovery:
        out["recovery"] = m.recovery
        in_flight = m.recovery.get("in_flight_at_last_flush")
        out["no_row"] = {
            "in_flight_at_last_flush": in_flight,
            "not_due_at_last_flush": m.recovery.get("not_due_at_last_flush"),
            "without_row": m.recovery.get("without_row"),
        }
    return out


def _run_info(run: _Run) -> dict[str, Any]:
    m = run.manifest
    target = m.target
    return {
        "run_kind": m.run_kind,
        "state": m.state,
        "stop": _stop_info(run),
        "scenario": m.scenario.name if m.scenario else None,
        "trace": m.trace.name if m.trace else None,
        "target": {"kind": target.kind, "base_url": target.base_url, "model": target.model, "version": target.version},
        "engine": target.engine.name if target.engine else None,
        "started_utc": m.started_utc,
        "duration_s": m.duration_s,
        "harness_version": m.harness.version if m.harness else None,
        "modelExecuted": m.model_executed,
        "benchmarkExecuted": m.benchmark_executed,
        "synthesized": m.synthesized,
        "source": m.source,
        "requests": run.n + run.not_due,
        "chunk_rows": run.gaps.rows,
        # the client's own schedule-keeping (None: a run with no send lag, such as an imported one)
        "send_lag_p99_ms": m.send_lag_p99_ms,
        "client_fell_behind": client_lag_line(m.send_lag_p99_ms),
        "prompt_tokens_differ": _prompt_tokens_differ(run),
    }


def _prompt_tokens_differ(run: _Run) -> str | None:
    """``prompt_tokens_line`` over the requests whose prompt the server counted."""
    target, server = run.c["target_prompt_tokens"], run.c["server_prompt_tokens"]
    both = ~np.isnan(target) & ~np.isnan(server)
    driver = run.manifest.driver
    tokenizer = driver.tokenizer if driver is not None else None
    return prompt_tokens_line(float(target[both].sum()), float(server[both].sum()), int(both.sum()), tokenizer)


def _warm_cold(run: _Run) -> dict[str, Any]:
    m = run.manifest
    notes = dict(sorted(m.engine_notes.model_dump(mode="json").items()))  # in the manifest file's order (sorted)
    out: dict[str, Any] = {
        "state": m.warm_state.state,
        "actions": m.warm_state.actions,
        "engine_notes": {
            k: v for k, v in notes.items() if any(w in k for w in ("load", "compile", "cache", "alloc", "graph", "kv"))
        },
        "behavior_relevant": m.behavior_relevant,
        "cold_rule": run.cold_rule,
        "n_cold": int((run.cold & run.in_window).sum()),
        "cold_in_tables": run.include_cold,
    }
    for label, mask in (("cold", run.cold & run.in_window), ("warm", ~run.cold & run.in_window)):
        desc = mask & (run.ok | run.abandoned)
        out[label] = {
            "n": int(mask.sum()),
            "status_counts": _counts(run.c["status"][mask], STATUSES),
            "ttft_ms": summarize_sorted(_sorted(run.values["ttft_ms"][desc])),
            "e2e_ms": summarize_sorted(_sorted(run.values["e2e_ms"][mask & run.ok])),
        }
    return out


def _replicas(run: _Run) -> dict[str, Any] | None:
    """The per-replica breakdown, for a run with several target URLs (None otherwise)."""
    codes, n_rep = run.gap_sink.replica, run.gap_sink.n_replicas
    targets = getattr(run.manifest, "targets", None) or []
    if max(n_rep, len(targets)) < 2:
        return None
    urls = [str(t.get("base_url")) if isinstance(t, dict) else "" for t in targets]
    masks = {"ok": run.ok, "failed": run.failed, "counted": run.ok | run.abandoned}
    return replica_breakdown(codes, urls, run.scope, masks, run.c, run.values["ttft_ms"], run.itl_by_replica)


def _verdict(checks: list[Check]) -> str:
    """fail: a hard check failed conclusively; inconclusive: none failed but one straddles its limit; else pass."""
    hard = [c for c in checks if c.hard and c.evaluated]
    if any(c.outcome == "fail" for c in hard):
        return "fail"
    if any(c.outcome == "inconclusive" for c in hard):
        return "inconclusive"
    return "pass"


def analyze_run(
    run_dir: Path | str,
    *,
    scenario: Scenario | None = None,
    window: Any = None,
    include_cold: bool = False,
    spill: SpillConfig | None = None,
) -> Analysis:
    """Analyse a run directory. ``scenario`` (a ``loadgen.workload.scenario.Scenario``) supplies budgets; by
    default it is rebuilt from the manifest; with none, every number but no verdicts. ``window`` is
    ``(start_s, end_s)`` or ``"start:end"`` on the run clock. Cold-start requests are reported apart
    and left out of the tables and budgets unless ``include_cold``. ``spill``: the memory budget for
    per-token samples and where they spill beyond it (default: ``SpillConfig.resolve()``)."""
    run_dir = Path(run_dir)
    manifest = read_run_manifest(run_dir)
    if scenario is None:
        scenario = scenario_from_manifest(manifest)
    run = _Run(run_dir, manifest, scenario, window, include_cold, spill)
    try:
        return _analysis(run, scenario, include_cold)
    finally:
        run.gap_sink.close()


def request_summaries(run_dir: Path | str) -> list[GroupSummary]:
    """``analyze_run``'s group summaries per class (sorted by name), then ``overall``, from the requests table
    alone: the same default window, cold-start rule, samples and percentiles, so every count, TTFT, TPOT, E2E
    and rate figure is the analysis' own; the chunk-derived ones (ITL, inter-chunk gaps) are empty. For
    reading many runs cheaply (the run catalog's headline figures). Empty for a run without requests."""
    run_dir = Path(run_dir)
    run = _Run(run_dir, read_run_manifest(run_dir), None, None, False, read_gaps=False)
    if run.n == 0:  # no requests: no classes, and no overall to speak of
        run.gap_sink.close()
        return []
    try:
        plot: dict[str, Any] = {}
        groups = sorted((run.group(name, [i], plot) for i, name in enumerate(run.class_names)), key=lambda g: g.name)
        return [*groups, run.group("overall", list(range(len(run.class_names))), plot)]
    finally:
        run.gap_sink.close()


def _analysis(run: _Run, scenario: Scenario | None, include_cold: bool) -> Analysis:
    synth = run.manifest.synthesized or {}
    rates_meaningful = not synth.get("timing", False)
    if not rates_meaningful:
        run.notes.append(
            "instants were synthesized by the importer ("
            + str(synth.get("method", ""))
            + "): rates, client queue, time series and stability are not measurements"
        )
    plot: dict[str, Any] = {}
    groups = {name: run.group(name, [i], plot) for i, name in enumerate(run.class_names)}
    overall = run.group("overall", list(range(len(run.class_names))), plot)
    for name in scenario.classes if scenario is not None else {}:
        if name not in groups:  # a budgeted class with no requests: present, empty, never 0 ms
            groups[name] = run.group(name, [], plot)
    failed_in, n_win = int((run.in_window & run.failed).sum()), int(run.in_window.sum())
    share = M.error_share(failed_in, n_win)
    limit = float(scenario.errors.error_rate_limit) if scenario is not None else 0.01
    checks, verdict = _judge(run, scenario, groups, overall, error_share_check(failed_in, n_win, limit))
    if run.cold.any() and not include_cold:
        run.notes.append(
            f"{int((run.cold & run.in_window).sum())} cold-start request(s) reported apart "
            f"({run.cold_rule}); not in the tables or budgets"
        )
    refuse = None if rates_meaningful else "instants synthesized by the importer: not a measured timeline"
    stability = assess_stability(run.c["scheduled_ns"], run.c["done_ns"], run.lo, run.hi, refuse=refuse)
    timeseries = _timeseries(run, plot)
    server = _server_summary(run)
    replicas = _replicas(run)
    _plot_tokens_and_budgets(run, scenario, plot)
    return Analysis(
        run_dir=run.run_dir,
        run=_run_info(run),
        window={
            "start_s": run.lo / M.NS_PER_S,
            "end_s": run.hi / M.NS_PER_S,
            "duration_s": run.window_s,
            "default": run.window_default,
            "rates_unmeasured": run.rate_unmeasured,
        },
        classes=groups,
        overall=overall,
        checks=checks,
        verdict=verdict,
        errored=share is not None and share > limit,
        error_share=share,
        error_rate_limit=limit,
        error_share_ci=_share_ci(failed_in, n_win),
        rates_meaningful=rates_meaningful,
        stability=stability,
        warm_cold=_warm_cold(run),
        server=server,
        timeseries=timeseries,
        definitions=dict(DEFINITIONS),
        notes=run.notes,
        plot_data=plot,
        replicas=replicas,
    )


def _judge(
    run: _Run, scenario: Scenario | None, groups: dict[str, GroupSummary], overall: GroupSummary, error_check: Check
) -> tuple[list[Check], str]:
    """(every budget, goodput and error-share check; the verdict): ``no budgets`` without a scenario, ``no
    data`` without a request scheduled in the window (each said in a note)."""
    if scenario is None:
        run.notes.append("no scenario: numbers only, no budget verdicts")
        return [], "no budgets"
    checks = _budgets_and_goodput(run, groups, overall)
    checks.append(error_check)
    if not run.in_window.sum():
        run.notes.append("no requests scheduled in the window: nothing to judge")
        return checks, "no data"
    return checks, _verdict(checks)


def _server_summary(run: _Run) -> dict[str, Any] | None:
    """The server's /metrics over the window (to the last request's end when later), with the whole run's
    time series."""
    server_table = read_run_table(run.run_dir, SERVER_METRICS_FILE)
    done = run.c["done_ns"]
    server = summarize_server_metrics(
        server_table, run.lo, max(run.hi, float(np.nanmax(done)) if np.isfinite(done).any() else run.hi)
    )
    full = summarize_server_metrics(server_table, -np.inf, np.inf) if server_table is not None else None
    if server is not None and full is not None and "timeseries" in full:
        server["timeseries"] = full["timeseries"]
    return server


def _plot_tokens_and_budgets(run: _Run, scenario: Scenario | None, plot: dict[str, Any]) -> None:
    """The plots' per-class token counts (ok requests in scope), and the budgets they are drawn against."""
    plot["tokens"] = {
        name: {
            "prompt": run.prompt_best[run.scope & run.ok & (run.cls == i)],
            "output": run.out_best[run.scope & run.ok & (run.cls == i)],
        }
        for i, name in enumerate(run.class_names)
    }
    if scenario is not None:
        plot["budgets"] = {
            name: {m: getattr(cls.budgets, m).limits() if getattr(cls.budgets, m) else {} for m in BUDGET_METRICS}
            for name, cls in scenario.classes.items()
        }
