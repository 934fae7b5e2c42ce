"""The recorder: one writer task owns the run directory; request tasks hand it their rows.

Request tasks call ``submit`` (synchronous, O(1), never blocks, safe in cancelled code): the row and its
chunks' machine-integer arrays join a pending list. Every ``flush_interval_s`` (1 s by default) the writer
task packs what is pending on the event loop, at most ``SLICE_ROWS`` rows at a time with the loop free in
between (``rowtables.pack_slice``: a fraction of a millisecond each, so a send that falls due waits
little), and a writer thread hands the slices to the part writer process (``loadgen.rundir.part_process``: a child at
low CPU priority, so converting them to Arrow and Parquet's encoding, compression and fsync never take
the loop's core), which converts them and writes them as closed part files. Without that process (it could
not start, or died), the loop converts to Arrow in the same slices and the writer thread writes.

Converting in a thread instead was measured: a thread that holds the GIL makes the event loop wait for it
at every I/O callback (uvloop takes the GIL per callback), and the schedule fell 20-70 ms behind at each
flush. Nor can the writer thread run at a lower priority: a thread that the OS holds back while it holds
the GIL holds the loop back too. A child process holds no GIL of ours.

So a run killed at any instant keeps every row packed before its last flush. A write error (disk
full, I/O error) ends ``run`` with ``RecordWriteError``, which stops the run. ``finish`` converts and
writes whatever is left, synchronously and in this process (the schedule is over), so a cancelled or
crashed run still records every row it produced.
"""

from __future__ import annotations

import concurrent.futures
import time
import typing
from array import array
from concurrent.futures import ThreadPoolExecutor
from typing import Any, NamedTuple

import anyio
import anyio.lowlevel
import pyarrow as pa
import pyarrow.parquet as pq

from loadgen.rundir.io import RunWriter
from loadgen.rundir.part_process import PartProcess
from loadgen.rundir.rowtables import ChunkBatch, StreamChunks, pack_slice, requests_table, unpack_slices
from loadgen.rundir.schema import empty_request_row

__all__ = ["ArrowRunWriter", "Recorder", "StreamChunks"]

#: Rows packed (or converted to Arrow) in one go on the event loop: a send that falls due waits for at most one
#: slice. Converting, measured on the loop at 2,500 req/s: ~0.4-0.7 ms of CPU for 50 rows with their chunks,
#: 1.3-2.2 ms for 200; packing costs about half.
SLICE_ROWS = 50
#: Rows pending that are converted before the flush is due (a long flush interval must not hold raw rows).
CONVERT_AT_ROWS = 8192
#: How long ``finish`` waits for the part writer process's answer before the writer thread takes over (once
#: the schedule is over the loop is idle, and a child that has not answered by then is not being run).
FINISH_WAIT_S = 0.5


#: RunWriter accepts ready Arrow tables itself; the old name stays for callers.
ArrowRunWriter = RunWriter


class _Taken(NamedTuple):
    """One flush's worth, handed from the loop to the writer thread."""

    req_tables: list[pa.Table]
    chunk_tables: list[pa.Table]
    metrics: list[dict[str, list[Any]]]
    packed: list[bytes]


class Recorder:
    """Feeds one ArrowRunWriter from many tasks; see module docstring."""

    def __init__(
        self,
        writer: ArrowRunWriter,
        flush_interval_s: float = 1.0,
        poll_s: float = 0.02,
        progress: typing.Callable[[], dict[str, Any]] | None = None,
        part_process: PartProcess | None = None,
    ) -> None:
        """``part_process``: converts and writes the flushes' rows (owned: ``finish`` closes it); None: the loop
        converts and the writer thread writes."""
        self.writer = writer
        self.part_process = part_process
        self.flush_interval_s = flush_interval_s
        self.poll_s = poll_s
        # what a killed run's reader needs to know about this flush (see RunWriter.flush)
        self.progress = progress or dict
        self.recorded_ids: set[str] = set()
        self.rows = 0
        self.chunks = 0
        self._items: list[tuple[dict[str, Any], StreamChunks | None]] = []  # submitted, not converted
        self._req_tables: list[pa.Table] = []
        self._chunk_tables: list[pa.Table] = []
        self._metrics: list[dict[str, list[Any]]] = []
        self._packed: list[bytes] = []  # slices packed for the part writer process to convert
        self._writer_pool: ThreadPoolExecutor | None = None
        self._job: concurrent.futures.Future | None = None  # the flush handed to the writer thread last

    def submit(self, row: dict[str, Any], chunks: StreamChunks | None) -> None:
        """Record one request row and its chunks (O(1): appended to the pending list)."""
        self._items.append((row, chunks))
        self.recorded_ids.add(row["request_id"])
        self.rows += 1
        if chunks is not None:
            self.chunks += len(chunks.arrival_ns)

    def submit_metrics(self, columns: dict[str, list[Any]]) -> None:
        """Record server-metric sample columns."""
        self._metrics.append(columns)

    def convert(self, limit: int | None = None, *, here: bool = False) -> int:
        """Turn pending rows (the first ``limit``, else all) into Arrow tables, or, while the part writer
        process runs (and not ``here``), pack them for it to convert (``rowtables.pack_slice``); returns how
        many."""
        items = self._items
        if limit is None or limit >= len(items):
            self._items = []
        else:
            items, self._items = items[:limit], items[limit:]
        if not items:
            return 0
        if not here and self.part_process is not None and self.part_process.running:
            self._packed.append(pack_slice(items))
            return len(items)
        batch = ChunkBatch()
        for row, chunks in items:
            if chunks is not None:
                batch.add(row["request_id"], chunks)
        self._req_tables.append(requests_table([row for row, _ in items]))
        if batch.ids:
            self._chunk_tables.append(batch.table())
        return len(items)

    @property
    def pending(self) -> bool:
        return bool(self._items or self._req_tables or self._chunk_tables or self._metrics or self._packed)

    def _take(self) -> _Taken:
        """The converted tables, packed slices and metric columns, handed over (on the loop)."""
        taken = _Taken(self._req_tables, self._chunk_tables, self._metrics, self._packed)
        self._req_tables, self._chunk_tables, self._metrics, self._packed = [], [], [], []
        return taken

    def _write(self, taken: _Taken, progress, sink: PartProcess | None = None) -> None:
        """Write taken tables as part files (chunks first: a request row never reaches disk without its
        chunks; see RunWriter.flush), by ``sink`` when given; packed slices are converted by ``sink``, or
        here when there is none."""
        req_tables, chunk_tables, metrics, packed = taken
        if packed:
            requests, chunks = sink.convert(packed) if sink is not None else unpack_slices(packed)
            req_tables = [*req_tables, requests] if requests is not None else req_tables
            chunk_tables = [*chunk_tables, chunks] if chunks is not None else chunk_tables
        if chunk_tables:
            self.writer.add_chunk_table(pa.concat_tables(chunk_tables))
        for columns in metrics:
            self.writer.add_metrics(columns)
        if req_tables:
            self.writer.add_request_table(pa.concat_tables(req_tables))
        self.writer.flush(progress, sink)

    async def run(self, *, task_status=anyio.TASK_STATUS_IGNORED) -> None:
        """The writer task: every ``flush_interval_s`` (checked every ``poll_s``) convert what is pending,
        ``SLICE_ROWS`` at a time with the loop free in between, and write it from the writer thread
        (``_flush``); sooner when ``CONVERT_AT_ROWS`` rows are pending (memory).

        Converting once per flush, not at every poll: a conversion's cost is mostly fixed (35 columns),
        and several times higher when its code has left the CPU's caches, as it has 20 ms later. At 2,500
        req/s on one core, converting at every poll made ~46 stalls of ~1 ms a second; once per flush, the
        slices run back to back, warm (``benchmarks/bench_flush_cpu.py`` measures the deadlines missed).

        A flush also happens when nothing new arrived since the last one: rows never wait in memory for
        the next request to finish.
        """
        task_status.started()
        last_flush = time.monotonic()
        while True:
            await anyio.sleep(self.poll_s)
            due = time.monotonic() - last_flush >= self.flush_interval_s
            if not due and len(self._items) < CONVERT_AT_ROWS:
                continue
            while self.convert(SLICE_ROWS) == SLICE_ROWS:
                await anyio.lowlevel.checkpoint()  # a send that fell due goes before the next slice
            now = time.monotonic()
            if due and self.pending:
                last_flush = now
                progress = self.progress()  # on the loop, with the hand-over: what was recorded is what is written
                await self._flush(self._take(), progress)

    def _pool(self) -> ThreadPoolExecutor:
        if self._writer_pool is None:
            self._writer_pool = ThreadPoolExecutor(1, "loadgen-writer")
        return self._writer_pool

    def write_manifest_soon(self) -> None:
        """The manifest as it stands now, written in the writer thread ahead of any later flush; the loop does
        not wait (a synced write can outlast the run's lead time on a busy disk). A failure marks the writer
        broken, so the next flush or ``finish`` raises it."""
        self._pool().submit(self.writer.save_manifest)

    async def _flush(self, taken, progress: dict[str, Any]) -> None:
        """``_write`` in the writer thread (by the part writer process, when there is one); waits for it to
        finish. A cancelled wait (Ctrl-C, the run's end) returns at once, so the run stops when it is told to;
        the thread still writes what it took, and ``finish`` waits for it."""
        job = self._pool().submit(self._write, taken, progress, self.part_process)
        self._job = job
        await anyio.to_thread.run_sync(job.result, abandon_on_cancel=True)

    def finish(self) -> None:
        """Convert and write everything still pending (synchronous; the end of the run), after a write
        still running in the writer thread (its task cancelled while it ran) has finished.

        A part writer process that has not answered within ``FINISH_WAIT_S`` (at idle priority, where the run
        has one CPU and something else keeps it busy, it may not run for seconds) is stopped, and the writer
        thread writes that flush itself (``PartProcess.abandon``)."""
        if self._writer_pool is not None:
            job = self._job
            if job is not None and not job.done() and self.part_process is not None:
                _, late = concurrent.futures.wait([job], timeout=FINISH_WAIT_S)
                if late:
                    self.part_process.abandon(f"it had not written a flush {FINISH_WAIT_S:g} s after the run ended")
            self._writer_pool.shutdown(wait=True)
            self._writer_pool = None
        if self.part_process is not None:
            self.part_process.close()
        self.convert(here=True)
        self._write(self._take(), self.progress())


def warm_up_arrow() -> None:
    """Pay pyarrow's and Parquet's one-time initialisation (~0.5 s) before the run clock starts."""

    row = empty_request_row(
        request_id="w", request_class="w", scheduled_ns=0, target_prompt_tokens=0, target_output_tokens=0, status="ok"
    )
    for table in (
        requests_table([row]),
        _one_chunk_table(),
    ):
        with pq.ParquetWriter(pa.BufferOutputStream(), table.schema, compression="zstd") as w:
            w.write_table(pa.concat_tables([table, table]))


def _one_chunk_table() -> pa.Table:
    batch = ChunkBatch()
    batch.add("w", StreamChunks(array("q", [0]), array("q", [0]), array("q", [0])))
    return batch.table()
