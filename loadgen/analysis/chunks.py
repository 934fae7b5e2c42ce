"""Streaming pass over chunks.parquet: per content chunk, its request and the gap before it.

Writers append chunks grouped by request (in completion order, not request-id order), so one pass
in record batches finds request boundaries by comparing neighbouring ids, maps each run of rows to
its request with one hash lookup per request (not per row), and carries the last content chunk
across batch edges. If a request's chunks are not contiguous or not in ``seq`` order, the pass
falls back to a full sort by (request, seq) and says so in the notes. Zero-token chunks (usage-only
or empty events) are not content and are skipped. Content chunks go to a *sink* batch by batch
(request index, gap to the previous content chunk or −1 for a request's first, tokens), so the
pass itself keeps nothing per row.
"""

from __future__ import annotations

import queue
import threading
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..errors import RunDirError
from ..parts import iter_file_batches
from ..records import CHUNKS_SCHEMA

__all__ = ["ChunkGaps", "ChunkSink", "read_chunk_gaps"]

_COLUMNS = ["request_id", "seq", "arrival_ns", "tokens"]
BATCH_ROWS = 1 << 19
#: Record batches decoded ahead of the pass (each ~10-20 MB).
READ_AHEAD = 2


class ChunkSink(Protocol):
    """Receives content chunks in request order, batch by batch."""

    def reset(self) -> None: ...

    def add(self, req_idx: np.ndarray, delta_ns: np.ndarray, tokens: np.ndarray) -> None: ...


@dataclass
class ChunkGaps:
    """What the pass saw: chunk rows read, rows naming no request, content rows, notes."""

    rows: int = 0
    orphan_rows: int = 0
    content_rows: int = 0
    notes: list[str] = field(default_factory=list)


class _NeedsSort(Exception):
    pass


class _Lookup:
    """request_id → row of requests.parquet (a dict: a lookup costs a third of a pandas Index's at 10^6 ids);
    duplicate ids are bad input."""

    def __init__(self, request_ids: pa.Array) -> None:
        ids = request_ids.to_pylist()
        self.rows = dict(zip(ids, range(len(ids)), strict=True))
        if len(self.rows) != len(ids):
            dup = next(i for i, k in Counter(ids).items() if k > 1)
            raise RunDirError(f"requests.parquet: request_id {dup!r} appears more than once: expected unique ids")

    def __len__(self) -> int:
        return len(self.rows)

    def get_indexer(self, ids: pa.Array) -> np.ndarray:
        """The row of every id (−1 for an id no request has), int64."""
        get = self.rows.get
        return np.fromiter((get(i, -1) for i in ids.to_pylist()), dtype=np.int64, count=len(ids))


class _Pass:
    """State carried across record batches."""

    def __init__(self, lookup: _Lookup, sink: ChunkSink) -> None:
        self.lookup = lookup
        self.sink = sink
        self.content = 0
        self.seen = np.zeros(len(lookup), dtype=bool)
        self.last_id: str | None = None
        self.last_req = -1
        self.last_seq = -1
        self.last_content_req = -2
        self.last_content_arrival = 0
        self.rows = 0
        self.orphans = 0

    def batch(self, batch: pa.RecordBatch, check_order: bool = True) -> None:
        n = batch.num_rows
        if n == 0:
            return
        ids = batch.column(0)
        seq = batch.column(1).to_numpy(zero_copy_only=False)
        start = np.empty(n, dtype=bool)
        first_id = ids[0].as_py()
        start[0] = self.last_id is None or first_id != self.last_id
        if isinstance(ids, pa.DictionaryArray):
            # one dictionary per batch (unique values): compare int indices, look up each value once
            codes = ids.indices.to_numpy(zero_copy_only=False)
            if n > 1:
                np.not_equal(codes[1:], codes[:-1], out=start[1:])
            seg_pos = np.flatnonzero(start)
            dict_req = self.lookup.get_indexer(ids.dictionary)
            seg_req = dict_req[codes[seg_pos]].astype(np.int64)
        else:
            if n > 1:
                start[1:] = pc.not_equal(ids.slice(1), ids.slice(0, n - 1)).to_numpy(zero_copy_only=False)
            seg_pos = np.flatnonzero(start)
            seg_req = self.lookup.get_indexer(ids.take(pa.array(seg_pos)))
        if check_order:
            known = seg_req[seg_req >= 0]
            if self.seen[known].any() or len(np.unique(known)) != len(known):
                raise _NeedsSort("chunks of a request are not contiguous")
            self.seen[known] = True
            bad = np.diff(seq) <= 0
            if (bad & ~start[1:]).any() or (not start[0] and seq[0] <= self.last_seq):
                raise _NeedsSort("chunks of a request are not in seq order")
        lengths = np.diff(np.append(seg_pos, n))
        prefix = int(seg_pos[0]) if len(seg_pos) else n
        row_req = np.concatenate([np.full(prefix, self.last_req, dtype=np.int64), np.repeat(seg_req, lengths)])
        self.last_id = ids[n - 1].as_py()
        self.last_req = int(row_req[-1])
        self.last_seq = int(seq[-1])
        self._content(
            row_req, batch.column(2).to_numpy(zero_copy_only=False), batch.column(3).to_numpy(zero_copy_only=False)
        )

    def _content(self, row_req: np.ndarray, arrival: np.ndarray, tokens: np.ndarray) -> None:
        self.rows += len(row_req)
        keep = (tokens > 0) & (row_req >= 0)
        self.orphans += int((row_req < 0).sum())
        ci = np.flatnonzero(keep)
        if len(ci) == 0:
            return
        creq = row_req[ci]
        carr = arrival[ci]
        first = np.empty(len(ci), dtype=bool)
        first[0] = creq[0] != self.last_content_req
        first[1:] = creq[1:] != creq[:-1]
        delta = np.empty(len(ci), dtype=np.int64)
        delta[0] = carr[0] - self.last_content_arrival
        delta[1:] = np.diff(carr)
        delta[first] = -1
        # a negative gap inside a request (clock went backwards) is clamped to 0, not a "first"
        np.maximum(delta, 0, out=delta, where=~first)
        self.last_content_req = int(creq[-1])
        self.last_content_arrival = int(carr[-1])
        self.content += len(ci)
        self.sink.add(creq, delta, tokens[ci])

    def result(self, notes: list[str]) -> ChunkGaps:
        return ChunkGaps(rows=self.rows, orphan_rows=self.orphans, content_rows=self.content, notes=notes)


_SCHEMA = pa.schema([CHUNKS_SCHEMA.field(c) for c in _COLUMNS])  # the columns this pass reads, typed


def _batches(files: list[Path]) -> Iterator[pa.RecordBatch]:
    types = [CHUNKS_SCHEMA.field(c).type for c in _COLUMNS]
    for _, batch in iter_file_batches(files, _COLUMNS, BATCH_ROWS):
        cols = [
            batch.column(i) if batch.column(i).type == t or i == 0 else batch.column(i).cast(t)
            for i, t in enumerate(types)
        ]
        yield pa.RecordBatch.from_arrays(cols, schema=_SCHEMA)


_DONE = object()


@contextmanager
def _read_ahead(batches: Iterator[pa.RecordBatch], depth: int = READ_AHEAD) -> Iterator[Iterator[pa.RecordBatch]]:
    """``batches`` decoded on a reader thread up to ``depth`` batches ahead of the consumer (Parquet
    decoding releases the GIL, so it overlaps the pass on a second core). A reader error is raised
    in the consumer; leaving the block early stops the reader."""
    ready: queue.Queue[Any] = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def put(item: Any) -> bool:
        while not stop.is_set():
            try:
                ready.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def read() -> None:
        try:
            for batch in batches:
                if not put(batch):
                    return
            put(_DONE)
        except BaseException as exc:  # handed to the consumer, raised there
            put(exc)

    def consume() -> Iterator[pa.RecordBatch]:
        while (item := ready.get()) is not _DONE:
            if isinstance(item, BaseException):
                raise item
            yield item

    reader = threading.Thread(target=read, name="loadgen-chunk-reader", daemon=True)
    reader.start()
    try:
        yield consume()
    finally:
        stop.set()
        reader.join()


def read_chunk_gaps(files: list[Path], request_ids: pa.Array, sink: ChunkSink) -> ChunkGaps:
    """One streaming pass over the chunk table's ``files`` (in write order) feeding ``sink`` (or a
    sort-based pass when rows are out of order)."""
    if not files:
        return ChunkGaps(notes=["no chunks.parquet: per-token metrics unavailable"])
    lookup = _Lookup(request_ids)
    state = _Pass(lookup, sink)
    try:
        with _read_ahead(_batches(files)) as batches:
            for batch in batches:
                state.batch(batch)
        return state.result([])
    except _NeedsSort as exc:
        reason = str(exc)
    # Fallback: read everything, sort by (request, seq), run the same kernel in slices of whole requests.
    sink.reset()
    table = pa.Table.from_batches(list(_batches(files)), schema=_SCHEMA)  # the same typed read as the pass
    req = lookup.get_indexer(table.column("request_id").combine_chunks())
    seq = table.column("seq").to_numpy().astype(np.int64)
    order = np.lexsort((seq, req))
    arrival = table.column("arrival_ns").to_numpy()[order]
    tokens = table.column("tokens").to_numpy()[order]
    req = req[order]
    del table, seq, order
    state = _Pass(lookup, sink)
    for a in range(0, len(req), BATCH_ROWS):
        b = min(a + BATCH_ROWS, len(req))
        state._content(req[a:b], arrival[a:b], tokens[a:b])
    return state.result([f"chunks re-sorted by (request, seq) before analysis: {reason}"])
