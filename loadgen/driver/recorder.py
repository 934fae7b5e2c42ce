"""The recorder: one writer task owns the RunWriter; request tasks hand it rows through a stream.

Request tasks call ``submit`` (synchronous, never blocks, safe inside cancelled code) which puts
``(row, chunk_columns)`` on an anyio memory object stream. The writer task appends them to the
RunWriter's buffers and flushes row groups in a worker thread every ``flush_interval_s`` so Parquet
encoding does not stall the event loop. ``finish`` drains whatever is still queued, synchronously,
so a cancelled or crashed run still records every row it produced.
"""

from __future__ import annotations

import math
import time
from typing import Any

import anyio
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from ..rundir import RunWriter

__all__ = ["Recorder"]

_REQUEST = 0
_METRICS = 1


class Recorder:
    """Feeds one RunWriter from many tasks; see module docstring."""

    def __init__(self, writer: RunWriter, flush_interval_s: float = 2.0, flush_rows: int = 20_000) -> None:
        self.writer = writer
        self.flush_interval_s = flush_interval_s
        self.flush_rows = flush_rows
        send, receive = anyio.create_memory_object_stream[tuple[int, Any, Any]](max_buffer_size=math.inf)
        self._send: MemoryObjectSendStream = send
        self._receive: MemoryObjectReceiveStream = receive
        self.rows = 0
        self.recorded_ids: set[str] = set()
        self._pending = 0
        self.poll_s = 0.05

    def submit(self, row: dict[str, Any], chunks: dict[str, list[Any]] | None) -> None:
        """Queue one request row and its chunk columns (never blocks)."""
        self._send.send_nowait((_REQUEST, row, chunks))

    def submit_metrics(self, columns: dict[str, list[Any]]) -> None:
        """Queue server-metric sample columns."""
        self._send.send_nowait((_METRICS, columns, None))

    def _apply(self, item: tuple[int, Any, Any]) -> None:
        kind, a, b = item
        if kind == _REQUEST:
            self.writer.add_request(a)
            self.recorded_ids.add(a["request_id"])
            self.rows += 1
            self._pending += 1
            if b is not None:
                self.writer.add_chunks(b)
                self._pending += len(b["seq"]) // 20
        else:
            self.writer.add_metrics(a)
            self._pending += len(a["name"]) // 10

    async def run(self, *, task_status=anyio.TASK_STATUS_IGNORED) -> None:
        """The writer task: apply queued items every ``poll_s``, flush in a thread; ends when cancelled.

        It polls with ``receive_nowait`` rather than awaiting ``receive`` so that cancelling it can
        never drop an item that was already handed over.
        """
        task_status.started()
        last_flush = time.monotonic()
        while True:
            await anyio.sleep(self.poll_s)
            self.drain()
            now = time.monotonic()
            if self._pending and (self._pending >= self.flush_rows or now - last_flush >= self.flush_interval_s):
                self._pending = 0
                last_flush = now
                await anyio.to_thread.run_sync(self.writer.flush)

    def drain(self) -> None:
        """Apply everything still queued (synchronous; for the end of the run)."""
        while True:
            try:
                item = self._receive.receive_nowait()
            except (anyio.WouldBlock, anyio.EndOfStream, anyio.ClosedResourceError):
                return
            self._apply(item)
