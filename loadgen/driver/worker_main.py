"""One worker of a run spread over workers: connect to the coordinator, replay one shard, close it.

Started by the coordinator (``loadgen.driver.workers``) as a process on this host
(``python -m loadgen.driver.worker_main --connect HOST:PORT --worker ID``, the token in
``LOADGEN_WORKER_TOKEN``) or inside a Ray actor (``loadgen.driver.ray_workers``). Either way it speaks the
control protocol (``loadgen.driver.control``): hello, the run options, the clock-offset measurement,
ready, the shared start; then ``run_trace`` replays its shard into the shared run directory (reporting its
live counts every ``report_s`` seconds when the coordinator shows a progress line). A ``stop``
from the coordinator, a lost coordinator, SIGTERM or SIGINT all stop the replay the same way: every
request of the shard gets its row and the shard is closed. At the end it writes
``workers/wN/worker.json`` (clock offset, CPU time, send lag) and ``workers/wN/send_lag_ns.npy`` (the raw
send lags, for exact percentiles over every worker), whatever ended it.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
from pathlib import Path
from typing import Any, TextIO

import anyio
import numpy as np

from loadgen.rundir.identity import hostname_sha256
from loadgen.rundir.io import WORKERS_DIR
from loadgen.util import interrupts
from loadgen.util.errors import LoadgenError
from loadgen.util.outputfile import output_partial, write_output_text

from .control import TOKEN_ENV, Channel, measure_offset
from .options import RunOptions
from .partition import Shard, worker_name
from .progress import context_counts
from .run import _loadgen_error, run_trace

__all__ = ["WORKER_FILE", "WorkerStopped", "serve_worker", "serve_worker_sync"]

#: Per worker, beside its shard manifest: what the coordinator records about it.
WORKER_FILE = "worker.json"
LAG_FILE = "send_lag_ns.npy"


class WorkerStopped(LoadgenError):
    """The coordinator stopped this worker (or was lost) before the shared start."""


async def _watch(channel: Channel, scope: anyio.CancelScope, why: dict[str, str]) -> None:
    """Cancel the replay on ``stop`` or when the coordinator is gone (no message is expected otherwise)."""
    while True:
        message = await channel.receive()
        if message is None or "stop" in message:
            why["stopped_by"] = "coordinator lost" if message is None else str(message["stop"])
            scope.cancel()
            return


async def _report(channel: Channel, shard: Shard, interval_s: float) -> None:
    """Every ``interval_s``, the replay's live counts to the coordinator (its progress line)."""
    while True:
        await _send_counts(channel, shard)
        await anyio.sleep(interval_s)


async def _send_counts(channel: Channel, shard: Shard | None) -> None:
    if shard is not None and shard.live is not None:
        await channel.try_send({"progress": context_counts(shard.live).to_json()})


class _Worker:
    def __init__(self, channel: Channel, worker_id: int, node_ip: str | None) -> None:
        self.channel, self.worker_id, self.node_ip = channel, worker_id, node_ip
        self.clock: dict[str, int] = {}
        self.why: dict[str, str] = {}
        self.report_s: float | None = None  # set when the coordinator shows a progress line
        self.shard: Shard | None = None

    async def hello(self, token: str) -> tuple[RunOptions, int]:
        await self.channel.send(
            {
                "hello": self.worker_id,
                "token": token,
                "pid": os.getpid(),
                "host_sha256": hostname_sha256(),
                "node_ip": self.node_ip,
            }
        )
        setup = await self.channel.receive()
        if setup is None or "options" not in setup:
            raise WorkerStopped(f"worker {self.worker_id}: the coordinator refused it or closed the channel")
        report_s = setup.get("report_s")
        self.report_s = float(report_s) if isinstance(report_s, int | float) and report_s > 0 else None
        return RunOptions.model_validate(setup["options"]), int(setup["workers"])

    async def gate(self, scope: anyio.CancelScope, tg: anyio.abc.TaskGroup) -> int:
        """Measure the clock offset, say ready, wait for the shared start: the anchor on perf_counter_ns."""
        offset, uncertainty = await measure_offset(self.channel)
        self.clock = {"offset_ns": offset, "uncertainty_ns": uncertainty}
        await self.channel.send({"ready": True, **self.clock})
        message = await self.channel.receive()
        if message is None or "start_ns" not in message:
            reason = "the coordinator was lost" if message is None else f"stopped ({message.get('stop')})"
            raise WorkerStopped(f"worker {self.worker_id}: {reason} before the shared start")
        tg.start_soon(_watch, self.channel, scope, self.why)
        if self.report_s is not None and self.shard is not None:
            tg.start_soon(_report, self.channel, self.shard, self.report_s)
        start_here_ns = int(message["start_ns"]) + offset  # the shared instant on this host's clock
        return time.perf_counter_ns() + (start_here_ns - time.time_ns())


def _write_stats(run_dir: Path, worker: _Worker, shard: Shard | None, outcome: str) -> None:
    """worker.json and the raw send lags, beside the shard's manifest (best effort: never masks an error)."""
    directory = run_dir / WORKERS_DIR / worker_name(worker.worker_id)
    times = os.times()
    lags = np.asarray(shard.lag_ns if shard else [], dtype=np.int64)
    stats: dict[str, Any] = {
        "worker_id": worker.worker_id,
        "pid": os.getpid(),
        "host_sha256": hostname_sha256(),
        "node_ip": worker.node_ip,
        "clock_offset_ns": worker.clock.get("offset_ns"),
        "clock_offset_uncertainty_ns": worker.clock.get("uncertainty_ns"),
        "cpu_user_s": round(times.user, 4),
        "cpu_sys_s": round(times.system, 4),
        "dispatched": shard.dispatched if shard else 0,
        "outcome": outcome,
        **worker.why,
    }
    try:
        directory.mkdir(parents=True, exist_ok=True)
        with output_partial(directory / LAG_FILE) as partial, partial.open("wb") as f:
            np.save(f, lags)  # whole or absent: a full disk leaves no truncated file to misread
        write_output_text(directory / WORKER_FILE, json.dumps(stats, indent=2, sort_keys=True) + "\n")
    except OSError as exc:
        print(f"loadgen: warning: worker {worker.worker_id}: cannot write {directory}: {exc}", file=sys.stderr)


async def serve_worker(address: str, token: str, worker_id: int, node_ip: str | None = None) -> int:
    """Be worker ``worker_id`` of the coordinator at ``address`` (HOST:PORT); returns the exit status."""
    host, _, port = address.rpartition(":")
    stream = await anyio.connect_tcp(host.strip("[]"), int(port))
    channel = Channel(stream)
    worker = _Worker(channel, worker_id, node_ip)
    shard: Shard | None = None
    outcome, code = "complete", 0
    run_dir: Path | None = None
    try:
        options, workers = await worker.hello(token)
        run_dir = Path(options.out_dir)
        try:
            async with anyio.create_task_group() as tg:
                shard = worker.shard = Shard(worker_id, workers, lambda: worker.gate(tg.cancel_scope, tg))
                await run_trace(options, shard)
                tg.cancel_scope.cancel()  # the watcher and the reporter
        except BaseExceptionGroup as group:  # say what stopped it, in one line
            error = _loadgen_error(group)
            if error is not None:
                raise error from None
            raise
        if worker.why:
            outcome = f"stopped ({worker.why['stopped_by']})"
    except LoadgenError as exc:
        outcome, code = f"error: {exc}", 2
        with anyio.CancelScope(shield=True):
            await channel.try_send({"error": str(exc)})
        if not isinstance(exc, WorkerStopped):
            raise
    except BaseException:
        outcome, code = f"interrupted ({interrupts.cancel_cause()})", interrupts.exit_code()
        raise
    finally:
        if run_dir is not None:
            _write_stats(run_dir, worker, shard, outcome)
        with anyio.CancelScope(shield=True):
            if worker.report_s is not None:  # the final counts, for the progress line's last draw
                await _send_counts(channel, shard)
            await channel.aclose()
    return code


def serve_worker_sync(address: str, token: str, worker_id: int, node_ip: str | None = None) -> int:
    """``serve_worker`` on its own event loop (uvloop when installed), as ``run_trace_sync`` runs a run."""
    try:
        import uvloop  # noqa: F401

        backend_options = {"use_uvloop": True}
    except ImportError:
        backend_options = {}
    return anyio.run(
        serve_worker, address, token, worker_id, node_ip, backend="asyncio", backend_options=backend_options
    )


class _BestEffortLog:
    """A worker's stdout/stderr (its log.txt, in the run directory): a write that fails (a full disk)
    is dropped, never raised into the replay, whose records and manifest matter more than its log."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except OSError:
            return len(text)

    def flush(self) -> None:
        with contextlib.suppress(OSError):
            self._stream.flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="loadgen-worker", description="one worker of a loadgen run (internal)")
    parser.add_argument("--connect", required=True, help="the coordinator's HOST:PORT")
    parser.add_argument("--worker", type=int, required=True, help="this worker's id (0 ... N-1)")
    args = parser.parse_args(argv)
    token = os.environ.pop(TOKEN_ENV, "")
    sys.stdout, sys.stderr = _BestEffortLog(sys.stdout), _BestEffortLog(sys.stderr)
    interrupts.install()
    try:
        return serve_worker_sync(args.connect, token, args.worker)
    except LoadgenError as exc:
        print(f"loadgen: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"loadgen: worker {args.worker} interrupted ({interrupts.signal_name()})", file=sys.stderr)
        return interrupts.exit_code()


if __name__ == "__main__":  # pragma: no cover
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
