"""Run directories: the contract between driver, simulator, importers and analyzer.

A run directory holds ``manifest.json`` (identity), ``requests.parquet`` (one row per scheduled
request), ``chunks.parquet`` (one row per received chunk) and, when there were any,
``server_metrics.parquet``. Files are written in row groups as the run goes; ``close()`` always runs
(Ctrl-C, dead server, exceptions) so an interrupted run is still readable. Each Parquet file also
carries the final manifest as key-value metadata under ``loadgen.manifest``.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from .errors import RunDirError
from .jsonfile import read_json_object
from .records import (
    CHUNKS_FILE,
    CHUNKS_SCHEMA,
    MANIFEST_FILE,
    REQUESTS_FILE,
    REQUESTS_SCHEMA,
    SCHEMA_VERSION,
    SERVER_METRICS_FILE,
    SERVER_METRICS_SCHEMA,
    STATUSES,
)

__all__ = ["RunWriter", "RunData", "read_manifest", "write_manifest", "load_run", "MANIFEST_METADATA_KEY"]

MANIFEST_METADATA_KEY = "loadgen.manifest"


def write_manifest(run_dir: Path, manifest: dict[str, Any]) -> None:
    """Write manifest.json atomically (write to a temp file, then rename)."""
    run_dir = Path(run_dir)
    tmp = run_dir / (MANIFEST_FILE + ".tmp")
    tmp.write_text(json.dumps(manifest, indent=2, sort_keys=True, default=str) + "\n")
    os.replace(tmp, run_dir / MANIFEST_FILE)


def read_manifest(run_dir: Path) -> dict[str, Any]:
    """Read a run directory's manifest.json."""
    path = Path(run_dir) / MANIFEST_FILE
    if not path.is_file():
        raise RunDirError(f"{run_dir}: no {MANIFEST_FILE}: expected a loadgen run directory")
    return read_json_object(path, "a manifest object", RunDirError)


class _TableWriter:
    """Column buffers flushed as Parquet row groups; the file is opened on creation."""

    def __init__(self, path: Path, schema: pa.Schema, flush_rows: int) -> None:
        self.path = path
        self.schema = schema
        self.flush_rows = flush_rows
        self.columns: dict[str, list[Any]] = {name: [] for name in schema.names}
        self.rows_buffered = 0
        self.rows_written = 0
        self.writer = pq.ParquetWriter(path, schema, compression="zstd")

    def append(self, row: dict[str, Any]) -> None:
        for name, column in self.columns.items():
            column.append(row.get(name))
        self.rows_buffered += 1
        if self.rows_buffered >= self.flush_rows:
            self.flush()

    def append_columns(self, columns: dict[str, list[Any]]) -> None:
        n = len(next(iter(columns.values())))
        for name, column in self.columns.items():
            values = columns.get(name)
            column.extend(values if values is not None else [None] * n)
        self.rows_buffered += n
        if self.rows_buffered >= self.flush_rows:
            self.flush()

    def write_table(self, table: pa.Table) -> None:
        """Append a ready Arrow table (this schema) after whatever is buffered."""
        self.flush()
        self.writer.write_table(table)
        self.rows_written += table.num_rows

    def flush(self) -> None:
        if not self.rows_buffered:
            return
        table = pa.Table.from_pydict(self.columns, schema=self.schema)
        self.writer.write_table(table)
        self.rows_written += self.rows_buffered
        self.rows_buffered = 0
        for column in self.columns.values():
            column.clear()

    def close(self, manifest_json: str) -> None:
        try:
            self.flush()
        finally:
            self.writer.add_key_value_metadata({MANIFEST_METADATA_KEY: manifest_json})
            self.writer.close()


class RunWriter:
    """Writes one run directory incrementally; use as a context manager so it always closes.

    ``manifest`` is written at open (``state: running``) and again, completed, at close.
    """

    def __init__(self, run_dir: Path, manifest: dict[str, Any], *, flush_rows: int = 2000) -> None:
        self.run_dir = Path(run_dir)
        try:
            self.run_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise RunDirError(f"{run_dir}: cannot create run directory: {exc.strerror}") from None
        if (self.run_dir / REQUESTS_FILE).exists():
            raise RunDirError(f"{run_dir}: already holds a run ({REQUESTS_FILE}): expected a new or empty directory")
        self.manifest = dict(manifest)
        self.manifest.setdefault("schema_version", SCHEMA_VERSION)
        self.manifest["state"] = "running"
        write_manifest(self.run_dir, self.manifest)
        self.requests = _TableWriter(self.run_dir / REQUESTS_FILE, REQUESTS_SCHEMA, flush_rows)
        self.chunks = _TableWriter(self.run_dir / CHUNKS_FILE, CHUNKS_SCHEMA, flush_rows * 20)
        self._metrics: _TableWriter | None = None
        self._flush_rows = flush_rows
        self.status_counts: dict[str, int] = {s: 0 for s in STATUSES}
        self.closed = False

    def add_request(self, row: dict[str, Any]) -> None:
        """Append one finished request row (all REQUESTS_SCHEMA columns; missing ones are null)."""
        status = row.get("status")
        if status not in self.status_counts:
            raise ValueError(f"request {row.get('request_id')}: status {status!r} not in {STATUSES}")
        self.status_counts[status] += 1
        self.requests.append(row)

    def add_request_table(self, table: pa.Table) -> None:
        """Append request rows already in REQUESTS_SCHEMA (the driver converts off its hot path)."""
        for status, count in zip(*table.column("status").value_counts().flatten()):
            status = status.as_py()
            if status not in self.status_counts:
                raise ValueError(f"status {status!r} not in {STATUSES}")
            self.status_counts[status] += count.as_py()
        self.requests.write_table(table)

    def add_chunk_table(self, table: pa.Table) -> None:
        """Append chunk rows already in CHUNKS_SCHEMA."""
        self.chunks.write_table(table)

    def add_chunks(self, columns: dict[str, list[Any]]) -> None:
        """Append chunk rows given as columns (request_id, seq, arrival_ns, tokens, bytes)."""
        if columns and len(next(iter(columns.values()))):
            self.chunks.append_columns(columns)

    def add_metrics(self, columns: dict[str, list[Any]]) -> None:
        """Append server-metric samples given as columns (time_ns, name, labels, value)."""
        if not columns or not len(next(iter(columns.values()))):
            return
        if self._metrics is None:
            self._metrics = _TableWriter(
                self.run_dir / SERVER_METRICS_FILE, SERVER_METRICS_SCHEMA, self._flush_rows * 10
            )
        self._metrics.append_columns(columns)

    def flush(self) -> None:
        self.requests.flush()
        self.chunks.flush()
        if self._metrics is not None:
            self._metrics.flush()

    def close(self, **manifest_updates: Any) -> dict[str, Any]:
        """Flush and close every file; record final counts and ``manifest_updates``; idempotent."""
        if self.closed:
            return self.manifest
        self.closed = True
        self.manifest.update(manifest_updates)
        self.manifest["state"] = manifest_updates.get("state", "complete")
        self.manifest["status_counts"] = dict(self.status_counts)
        self.manifest["requests_recorded"] = self.requests.rows_written + self.requests.rows_buffered
        self.manifest["chunks_recorded"] = self.chunks.rows_written + self.chunks.rows_buffered
        manifest_json = json.dumps(self.manifest, sort_keys=True, default=str)
        errors: list[BaseException] = []
        for table in (self.requests, self.chunks, self._metrics):
            if table is None:
                continue
            try:
                table.close(manifest_json)
            except BaseException as exc:  # keep closing the others; a full disk must not lose them all
                errors.append(exc)
        write_manifest(self.run_dir, self.manifest)
        if errors:
            raise errors[0]
        return self.manifest

    def __enter__(self) -> "RunWriter":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
        else:
            self.close(state="interrupted", interrupted_by=exc_type.__name__)


@dataclass
class RunData:
    """A run directory read back: manifest plus Arrow tables (server_metrics may be None)."""

    run_dir: Path
    manifest: dict[str, Any]
    requests: pa.Table
    chunks: pa.Table | None
    server_metrics: pa.Table | None


def _read_table(path: Path, schema: pa.Schema) -> pa.Table | None:
    if not path.exists():
        return None
    try:
        table = pq.read_table(path)
    except (pa.ArrowInvalid, OSError) as exc:
        raise RunDirError(f"{path}: unreadable Parquet ({exc}): expected a file written by loadgen") from None
    missing = [name for name in schema.names if name not in table.column_names]
    if missing:
        raise RunDirError(f"{path}: missing column(s) {missing}: expected the loadgen record schema v{SCHEMA_VERSION}")
    return table.select(schema.names).cast(schema)


def load_run(run_dir: Path, *, chunks: bool = True) -> RunData:
    """Read a whole run directory into memory (for large runs read the Parquet files in batches)."""
    run_dir = Path(run_dir)
    manifest = read_manifest(run_dir)
    requests = _read_table(run_dir / REQUESTS_FILE, REQUESTS_SCHEMA)
    if requests is None:
        raise RunDirError(f"{run_dir}: no {REQUESTS_FILE}: expected a loadgen run directory")
    return RunData(
        run_dir=run_dir,
        manifest=manifest,
        requests=requests,
        chunks=_read_table(run_dir / CHUNKS_FILE, CHUNKS_SCHEMA) if chunks else None,
        server_metrics=_read_table(run_dir / SERVER_METRICS_FILE, SERVER_METRICS_SCHEMA),
    )
