"""Reading and writing trace Parquet files with their provenance metadata."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from ..errors import TraceError
from ..records import TRACE_FULL_SCHEMA, TRACE_OPTIONAL_FIELDS, TRACE_SCHEMA

__all__ = ["TRACE_METADATA_KEY", "write_trace", "read_trace"]

TRACE_METADATA_KEY = b"loadgen.trace"


def _with_optional(table: pa.Table) -> pa.Table:
    """Add the optional columns an older trace lacks, as nulls."""
    for f in TRACE_OPTIONAL_FIELDS:
        if f.name not in table.column_names:
            table = table.append_column(f, pa.nulls(table.num_rows, f.type))
    return table


def write_trace(table: pa.Table, path: str | Path, metadata: dict[str, Any]) -> Path:
    """Write a trace table (TRACE_SCHEMA) with ``metadata``; byte-identical for identical inputs."""
    path = Path(path)
    table = _with_optional(table).select(TRACE_FULL_SCHEMA.names).cast(TRACE_FULL_SCHEMA)
    schema = TRACE_FULL_SCHEMA.with_metadata({TRACE_METADATA_KEY: json.dumps(metadata, sort_keys=True).encode()})
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(table.cast(schema), path, compression="zstd", row_group_size=1 << 20)
    except OSError as exc:
        raise TraceError(f"{path}: cannot write trace ({exc.strerror or exc})") from None
    return path


def read_trace(path: str | Path) -> tuple[pa.Table, dict[str, Any]]:
    """Read a trace file; returns the table (TRACE_FULL_SCHEMA: optional columns null when absent; no metadata)
    and its metadata dict."""
    path = Path(path)
    if not path.is_file():
        raise TraceError(f"{path}: no such file: expected a trace Parquet file (loadgen trace generate/import)")
    try:
        table = pq.read_table(path)
    except (pa.ArrowInvalid, OSError) as exc:
        raise TraceError(f"{path}: unreadable Parquet ({exc}): expected a loadgen trace") from None
    missing = [n for n in TRACE_SCHEMA.names if n not in table.column_names]
    if missing:
        raise TraceError(f"{path}: missing column(s) {missing}: expected a loadgen trace (TRACE_SCHEMA)")
    raw = (table.schema.metadata or {}).get(TRACE_METADATA_KEY)
    try:
        metadata = json.loads(raw) if raw else {}
    except json.JSONDecodeError:
        raise TraceError(f"{path}: metadata {TRACE_METADATA_KEY.decode()} is not JSON") from None
    table = _with_optional(table).select(TRACE_FULL_SCHEMA.names).cast(TRACE_FULL_SCHEMA)
    offsets = table.column("scheduled_offset_ns").to_numpy()
    if len(offsets) and ((offsets[1:] < offsets[:-1]).any() or offsets[0] < 0):
        raise TraceError(f"{path}: scheduled_offset_ns not sorted ascending from >= 0: expected a time-ordered trace")
    return table, metadata
