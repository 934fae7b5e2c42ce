"""Streaming pass over chunks.parquet: per content chunk, its request and the gap before it.

Writers append chunks grouped by request (in completion order, not request-id order), so one pass
in record batches finds request boundaries by comparing neighbouring ids, maps each run of rows to
its request with one lookup per request (not per row; ``idlookup``), and carries the last content
chunk across batch edges. If a request's chunks are not contiguous or not in ``seq`` order, the pass
falls back to a full sort by (request, seq) and says so in the notes. Zero-token chunks (usage-only
or empty events) are not content and are skipped. Content chunks go to a *sink* batch by batch
(request index, gap to the previous content chunk or −1 for a request's first, tokens), so the
pass itself keeps nothing per row.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from loadgen.rundir.parts import iter_file_batches
from loadgen.rundir.schema import CHUNKS_SCHEMA

from .idlookup import IdLookup

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
    backwards_rows: int = 0  # content chunks that arrived before their request's previous one (gap taken as 0)
    negative_token_rows: int = 0  # chunk rows with tokens < 0 (no loadgen writer records one): no content


class _NeedsSort(Exception):
    pass


@dataclass
class _Content:
    """A batch's content rows (tokens > 0, naming a request), with everything but their first row's link to
    the batch before: ``first[1:]`` and ``delta[1:]`` are final, ``first[0]`` and ``delta[0]`` are set by the pass."""

    rows: int
    orphans: int
    req: np.ndarray
    arrival: np.ndarray
    tokens: np.ndarray
    first: np.ndarray
    delta: np.ndarray
    backwards: int = 0
    negative_tokens: int = 0


def _content(row_req: np.ndarray, arrival: np.ndarray, tokens: np.ndarray) -> _Content:
    keep = (tokens > 0) & (row_req >= 0)
    orphans = int((row_req < 0).sum())
    if keep.all():  # no copies
        creq, carr, ctok = row_req, arrival, tokens
    else:
        ci = np.flatnonzero(keep)
        creq, carr, ctok = row_req[ci], arrival[ci], tokens[ci]
    first = np.empty(len(creq), dtype=bool)
    delta = np.empty(len(creq), dtype=np.int64)
    if len(creq):
        np.not_equal(creq[1:], creq[:-1], out=first[1:])
        np.subtract(carr[1:], carr[:-1], out=delta[1:])
        # a negative gap inside a request (clock went backwards) is clamped to 0, not a "first"; counted
        backwards = int(np.count_nonzero((delta[1:] < 0) & ~first[1:]))
        delta[1:][first[1:]] = -1
        np.maximum(delta[1:], 0, out=delta[1:], where=~first[1:])
    else:
        backwards = 0
    negative = 0 if keep.all() else int(np.count_nonzero(tokens < 0))
    return _Content(len(row_req), orphans, creq, carr, ctok, first, delta, backwards, negative)


@dataclass
class _Prepared:
    """One record batch as the pass needs it, prepared on the reader thread: its runs of one request id
    (segments; the first starts at row 0 even when it continues the batch before) and its content rows."""

    first_id: Any
    last_id: Any
    seg_req: np.ndarray
    first_seq: int
    last_seq: int
    unordered: bool  # seq does not increase somewhere inside a segment
    content: _Content


def _prepare(batch: pa.RecordBatch, lookup: IdLookup) -> _Prepared | None:
    n = batch.num_rows
    if n == 0:
        return None
    ids = batch.column(0)
    seq = batch.column(1).to_numpy(zero_copy_only=False)
    start = np.empty(n, dtype=bool)
    start[0] = True
    if isinstance(ids, pa.DictionaryArray):
        # one dictionary per batch (unique values): compare int indices, look up each value once
        codes = ids.indices.to_numpy(zero_copy_only=False)
        np.not_equal(codes[1:], codes[:-1], out=start[1:])
        seg_pos = np.flatnonzero(start)
        seg_req = lookup.get_indexer(ids.dictionary)[codes[seg_pos]].astype(np.int64)
    else:
        if n > 1:
            start[1:] = pc.not_equal(ids.slice(1), ids.slice(0, n - 1)).to_numpy(zero_copy_only=False)
        seg_pos = np.flatnonzero(start)
        seg_req = lookup.get_indexer(ids.take(pa.array(seg_pos)))
    unordered = bool(((np.diff(seq) <= 0) & ~start[1:]).any())
    row_req = np.repeat(seg_req, np.diff(np.append(seg_pos, n)))
    content = _content(
        row_req, batch.column(2).to_numpy(zero_copy_only=False), batch.column(3).to_numpy(zero_copy_only=False)
    )
    return _Prepared(ids[0].as_py(), ids[n - 1].as_py(), seg_req, int(seq[0]), int(seq[-1]), unordered, content)


def _prepared(batches: Iterator[pa.RecordBatch], lookup: IdLookup) -> Iterator[_Prepared]:
    for batch in batches:
        if (p := _prepare(batch, lookup)) is not None:
            yield p


class _Pass:
    """State carried across record batches: the links between them, the order checks, the counts."""

    def __init__(self, n_requests: int, sink: ChunkSink) -> None:
        self.sink = sink
        self.content = 0
        self.seen = np.zeros(n_requests, dtype=bool)
        self.last_id: Any = None
        self.last_seq = -1
        self.last_content_req = -2
        self.last_content_arrival = 0
        self.rows = 0
        self.orphans = 0
        self.backwards = 0
        self.negative_tokens = 0

    def batch(self, p: _Prepared) -> None:
        continues = self.last_id is not None and p.first_id == self.last_id
        seg_req = p.seg_req[1:] if continues else p.seg_req  # the first segment was seen in the batch before
        known = seg_req[seg_req >= 0]
        ordered = np.sort(known)  # a few thousand ids: a sort beats a hash here
        if self.seen[known].any() or (ordered[1:] == ordered[:-1]).any():
            raise _NeedsSort("chunks of a request are not contiguous")
        self.seen[known] = True
        if p.unordered or (continues and p.first_seq <= self.last_seq):
            raise _NeedsSort("chunks of a request are not in seq order")
        self.last_id, self.last_seq = p.last_id, p.last_seq
        self.add(p.content)

    def add(self, c: _Content) -> None:
        """Link ``c``'s first content row to the content before it, and hand the rows to the sink."""
        self.rows += c.rows
        self.orphans += c.orphans
        self.backwards += c.backwards
        self.negative_tokens += c.negative_tokens
        if not len(c.req):
            return
        c.first[0] = c.req[0] != self.last_content_req
        gap = int(c.arrival[0]) - self.last_content_arrival
        self.backwards += int(not c.first[0] and gap < 0)
        c.delta[0] = -1 if c.first[0] else max(gap, 0)
        self.last_content_req = int(c.req[-1])
        self.last_content_arrival = int(c.arrival[-1])
        self.content += len(c.req)
        self.sink.add(c.req, c.delta, c.tokens)

    def result(self, notes: list[str]) -> ChunkGaps:
        if self.backwards:
            notes.append(
                f"{self.backwards} content chunk(s) arrived before the previous chunk of their request (a clock step "
                "or a foreign writer): each gap counted as 0 ms in ITL and inter-chunk gaps"
            )
        if self.negative_tokens:
            notes.append(
                f"{self.negative_tokens} chunk row(s) with a negative token count (no loadgen writer records one): "
                "not counted as content"
            )
        return ChunkGaps(
            rows=self.rows,
            orphan_rows=self.orphans,
            content_rows=self.content,
            notes=notes,
            backwards_rows=self.backwards,
            negative_token_rows=self.negative_tokens,
        )


_SCHEMA = pa.schema([CHUNKS_SCHEMA.field(c) for c in _COLUMNS])  # the columns this pass reads, typed


def _batches(files: list[Path]) -> Iterator[pa.RecordBatch]:
    for _, batch in iter_file_batches(files, _SCHEMA, BATCH_ROWS):
        yield batch


_DONE = object()
_T = TypeVar("_T")


@contextmanager
def _read_ahead(batches: Iterator[_T], depth: int = READ_AHEAD) -> Iterator[Iterator[_T]]:
    """``batches`` produced on a reader thread up to ``depth`` ahead of the consumer (Parquet decoding,
    Arrow's kernels and numpy's large loops release the GIL, so it overlaps the pass on a second core).
    A reader error is raised in the consumer; leaving the block early stops the reader."""
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

    def consume() -> Iterator[_T]:
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
    lookup = IdLookup(request_ids)
    state = _Pass(len(lookup), sink)
    try:
        with _read_ahead(_prepared(_batches(files), lookup)) as prepared:
            for p in prepared:
                state.batch(p)
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
    state = _Pass(len(lookup), sink)
    for a in range(0, len(req), BATCH_ROWS):
        b = min(a + BATCH_ROWS, len(req))
        state.add(_content(req[a:b], arrival[a:b], tokens[a:b]))
    return state.result([f"chunks re-sorted by (request, seq) before analysis: {reason}"])
