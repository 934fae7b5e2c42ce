"""Reading and writing trace Parquet files with their provenance metadata.

Both directions validate: column types (no silent float->int truncation), no nulls where the schema has
none, every number within ``loadgen.util.limits`` (offsets, token counts), unique request ids, and metadata that
is a JSON object whose known keys have the expected types. A bad trace is one ``TraceError`` line naming
the file, the column (or key), the value and what was expected.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from loadgen.rundir.schema import TRACE_FULL_SCHEMA, TRACE_OPTIONAL_FIELDS, TRACE_SCHEMA
from loadgen.util.errors import TraceError
from loadgen.util.limits import (
    MAX_CONCURRENCY,
    MAX_DURATION_S,
    MAX_OFFSET_NS,
    MAX_REPLAY_OFFSET_NS,
    MAX_SEED,
    MAX_TOKENS,
    MAX_TRACE_REQUESTS,
    MAX_TURNS,
)
from loadgen.util.outputfile import PARTIAL_SUFFIX, output_partial

__all__ = [
    "TRACE_METADATA_KEY",
    "read_trace",
    "refuse_unreplayable",
    "trace_table",
    "validate_trace",
    "validate_trace_metadata",
    "write_trace",
]

TRACE_METADATA_KEY = b"loadgen.trace"

#: Optional columns written only when some row holds a value (recorded text, tool calls): a trace without them
#: is byte-identical to one written before they existed.
_SPARSE_COLUMNS = ("prompt_text", "reply_text", "tool_call_tokens")
#: Inclusive bounds of every integer column (prompt_tokens counts the whole thread context).
_COLUMN_RANGES = {
    "scheduled_offset_ns": (0, MAX_OFFSET_NS),
    "prompt_tokens": (0, MAX_TOKENS),
    "output_tokens": (0, MAX_TOKENS),
    "prefix_tokens": (0, MAX_TOKENS),
    "turn_index": (0, MAX_TURNS),
    "cancel_after_tokens": (0, MAX_TOKENS),
    "tool_call_tokens": (1, MAX_TOKENS),
    "reasoning_tokens": (0, MAX_TOKENS),
    "think_after_reply_ns": (0, MAX_OFFSET_NS),  # a pause within the span of a trace
    "service_ns": (0, MAX_OFFSET_NS),
}
#: Metadata keys other code reads, with the accepted types and numeric bounds (None is always accepted).
_META_NUMBERS = {
    "duration_s": (0.0, MAX_DURATION_S * 53),  # imported traces may span a year
    "max_in_flight": (1, MAX_CONCURRENCY),
    "concurrency": (1, MAX_CONCURRENCY),
    "requests": (0, MAX_TRACE_REQUESTS),
    "seed": (0, MAX_SEED),
    "offered_rate_rps": (0.0, 1e9),
    "block_hash_tokens": (1, MAX_TOKENS),  # tokens each prompt_block_hashes entry stands for
}
_META_STRINGS = ("trace_name", "scenario_name", "scenario_sha256", "source", "generator")


def _cast_columns(table: pa.Table, source: object) -> pa.Table:
    """The trace columns (optional ones added as nulls), cast safely one by one (a failed cast names its column)."""
    table = _with_optional(table)
    columns = []
    for field in TRACE_FULL_SCHEMA:
        column = table.column(field.name)
        try:
            columns.append(column.cast(field.type))  # safe: 1.5 or NaN never becomes an integer
        except (pa.ArrowException, ValueError) as exc:
            detail = str(exc).splitlines()[0][:120]
            raise TraceError(
                f"{source}: column {field.name} of type {column.type} ({detail}): expected {field.type}"
            ) from None
    return pa.Table.from_arrays(columns, schema=TRACE_FULL_SCHEMA)


def validate_trace(table: pa.Table, source: object) -> None:
    """Raise TraceError on nulls in required columns, out-of-range numbers, duplicate ids or disorder."""
    if table.num_rows > MAX_TRACE_REQUESTS:
        raise TraceError(f"{source}: {table.num_rows} requests: expected at most {MAX_TRACE_REQUESTS} per trace")
    for field in TRACE_SCHEMA:
        column = table.column(field.name)
        if not field.nullable and column.null_count:
            row = pc.index(pc.is_null(column), True).as_py()
            raise TraceError(f"{source}: column {field.name} = null (row {row}): expected a value in every row")
    for name, (lo, hi) in _COLUMN_RANGES.items():
        column = table.column(name)
        if table.num_rows == 0 or column.null_count == table.num_rows:
            continue
        low, high = pc.min_max(column).values()
        for value in (low.as_py(), high.as_py()):
            if value is not None and not lo <= value <= hi:
                row = pc.index(column, value).as_py()
                raise TraceError(f"{source}: column {name} = {value} (row {row}): expected {lo}..{hi}")
    ids = table.column("request_id")
    if pc.count_distinct(ids).as_py() != table.num_rows:
        counts = pc.value_counts(ids)
        dup = counts.filter(pc.greater(counts.field("counts"), 1))[0]["values"].as_py()
        raise TraceError(f"{source}: column request_id = {dup!r} appears more than once: expected unique request ids")
    _validate_block_hashes(table, source)
    _validate_tool_calls(table, source)
    offsets = table.column("scheduled_offset_ns").to_numpy()
    if len(offsets) and (offsets[1:] < offsets[:-1]).any():
        raise TraceError(f"{source}: scheduled_offset_ns not sorted ascending from >= 0: expected a time-ordered trace")


def _validate_tool_calls(table: pa.Table, source: object) -> None:
    """reasoning_tokens and tool_call_tokens fit in the output (reasoning, answer, tool call)."""
    reasoning = pc.fill_null(table.column("reasoning_tokens"), 0)
    over = pc.greater(reasoning, table.column("output_tokens"))
    if pc.any(over).as_py():
        row = int(pc.index(over, True).as_py())
        value = reasoning[row].as_py()
        raise TraceError(f"{source}: column reasoning_tokens = {value} (row {row}): expected at most output_tokens")
    tool = table.column("tool_call_tokens")
    if tool.null_count == table.num_rows:
        return
    over = pc.fill_null(pc.greater(pc.add(tool, reasoning), table.column("output_tokens")), False)
    if pc.any(over).as_py():
        row = int(pc.index(over, True).as_py())
        value = tool[row].as_py()
        raise TraceError(
            f"{source}: column tool_call_tokens = {value} (row {row}): expected at most output_tokens - "
            "reasoning_tokens"
        )


def _validate_block_hashes(table: pa.Table, source: object) -> None:
    """prompt_block_hashes: no null entry inside a list (a null list = unknown prefix structure is fine)."""
    column = table.column("prompt_block_hashes")
    if column.null_count == table.num_rows:
        return
    flat = pc.list_flatten(column)
    if flat.null_count:
        lengths = pc.list_value_length(column).fill_null(0).to_numpy()
        first = int(pc.index(pc.is_null(flat), True).as_py())
        row = int(np.searchsorted(np.cumsum(lengths), first, side="right"))
        raise TraceError(
            f"{source}: column prompt_block_hashes holds a null hash (row {row}): expected an int64 per block"
        )


def validate_trace_metadata(metadata: object, source: object) -> dict[str, Any]:
    """The metadata as a dict, after checking the keys loadgen reads; TraceError on a wrong type or value."""
    key = TRACE_METADATA_KEY.decode()
    if not isinstance(metadata, dict):
        raise TraceError(f"{source}: metadata {key} is a JSON {type(metadata).__name__}: expected a JSON object")
    for name, (lo, hi) in _META_NUMBERS.items():
        value = metadata.get(name)
        if value is None:
            continue
        integral = isinstance(lo, int)
        ok = (isinstance(value, int) or (not integral and isinstance(value, float))) and not isinstance(value, bool)
        if not ok or not lo <= value <= hi:  # NaN fails the comparison too
            kind = "an integer" if integral else "a number"
            raise TraceError(f"{source}: metadata {key}.{name} = {value!r}: expected {kind} in {lo:g}..{hi:g}")
    for name in _META_STRINGS:
        value = metadata.get(name)
        if value is not None and not isinstance(value, str):
            raise TraceError(f"{source}: metadata {key}.{name} = {value!r}: expected a string")
    if metadata.get("mode") not in (None, "open", "closed"):
        raise TraceError(f"{source}: metadata {key}.mode = {metadata['mode']!r}: expected 'open' or 'closed'")
    return metadata


def trace_table(columns: dict[str, Any]) -> pa.Table:
    """A TRACE_FULL_SCHEMA table from columns by name; optional columns left out are nulls."""
    n = len(columns["request_id"])
    full = {f.name: columns[f.name] if f.name in columns else pa.nulls(n, f.type) for f in TRACE_FULL_SCHEMA}
    return pa.Table.from_pydict(full, schema=TRACE_FULL_SCHEMA)


def _with_optional(table: pa.Table) -> pa.Table:
    """Add the optional columns an older trace lacks, as nulls."""
    for f in TRACE_OPTIONAL_FIELDS:
        if f.name not in table.column_names:
            table = table.append_column(f, pa.nulls(table.num_rows, f.type))
    return table


def write_trace(table: pa.Table, path: str | Path, metadata: dict[str, Any]) -> Path:
    """Write a trace table (TRACE_SCHEMA) with ``metadata``, whole or not at all; byte-identical for identical
    inputs."""
    path = Path(path)
    table = _cast_columns(table, path)
    validate_trace(table, path)
    validate_trace_metadata(metadata, path)
    _check_block_hash_tokens(table, metadata, path)
    try:
        encoded = json.dumps(metadata, sort_keys=True, allow_nan=False).encode()
    except ValueError as exc:
        raise TraceError(f"{path}: trace metadata ({exc}): expected finite numbers") from None
    for name in _SPARSE_COLUMNS:  # absent when every row is null (read back as nulls)
        if table.column(name).null_count == table.num_rows:
            table = table.drop_columns([name])
    schema = pa.schema([TRACE_FULL_SCHEMA.field(n) for n in table.column_names]).with_metadata(
        {TRACE_METADATA_KEY: encoded}
    )
    try:
        with output_partial(path) as partial:  # whole or not at all
            pq.write_table(table.cast(schema), partial, compression="zstd", row_group_size=1 << 20)
    except OSError as exc:
        detail = str(exc.strerror or exc).replace(f"{path}{PARTIAL_SUFFIX}", str(path))
        raise TraceError(f"{path}: cannot write trace ({detail})") from None
    return path


def refuse_unreplayable(table: pa.Table, source: object) -> None:
    """Refuse (TraceError) a trace a run cannot replay whole: its last scheduled offset past MAX_REPLAY_OFFSET_NS
    (97 days; a run's instants are read exactly up to 2**53 ns). Checked before anything is sent or simulated:
    such a trace was replayed to its end, and its run then refused at its close or by analyze."""
    offsets = table.column("scheduled_offset_ns")
    last = pc.max(offsets).as_py() if table.num_rows else None
    if last is not None and last > MAX_REPLAY_OFFSET_NS:
        raise TraceError(
            f"{source}: scheduled_offset_ns = {last} ({last / 86400e9:.1f} days): expected at most "
            f"{MAX_REPLAY_OFFSET_NS} ({MAX_REPLAY_OFFSET_NS / 86400e9:.1f} days) to replay it: a run's instants are "
            "held to 2**53 ns; import it in windows (trace import --start-s, --duration-s) or --time-scale it"
        )


def read_trace(path: str | Path) -> tuple[pa.Table, dict[str, Any]]:
    """Read a trace file; returns the table (TRACE_FULL_SCHEMA: optional columns null when absent; no metadata)
    and its metadata dict."""
    path = Path(path)
    if not path.is_file():
        problem = "is a directory" if path.is_dir() else "no such file"
        raise TraceError(f"{path}: {problem}: expected a trace Parquet file (loadgen trace generate/import)")
    try:
        table = pq.read_table(path)
        table.validate(full=True)  # also every string is UTF-8 (a damaged file may decode to anything)
        names = table.column_names
    except (pa.ArrowException, OSError, ValueError) as exc:  # ValueError: UnicodeDecodeError in a name
        detail = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
        raise TraceError(f"{path}: unreadable Parquet ({detail}): expected a loadgen trace") from None
    missing = [n for n in TRACE_SCHEMA.names if n not in names]
    if missing:
        raise TraceError(f"{path}: missing column(s) {missing}: expected a loadgen trace (TRACE_SCHEMA)")
    raw = (table.schema.metadata or {}).get(TRACE_METADATA_KEY)
    try:
        metadata = json.loads(raw, parse_constant=_no_constant) if raw else {}
    except (ValueError, RecursionError):  # JSONDecodeError, UnicodeDecodeError, NaN/Infinity, deep nesting
        raise TraceError(
            f"{path}: metadata {TRACE_METADATA_KEY.decode()} is not UTF-8 JSON with finite numbers"
        ) from None
    metadata = validate_trace_metadata(metadata, path)
    table = _cast_columns(table, path)
    validate_trace(table, path)
    _check_block_hash_tokens(table, metadata, path)
    return table, metadata


def _check_block_hash_tokens(table: pa.Table, metadata: dict[str, Any], source: object) -> None:
    """A trace that carries prompt_block_hashes says how many tokens each stands for."""
    column = table.column("prompt_block_hashes")
    if column.null_count < table.num_rows and metadata.get("block_hash_tokens") is None:
        raise TraceError(
            f"{source}: column prompt_block_hashes is set but metadata {TRACE_METADATA_KEY.decode()}.block_hash_tokens "
            "is missing: expected the tokens each block hash stands for"
        )


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a finite number")
