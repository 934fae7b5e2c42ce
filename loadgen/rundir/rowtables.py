"""The driver's rows as Arrow tables: one definition, used on the event loop and in the part writer process.

A request task hands the recorder a row dict (REQUESTS_SCHEMA's columns) and its chunks as machine-integer
arrays (``StreamChunks``). They become tables either on the event loop (``requests_table``,
``ChunkBatch.table``), or, while the part writer process runs, in that process: the loop only packs a
slice of rows (``pack_slice``: the values in schema order, pickled, and the chunk arrays as bytes; ~4x
cheaper than converting them, and a conversion's cost is what a send that falls due waits for), and the
child unpacks and converts (``unpack_slices``).
"""

from __future__ import annotations

import json
import operator
import pickle
from array import array
from typing import Any, NamedTuple

import numpy as np
import pyarrow as pa

from loadgen.rundir.schema import CHUNK_KINDS, CHUNKS_SCHEMA, REQUESTS_SCHEMA, STATUS_ERROR

__all__ = ["ChunkBatch", "StreamChunks", "fit_row", "kind_column", "pack_slice", "requests_table", "unpack_slices"]

_REQUEST_STRUCT = pa.struct(list(REQUESTS_SCHEMA))
_REQUEST_NAMES = tuple(REQUESTS_SCHEMA.names)
#: A row dict's values in schema order, whatever the dict's own key order (one C call per row).
_REQUEST_VALUES = operator.itemgetter(*_REQUEST_NAMES)


class StreamChunks(NamedTuple):
    """One request's chunks in arrival order, as equal-length machine-integer arrays (``array("q")``);
    the recorder adds the request id and ``seq`` (CHUNKS_SCHEMA). ``kind``: each chunk's code in
    ``CHUNK_KINDS`` (0 answer, 1 reasoning); None: every chunk is answer."""

    arrival_ns: array
    tokens: array
    bytes: array
    kind: array | None = None


def requests_table(rows: list[dict[str, Any]]) -> pa.Table:
    """REQUESTS_SCHEMA rows from row dicts, in one conversion (a struct array; not one per column: 35 columns'
    fixed costs made 50 rows take twice as long).

    A value that does not fit its column never costs the flush: the rows are then fitted one by one
    (``fit_row``) and only the row that held it changes.
    """
    try:
        rows_array = pa.array(rows, type=_REQUEST_STRUCT)
    except (pa.ArrowTypeError, pa.ArrowInvalid, OverflowError, TypeError, ValueError):
        rows_array = pa.array([fit_row(row) for row in rows], type=_REQUEST_STRUCT)
    return pa.Table.from_batches([pa.RecordBatch.from_struct_array(rows_array)], schema=REQUESTS_SCHEMA)


def fit_row(row: dict[str, Any]) -> dict[str, Any]:
    """``row`` with every value its column cannot hold replaced: text columns get the value as JSON text,
    others null; the row then says so (status ``error``, kind ``malformed_sse``, the column in its message).

    The driver checks what a server sends before it reaches a row; this is the writer's guarantee that a
    value nothing checked loses no other request's row.
    """
    bad: list[str] = []
    fitted = dict(row)
    for field in REQUESTS_SCHEMA:
        value = row.get(field.name)
        try:
            pa.array([value], type=field.type)
        except (pa.ArrowTypeError, pa.ArrowInvalid, OverflowError, TypeError, ValueError):
            bad.append(f"{field.name} = {_shown(value)}")
            fitted[field.name] = _shown(value, 500) if pa.types.is_string(field.type) else None
    if bad:
        fitted["status"] = STATUS_ERROR
        fitted["error_kind"] = "malformed_sse"
        fitted["error_message"] = f"{'; '.join(bad)[:300]}: expected a value of the column's type"
    return fitted


def _shown(value: object, limit: int = 60) -> str:
    try:
        text = json.dumps(value, default=str)
    except (TypeError, ValueError, RecursionError):
        text = repr(value)
    return text[:limit]


class ChunkBatch:
    """Chunks of many requests gathered for one table: arrays appended whole, ids once per request."""

    __slots__ = ("arrival_ns", "bytes", "ids", "kind", "lengths", "tokens")

    def __init__(self) -> None:
        self.ids: list[str] = []
        self.lengths: list[int] = []
        self.arrival_ns = array("q")
        self.tokens = array("q")
        self.bytes = array("q")
        self.kind = array("q")

    def add(self, request_id: str, chunks: StreamChunks) -> None:
        n = len(chunks.arrival_ns)
        self.ids.append(request_id)
        self.lengths.append(n)
        self.arrival_ns.extend(chunks.arrival_ns)
        self.tokens.extend(chunks.tokens)
        self.bytes.extend(chunks.bytes)
        if chunks.kind is not None:
            self.kind.extend(chunks.kind)
        else:
            self.kind.frombytes(bytes(8 * n))

    def table(self) -> pa.Table:
        """CHUNKS_SCHEMA rows: each request's id repeated and ``seq`` counted in C, not per row in Python."""
        counts = np.asarray(self.lengths, dtype=np.int64)
        owner = np.repeat(np.arange(len(counts)), counts)
        seq = np.arange(len(owner), dtype=np.int64) - np.repeat(np.cumsum(counts) - counts, counts)
        columns = [
            pa.array(self.ids, pa.string()).take(owner),
            pa.array(seq.astype(np.int32)),
            pa.array(np.frombuffer(self.arrival_ns, dtype=np.int64)),
            pa.array(np.frombuffer(self.tokens, dtype=np.int64).astype(np.int32)),
            pa.array(np.frombuffer(self.bytes, dtype=np.int64).astype(np.int32)),
            kind_column(np.frombuffer(self.kind, dtype=np.int64)),
        ]
        return pa.Table.from_arrays(columns, schema=CHUNKS_SCHEMA)


_KIND_NAMES = pa.array(CHUNK_KINDS, pa.string())


def kind_column(codes: np.ndarray) -> pa.Array:
    """The chunks' ``kind`` column from codes into ``CHUNK_KINDS`` (0 answer, 1 reasoning), in one take."""
    return _KIND_NAMES.take(pa.array(codes.astype(np.int8)))


def pack_slice(items: list[tuple[dict[str, Any], StreamChunks | None]]) -> bytes:
    """Rows and their chunks, packed for ``unpack_slices`` (on the loop: no Arrow, one pickle)."""
    batch = ChunkBatch()
    for row, chunks in items:
        if chunks is not None:
            batch.add(row["request_id"], chunks)
    values = [_REQUEST_VALUES(row) for row, _ in items]
    return pickle.dumps((values, batch.ids, batch.lengths, batch.arrival_ns, batch.tokens, batch.bytes, batch.kind), 5)


def unpack_slices(packed: list[bytes]) -> tuple[pa.Table | None, pa.Table | None]:
    """The requests and chunks tables of packed slices, in order (None where there are no rows)."""
    rows: list[dict[str, Any]] = []
    batch = ChunkBatch()
    for blob in packed:
        values, ids, lengths, arrival_ns, tokens, sizes, kind = pickle.loads(blob)  # our own bytes, from our parent
        rows.extend(dict(zip(_REQUEST_NAMES, v, strict=True)) for v in values)
        batch.ids.extend(ids)
        batch.lengths.extend(lengths)
        batch.arrival_ns.extend(arrival_ns)
        batch.tokens.extend(tokens)
        batch.bytes.extend(sizes)
        batch.kind.extend(kind)
    return (requests_table(rows) if rows else None), (batch.table() if batch.ids else None)
