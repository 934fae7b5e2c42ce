"""Deterministic synthetic traces: a pure function of (scenario, trace name, seed).

Arrivals come from the named trace's process (Poisson, gamma with a CV, on/off bursts, a constant
rate, a linear ramp, or closed loop). ``constant`` spaces arrivals exactly 1/rate apart from 0 s (no
randomness). ``ramp`` is a Poisson process whose rate rises (or falls) linearly from
``start_rate_rps`` at 0 s to ``end_rate_rps`` at ``duration_s``: unit-rate Poisson points of the
seeded stream are mapped through the inverse of the cumulative rate Λ(t) = r0·t + (r1 − r0)·t²/(2T),
so the same seed gives the same arrivals; each arrival gets a class by share (burst shares inside bursts), token lengths from the class
distributions, an optional shared-prefix group (its tokens are prepended to the sampled input), an
optional cancel-after-tokens, and long-thread arrivals expand into conversations whose turns carry
the growing context (prompt of turn k = all earlier turns' input and output + turn k's input).
Turn k is scheduled one think time after turn k-1 was scheduled; with the class's
``thread.wait_for_reply`` that instant is only the open-loop estimate and the row also carries the
think time (``think_after_reply_ns``): the driver sends turn k that long after turn k-1's reply ended.
"""

from __future__ import annotations

import itertools
import zlib
from pathlib import Path
from typing import Any, cast

import numpy as np
import pyarrow as pa

from loadgen.util.errors import TraceError
from loadgen.util.limits import MAX_TOKENS, MAX_TRACE_REQUESTS, MAX_TURNS
from loadgen.workload.distributions import sample, sample_tokens
from loadgen.workload.scenario import Scenario, TraceSettings, class_order

from .. import __version__
from .fanout import FanoutDraws, requests_per_session
from .io import trace_table, write_trace
from .toolcalls import ToolCallDraws

__all__ = ["GENERATOR_VERSION", "arrival_times", "generate_trace", "generate_trace_file", "ramp_inverse"]

GENERATOR_VERSION = "1"
_NS = 1_000_000_000


def _poisson_times(rng: np.random.Generator, rate: float, start: float, end: float) -> np.ndarray:
    count = rng.poisson(rate * (end - start))
    return np.sort(rng.uniform(start, end, count))


def ramp_inverse(y: np.ndarray, r0: float, r1: float, duration: float) -> np.ndarray:
    """t with Λ(t) = y for the linear rate r0 → r1 over ``duration`` (Λ(t) = r0·t + (r1 − r0)·t²/(2·duration));
    the stable root 2y / (r0 + sqrt(r0² + 4ay)), a = (r1 − r0)/(2·duration), which is y/r0 when flat."""
    a = (r1 - r0) / (2.0 * duration)
    return 2.0 * y / (r0 + np.sqrt(np.maximum(r0 * r0 + 4.0 * a * y, 0.0)))


def _shaped_times(settings: TraceSettings, rng: np.random.Generator, scale: float) -> np.ndarray:
    """Arrivals (s) of the ``constant`` (evenly spaced) and ``ramp`` (linear-rate Poisson) processes in [0, duration)."""
    duration = settings.duration_s
    if settings.process == "constant":
        rate = float(settings.rate_rps or 0) * scale
        return np.arange(int(np.ceil(rate * duration - 1e-9))) / rate
    r0, r1 = float(settings.start_rate_rps or 0) * scale, float(settings.end_rate_rps or 0) * scale
    total = (r0 + r1) / 2.0 * duration  # Λ(duration): the expected number of arrivals
    parts, y = [], 0.0
    while y < total:  # unit-rate Poisson points on [0, Λ(duration))
        cum = y + np.cumsum(rng.exponential(1.0, int(total * 1.2) + 64))
        parts.append(cum[cum < total])
        y = float(cum[-1])
    return ramp_inverse(np.concatenate(parts), r0, r1, duration)


def arrival_times(
    settings: TraceSettings, rng: np.random.Generator, scale: float = 1.0, burst_scale: float = 1.0
) -> tuple[np.ndarray, np.ndarray]:
    """Arrival times in seconds within [0, duration) and a per-arrival 'inside a burst' flag.

    ``scale``/``burst_scale`` multiply the rates (sessions per request, see generate_trace).
    """
    duration = settings.duration_s
    if settings.process in ("constant", "ramp"):
        shaped = _shaped_times(settings, rng, scale)
        return shaped, np.zeros(len(shaped), dtype=bool)
    if settings.process == "closed":
        n = int(np.ceil(int(settings.requests or 0) * scale)) + 16
        return np.zeros(n), np.zeros(n, dtype=bool)
    if settings.process in ("poisson", "gamma"):
        rate = float(settings.rate_rps or 0) * scale
        times: list[np.ndarray] = []
        t0 = 0.0
        while t0 < duration:
            n = int(rate * duration * 1.2) + 64
            if settings.process == "poisson":
                gaps = rng.exponential(1.0 / rate, n)
            else:
                shape = 1.0 / float(cast(float, settings.cv)) ** 2  # gamma requires cv (TraceSettings)
                gaps = rng.gamma(shape, 1.0 / (rate * shape), n)
            cum = t0 + np.cumsum(gaps)
            times.append(cum[cum < duration])
            t0 = float(cum[-1])
        out = np.concatenate(times) if times else np.zeros(0)
        return out, np.zeros(len(out), dtype=bool)
    # on/off: quiet for gap_s, then a burst of burst_s, repeated
    quiet, burst = float(settings.quiet_rate_rps or 0) * scale, float(settings.burst_rate_rps or 0) * burst_scale
    gap_s, burst_s = float(settings.gap_s or 0), float(settings.burst_s or 0)
    parts, flags = [], []
    t = 0.0
    while t < duration:
        q_end = min(t + gap_s, duration)
        if quiet > 0:
            qt = _poisson_times(rng, quiet, t, q_end)
            parts.append(qt)
            flags.append(np.zeros(len(qt), dtype=bool))
        b_end = min(q_end + burst_s, duration)
        if b_end > q_end:
            bt = _poisson_times(rng, burst, q_end, b_end)
            parts.append(bt)
            flags.append(np.ones(len(bt), dtype=bool))
        t = b_end
    if not parts:
        return np.zeros(0), np.zeros(0, dtype=bool)
    return np.concatenate(parts), np.concatenate(flags)


def _check_sampled(scenario: Scenario, field: str, values: np.ndarray, limit: int) -> None:
    """A sampled count above ``limit`` (a distribution's tail) is a scenario error, never a silent clamp."""
    if len(values) and int(values.max()) > limit:
        raise TraceError(
            f"{scenario.source_path or scenario.name}: {field}: sampled {int(values.max())}: expected at "
            f"most {limit} (set the distribution's max)"
        )


def _rng_streams(seed: int, trace_name: str, n: int) -> list[np.random.Generator]:
    root = np.random.SeedSequence([seed, zlib.crc32(trace_name.encode())])
    return [np.random.default_rng(s) for s in root.spawn(n)]


def _session_weights(names: list[str], turns_mean: np.ndarray, shares: dict[str, float]) -> tuple[np.ndarray, float]:
    """Class probabilities per session (share / E[turns], normalised) and their sum Z (the rate factor)."""
    w = np.array([shares.get(n, 0.0) for n in names]) / turns_mean
    return w / w.sum(), float(w.sum())


def _arrivals_and_classes(
    scenario: Scenario,
    trace_name: str,
    names: list[str],
    rng_arrival: np.random.Generator,
    rng_class: np.random.Generator,
) -> tuple[np.ndarray, np.ndarray]:
    """Session arrival times (s) and each session's class index into ``names``.

    Rates and shares are per *request*; a long-thread arrival opens a conversation of E[turns]
    requests, so sessions are drawn with weights share/E[turns] at rate x Z, Z = sum(share/E[turns]).
    """
    base_dir = scenario.base_dir()
    turns_mean = np.array([requests_per_session(scenario.classes[n].thread, base_dir) for n in names])
    normal_p, z_normal = _session_weights(names, turns_mean, scenario.class_shares(trace_name))
    burst_p, z_burst = _session_weights(names, turns_mean, scenario.class_shares(trace_name, in_burst=True))
    times_s, in_burst = arrival_times(scenario.traces[trace_name], rng_arrival, z_normal, z_burst)
    u = rng_class.random(len(times_s))
    cls_normal = np.searchsorted(np.cumsum(normal_p), u, side="right").clip(max=len(names) - 1)
    cls_burst = np.searchsorted(np.cumsum(burst_p), u, side="right").clip(max=len(names) - 1)
    return times_s, np.where(in_burst, cls_burst, cls_normal)


class _ClassRows:
    """The rows of one class: each of its arrivals opens a session, one request or a conversation of turns.

    Every per-turn draw comes from the class's own six seeded streams, drawn up front in bulk.
    """

    def __init__(self, scenario: Scenario, trace_name: str, cname: str, n_sessions: int, seed: int) -> None:
        base_dir = scenario.base_dir()
        settings = scenario.traces[trace_name]
        cls = scenario.classes[cname]
        thread = cls.thread
        self.cname, self.cls = cname, cls
        self.groups = [g for g in scenario.cache.prefix_groups if g.classes is None or cname in g.classes]
        self.is_thread = cls.thread is not None
        self.waits = bool(cls.thread is not None and cls.thread.wait_for_reply)
        self.closed = settings.process == "closed"
        self.duration_s = settings.duration_s
        streams = _rng_streams(seed, f"{trace_name}/{cname}", 6)
        rng_in, rng_out, rng_cancel, rng_turns, rng_think, rng_cancel_n = streams
        self.turns = (
            sample_tokens(thread.turns, rng_turns, n_sessions, base_dir)
            if thread is not None  # self.is_thread
            else np.ones(n_sessions, np.int64)
        )
        _check_sampled(scenario, f"classes.{cname}.thread.turns", self.turns, MAX_TURNS)
        total_turns = int(self.turns.sum())
        if total_turns > MAX_TRACE_REQUESTS:
            raise TraceError(
                f"{scenario.source_path or scenario.name}: traces.{trace_name}: {total_turns} requests of "
                f"class {cname}: expected at most {MAX_TRACE_REQUESTS} per trace"
            )
        self.new_in = sample_tokens(cls.input_tokens, rng_in, total_turns, base_dir)
        self.outs = sample_tokens(cls.output_tokens, rng_out, total_turns, base_dir)
        _check_sampled(scenario, f"classes.{cname}.input_tokens", self.new_in, MAX_TOKENS)
        _check_sampled(scenario, f"classes.{cname}.output_tokens", self.outs, MAX_TOKENS)
        self.where = f"{scenario.source_path or scenario.name}: classes.{cname}"
        self.think_s = (
            sample(thread.think_time_s, rng_think, total_turns, base_dir)
            if thread is not None  # self.is_thread
            else np.zeros(total_turns)
        )
        self.cancel_u = rng_cancel.random(total_turns)
        self.cancel_n = (
            sample_tokens(cls.cancel.after_tokens, rng_cancel_n, total_turns, base_dir)
            if cls.cancel
            else np.zeros(total_turns, np.int64)
        )
        self.reasoning = (
            sample_tokens(
                cls.reasoning_tokens, _rng_streams(seed, f"{trace_name}/{cname}/reasoning", 1)[0], total_turns, base_dir
            )
            if cls.reasoning_tokens is not None
            else None
        )
        if self.reasoning is not None:
            _check_sampled(scenario, f"classes.{cname}.reasoning_tokens", self.reasoning, MAX_TOKENS)
        tool_rng = _rng_streams(seed, f"{trace_name}/{cname}/tool_calls", 1)[0]
        self.tools = (
            ToolCallDraws(thread.tool_calls, tool_rng, base_dir) if thread is not None and thread.tool_calls else None
        )
        fan_rng = _rng_streams(seed, f"{trace_name}/{cname}/fanout", 1)[0]
        self.fanout = (
            FanoutDraws(cname, cls, fan_rng, base_dir, self.where, self.tools)
            if thread is not None and thread.fanout
            else None
        )
        self.k = 0  # next per-turn draw
        self.rows: list[tuple] = []  # (offset_ns, arrival order, turn, fields...)

    def prefix_group(self, u: float) -> tuple[str | None, int]:
        """(group name, prefix tokens) the uniform draw ``u`` falls into by share; (None, 0) for none."""
        acc = 0.0
        for g in self.groups:
            acc += g.share
            if u < acc:
                return g.name, g.prefix_tokens
        return None, 0

    def add_session(self, j: int, arrival: int, t: float, group_u: float, conv_id: str | None) -> None:
        """Session ``j`` (arrival order ``arrival``, at ``t`` s): its turns, until the trace ends (open loop)."""
        cls = self.cls
        group_name, group_tokens = self.prefix_group(group_u)
        context = group_tokens
        n_turns = int(self.turns[j])
        waits: list[tuple[str, int]] | None = None  # keys of the replies the next turn waits for (fan-out)
        subs_end = t
        for turn in range(n_turns):
            k = self.k
            if turn > 0:
                t = max(t, subs_end) + float(self.think_s[k])
                if not self.closed and t >= self.duration_s:
                    self.k += n_turns - turn
                    break
            prompt = context + int(self.new_in[k])
            if prompt > MAX_TOKENS:
                raise TraceError(
                    f"{self.where}: a turn's prompt (thread context) reaches {prompt} tokens: expected at "
                    f"most {MAX_TOKENS} (lower max turns or token lengths)"
                )
            reasoning = int(self.reasoning[k]) if self.reasoning is not None else None
            tool = self.tools.next(turn + 1 == n_turns) if self.tools is not None else None
            out = int(self.outs[k]) + (reasoning or 0) + (tool or 0)  # reasoning, the answer, a tool call
            if out > MAX_TOKENS:
                raise TraceError(
                    f"{self.where}: a request's reasoning, answer and tool call reach {out} output tokens: "
                    f"expected at most {MAX_TOKENS} (lower reasoning_tokens, output_tokens or tool_calls.tokens)"
                )
            cancel = None
            if cls.cancel and self.cancel_u[k] < cls.cancel.share and int(self.cancel_n[k]) < out:
                cancel = int(self.cancel_n[k])
            think_ns = round(float(self.think_s[k]) * _NS) if self.waits and turn > 0 else None
            self.rows.append(
                (
                    round(t * _NS) if not self.closed else 0,
                    arrival,
                    turn,
                    self.cname,
                    prompt,
                    out,
                    group_name,
                    group_tokens if group_name else None,
                    conv_id,
                    turn if self.is_thread else None,
                    cancel,
                    think_ns,
                    reasoning,
                    (conv_id, turn) if conv_id is not None else None,
                    waits,
                    tool,
                )
            )
            context = prompt + out
            self.k += 1
            if self.fanout is not None and conv_id is not None and turn + 1 < n_turns:
                sub_rows, lasts, subs_end = self.fanout.spawn((conv_id, turn), t, arrival)
                self.rows.extend(sub_rows)
                waits = [(conv_id, turn), *lasts] if lasts else None


def _table(rows: list[tuple]) -> pa.Table:
    width = max(6, len(str(len(rows))))
    ids = [f"r{i:0{width}d}" for i in range(len(rows))]
    id_of = {r[13]: rid for r, rid in zip(rows, ids, strict=True) if r[13] is not None}
    columns = {
        "request_id": ids,
        "request_class": [r[3] for r in rows],
        "scheduled_offset_ns": [r[0] for r in rows],
        "prompt_tokens": [r[4] for r in rows],
        "output_tokens": [r[5] for r in rows],
        "prefix_group": [r[6] for r in rows],
        "prefix_tokens": [r[7] for r in rows],
        "conversation_id": [r[8] for r in rows],
        "turn_index": [r[9] for r in rows],
        "cancel_after_tokens": [r[10] for r in rows],
        "think_after_reply_ns": [r[11] for r in rows],
        "reasoning_tokens": [r[12] for r in rows],
        "prompt_block_hashes": [None] * len(rows),
        "wait_for_ids": [[id_of[w] for w in r[14] if w in id_of] if r[14] else None for r in rows],
        "service_ns": [None] * len(rows),
        "tool_call_tokens": [r[15] for r in rows],
    }
    return trace_table(columns)


def _metadata(scenario: Scenario, trace_name: str, seed: int, settings: TraceSettings, requests: int) -> dict[str, Any]:
    closed = settings.process == "closed"
    return {
        "generator": "loadgen.trace.generate",
        "generator_version": GENERATOR_VERSION,
        "loadgen_version": __version__,
        "scenario_name": scenario.name,
        "scenario_sha256": scenario.sha256,
        "trace_name": trace_name,
        "seed": seed,
        "mode": "closed" if closed else "open",
        "concurrency": settings.concurrency if closed else None,
        "max_in_flight": settings.max_in_flight,
        "duration_s": settings.duration_s,
        "settings": settings.model_dump(mode="json"),
        "requests": requests,
    }


def generate_trace(scenario: Scenario, trace_name: str, seed: int | None = None) -> tuple[pa.Table, dict[str, Any]]:
    """Build the trace table and its metadata; same inputs give the same table."""
    if trace_name not in scenario.traces:
        raise TraceError(
            f"{scenario.source_path or scenario.name}: traces.{trace_name}: no such trace; expected one of {', '.join(scenario.traces)}"
        )
    seed = scenario.seed if seed is None else seed
    settings = scenario.traces[trace_name]
    rng_arrival, rng_class, rng_group = _rng_streams(seed, trace_name, 3)
    # The one class order (not file order), so a scenario rebuilt from a manifest gives the same trace.
    names = class_order(scenario.classes)
    times_s, class_idx = _arrivals_and_classes(scenario, trace_name, names, rng_arrival, rng_class)
    group_u = rng_group.random(len(times_s))
    rows: list[tuple] = []
    conversations = itertools.count(1)  # numbered across classes, in class order
    for ci, cname in enumerate(names):
        idx = np.flatnonzero(class_idx == ci)
        if len(idx) == 0:
            continue
        builder = _ClassRows(scenario, trace_name, cname, len(idx), seed)
        for j, arrival in enumerate(idx):
            conv_id = f"c{next(conversations):06d}" if builder.is_thread else None
            builder.add_session(j, int(arrival), float(times_s[arrival]), group_u[arrival], conv_id)
        rows.extend(builder.rows)
    rows.sort(key=lambda r: (r[0], r[1], r[2]))
    if settings.process == "closed":
        rows = rows[: int(settings.requests or 0)]
    return _table(rows), _metadata(scenario, trace_name, seed, settings, len(rows))


def generate_trace_file(scenario: Scenario, trace_name: str, out: str | Path, seed: int | None = None) -> Path:
    """Generate and write a trace; returns the path."""
    table, metadata = generate_trace(scenario, trace_name, seed)
    return write_trace(table, out, metadata)
