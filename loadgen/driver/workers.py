"""One run spread over N workers: worker processes on this host (``--workers N``) or Ray actors (``--ray``).

The coordinator (this module) partitions the trace (``loadgen.driver.partition``: a conversation stays on
one worker, each worker replays a thinned copy of the same arrival process), opens the run directory
(its manifest and its own, usually empty, part series), listens on a TCP control channel
(``loadgen.driver.control``) and launches the workers through a launcher: processes on this host
(``loadgen.util.childproc``: own process group, parent-death signal) or Ray actors (``ray_workers``). Each worker
measures its clock offset to the coordinator, says ready; when every worker is ready the coordinator
sends one shared start instant, a little in the future on its clock, and each worker anchors its run
there, corrected by its offset. Each worker writes its shard with ``run_trace`` as part files with its
own prefix in the run's tables (``requests.parquet/part-w0-*.parquet``), so every reader sees one run.

At the end the coordinator reads what each worker left (its shard manifest, ``worker.json``, its raw
send lags) and writes the run's manifest: counts from the records, exact send-lag percentiles over all
workers, and a ``workers`` section. A worker that died (SIGKILL, a crashed Ray actor) leaves the rows it
flushed; the coordinator records each of its other requests itself, with error kind ``worker_lost``
(``cancelled`` when it was due by the time the death was seen, ``not_sent`` otherwise), and the run ends
with one line naming the worker. A coordinator stopped by SIGINT/SIGTERM sends ``stop`` to every worker,
waits for each to close its shard (then kills what is left) and records what is still missing.

Progress: when the coordinator shows a progress line (``--progress on``, or auto on a terminal), it asks
each worker for a report of its live counts every ``REPORT_S`` (and one at its end) and draws one line
for the whole run: the sums, and the worst worker's p99 TTFT.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import sys
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

import anyio
import anyio.abc
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from loadgen.rundir.identity import harness_identity, host_identity, utc_now_iso
from loadgen.rundir.io import WORKERS_DIR, RunWriter, read_run_table
from loadgen.rundir.manifest import (
    Manifest,
    WarmState,
    WorkerInfo,
    WorkersInfo,
    merge_manifest,
    read_manifest,
)
from loadgen.rundir.parts import table_files, table_rows
from loadgen.rundir.schema import (
    CHUNKS_FILE,
    REQUESTS_FILE,
    STATUS_CANCELLED,
    STATUS_NOT_SENT,
    STATUSES,
    empty_request_row,
)
from loadgen.util import interrupts
from loadgen.util.childproc import ChildProcess
from loadgen.util.errors import LoadgenError, RecordWriteError, RunDirError
from loadgen.util.jsonfile import read_json_object

from .control import TOKEN_ENV, Channel
from .options import RunOptions
from .partition import shard_index, split_bound, worker_name
from .progress import Counts, Progress, merged_counts, shows_progress
from .run import _Inputs, _read_inputs, trace_ref
from .schedule import LagStats
from .worker_main import LAG_FILE, WORKER_FILE

__all__ = ["Launcher", "ProcessLauncher", "WorkerHandle", "run_workers", "run_workers_sync"]

#: The shared start is this far after the start message leaves (a worker is anchored before it).
START_LEAD_NS = 300_000_000
#: After ``stop``, how long workers get to close their shards before they are killed.
STOP_GRACE_S = 30.0
POLL_S = 0.05
#: With a progress line: how often each worker reports its counts, and how long the end waits for the
#: final reports (each channel closed by its worker) before the line's last draw.
REPORT_S = 0.5
FINAL_REPORTS_S = 2.0
PARTITION_RULE = "blake2b(conversation_id, else request_id) mod count"
_WORST = ("complete", "interrupted", "failed", "killed")


class WorkerHandle(Protocol):
    """A launched worker, as the coordinator watches it."""

    def exit_status(self) -> str | None:
        """None while it runs; else how it ended (``exit code 0``, ``killed by SIGKILL``, ``actor died``)."""

    def kill(self) -> None:
        """End it now (the last resort after ``stop`` and the grace time)."""


class Launcher(Protocol):
    kind: str  # processes | ray
    listen_host: str  # the address workers reach the coordinator at
    address_label: str | None  # recorded in the manifest (Ray: the cluster address)

    def start(self, worker_id: int, address: str, token: str, log_path: Path, options: RunOptions) -> WorkerHandle:
        """Launch worker ``worker_id``, told to connect to ``address`` (HOST:PORT) with ``token``."""

    def close(self) -> None: ...


def describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


class _ProcessHandle:
    def __init__(self, child: ChildProcess) -> None:
        self.child = child

    def exit_status(self) -> str | None:
        code = self.child.returncode
        return None if code is None else describe_exit(code)

    def kill(self) -> None:
        self.child.stop(grace_s=1.0)


class ProcessLauncher:
    """Worker processes on this host (``python -m loadgen.driver.worker_main``), launched as every child is."""

    kind = "processes"
    listen_host = "127.0.0.1"
    address_label: str | None = None

    def start(self, worker_id: int, address: str, token: str, log_path: Path, options: RunOptions) -> WorkerHandle:
        argv = [sys.executable, "-m", "loadgen.driver.worker_main", "--connect", address, "--worker", str(worker_id)]
        child = ChildProcess(
            argv,
            log_path=log_path,
            what=f"worker {worker_id}",
            env={**os.environ, TOKEN_ENV: token},
            error=LoadgenError,
        )
        return _ProcessHandle(child.start())

    def close(self) -> None:
        pass


@dataclass
class _Worker:
    worker_id: int
    assigned: int
    handle: WorkerHandle | None = None
    channel: Channel | None = None
    pid: int | None = None
    host_sha256: str | None = None
    node_ip: str | None = None
    offset_ns: int | None = None
    uncertainty_ns: int | None = None
    ready: bool = False
    error: str | None = None
    exit: str | None = None
    exit_perf_ns: int | None = None
    lost: int = 0
    counts: Counts = field(default_factory=Counts)  # its latest progress report
    closed: bool = False  # its channel was read to its end
    extra: dict[str, Any] = field(default_factory=dict)


def _check_split(options: RunOptions, inputs: _Inputs, workers: int, index: np.ndarray) -> None:
    sizes = np.bincount(index, minlength=workers)
    if (sizes == 0).any():
        empty = int(np.flatnonzero(sizes == 0)[0])
        raise LoadgenError(
            f"--workers {workers}: worker {empty} would get no request of {options.trace_path} "
            f"({inputs.table.num_rows} requests; a conversation stays on one worker): expected fewer workers"
        )
    if inputs.concurrency is not None and inputs.concurrency < workers:
        raise LoadgenError(
            f"--workers {workers}: the run's concurrency bound is {inputs.concurrency}, split between the workers: "
            f"expected at most {inputs.concurrency} workers (or a larger --max-concurrency)"
        )


def _worker_options(options: RunOptions, inputs: _Inputs, workers: int, worker_id: int) -> RunOptions:
    """What one worker runs: its share of the bounds, no progress line, metrics and GPUs sampled by worker 0 only."""
    rate = options.rate_limit_rps
    return options.model_copy(
        update={
            "trace_path": Path(options.trace_path).resolve(),
            "out_dir": Path(options.out_dir).resolve(),
            "scenario_path": Path(options.scenario_path).resolve() if options.scenario_path else None,
            "max_concurrency": split_bound(inputs.concurrency, workers, worker_id),
            "rate_limit_rps": rate / workers if rate else None,
            "progress": "off",
            "workers": 1,
            "ray": None,
            "scrape_metrics": options.scrape_metrics if worker_id == 0 else "off",
            "gpu_telemetry": options.gpu_telemetry if worker_id == 0 else "off",
        }
    )


class Coordinator:
    """The coordinator's state for one run (see the module docstring)."""

    def __init__(self, options: RunOptions, inputs: _Inputs, launcher: Launcher, count: int) -> None:
        self.options, self.inputs, self.launcher = options, inputs, launcher
        self.index = shard_index(inputs.table, count)
        _check_split(options, inputs, count, self.index)
        sizes = np.bincount(self.index, minlength=count)
        self.workers = [_Worker(i, int(sizes[i])) for i in range(count)]
        self.token = secrets.token_hex(16)
        self.all_ready = anyio.Event()
        self.start_ns: int | None = None  # the shared start, coordinator time.time_ns
        self.start_perf_ns: int | None = None  # the same instant on the coordinator's perf_counter_ns
        self.setup_s = 0.0
        self.cpu_start = os.times()
        self.show_progress = shows_progress(options.progress)
        self.progress: Progress | None = None
        self.writer = RunWriter(options.out_dir, self._start_manifest(), flush_interval_s=options.flush_interval_s)
        self.run_dir = self.writer.run_dir

    # ---- manifest ---------------------------------------------------------------------------------------
    def _start_manifest(self) -> Manifest:
        options, inputs = self.options, self.inputs
        manifest = Manifest(
            run_kind=options.run_kind,
            harness=harness_identity(),
            host=host_identity(),
            trace=trace_ref(options, inputs.trace_meta),
            options=options.manifest(),
            warm_state=WarmState(state=options.warm_state, actions=list(options.warm_actions)),
            order_index=options.order_index,
            repeat=options.repeat,
            plan_cell=options.plan_cell,
            warnings=list(inputs.warnings),
            scheduled_requests=inputs.table.num_rows,
            workers=self._section(),
        )
        return merge_manifest(manifest, options.extra_manifest) if options.extra_manifest else manifest

    def _section(self, infos: list[WorkerInfo] | None = None) -> WorkersInfo:
        start = datetime.fromtimestamp(self.start_ns / 1e9, UTC) if self.start_ns else None
        return WorkersInfo(
            mode=self.launcher.kind,
            count=len(self.workers),
            ray_address=self.launcher.address_label,
            partition=PARTITION_RULE,
            start_utc=start.isoformat(timespec="microseconds") if start else None,
            start_lead_ns=START_LEAD_NS,
            workers=infos
            if infos is not None
            else [
                WorkerInfo(
                    worker_id=w.worker_id,
                    pid=w.pid,
                    host_sha256=w.host_sha256,
                    node_ip=w.node_ip,
                    clock_offset_ns=w.offset_ns,
                    clock_offset_uncertainty_ns=w.uncertainty_ns,
                    requests_assigned=w.assigned,
                )
                for w in self.workers
            ],
        )

    # ---- the live part ------------------------------------------------------------------------------------
    async def run(self) -> None:
        """Launch every worker, start them together, return when every worker has ended."""
        t0 = time.perf_counter()
        listener = await anyio.create_tcp_listener(local_host=self.launcher.listen_host, local_port=0)
        port = listener.extra(anyio.abc.SocketAttribute.local_port)
        host = self.launcher.listen_host
        address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        async with listener, anyio.create_task_group() as tg:
            tg.start_soon(listener.serve, self._connection)
            for w in self.workers:
                log = self.run_dir / WORKERS_DIR / worker_name(w.worker_id) / "log.txt"
                options = _worker_options(self.options, self.inputs, len(self.workers), w.worker_id)
                w.handle = self.launcher.start(w.worker_id, address, self.token, log, options)
            tg.start_soon(self._starter, t0)
            try:
                await self._monitor()
                if self.progress is not None:
                    await self._final_reports()
                tg.cancel_scope.cancel()
            finally:
                if self.progress is not None:
                    self.progress.close()
        await self.close_channels()

    async def _final_reports(self) -> None:
        """Every worker has ended: let the channels deliver their last reports (each worker sends its final
        counts before it closes its channel), up to ``FINAL_REPORTS_S``."""
        with anyio.move_on_after(FINAL_REPORTS_S):
            while any(w.channel is not None and not w.closed for w in self.workers):
                await anyio.sleep(POLL_S)

    async def close_channels(self) -> None:
        with anyio.CancelScope(shield=True):
            for w in self.workers:
                if w.channel is not None:
                    await w.channel.aclose()

    async def _connection(self, stream: anyio.abc.SocketStream) -> None:
        channel = Channel(stream)
        hello = await channel.receive()
        wid = hello.get("hello") if hello else None
        if (
            hello is None
            or not secrets.compare_digest(str(hello.get("token", "")), self.token)
            or not isinstance(wid, int)
            or not 0 <= wid < len(self.workers)
            or self.workers[wid].channel is not None
        ):
            await stream.aclose()
            return
        w = self.workers[wid]
        w.channel, w.pid, w.host_sha256, w.node_ip = (
            channel,
            hello.get("pid"),
            hello.get("host_sha256"),
            hello.get("node_ip"),
        )
        options = _worker_options(self.options, self.inputs, len(self.workers), wid)
        setup: dict[str, Any] = {"options": options.model_dump(mode="json"), "workers": len(self.workers)}
        if self.show_progress:
            setup["report_s"] = REPORT_S
        await channel.send(setup)
        try:
            await self._receive(w, channel)
        finally:
            w.closed = True

    async def _receive(self, w: _Worker, channel: Channel) -> None:
        """A worker's messages, until it closes its channel."""
        while (message := await channel.receive()) is not None:
            if "progress" in message:
                counts = Counts.from_json(message["progress"])
                if counts is not None:
                    w.counts = counts
            elif "ping" in message:
                await channel.send({"pong": time.time_ns()})
            elif "ready" in message:
                w.offset_ns, w.uncertainty_ns, w.ready = message.get("offset_ns"), message.get("uncertainty_ns"), True
                if all(x.ready for x in self.workers):
                    self.all_ready.set()
            elif "error" in message:
                w.error = str(message["error"])

    async def _starter(self, t0: float) -> None:
        await self.all_ready.wait()
        self.setup_s = time.perf_counter() - t0
        self.start_perf_ns = time.perf_counter_ns() + START_LEAD_NS
        self.start_ns = time.time_ns() + START_LEAD_NS
        for w in self.workers:
            if w.channel is not None:
                await w.channel.try_send({"start_ns": self.start_ns})
        start = datetime.fromtimestamp(self.start_ns / 1e9, UTC)
        await anyio.to_thread.run_sync(
            lambda: self.writer.update_manifest(
                {
                    "started_utc": start.isoformat(timespec="milliseconds"),
                    "anchor": {"perf_counter_ns": self.start_perf_ns, "utc": start.isoformat(timespec="microseconds")},
                    "workers": self._section().model_dump(mode="json"),
                },
                write=True,
            )
        )
        if self.show_progress:  # from the start on: one line for the whole run
            self.progress = self._progress_line()
            await self.progress.run()

    def _progress_line(self) -> Progress:
        count = len(self.workers)
        kind = "Ray actors" if self.launcher.kind == "ray" else "processes"
        return Progress(
            lambda: merged_counts([w.counts for w in self.workers]),
            self.inputs.table.num_rows,
            what=f"loadgen run ({count} {kind})",
            ttft_label="p99 TTFT (worst worker)",
        )

    async def _monitor(self) -> None:
        """Note each worker's end; one that ends before the shared start stops the whole run."""
        while True:
            for w in self.workers:
                status = w.handle.exit_status() if w.handle is not None else None
                if w.exit is None and status is not None:
                    w.exit, w.exit_perf_ns = status, time.perf_counter_ns()
                    if not self.all_ready.is_set():
                        await self.stop_all(f"worker {w.worker_id} ended before the start ({status})")
            if all(w.exit is not None for w in self.workers):
                return
            await anyio.sleep(POLL_S)

    async def stop_all(self, reason: str) -> None:
        """``stop`` to every worker with a channel; a worker that never connected is ended at once."""
        for w in self.workers:
            if w.exit is not None:
                continue
            if w.channel is None or not await w.channel.try_send({"stop": reason}):
                if w.handle is not None:
                    await anyio.to_thread.run_sync(w.handle.kill)

    async def shutdown(self, reason: str) -> None:
        """Stop every worker, give them ``STOP_GRACE_S`` to close their shards, then kill what is left."""
        await self.stop_all(reason)
        with anyio.move_on_after(STOP_GRACE_S):
            await self._monitor()
        for w in self.workers:
            if w.exit is None and w.handle is not None:
                await anyio.to_thread.run_sync(w.handle.kill)
        with anyio.move_on_after(10):
            await self._monitor()
        await self.close_channels()

    # ---- the end: accounting and the merged manifest ----------------------------------------------------------
    def finish(self, state: str, interrupted_by: str | None) -> Manifest:
        """Record every request no worker recorded, then write the run's merged manifest (synchronous).

        A write error on the way (a full disk) stops the recording, not the manifest: it says ``failed``,
        names the error and how many scheduled requests have no row; the error is raised after it.
        """
        infos, shard_manifests, lags = [], [], []
        for w in self.workers:
            info, shard, lag = self._account(w)
            infos.append(info)
            if shard is not None:
                shard_manifests.append(shard)
            lags.append(lag)
        lost = [w for w in self.workers if w.lost]
        failed = [w for w in self.workers if w.error and "before the shared start" not in w.error]
        if failed and interrupted_by is None:
            interrupted_by = f"worker {failed[0].worker_id}: {failed[0].error}"[:500]
        if lost and state == "complete":
            state = "failed"
        if lost and interrupted_by is None:
            interrupted_by = "; ".join(f"worker {w.worker_id} died ({w.exit})" for w in lost)
        for m in shard_manifests:
            state = max(state, m.state if m.state in _WORST else "failed", key=_WORST.index)
        updates = self._merged(shard_manifests, np.concatenate(lags) if lags else np.empty(0, np.int64), infos, state)
        if interrupted_by:
            updates["interrupted_by"] = interrupted_by
        return self.writer.close(updates, totals=lambda closing: self._totals(closing, shard_manifests))

    def _totals(self, closing: Manifest, shards: list[Manifest]) -> dict[str, Any]:
        """The run's counts over every part on disk (the workers' and the coordinator's); after a write
        error, how many scheduled requests have no row, and why."""
        counts = {s: 0 for s in STATUSES}
        statuses = read_run_table(self.run_dir, REQUESTS_FILE, ["status"])
        if statuses is not None:
            for entry in pa.compute.value_counts(statuses.column("status")).to_pylist():
                counts[str(entry["values"])] = int(entry["counts"])
        recorded = sum(counts.values())
        totals: dict[str, Any] = {
            "status_counts": counts,
            "requests_recorded": recorded,
            "chunks_recorded": table_rows(self.run_dir / CHUNKS_FILE),
            "last_flush": _last_flush(shards),
        }
        scheduled = self.inputs.table.num_rows
        if self.writer.broken is not None and recorded < scheduled:
            totals["warnings"] = [
                *closing.warnings,
                f"{scheduled - recorded} of {scheduled} scheduled requests have no row: {self.writer.broken.short}",
            ]
        return totals

    def _worker_rows(self, w: _Worker) -> pa.Table:
        """The request rows worker ``w`` wrote (its part series), columns request_id, status, sent_ns."""
        prefix = f"part-{worker_name(w.worker_id)}-"
        files = [f for f in table_files(self.run_dir / REQUESTS_FILE) if f.name.startswith(prefix)]
        tables = []
        for f in files:
            try:
                tables.append(pq.read_table(f, columns=["request_id", "status", "sent_ns"]))
            except (pa.ArrowInvalid, OSError) as exc:
                raise RunDirError(f"{f}: unreadable Parquet ({exc}): expected a file written by a worker") from None
        if not tables:
            return pa.table(
                {"request_id": pa.array([], pa.string()), "status": [], "sent_ns": pa.array([], pa.int64())}
            )
        return pa.concat_tables(tables)

    def _account(self, w: _Worker) -> tuple[WorkerInfo, Manifest | None, np.ndarray]:
        directory = self.run_dir / WORKERS_DIR / worker_name(w.worker_id)
        shard: Manifest | None = None
        try:
            shard = read_manifest(directory)
        except RunDirError:
            pass
        stats: dict[str, Any] = {}
        if (directory / WORKER_FILE).is_file():
            try:
                stats = read_json_object(directory / WORKER_FILE, "worker stats", RunDirError)
            except RunDirError:
                stats = {}
        try:
            lag = np.load(directory / LAG_FILE) if (directory / LAG_FILE).is_file() else np.empty(0, np.int64)
        except (OSError, ValueError, EOFError):  # unreadable (an older loadgen's write cut short): no lags
            lag = np.empty(0, np.int64)
        rows = self._worker_rows(w)
        w.lost = self._record_lost(w, set(rows.column("request_id").to_pylist()))
        status = rows.column("status")
        return (
            WorkerInfo(
                worker_id=w.worker_id,
                host_sha256=w.host_sha256 or stats.get("host_sha256"),
                node_ip=w.node_ip,
                pid=w.pid or stats.get("pid"),
                clock_offset_ns=w.offset_ns,
                clock_offset_uncertainty_ns=w.uncertainty_ns,
                send_lag_ns=LagStats(values=lag.tolist()).summary(),
                cpu_user_s=stats.get("cpu_user_s"),
                cpu_sys_s=stats.get("cpu_sys_s"),
                requests_assigned=w.assigned,
                requests_sent=int(rows.num_rows - rows.column("sent_ns").null_count),
                requests_completed=int(pa.compute.sum(pa.compute.equal(status, "ok")).as_py() or 0),
                requests_lost=w.lost,
                # its shard's own word; one left "running" is a worker that died without closing it
                state=("killed" if shard.state == "running" else shard.state) if shard is not None else None,
                exit=w.exit,
            ),
            shard,
            lag,
        )

    def _record_lost(self, w: _Worker, recorded: set[str]) -> int:
        """A ``worker_lost`` row for each request of ``w`` that has none: cancelled when due by the time
        its death was seen (it may have been in flight), not_sent otherwise."""
        table = self.inputs.table.filter(pa.array(self.index == w.worker_id))
        seen = w.exit_perf_ns or time.perf_counter_ns()
        due_before = seen - self.start_perf_ns if self.start_perf_ns is not None else -1
        n = 0
        for row in table.to_pylist():
            if row["request_id"] in recorded:
                continue
            n += 1
            if self.writer.broken is not None:  # a full disk: counted here; the manifest says how many lack a row
                continue
            due = row["scheduled_offset_ns"] < due_before
            self._add_lost_row(
                empty_request_row(
                    request_id=row["request_id"],
                    request_class=row["request_class"],
                    conversation_id=row.get("conversation_id"),
                    turn_index=row.get("turn_index"),
                    prefix_group=row.get("prefix_group"),
                    scheduled_ns=row["scheduled_offset_ns"],
                    target_prompt_tokens=row["prompt_tokens"],
                    target_output_tokens=row["output_tokens"],
                    cancel_after_tokens=row.get("cancel_after_tokens"),
                    status=STATUS_CANCELLED if due else STATUS_NOT_SENT,
                    error_kind="worker_lost",
                    error_message=f"worker {w.worker_id} ended ({w.exit or 'unknown'}) before recording it"
                    + (": it was due, its outcome is unknown" if due else ": it was not yet due")
                    + (f" (the worker's error: {w.error[:300]})" if w.error else ""),
                )
            )
        return n

    def _add_lost_row(self, row: dict[str, Any]) -> None:
        """One ``worker_lost`` row; a write error (kept by the writer, raised at its close) stops the recording."""
        with contextlib.suppress(RecordWriteError):
            self.writer.add_request(row)

    def _merged(self, shards: list[Manifest], lags: np.ndarray, infos: list[WorkerInfo], state: str) -> dict[str, Any]:
        """The run's manifest from its workers': sections of the first, sums of the additive figures."""
        updates: dict[str, Any] = {"state": state, "ended_utc": utc_now_iso()}
        first = shards[0] if shards else None
        if first is not None:
            updates.update(
                target=first.target.model_dump(mode="json"),
                scenario=first.scenario.model_dump(mode="json") if first.scenario else None,
                driver=_merged_driver(shards),
                engine_notes=first.engine_notes.model_dump(mode="json"),
                behavior_relevant=first.behavior_relevant,
            )
        updates.update(
            {
                "modelExecuted": any(m.model_executed for m in shards),
                "benchmarkExecuted": any(m.benchmark_executed for m in shards),
                "duration_s": max((m.duration_s or 0.0 for m in shards), default=0.0),
                "send_lag_ns": LagStats(values=lags.tolist()).summary(),
                "stopped_by_deadline": any(m.stopped_by_deadline for m in shards),
                "stopped_ns": max((m.stopped_ns for m in shards if m.stopped_ns is not None), default=None),
                "warnings": [*self.inputs.warnings]
                + [f"worker {i}: {text}" for i, m in enumerate(shards) for text in m.warnings],
            }
        )
        cpu = os.times()
        section = self._section(infos)
        section.coordination = {
            "cpu_user_s": round(cpu.user - self.cpu_start.user, 4),
            "cpu_sys_s": round(cpu.system - self.cpu_start.system, 4),
            "setup_s": round(self.setup_s, 3),
            "what": "coordinator process CPU from opening the run to the merged manifest; set-up: launch to all ready",
        }
        updates["workers"] = section.model_dump(mode="json")
        return updates | _sampled_sections(shards)


def _sampled_sections(shards: list[Manifest]) -> dict[str, Any]:
    """The sections of the worker that scraped /metrics and sampled the GPUs (worker 0: ``_worker_options``)."""
    written = [m.to_dict() for m in shards]
    keys = ("metrics_scrapes", "gpu_telemetry")
    return {key: found[0] for key in keys if (found := [d[key] for d in written if d.get(key) is not None])}


def _merged_driver(shards: list[Manifest]) -> dict[str, Any]:
    """The first worker's driver section; counters summed over workers; per-process figures left to ``workers``."""
    driver = shards[0].driver.model_dump(mode="json") if shards[0].driver else {}
    for key in ("slot_waits", "sent_at_deadline", "rate_limited", "connections_opened", "concurrency"):
        values = [getattr(m.driver, key) for m in shards if m.driver is not None and getattr(m.driver, key) is not None]
        driver[key] = sum(values) if values else None
    cpu = [m.driver.process_cpu_s for m in shards if m.driver is not None and m.driver.process_cpu_s is not None]
    driver["process_cpu_s"] = round(sum(cpu), 4) if cpu else None
    parts = [
        m.driver.part_writer_cpu_s for m in shards if m.driver is not None and m.driver.part_writer_cpu_s is not None
    ]
    driver["part_writer_cpu_s"] = round(sum(parts), 4) if parts else None
    for key, differ in (("part_writer", "both"), ("part_writer_priority", "mixed")):  # each worker's own
        seen = {getattr(m.driver, key) for m in shards if m.driver is not None}
        driver[key] = seen.pop() if len(seen) == 1 else differ
    for key in ("rss_start_bytes", "max_rss_bytes", "peak_in_flight"):
        driver[key] = None  # per process: see workers
    return driver


def _last_flush(shards: list[Manifest]) -> dict[str, Any] | None:
    covered = [
        m.last_flush.covered_until_ns for m in shards if m.last_flush and m.last_flush.covered_until_ns is not None
    ]
    if not covered:
        return None
    return {"covered_until_ns": min(covered), "parts": sum((m.last_flush.parts or 0) for m in shards if m.last_flush)}


async def run_workers(options: RunOptions, count: int, launcher: Launcher) -> Path:
    """Replay ``options.trace_path`` over ``count`` workers into one run directory; returns it.

    Raises ``LoadgenError`` (one line) when a worker could not run (its own error) or died mid-run
    (after every one of its requests was accounted for).
    """
    try:
        inputs = _read_inputs(options)
        coordinator = Coordinator(options, inputs, launcher, count)
    except BaseException:
        launcher.close()
        raise
    state, interrupted_by = "complete", None
    try:
        await coordinator.run()
    except anyio.get_cancelled_exc_class():
        state, interrupted_by = "interrupted", interrupts.cancel_cause()
        with anyio.CancelScope(shield=True):
            await coordinator.shutdown(f"coordinator stopped ({interrupted_by})")
        raise
    except BaseException as exc:
        state, interrupted_by = "failed", type(exc).__name__
        with anyio.CancelScope(shield=True):
            await coordinator.shutdown(f"coordinator failed ({interrupted_by})")
        raise
    finally:
        try:
            coordinator.finish(state, interrupted_by)
        finally:
            launcher.close()
    errors = [w for w in coordinator.workers if w.error and "before the shared start" not in w.error]
    if errors:
        raise LoadgenError(str(errors[0].error))
    lost = [w for w in coordinator.workers if w.lost]
    if lost:
        w = lost[0]
        more = f" (and {len(lost) - 1} more worker(s))" if len(lost) > 1 else ""
        raise LoadgenError(
            f"worker {w.worker_id} died ({w.exit}){more}; {sum(x.lost for x in lost)} requests recorded as "
            f"not sent or cancelled (error kind worker_lost) in {coordinator.run_dir}"
        )
    return coordinator.run_dir


#: Workers on Ray when ``--ray`` is given without ``--workers``.
DEFAULT_RAY_WORKERS = 2


def run_workers_sync(options: RunOptions) -> Path:
    """``run_workers`` on its own event loop: ``options.workers`` processes on this host, or Ray actors
    when ``options.ray`` is set (``local``: a local Ray; else a cluster address)."""
    count = options.workers if options.workers > 1 or not options.ray else DEFAULT_RAY_WORKERS
    launcher: Launcher
    if options.ray:
        from .ray_workers import RayLauncher  # deferred: Ray is optional

        address = None if options.ray == "local" else options.ray
        launcher = RayLauncher(address, num_cpus=max(2, count) if address is None else None)
    else:
        launcher = ProcessLauncher()
    return anyio.run(run_workers, options, count, launcher, backend="asyncio")
