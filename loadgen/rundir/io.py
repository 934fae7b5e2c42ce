"""Run directories: the contract between driver, simulator, importers and analyzer.

A run directory holds ``manifest.json`` (identity) and one table per record kind:
``requests.parquet`` (one row per scheduled request), ``chunks.parquet`` (one row per received chunk)
and, when there were any, ``server_metrics.parquet``. Each table is a directory of closed Parquet part
files (``loadgen.rundir.parts``): every flush writes complete parts, so what is on disk is readable at every
moment, whatever ends the run (Ctrl-C, SIGTERM, SIGKILL, a full disk, power loss after the last
flush). Runs written before schema version 2 (one file per table) still load.

A manifest that still says ``state: running`` when its writer is gone (SIGKILL, a crash) is read as
``killed``: ``read_run_manifest`` derives the counts from the records and says when the last flush
was, and until which scheduled instant every request has its row (``stopped_ns``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Self

import psutil
import pyarrow as pa
import pyarrow.compute as pc

from loadgen.rundir.identity import hostname_sha256, utc_now_iso
from loadgen.rundir.manifest import Manifest, merge_manifest, read_manifest, write_manifest
from loadgen.rundir.parts import (
    MANIFEST_METADATA_KEY,
    PartSink,
    PartTable,
    last_part_metadata,
    read_table,
    shard_last_part_metadata,
    table_files,
    table_rows,
    write_error,
)
from loadgen.rundir.schema import (
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
from loadgen.util.errors import RecordWriteError, RunDirError

__all__ = [
    "MANIFEST_METADATA_KEY",
    "RunData",
    "RunWriter",
    "WORKERS_DIR",
    "RUN_DIR_NAMES",
    "has_run",
    "held_run_names",
    "load_run",
    "persist_recovery",
    "read_manifest",
    "read_run_manifest",
    "read_run_table",
    "run_table_files",
    "write_manifest",
    "writer_alive",
]

#: A run spread over workers keeps each worker's own manifest (and log) in WORKERS_DIR/w0/ ...
WORKERS_DIR = "workers"
#: What a run directory owns at its top level. A new run is never written into a directory that holds one of
#: them, and no other output is written over one (a handoff bundle holds a manifest.json too).
RUN_DIR_NAMES = (MANIFEST_FILE, REQUESTS_FILE, CHUNKS_FILE, SERVER_METRICS_FILE, WORKERS_DIR)
#: A handoff bundle's checksum list (``loadgen.handoff.layout.SUMS_FILE``; the bundle layer sits above this one).
_BUNDLE_SUMS = "SHA256SUMS"
#: Rows per row group when a table's parts are merged at close.
_COMPACT_ROWS = {REQUESTS_FILE: 100_000, CHUNKS_FILE: 1_000_000, SERVER_METRICS_FILE: 200_000}
_SCHEMAS = {REQUESTS_FILE: REQUESTS_SCHEMA, CHUNKS_FILE: CHUNKS_SCHEMA, SERVER_METRICS_FILE: SERVER_METRICS_SCHEMA}
#: The manifest written at open is padded to at least this many bytes (see ``write_manifest``).
_MANIFEST_RESERVE = 64 * 1024


def _process_start_s() -> float | None:
    try:
        return psutil.Process().create_time()
    except psutil.Error:
        return None


class RunWriter:
    """Writes one run directory as part files; use as a context manager so it always closes.

    Rows are buffered until ``flush`` (the driver's recorder calls it every flush interval; the
    worksheet and importers every ``flush_rows`` requests). The first write error (ENOSPC, EIO,
    read-only) is raised as ``RecordWriteError`` naming the path; the writer then writes no more
    records, and ``close`` leaves what was flushed readable with a manifest that says ``failed``.
    ``manifest`` is written at open (``state: running``, with the writer's identity) and again,
    completed, at close. ``defer_parts``: no part reaches the disk before ``close``, which writes the
    merged files from memory (a writer that holds its whole tables anyway and has no crash to survive:
    the worksheet; see ``PartTable``).
    """

    def __init__(
        self,
        run_dir: Path,
        manifest: Manifest,
        *,
        flush_rows: int = 2000,
        fsync: bool = True,
        flush_interval_s: float | None = None,
        shard: str | None = None,
        defer_parts: bool = False,
    ) -> None:
        self.run_dir = Path(run_dir)
        # a worker's shard (``--workers``): its parts beside the other workers' in the run's tables,
        # its own manifest in workers/SHARD/ (the coordinator owns the run's manifest.json)
        self.shard = shard
        self.manifest_dir = self.run_dir / WORKERS_DIR / shard if shard else self.run_dir
        try:
            self.manifest_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise RunDirError(f"{self.manifest_dir}: cannot create run directory: {exc.strerror}") from None
        held = held_run_names(self.run_dir)
        if held and shard is None:
            raise RunDirError(
                f"{run_dir}: already holds a run or handoff bundle ({held[0]}): expected a new or empty directory"
            )
        writer = {
            "pid": psutil.Process().pid,
            "hostname_sha256": hostname_sha256(),
            "process_start_s": _process_start_s(),
            "flush_interval_s": flush_interval_s,
        }
        self.manifest = merge_manifest(
            manifest, {"schema_version": SCHEMA_VERSION, "state": "running", "writer": writer}
        )
        self._flush_rows = flush_rows
        self.status_counts: dict[str, int] = {s: 0 for s in STATUSES}
        self.closed = False
        self.broken: RecordWriteError | None = None
        self.flushes = 0
        self.last_part: dict[str, Any] = {}
        self.write_manifest()
        self._defer = defer_parts
        self.requests = PartTable(
            self.run_dir / REQUESTS_FILE, REQUESTS_SCHEMA, fsync=fsync, shard=shard, defer=defer_parts
        )
        self.chunks = PartTable(self.run_dir / CHUNKS_FILE, CHUNKS_SCHEMA, fsync=fsync, shard=shard, defer=defer_parts)
        self._metrics: PartTable | None = None
        self._fsync = fsync
        try:
            self._io(lambda: self._write_parts({}, empty=True))  # the schema is on disk from the start
        except RecordWriteError as exc:
            self.closed = True
            try:
                write_manifest(
                    self.manifest_dir, merge_manifest(self.manifest, {"state": "failed", "interrupted_by": exc.short})
                )
            except OSError:
                pass
            raise

    # ---- manifest -----------------------------------------------------------------------------------
    def write_manifest(self) -> None:
        """Write the manifest as it is now (padded, so a final one fits in place on a full disk)."""
        reserve = max(_MANIFEST_RESERVE, 2 * len(self.manifest.to_json()))
        try:
            write_manifest(self.manifest_dir, self.manifest, reserve_bytes=reserve)
        except OSError as exc:
            raise write_error(self.manifest_dir / MANIFEST_FILE, exc) from None

    def update_manifest(self, updates: Mapping[str, Any], *, write: bool = False) -> None:
        """Merge what was learnt during the run (the anchor ...); ``write``: on disk now, too."""
        self.manifest = merge_manifest(self.manifest, updates)
        if write:
            self.save_manifest()

    def save_manifest(self) -> None:
        """``write_manifest`` now; a failure marks the writer broken (no more record writes) and is raised."""
        self._io(self.write_manifest)

    # ---- rows ---------------------------------------------------------------------------------------
    def _check_statuses(self, statuses: pa.ChunkedArray) -> None:
        for entry in pc.value_counts(statuses).to_pylist():
            if entry["values"] not in self.status_counts:
                raise ValueError(f"status {entry['values']!r} not in {STATUSES}")

    def add_request(self, row: dict[str, Any]) -> None:
        """Append one finished request row (all REQUESTS_SCHEMA columns; missing ones are null)."""
        status = row.get("status")
        if status not in self.status_counts:
            raise ValueError(f"request {row.get('request_id')}: status {status!r} not in {STATUSES}")
        self.requests.append(row)
        self.flush_if_full()

    def add_request_table(self, table: pa.Table) -> None:
        """Append request rows already in REQUESTS_SCHEMA (the driver converts off its hot path)."""
        self._check_statuses(table.column("status"))
        self.requests.append_table(table)

    def add_chunk_table(self, table: pa.Table) -> None:
        """Append chunk rows already in CHUNKS_SCHEMA."""
        self.chunks.append_table(table)

    def add_chunks(self, columns: dict[str, list[Any]]) -> None:
        """Append chunk rows given as columns (request_id, seq, arrival_ns, tokens, bytes)."""
        if columns and len(next(iter(columns.values()))):
            self.chunks.append_columns(columns)
            self.flush_if_full()

    def add_metrics(self, columns: dict[str, list[Any]]) -> None:
        """Append server-metric samples given as columns (time_ns, name, labels, value)."""
        if columns and len(next(iter(columns.values()))):
            self._metric_parts().append_columns(columns)

    def add_metric_table(self, table: pa.Table) -> None:
        """Append server-metric samples already in SERVER_METRICS_SCHEMA."""
        if table.num_rows:
            self._metric_parts().append_table(table)

    def _metric_parts(self) -> PartTable:
        """The server-metrics table, created with the first samples (a run without them has none)."""
        if self._metrics is None:
            self._metrics = self._io(
                lambda: PartTable(
                    self.run_dir / SERVER_METRICS_FILE,
                    SERVER_METRICS_SCHEMA,
                    fsync=self._fsync,
                    shard=self.shard,
                    defer=self._defer,
                )
            )
        return self._metrics

    def flush_if_full(self) -> None:
        """Flush when enough rows are buffered (``flush_rows`` requests, 20 times as many chunks)."""
        if self.requests.rows_buffered >= self._flush_rows or self.chunks.rows_buffered >= self._flush_rows * 20:
            self.flush()

    # ---- writing ------------------------------------------------------------------------------------
    def _io(self, action: Any) -> Any:
        """Run a write; the first failure marks the writer broken (no more record writes) and is raised."""
        if self.broken is not None:
            raise self.broken
        try:
            return action()
        except RecordWriteError as exc:
            self.broken = exc
            raise

    def _write_parts(self, progress: Mapping[str, Any], *, empty: bool = False, sink: PartSink | None = None) -> None:
        """One part per table with rows (chunks and metrics before requests: a request row never
        reaches disk without its chunks), written by ``sink`` when given (see ``PartTable.write_part``)."""
        part = {"flushed_utc": utc_now_iso(), **progress}
        manifest_json = self.manifest.to_json() if empty else None  # the first part carries the manifest
        wrote = False
        for table in (self.chunks, self._metrics, self.requests):
            if table is None:
                continue
            data = table.take()
            if data is None and empty:
                data = table.schema.empty_table()
            if data is None:
                continue
            table.write_part(data, manifest_json, part, sink)
            if table is self.requests:
                for entry in pc.value_counts(data.column("status")).to_pylist() if data.num_rows else []:
                    self.status_counts[entry["values"]] += entry["counts"]
            wrote = True
        if wrote and not empty:
            self.flushes += 1
            self.last_part = part

    def flush(self, progress: Mapping[str, Any] | None = None, sink: PartSink | None = None) -> None:
        """Write everything buffered as part files; ``progress`` goes into their metadata
        (``flushed_ns``, ``covered_until_ns``, ``dispatched``: what a killed run's reader needs);
        ``sink``: who writes the files (``loadgen.rundir.part_process``), by default this thread."""
        self._io(lambda: self._write_parts(progress or {}, sink=sink))

    def _compact(self) -> list[str]:
        """Merge each table's parts (a clean close), the tables side by side (Parquet writing releases the
        GIL); a failure keeps the parts, readable, and is a warning (deferred parts, never written: it is
        raised)."""
        manifest_json = self.manifest.to_json()
        tables = [
            (name, table)
            for name, table in (
                (REQUESTS_FILE, self.requests),
                (CHUNKS_FILE, self.chunks),
                (SERVER_METRICS_FILE, self._metrics),
            )
            if table is not None
        ]
        with ThreadPoolExecutor(max_workers=len(tables)) as pool:
            merges = [
                pool.submit(table.compact, manifest_json, self.last_part, _COMPACT_ROWS[name]) for name, table in tables
            ]
        warnings = []
        for (name, table), merge in zip(tables, merges, strict=True):
            exc = merge.exception()
            if exc is None:
                continue
            if not isinstance(exc, (RecordWriteError, OSError)):
                raise exc
            if self._defer:  # its rows were in memory only: the run failed
                raise exc if isinstance(exc, RecordWriteError) else write_error(table.dir, exc) from None
            warnings.append(f"{name}: parts not merged ({exc}); every part is kept and readable")
        return warnings

    def close(
        self,
        updates: Mapping[str, Any] | None = None,
        totals: Callable[[Manifest], Mapping[str, Any]] | None = None,
    ) -> Manifest:
        """Flush, merge the parts and write the final manifest (``updates`` merged in); idempotent.

        ``totals``: called with the closing manifest once every part is on disk, its answer merged in
        before the one final write (a coordinator's counts over its workers' parts too).
        After a write error nothing more is written but the manifest, which says ``failed`` and
        names the error; an error raised here (the final flush or manifest) is raised after that.
        """
        if self.closed:
            return self.manifest
        self.closed = True
        error: RecordWriteError | None = None
        if self.broken is None:
            try:
                self.flush()
            except RecordWriteError as exc:
                error = exc
        final: dict[str, Any] = {"state": "complete", **(updates or {})}
        if self.broken is not None:
            final.update(state="failed", interrupted_by=self.broken.short)
        final.update(
            status_counts=dict(self.status_counts),
            requests_recorded=self.requests.rows_written,
            chunks_recorded=self.chunks.rows_written,
            last_flush={
                "utc": self.last_part.get("flushed_utc"),
                "ns": self.last_part.get("flushed_ns"),
                "covered_until_ns": self.last_part.get("covered_until_ns"),
                "parts": self.flushes,
            },
        )
        self.manifest = merge_manifest(self.manifest, final)
        if self.broken is None:
            try:
                warnings = self._compact()
            except RecordWriteError as exc:  # deferred parts (``defer_parts``) that could not be written
                error, warnings = exc, []
                self.manifest = merge_manifest(self.manifest, {"state": "failed", "interrupted_by": exc.short})
            if warnings:
                self.manifest = merge_manifest(self.manifest, {"warnings": [*self.manifest.warnings, *warnings]})
        if totals is not None:
            self.manifest = merge_manifest(self.manifest, totals(self.manifest))
        try:
            write_manifest(self.manifest_dir, self.manifest)
        except OSError as exc:
            error = error or write_error(self.manifest_dir / MANIFEST_FILE, exc)
        if error is not None:
            raise error
        return self.manifest

    def __enter__(self) -> Self:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
        else:
            state = "interrupted" if issubclass(exc_type, (KeyboardInterrupt, SystemExit)) else "failed"
            self.close({"state": state, "interrupted_by": exc_type.__name__})


# ---- reading --------------------------------------------------------------------------------------------


def run_table_files(run_dir: Path | str, name: str) -> list[Path]:
    """The files of one table of a run (``REQUESTS_FILE`` ...), in write order."""
    return table_files(Path(run_dir) / name)


def read_run_table(run_dir: Path | str, name: str, columns: list[str] | None = None) -> pa.Table | None:
    """One table of a run (``REQUESTS_FILE``, ``CHUNKS_FILE``, ``SERVER_METRICS_FILE``); None if absent."""
    return read_table(Path(run_dir) / name, _SCHEMAS[name], columns)


def held_run_names(directory: Path | str) -> list[str]:
    """The names of ``RUN_DIR_NAMES`` (and a bundle's checksum list) that ``directory`` already holds."""
    directory = Path(directory)
    return [name for name in (*RUN_DIR_NAMES, _BUNDLE_SUMS) if (directory / name).exists()]


def run_owns(path: Path | str) -> str | None:
    """Why writing ``path`` would overwrite what a run directory or handoff bundle owns, or None.

    Owned: a top-level name of ``RUN_DIR_NAMES`` in a directory holding a manifest, anything under one
    (table parts, worker shards), and every file of a handoff bundle (listed in its checksums, and the list).
    """
    target = Path(path).resolve()
    for parent in target.parents:
        if not (parent / MANIFEST_FILE).is_file():
            continue
        top = target.relative_to(parent).parts[0]
        if top in RUN_DIR_NAMES:
            return f"{top} belongs to the run directory {parent}"
        sums = parent / _BUNDLE_SUMS
        if sums.is_file():
            rel = target.relative_to(parent).as_posix()
            listed = {line.split(maxsplit=1)[-1].lstrip("*") for line in sums.read_text(errors="replace").splitlines()}
            if rel == _BUNDLE_SUMS or rel in listed:
                return f"{rel} belongs to the handoff bundle {parent}"
    return None


def has_run(path: Path | str) -> bool:
    """True when ``path`` holds a run directory (a manifest and a requests table)."""
    path = Path(path)
    return (path / MANIFEST_FILE).is_file() and (path / REQUESTS_FILE).exists()


def writer_alive(manifest: Manifest) -> bool | None:
    """Is the process that wrote this run still running? None when it cannot be told (another host)."""
    w = manifest.writer
    if w is None or w.pid is None:
        pid = manifest.harness.pid if manifest.harness else None
        host = manifest.host.hostname_sha256 if manifest.host else None
        start = None
    else:
        pid, host, start = w.pid, w.hostname_sha256, w.process_start_s
    if pid is None or host != hostname_sha256():
        return None
    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return False
        return start is None or abs(proc.create_time() - start) < 1.0
    except psutil.NoSuchProcess:
        return False
    except psutil.Error:
        return True


def _status_counts(run_dir: Path) -> tuple[dict[str, int], int]:
    statuses = read_run_table(run_dir, REQUESTS_FILE, ["status"])
    counts = {s: 0 for s in STATUSES}
    if statuses is None:
        return counts, 0
    for entry in pc.value_counts(statuses.column("status")).to_pylist():
        counts[str(entry["values"])] = int(entry["counts"])
    return counts, statuses.num_rows


def recovered_manifest(run_dir: Path, manifest: Manifest) -> Manifest:
    """The view of a run whose writer died without closing it: state ``killed``, counts from the records.

    ``stopped_ns`` is the instant up to which every scheduled request has its row (the last flush's
    ``covered_until_ns``); ``recovery`` says when the last flush was and how many requests were in
    flight (dispatched, no row) or not yet due at that flush.
    """
    counts, recorded = _status_counts(run_dir)
    part = last_part_metadata(run_dir / REQUESTS_FILE) or {}
    # a run over workers: the last part is one worker's, its dispatch count not the run's (unknown, not wrong),
    # and the run covers up to the instant every worker covered
    spread = manifest.workers is not None and (manifest.workers.count or 0) > 1
    dispatched = None if spread else part.get("dispatched")
    covered = _covered_by_every_worker(run_dir, manifest) if spread else part.get("covered_until_ns")
    scheduled = manifest.scheduled_requests
    alive = writer_alive(manifest)
    why = (
        "its writer is gone (pid not running)"
        if alive is False
        else "its writer ran on another host and the run was never closed"
    )
    recovery = {
        "detected_utc": utc_now_iso(),
        "reason": f"manifest says running but {why}: killed (SIGKILL, crash or power loss) before closing",
        "rows_recorded": recorded,
        "last_flush_utc": part.get("flushed_utc"),
        "last_flush_ns": part.get("flushed_ns"),
        "dispatched_at_last_flush": dispatched,
        "in_flight_at_last_flush": dispatched - recorded if dispatched is not None else None,
        "not_due_at_last_flush": scheduled - dispatched if scheduled is not None and dispatched is not None else None,
        # every scheduled request either has a row or is one of these (in flight, not yet due, or never recorded)
        "without_row": scheduled - recorded if scheduled is not None else None,
    }
    return merge_manifest(
        manifest,
        {
            "state": "killed",
            "interrupted_by": "SIGKILL, a crash or power loss (no clean close)",
            "status_counts": counts,
            "requests_recorded": recorded,
            "chunks_recorded": table_rows(run_dir / CHUNKS_FILE),
            "stopped_ns": covered,
            "last_flush": {
                "utc": part.get("flushed_utc"),
                "ns": part.get("flushed_ns"),
                "covered_until_ns": covered,
                "parts": len(run_table_files(run_dir, REQUESTS_FILE)),
            },
            "recovery": recovery,
        },
    )


def _covered_by_every_worker(run_dir: Path, manifest: Manifest) -> int | None:
    """The earliest instant a worker still writing had covered at its last flush (0: it flushed no progress);
    a worker that closed its shard has every row on disk and bounds nothing (None: none bounds it)."""
    count = manifest.workers.count if manifest.workers is not None and manifest.workers.count else 0
    instants = []
    for worker_id in range(count):
        shard = f"w{worker_id}"  # driver.partition.worker_name: its parts part-w0-*, its manifest workers/w0/
        try:
            if read_manifest(run_dir / WORKERS_DIR / shard).state != "running":
                continue
        except RunDirError:
            pass  # never opened, or unreadable: what it covered is what its parts say
        meta = shard_last_part_metadata(run_dir / REQUESTS_FILE, shard) or {}
        instants.append(int(meta.get("covered_until_ns") or 0))
    return min(instants, default=None)


def persist_recovery(run_dir: Path | str) -> Manifest | None:
    """Write a killed run's recovered manifest over the one that still says running (only when its
    writer is provably gone: same host, process not running); returns it, or None when nothing was due."""
    run_dir = Path(run_dir)
    manifest = read_manifest(run_dir)
    if manifest.state != "running" or writer_alive(manifest) is not False:
        return None
    recovered = recovered_manifest(run_dir, manifest)
    write_manifest(run_dir, recovered)
    return recovered


def read_run_manifest(run_dir: Path | str) -> Manifest:
    """The manifest, or, for a run whose writer died mid-run, its recovered view (``recovered_manifest``);
    for a run still being written, with its last flush (what a reader can see of it so far)."""
    run_dir = Path(run_dir)
    manifest = read_manifest(run_dir)
    if manifest.state != "running":
        return manifest
    if writer_alive(manifest) is not True:
        return recovered_manifest(run_dir, manifest)
    part = last_part_metadata(run_dir / REQUESTS_FILE) or {}  # a live run, as far as it is on disk
    return merge_manifest(
        manifest,
        {
            "last_flush": {
                "utc": part.get("flushed_utc"),
                "ns": part.get("flushed_ns"),
                "covered_until_ns": part.get("covered_until_ns"),
            }
        },
    )


@dataclass
class RunData:
    """A run directory read back: manifest plus Arrow tables (server_metrics may be None)."""

    run_dir: Path
    manifest: Manifest
    requests: pa.Table
    chunks: pa.Table | None
    server_metrics: pa.Table | None


def load_run(run_dir: Path, *, chunks: bool = True) -> RunData:
    """Read a whole run directory into memory (for large runs read the tables in batches).

    A killed run loads as it was at its last flush, with its recovered manifest.
    """
    run_dir = Path(run_dir)
    manifest = read_run_manifest(run_dir)
    requests = read_run_table(run_dir, REQUESTS_FILE)
    if requests is None:
        raise RunDirError(f"{run_dir}: no {REQUESTS_FILE}: expected a loadgen run directory")
    return RunData(
        run_dir=run_dir,
        manifest=manifest,
        requests=requests,
        chunks=read_run_table(run_dir, CHUNKS_FILE) if chunks else None,
        server_metrics=read_run_table(run_dir, SERVER_METRICS_FILE),
    )
