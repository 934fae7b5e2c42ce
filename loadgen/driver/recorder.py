"""The recorder: one writer task owns the run directory; request tasks hand it rows through a stream.

Request tasks call ``submit`` (synchronous, never blocks, safe in cancelled code), which puts
``(row, chunk_columns)`` on an anyio memory object stream. Every ``poll_s`` the writer task turns
what arrived into small Arrow tables on the event loop (a fraction of a millisecond each, so the
schedule is not disturbed: converting Python objects holds the GIL, even in a thread) and every
``flush_interval_s`` (1 s by default) hands them to the run writer in a worker thread, which writes
them as closed part files (Parquet encoding releases the GIL). So a run killed at any instant keeps
every row converted before its last flush. A write error (disk full, I/O error) ends ``run`` with
``RecordWriteError``, which stops the run. ``finish`` drains and writes whatever is left,
synchronously, so a cancelled or crashed run still records every row it produced.
"""

from __future__ import annotations

import math
import time
import typing
from typing import Any

import anyio
import pyarrow as pa
import pyarrow.parquet as pq
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from ..records import CHUNKS_SCHEMA, REQUESTS_SCHEMA, empty_request_row
from ..rundir import RunWriter

__all__ = ["ArrowRunWriter", "Recorder"]

_REQUEST = 0
_METRICS = 1
#: Convert at once when this many rows are queued (each conversion stays around a millisecond).
BACKLOG_ITEMS = 400
#: Otherwise convert only when the next scheduled send is at least this far away, or when a flush is due.
QUIET_NS = 4_000_000
_REQUEST_NAMES = REQUESTS_SCHEMA.names
_CHUNK_NAMES = CHUNKS_SCHEMA.names


#: RunWriter accepts ready Arrow tables itself; the old name stays for callers.
ArrowRunWriter = RunWriter


def _requests_table(rows: list[dict[str, Any]]) -> pa.Table:
    return pa.Table.from_pydict({name: [r[name] for r in rows] for name in _REQUEST_NAMES}, schema=REQUESTS_SCHEMA)


class Recorder:
    """Feeds one ArrowRunWriter from many tasks; see module docstring."""

    def __init__(
        self,
        writer: ArrowRunWriter,
        flush_interval_s: float = 1.0,
        poll_s: float = 0.02,
        quiet_ns: typing.Callable[[], int] | None = None,
        progress: typing.Callable[[], dict[str, Any]] | None = None,
    ) -> None:
        self.writer = writer
        self.flush_interval_s = flush_interval_s
        self.poll_s = poll_s
        # time until the scheduler's next deadline: converting (which blocks the loop for a
        # fraction of a millisecond) waits for a gap, unless the backlog grows large or a flush is due
        self.quiet_ns = quiet_ns or (lambda: 1 << 62)
        # what a killed run's reader needs to know about this flush (see RunWriter.flush)
        self.progress = progress or dict
        send, receive = anyio.create_memory_object_stream[tuple[int, Any, Any]](max_buffer_size=math.inf)
        self._send: MemoryObjectSendStream = send
        self._receive: MemoryObjectReceiveStream = receive
        self.recorded_ids: set[str] = set()
        self.rows = 0
        self.chunks = 0
        self._req_tables: list[pa.Table] = []
        self._chunk_tables: list[pa.Table] = []
        self._metrics: list[dict[str, list[Any]]] = []

    def submit(self, row: dict[str, Any], chunks: dict[str, list[Any]] | None) -> None:
        """Queue one request row and its chunk columns (never blocks)."""
        self._send.send_nowait((_REQUEST, row, chunks))

    def submit_metrics(self, columns: dict[str, list[Any]]) -> None:
        """Queue server-metric sample columns."""
        self._send.send_nowait((_METRICS, columns, None))

    def convert(self) -> None:
        """Turn everything queued into Arrow tables (runs on the event loop; small batches)."""
        rows: list[dict[str, Any]] = []
        chunk_cols: dict[str, list[Any]] = {name: [] for name in _CHUNK_NAMES}
        receive = self._receive
        while True:
            try:
                kind, a, b = receive.receive_nowait()
            except (anyio.WouldBlock, anyio.EndOfStream, anyio.ClosedResourceError):
                break
            if kind == _REQUEST:
                rows.append(a)
                if b is not None:
                    for name in _CHUNK_NAMES:
                        chunk_cols[name].extend(b[name])
            else:
                self._metrics.append(a)
        if rows:
            self._req_tables.append(_requests_table(rows))
            self.recorded_ids.update(r["request_id"] for r in rows)
            self.rows += len(rows)
        if chunk_cols["seq"]:
            self._chunk_tables.append(pa.Table.from_pydict(chunk_cols, schema=CHUNKS_SCHEMA))
            self.chunks += len(chunk_cols["seq"])

    @property
    def pending(self) -> bool:
        return bool(self._req_tables or self._chunk_tables or self._metrics)

    def _write(self, progress: dict[str, Any]) -> None:
        """Hand everything converted to the writer and flush it (takes the tables itself: if the
        thread that runs this never starts, nothing was taken and ``finish`` writes them)."""
        req_tables, chunk_tables, metrics = self._req_tables, self._chunk_tables, self._metrics
        self._req_tables, self._chunk_tables, self._metrics = [], [], []
        if chunk_tables:
            self.writer.add_chunk_table(pa.concat_tables(chunk_tables))
        for columns in metrics:
            self.writer.add_metrics(columns)
        if req_tables:
            self.writer.add_request_table(pa.concat_tables(req_tables))
        self.writer.flush(progress)

    async def run(self, *, task_status=anyio.TASK_STATUS_IGNORED) -> None:
        """The writer task: convert every ``poll_s`` (in gaps of the schedule), flush every ``flush_interval_s``.

        It polls with ``receive_nowait`` rather than awaiting ``receive`` so that cancelling it can
        never drop an item already handed over. A flush also happens when nothing new arrived since
        the last conversion: rows never wait in memory for the next request to finish.
        """
        task_status.started()
        last_flush = time.monotonic()
        while True:
            await anyio.sleep(self.poll_s)
            backlog = self._receive.statistics().current_buffer_used
            now = time.monotonic()
            flush_due = now - last_flush >= self.flush_interval_s
            if backlog and (flush_due or backlog >= BACKLOG_ITEMS or self.quiet_ns() >= QUIET_NS):
                self.convert()
            if flush_due and self.pending:
                last_flush = now
                progress = self.progress()  # on the loop: what was converted up to now is what is written
                await anyio.to_thread.run_sync(self._write, progress)

    def finish(self) -> None:
        """Convert and write everything still queued (synchronous; the end of the run)."""
        self.convert()
        self._write(self.progress())


def warm_up_arrow() -> None:
    """Pay pyarrow's and Parquet's one-time initialisation (~0.5 s) before the run clock starts."""

    row = empty_request_row(
        request_id="w", request_class="w", scheduled_ns=0, target_prompt_tokens=0, target_output_tokens=0, status="ok"
    )
    for table in (
        _requests_table([row]),
        pa.Table.from_pydict(
            {"request_id": ["w"], "seq": [0], "arrival_ns": [0], "tokens": [0], "bytes": [0]}, schema=CHUNKS_SCHEMA
        ),
    ):
        with pq.ParquetWriter(pa.BufferOutputStream(), table.schema, compression="zstd") as w:
            w.write_table(pa.concat_tables([table, table]))
