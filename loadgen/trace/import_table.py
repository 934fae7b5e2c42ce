"""From a parsed source (columns as arrays) to a loadgen trace file, vectorised: the shared tail of the
BurstGPT, Bailian and ShareGPT importers.

A source gives arrival instants (ns, any zero), token counts, optionally a class column (a source field such as
BurstGPT's ``Model``), threads (conversation id per row; turn order = arrival order), prompt block hashes and
prompt texts. This module orders the rows by arrival (stable), cuts the window, scales the gaps, names the
classes, numbers the turns inside the window and writes the trace with its provenance.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from loadgen.rundir.identity import sha256_file
from loadgen.util.errors import TraceError
from loadgen.util.limits import MAX_OFFSET_NS, MAX_TOKENS, MAX_TRACE_REQUESTS, is_finite
from loadgen.workload.scenario import class_name_problem

from .. import __version__
from .io import trace_table, write_trace

__all__ = ["ImportOptions", "Source", "bad_seconds", "class_slug", "first_missing", "parse_class_map", "write_imported"]

_NS = 1_000_000_000


@dataclass(frozen=True, slots=True)
class ImportOptions:
    """The window, scale and class options every importer takes (the CLI's flags)."""

    time_scale: float = 1.0
    start_s: float = 0.0
    duration_s: float | None = None
    max_requests: int | None = None
    request_class: str = "short-message"
    class_map: tuple[tuple[str, str], ...] = ()  # source value -> class name (with a class column)


@dataclass(slots=True)
class Source:
    """One parsed source file, one entry per request, in file order."""

    kind: str
    path: Path
    times_ns: np.ndarray  # int64 arrival instants
    prompts: np.ndarray  # int64 prompt tokens (whole prompt, thread context included)
    outputs: np.ndarray  # int64 output tokens
    class_values: pa.Array | None = None  # the source field classes are named from (None: one class)
    class_field: str | None = None  # its name, for metadata and errors
    conversations: pa.Array | None = None  # string conversation id per request (None: no threads)
    block_hashes: pa.Array | None = None  # list<int64> per request
    block_tokens: int | None = None
    block_rule: str | None = None
    prompt_text: pa.Array | None = None  # recorded user text per request (string)
    reply_text: pa.Array | None = None  # recorded reply per request (string)
    source_turns: np.ndarray | None = None  # with text: 0-based turn; a window keeps only threads it opens
    think_after_reply_ns: pa.Array | None = None  # int64: sent this long after the previous reply (null: at offset)
    extra_meta: dict[str, Any] | None = None


def first_missing(table: pa.Table, names: tuple[str, ...]) -> tuple[str, int] | None:
    """The first of ``names`` with a null, and the 0-based row of its first null; None when none has one."""
    for name in names:
        column = table.column(name)
        if column.null_count:
            return name, int(pc.index(pc.is_null(column), True).as_py())
    return None


def bad_seconds(seconds: np.ndarray, most_s: float) -> int | None:
    """The 0-based row of the first timestamp that is not finite, negative or over ``most_s``; None if all fit."""
    bad = np.flatnonzero(~np.isfinite(seconds) | (seconds < 0) | (seconds > most_s))
    return int(bad[0]) if len(bad) else None


def class_slug(value: str) -> str:
    """A source value as a class name: lower case, runs of other characters as '-' ('Conversation log' ->
    'conversation-log', 'GPT-4' -> 'gpt-4')."""
    return re.sub(r"[^a-z0-9_]+", "-", value.strip().lower()).strip("-_")[:64]


def parse_class_map(items: list[str] | None) -> tuple[tuple[str, str], ...]:
    """``VALUE=CLASS`` pairs (the CLI's ``--class-map``), each class name checked."""
    pairs = []
    for item in items or []:
        value, sep, name = item.rpartition("=")
        if not sep or not value:
            raise TraceError(f"--class-map = {item!r}: expected SOURCE_VALUE=CLASS")
        problem = class_name_problem(name)
        if problem is not None:
            raise TraceError(f"--class-map = {item!r}: class {name!r}: {problem}")
        pairs.append((value, name))
    return tuple(pairs)


def _check_counts(source: Source) -> None:
    for column, values in (("prompt tokens", source.prompts), ("output tokens", source.outputs)):
        bad = np.flatnonzero((values < 0) | (values > MAX_TOKENS))
        if len(bad):
            raise TraceError(
                f"{source.path}: request {int(bad[0]) + 1}: {column} = {int(values[bad[0]])}: expected 0..{MAX_TOKENS}"
            )


def _check_options(options: ImportOptions) -> None:
    """The window and scale options: finite and in range (the CLI checks its flags too; this guards library use)."""
    if not is_finite(options.time_scale) or not 0 < options.time_scale <= 1e6:
        raise TraceError(f"--time-scale = {options.time_scale}: expected a finite number in (0, 1e6]")
    for name, value in (("--start-s", options.start_s), ("--duration-s", options.duration_s)):
        if value is not None and (not is_finite(value) or not 0 <= value <= MAX_OFFSET_NS / _NS):
            raise TraceError(f"{name} = {value}: expected a finite number of seconds in 0..{MAX_OFFSET_NS / _NS:g}")
    if options.max_requests is not None and not 1 <= options.max_requests <= MAX_TRACE_REQUESTS:
        raise TraceError(f"--max-requests = {options.max_requests}: expected 1..{MAX_TRACE_REQUESTS}")
    problem = class_name_problem(options.request_class)
    if problem is not None:
        raise TraceError(f"--request-class = {options.request_class!r}: {problem}")


def _window(source: Source, options: ImportOptions) -> tuple[np.ndarray, np.ndarray]:
    """(row indices in arrival order inside the window, their offsets in ns after scaling)."""
    order = np.argsort(source.times_ns, kind="stable")
    times = source.times_ns[order]
    rel = times - times[0]
    keep = rel >= int(options.start_s * _NS)
    if options.duration_s is not None:
        keep &= rel < int((options.start_s + options.duration_s) * _NS)
    idx = np.flatnonzero(keep)
    if options.max_requests is not None:
        idx = idx[: options.max_requests]
    if len(idx) == 0:
        raise TraceError(
            f"{source.path}: window start {options.start_s} s, duration {options.duration_s} s holds no requests"
        )
    scaled = (rel[idx] - rel[idx[0]]).astype(np.float64) * options.time_scale
    if scaled[-1] > MAX_OFFSET_NS:
        raise TraceError(
            f"{source.path}: the window spans {scaled[-1] / _NS:.3g} s after --time-scale {options.time_scale:g}: "
            f"expected at most {MAX_OFFSET_NS / _NS:.3g} s (cut it with --duration-s)"
        )
    return order[idx], np.rint(scaled).astype(np.int64)


def _classes(source: Source, rows: pa.Array, options: ImportOptions) -> pa.Array:
    """The class of every kept row: ``--class-map`` where it names the value, else the value's slug."""
    n = len(rows)
    if source.class_values is None:
        return pa.array([options.request_class] * n, pa.string()) if n else pa.array([], pa.string())
    values = pc.take(source.class_values, rows).cast(pa.string())
    mapping = dict(options.class_map)
    distinct = pc.unique(values).to_pylist()
    names = {}
    for value in distinct:
        name = mapping.get(value) if value is not None else options.request_class
        name = name if name is not None else class_slug(value)
        problem = class_name_problem(name)
        if problem is not None:
            raise TraceError(
                f"{source.path}: {source.class_field} = {value!r} gives class {name!r}: {problem} "
                f"(map it with --class-map {value!r}=NAME)"
            )
        names[value] = name
    codes = pc.index_in(values, pa.array(distinct, pa.string()))
    return pc.take(pa.array([names[v] for v in distinct], pa.string()), codes)


def _take(column: pa.Array | None, rows: pa.Array, kind: pa.DataType) -> pa.Array:
    return pc.take(column, rows) if column is not None else pa.nulls(len(rows), kind)


def _whole_threads(source: Source, rows: np.ndarray, offsets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The window's rows of the threads whose first turn it holds (a text turn needs its earlier turns)."""
    assert source.source_turns is not None and source.conversations is not None
    conv = pc.take(source.conversations, pa.array(rows))
    opened = pc.filter(conv, pa.array(source.source_turns[rows] == 0))
    keep = pc.is_in(conv, value_set=opened).to_numpy(zero_copy_only=False)
    if not keep.any():
        raise TraceError(f"{source.path}: the window opens no conversation: expected one starting inside it")
    rows, offsets = rows[keep], offsets[keep]
    return rows, offsets - offsets[0]


def _request_ids(n: int, width: int) -> pa.Array:
    """``r000000``, ``r000001``, ...: 'r' and ``width`` digits (the other importers' ids), built as one buffer."""
    chars = np.empty((n, width + 1), np.uint8)
    chars[:, 0] = ord("r")
    rest = np.arange(n, dtype=np.int64)
    for col in range(width, 0, -1):
        chars[:, col] = ord("0") + rest % 10
        rest //= 10
    offsets = np.arange(0, (n + 1) * (width + 1), width + 1, dtype=np.int32)
    return pa.StringArray.from_buffers(n, pa.py_buffer(offsets), pa.py_buffer(chars.ravel()))


def _turns(conversations: pa.Array) -> pa.Array:
    """0-based turn of every row within its conversation, in row (arrival) order; null without a conversation."""
    codes = pc.dictionary_encode(conversations).indices.to_numpy(zero_copy_only=False)
    n = len(codes)
    order = np.argsort(codes, kind="stable")
    sorted_codes = codes[order]
    starts = np.r_[0, np.flatnonzero(sorted_codes[1:] != sorted_codes[:-1]) + 1] if n else np.array([], np.int64)
    run_start = np.repeat(starts, np.diff(np.r_[starts, n]))
    turns = np.empty(n, np.int32)
    turns[order] = np.arange(n) - run_start
    return pa.array(turns, pa.int32(), mask=pc.is_null(conversations).to_numpy(zero_copy_only=False))


def write_imported(source: Source, out: str | Path, options: ImportOptions) -> Path:
    """Write ``source`` as a trace file at ``out`` (see the module docstring)."""
    _check_options(options)
    if len(source.times_ns) == 0:
        raise TraceError(f"{source.path}: no requests: expected at least one row")
    _check_counts(source)
    rows_np, offsets = _window(source, options)
    if source.source_turns is not None and source.conversations is not None:
        rows_np, offsets = _whole_threads(source, rows_np, offsets)
    rows = pa.array(rows_np)
    n = len(rows_np)
    width = max(6, len(str(n)))
    null_str, null_i32 = pa.nulls(n, pa.string()), pa.nulls(n, pa.int32())
    conv = pc.take(source.conversations, rows) if source.conversations is not None else null_str
    hashes = pc.take(source.block_hashes, rows) if source.block_hashes is not None else None
    columns = {
        "request_id": _request_ids(n, width),
        "request_class": _classes(source, rows, options),
        "scheduled_offset_ns": pa.array(offsets, pa.int64()),
        "prompt_tokens": pa.array(np.maximum(source.prompts[rows_np], 1).astype(np.int32)),
        "output_tokens": pa.array(np.maximum(source.outputs[rows_np], 1).astype(np.int32)),
        "prefix_group": null_str,
        "prefix_tokens": null_i32,
        "conversation_id": conv,
        "turn_index": _turns(conv) if source.conversations is not None else null_i32,
        "cancel_after_tokens": null_i32,
        "think_after_reply_ns": _take(source.think_after_reply_ns, rows, pa.int64()),
        "reasoning_tokens": null_i32,
        "prompt_block_hashes": hashes if hashes is not None else pa.nulls(n, pa.list_(pa.int64())),
        "prompt_text": _take(source.prompt_text, rows, pa.string()),
        "reply_text": _take(source.reply_text, rows, pa.string()),
    }
    table = trace_table(columns)
    return write_trace(table, out, _metadata(source, options, n, offsets))


def _metadata(source: Source, options: ImportOptions, n: int, offsets: np.ndarray) -> dict[str, Any]:
    hashed = source.block_hashes is not None
    meta: dict[str, Any] = {
        "generator": f"loadgen.trace.importers.{source.kind}",
        "loadgen_version": __version__,
        "source": str(source.path),
        "source_sha256": sha256_file(source.path),
        "trace_name": source.path.stem,
        "seed": None,
        "mode": "open",
        "max_in_flight": None,
        "time_scale": options.time_scale,
        "window_start_s": options.start_s,
        "window_duration_s": options.duration_s,
        "max_requests": options.max_requests,
        "request_class": options.request_class if source.class_values is None else None,
        "class_by": source.class_field,
        "class_map": dict(options.class_map) or None,
        "requests": n,
        "duration_s": float(offsets[-1]) / _NS,
        "block_hash_tokens": source.block_tokens if hashed else None,
        "block_hash_rule": source.block_rule if hashed else None,
    }
    meta.update(source.extra_meta or {})
    return meta
