"""A record table on disk: a directory of closed Parquet part files, read back as one table.

Why parts: a Parquet file is readable only once its footer is written, so a single file kept open for
a whole run is lost to SIGKILL, power loss or a full disk. Each flush here writes one complete part
file under a hidden temporary name, syncs it, and renames it into place: whatever a reader finds is
whole, at every moment. At a clean close the parts are merged into one range file
(``part-000000-000059.parquet``) and the single parts it covers are deleted; a reader that finds both
(a crash between the two steps) reads the range file only. A run spread over workers (``--workers``)
holds one series of parts per worker, named with its shard prefix (``part-w0-000000.parquet``,
``part-w1-000000-000012.parquet``); the unprefixed series is the coordinator's. Each series is read the
same way, the coordinator's first, then the workers' in shard order. ``pyarrow.parquet.read_table(DIR)``, pandas
and Spark read such a directory as one dataset (they skip the hidden ``.part-*.tmp`` names).

A table written before schema version 2 is one plain file at the same path; ``table_files`` returns it.
Part names sort in write order, so rows come back in the order they were written.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, NoReturn, Protocol

import pyarrow as pa
import pyarrow.parquet as pq

from loadgen.rundir.schema import COLUMNS_SINCE, SCHEMA_VERSION
from loadgen.util.errors import RecordWriteError, RunDirError

__all__ = [
    "MANIFEST_METADATA_KEY",
    "PART_METADATA_KEY",
    "PartSink",
    "PartTable",
    "iter_file_batches",
    "last_part_metadata",
    "read_table",
    "table_files",
    "table_rows",
    "write_error",
    "write_part_file",
]

MANIFEST_METADATA_KEY = "loadgen.manifest"
#: Per part: {"seq", "flushed_ns", "flushed_utc", "covered_until_ns", "dispatched"} (JSON).
PART_METADATA_KEY = "loadgen.part"
_PART = re.compile(r"^part-(?:([a-z]+[0-9]*)-)?(\d{6,})(?:-(\d{6,}))?\.parquet$")
#: A shard prefix: letters, then digits (``w0``, ``w12``).
SHARD_PREFIX = re.compile(r"^[a-z]+[0-9]*$")


def write_error(path: Path, exc: BaseException) -> RecordWriteError:
    """One line naming the path and the error (ENOSPC, EIO, EROFS ...)."""
    errno = getattr(exc, "errno", None)
    what = (
        f"{os.strerror(errno)} (errno {errno})"
        if errno
        else (str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
    )
    return RecordWriteError(path, what)


def _fsync(path: Path, directory: bool = False) -> None:
    fd = os.open(path, os.O_RDONLY | (os.O_DIRECTORY if directory else 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_atomic(final: Path, write: Any, fsync: bool) -> None:
    """``write(tmp)`` then rename to ``final``; the hidden temp file never outlives a failure."""
    tmp = final.parent / f".{final.name}.tmp"
    try:
        write(tmp)
        if fsync:
            _fsync(tmp)
        os.replace(tmp, final)
        if fsync:
            _fsync(final.parent, directory=True)
    except BaseException as exc:
        try:
            tmp.unlink(missing_ok=True)
        except OSError:
            pass
        if isinstance(exc, OSError):
            raise write_error(final, exc) from None
        raise


def write_part_file(final: Path, table: pa.Table, meta: dict[str, str], fsync: bool) -> None:
    """One part file, whole or not at all (``_write_atomic``), with ``meta`` as its schema metadata."""
    # small parts: statistics and dictionaries cost more than they save (the merged file has both)
    _write_atomic(
        final,
        lambda tmp: pq.write_table(
            table.replace_schema_metadata(meta),
            tmp,
            compression="zstd",
            write_statistics=False,
            use_dictionary=False,
        ),
        fsync,
    )


class PartSink(Protocol):
    """Writes a part file as ``write_part_file`` does (elsewhere: ``loadgen.rundir.part_process.PartProcess``)."""

    def write(self, final: Path, table: pa.Table, meta: dict[str, str], fsync: bool) -> None: ...


class PartTable:
    """One table being written: rows buffered in memory, written as a part per ``write_part``."""

    def __init__(
        self, directory: Path, schema: pa.Schema, *, fsync: bool = True, shard: str | None = None, defer: bool = False
    ) -> None:
        """``shard``: this writer's prefix in a directory other writers share (it may exist already).
        ``defer``: parts stay in memory, and ``compact`` writes what a clean close leaves (the merged
        file, or the one part) from there; for a writer that holds its whole tables anyway and has no
        crash to survive (the worksheet), parts written only to be read back and merged are wasted."""
        if shard is not None and not SHARD_PREFIX.match(shard):
            raise ValueError(f"shard prefix {shard!r}: expected letters, then digits")
        self.dir = directory
        self.name_prefix = f"part-{shard}-" if shard else "part-"
        self.schema = schema
        self.fsync = fsync
        self.columns: dict[str, list[Any]] = {name: [] for name in schema.names}
        self.tables: list[pa.Table] = []
        self.rows_buffered = 0
        self.rows_written = 0
        self.parts: list[tuple[int, Path]] = []
        self.deferred: list[tuple[pa.Table, dict[str, str]]] | None = [] if defer else None  # (table, metadata)
        self.seq = 0
        try:
            self.dir.mkdir(exist_ok=shard is not None)
        except OSError as exc:
            raise write_error(self.dir, exc) from None

    def append(self, row: dict[str, Any]) -> None:
        for name, column in self.columns.items():
            column.append(row.get(name))
        self.rows_buffered += 1

    def append_columns(self, columns: dict[str, list[Any]]) -> None:
        n = len(next(iter(columns.values())))
        for name, column in self.columns.items():
            values = columns.get(name)
            column.extend(values if values is not None else [None] * n)
        self.rows_buffered += n

    def append_table(self, table: pa.Table) -> None:
        """A ready Arrow table in this schema (kept after the rows buffered before it)."""
        self._fold_columns()
        self.tables.append(table)
        self.rows_buffered += table.num_rows

    def _fold_columns(self) -> None:
        if self.columns[self.schema.names[0]]:
            self.tables.append(pa.Table.from_pydict(self.columns, schema=self.schema))
            for column in self.columns.values():
                column.clear()

    def take(self) -> pa.Table | None:
        """Everything buffered as one table (None when nothing is), and the buffer emptied."""
        self._fold_columns()
        if not self.tables:
            return None
        table = pa.concat_tables(self.tables) if len(self.tables) > 1 else self.tables[0]
        self.tables = []
        self.rows_buffered = 0
        return table

    def write_part(
        self, table: pa.Table, manifest_json: str | None, part: dict[str, Any], sink: PartSink | None = None
    ) -> Path:
        """Write ``table`` as the next part file (complete, synced, renamed into place); ``manifest_json``
        goes into its metadata when given (the first part and merged files carry the manifest). ``sink``:
        who writes the file (``loadgen.rundir.part_process``: a child process); by default this thread."""
        final = self.dir / f"{self.name_prefix}{self.seq:06d}.parquet"
        meta = {PART_METADATA_KEY: json.dumps({"seq": self.seq, **part})}
        if manifest_json is not None:
            meta[MANIFEST_METADATA_KEY] = manifest_json
        if self.deferred is not None:
            self.deferred.append((table, meta))
        else:
            (sink.write if sink is not None else write_part_file)(final, table, meta, self.fsync)
        self.parts.append((self.seq, final))
        self.seq += 1
        self.rows_written += table.num_rows
        return final

    def compact(self, manifest_json: str, part: dict[str, Any], row_group_rows: int) -> None:
        """Merge the parts into one range file, then delete them (a reader prefers the range file)."""
        if len(self.parts) < 2:
            if self.deferred:  # the one part, as it would have been written
                ((table, meta),) = self.deferred
                write_part_file(self.parts[0][1], table, meta, self.fsync)
            self.deferred = None
            return
        first, last = self.parts[0][0], self.parts[-1][0]
        final = self.dir / f"{self.name_prefix}{first:06d}-{last:06d}.parquet"
        meta = {MANIFEST_METADATA_KEY: manifest_json, PART_METADATA_KEY: json.dumps({"seq": last, **part})}

        def write(tmp: Path) -> None:
            # numbers in every row (times, counts) are written plain: as dictionaries they cost time and bytes;
            # the other columns keep theirs (and a reader gets the very buffers it got before)
            dictionary = [f.name for f in self.schema if f.nullable or not _is_number(f.type)]
            with pq.ParquetWriter(
                tmp, self.schema.with_metadata(meta), compression="zstd", use_dictionary=dictionary
            ) as out:
                pending: list[pa.Table] = []
                rows = 0
                for table in self._part_tables():
                    pending.append(table)
                    rows += table.num_rows
                    if rows >= row_group_rows:
                        out.write_table(pa.concat_tables(pending), row_group_size=row_group_rows)
                        pending, rows = [], 0
                if pending:
                    out.write_table(pa.concat_tables(pending), row_group_size=row_group_rows)

        _write_atomic(final, write, self.fsync)
        for _, path in self.parts:
            path.unlink(missing_ok=True)
        if self.fsync:
            _fsync(self.dir, directory=True)
        self.deferred = None  # every part is on disk now, merged
        self.parts = [(last, final)]

    def _part_tables(self) -> Iterator[pa.Table]:
        """The parts' tables in order, in this schema: the deferred ones, or else read back from disk."""
        for k, (_, path) in enumerate(self.parts):
            table = self.deferred[k][0] if self.deferred is not None else pq.read_table(path)
            yield table.select(self.schema.names).cast(self.schema)


def _is_number(t: pa.DataType) -> bool:
    return pa.types.is_integer(t) or pa.types.is_floating(t)


def table_files(path: Path) -> list[Path]:
    """The files of a table in write order: the file itself (schema v1), or its part files."""
    path = Path(path)
    if path.is_file():
        return [path]
    if not path.is_dir():
        return []
    series: dict[str, tuple[dict[int, Path], list[tuple[int, int, Path]]]] = {}
    for entry in os.scandir(path):
        m = _PART.match(entry.name)
        if m is None:
            continue
        singles, ranges = series.setdefault(m.group(1) or "", ({}, []))
        if m.group(3) is None:
            singles[int(m.group(2))] = path / entry.name
        else:
            ranges.append((int(m.group(2)), int(m.group(3)), path / entry.name))
    out: list[Path] = []
    for shard in sorted(series, key=_shard_order):
        singles, ranges = series[shard]
        items = [(a, p) for a, _, p in ranges]
        items += [(s, p) for s, p in singles.items() if not any(a <= s <= b for a, b, _ in ranges)]
        out += [p for _, p in sorted(items)]
    return out


def _shard_order(shard: str) -> tuple[int, str, int]:
    """The coordinator's series (no prefix) first, then ``w0``, ``w1`` ... ``w10`` in numeric order."""
    digits = shard.lstrip("abcdefghijklmnopqrstuvwxyz")
    return (1 if shard else 0, shard[: len(shard) - len(digits)], int(digits) if digits else -1)


def _unreadable(path: Path, exc: BaseException) -> RunDirError:
    """One line for a part file Arrow cannot read (its footer, a page): the path and the error's first line."""
    detail = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
    return RunDirError(f"{path}: unreadable Parquet ({detail}): expected a file written by loadgen")


def _open(path: Path) -> pq.ParquetFile:
    try:
        return pq.ParquetFile(path)
    except (pa.ArrowException, OSError) as exc:
        raise _unreadable(path, exc) from None


def _conform(table: pa.Table, schema: pa.Schema, wanted: list[str], path: Path) -> pa.Table:
    """Columns ``wanted`` in ``schema``'s types; columns added since an older schema version read as null."""
    missing = [c for c in wanted if c not in table.column_names]
    bad = [c for c in missing if c not in COLUMNS_SINCE]
    if bad:
        raise RunDirError(f"{path}: missing column(s) {bad}: expected the loadgen record schema v{SCHEMA_VERSION}")
    present = [c for c in wanted if c not in missing]
    _refuse_nulls([table.column(c) for c in present], schema, present, path)
    for name in missing:
        table = table.append_column(name, pa.nulls(table.num_rows, schema.field(name).type))
    target = pa.schema([schema.field(c) for c in wanted])
    try:
        return table.select(wanted).cast(target)
    except (pa.ArrowException, ValueError) as exc:
        _raise_wrong_type(path, exc, _failing_column(table, target))


def read_table(path: Path, schema: pa.Schema, columns: list[str] | None = None) -> pa.Table | None:
    """The whole table (``columns`` of it) in ``schema``'s types; None when the table does not exist."""
    path = Path(path)
    if not path.exists():
        return None
    wanted = list(columns) if columns is not None else list(schema.names)
    tables = []
    for file in table_files(path):
        pf = _open(file)
        have = set(pf.schema_arrow.names)
        try:
            table = pf.read(columns=[c for c in wanted if c in have])
        except (pa.ArrowException, OSError) as exc:
            raise _unreadable(file, exc) from None
        tables.append(_conform(table, schema, wanted, file))
    if not tables:
        return pa.schema([schema.field(c) for c in wanted]).empty_table()
    return pa.concat_tables(tables) if len(tables) > 1 else tables[0]


def iter_file_batches(files: list[Path], schema: pa.Schema, batch_size: int) -> Iterator[tuple[Path, pa.RecordBatch]]:
    """Record batches of ``schema``'s columns over a table's ``files`` (``table_files``), in order, each column in
    ``schema``'s type (the rule of ``read_table``): (file, batch). A missing column, a column that will not
    convert or a corrupt page is one RunDirError naming the file."""
    columns = schema.names
    for file in files:
        pf = _open(file)
        missing = [c for c in columns if c not in pf.schema_arrow.names]
        if missing:
            raise RunDirError(
                f"{file}: missing column(s) {missing}: expected the loadgen record schema v{SCHEMA_VERSION}"
            )
        batches = pf.iter_batches(batch_size=batch_size, columns=columns)
        while True:
            try:
                batch = next(batches, None)
            except (pa.ArrowException, OSError) as exc:  # a corrupt page: name the file
                raise _unreadable(file, exc) from None
            if batch is None:
                break
            yield file, _conform_batch(batch, schema, file)


def _conform_batch(batch: pa.RecordBatch, schema: pa.Schema, path: Path) -> pa.RecordBatch:
    """``batch`` in ``schema``'s types (a column already of its type is kept as it is)."""
    _refuse_nulls(batch.columns, schema, schema.names, path)
    cols = []
    for col, field in zip(batch.columns, schema):
        try:
            cols.append(col if col.type == field.type else col.cast(field.type))
        except (pa.ArrowException, ValueError) as exc:
            _raise_wrong_type(path, exc, field.name)
    return pa.RecordBatch.from_arrays(cols, schema=schema)


def _refuse_nulls(
    columns: Sequence[pa.Array | pa.ChunkedArray], schema: pa.Schema, names: list[str], path: Path
) -> None:
    """A null in a column the schema declares not null (``request_id``, ``seq``, ``arrival_ns`` ...) is one
    RunDirError naming the file, the column and how many rows: loadgen never writes one."""
    for name, col in zip(names, columns):
        if col.null_count and not schema.field(name).nullable:
            raise RunDirError(
                f"{path}: {name} = null ({col.null_count} row(s)): expected a value in every row "
                f"(loadgen record schema v{SCHEMA_VERSION})"
            )


def _failing_column(table: pa.Table, target: pa.Schema) -> str | None:
    """The first column of ``table`` that will not cast to its ``target`` type (the error path only)."""
    for f in target:
        try:
            table.column(f.name).cast(f.type)
        except (pa.ArrowException, ValueError):
            return f.name
    return None


def _raise_wrong_type(path: Path, exc: BaseException, column: str | None = None) -> NoReturn:
    detail = str(exc).splitlines()[0][:120] if str(exc) else type(exc).__name__
    where = f"{column}: " if column else ""
    raise RunDirError(
        f"{path}: {where}a column of the wrong type ({detail}): expected the loadgen record schema v{SCHEMA_VERSION}"
    ) from None


def table_rows(path: Path) -> int:
    """Rows of a table from the file footers alone."""
    return sum(_open(file).metadata.num_rows for file in table_files(path))


def shard_last_part_metadata(path: Path, shard: str) -> dict[str, Any] | None:
    """``last_part_metadata`` of one shard's series (``w0`` ...) of a table spread over workers."""
    files = [f for f in table_files(path) if (m := _PART.match(f.name)) is not None and m.group(1) == shard]
    return _part_metadata(files[-1]) if files else None


def last_part_metadata(path: Path) -> dict[str, Any] | None:
    """The ``loadgen.part`` metadata of a table's last file (None for schema v1 files, or none written)."""
    files = table_files(path)
    return _part_metadata(files[-1]) if files else None


def _part_metadata(file: Path) -> dict[str, Any] | None:
    meta = _open(file).schema_arrow.metadata or {}
    raw = meta.get(PART_METADATA_KEY.encode())
    try:
        return json.loads(raw) if raw else None
    except ValueError:
        return None
