"""What a flush costs the driver's own process: parts written in the writer thread, or by the part writer process.

A flush happens every ``--flush-interval-s`` (1 s) during a run, and its CPU competes with the event loop for
the client's core. This builds the recorder's tables for ``--requests`` requests of ``--chunks`` chunks each
(one second at that rate), then flushes them as the recorder does, ``--repeats`` times each way, alternating:

- ``thread`` (before): the loop converts the rows to Arrow in slices, and the writer thread encodes,
  compresses and syncs the Parquet parts itself;
- ``process``: the loop only packs the rows (``rowtables.pack_slice``), and the writer thread hands them to
  ``loadgen.rundir.part_process`` (a child at SCHED_IDLE) to convert, then the tables to write, waiting for its answers.

For each it prints the median and range of the CPU per flush on the loop and in the writer thread
(``time.thread_time``: what the loop's core loses, whoever else runs), the writer thread's wall time, and
the child's CPU per flush (its total, start-up included, from ``psutil``, over the flushes). The first flush
of each kind is a warm-up and is not counted. Pin it (``taskset -c 0``) to see the one-core case the driver is tuned for.

Then, with ``--lag-s`` > 0, what the flushes do to an event loop's schedule, without a network or a server in
the way: on uvloop, a task waits for deadlines ``1/--requests`` s apart with the driver's own ``sleep_until``
and submits one request (``--chunks`` chunks) per deadline to a real ``Recorder``, whose writer task flushes
every second, in the writer thread or through the part writer process. It prints the lateness of the
deadlines (p50, p99, max, how many were over 1 ms), each kind run ``--lag-repeats`` times, alternating.

    taskset -c 0 python benchmarks/bench_flush_cpu.py
    python benchmarks/bench_flush_cpu.py --requests 1000 --chunks 64
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from array import array
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from loadgen.driver.recorder import SLICE_ROWS, Recorder, StreamChunks, warm_up_arrow
from loadgen.rundir.io import RunWriter
from loadgen.rundir.manifest import Manifest
from loadgen.rundir.part_process import PartProcess
from loadgen.rundir.schema import empty_request_row


def _fill(recorder: Recorder, requests: int, chunks: int, tag: str, convert: bool = True) -> None:
    for i in range(requests):
        row = empty_request_row(
            request_id=f"{tag}-{i:07d}",
            request_class="short",
            scheduled_ns=i * 400_000,
            target_prompt_tokens=64,
            target_output_tokens=chunks,
            status="ok",
        )
        arrivals = array("q", range(i * 400_000, i * 400_000 + chunks * 20_000, 20_000))
        recorder.submit(row, StreamChunks(arrivals, array("q", [1] * chunks), array("q", [180] * chunks)))
    if convert:
        recorder.convert()


def _convert(recorder: Recorder) -> float:
    """The loop's part of a flush, as the writer task does it (``SLICE_ROWS`` at a time); its CPU ms."""
    cpu0 = time.thread_time()
    while recorder.convert(SLICE_ROWS) == SLICE_ROWS:
        pass
    return 1e3 * (time.thread_time() - cpu0)


def _flush(recorder: Recorder) -> tuple[float, float]:
    """One flush as the writer thread does it; (this thread's CPU ms, wall ms)."""
    taken = recorder._take()
    cpu0, wall0 = time.thread_time(), time.perf_counter()
    recorder._write(taken, {}, recorder.part_process)
    return 1e3 * (time.thread_time() - cpu0), 1e3 * (time.perf_counter() - wall0)


async def _paced(recorder: Recorder, rate: float, chunks: int, seconds: float) -> list[int]:
    """Deadlines ``1/rate`` apart for ``seconds``, one submitted request each; returns each one's lateness (ns)."""
    import anyio

    from loadgen.driver.run import replay_settings
    from loadgen.driver.schedule import sleep_until

    late: list[int] = []
    step = int(1e9 / rate)
    with replay_settings():  # the driver's, for its replay
        async with anyio.create_task_group() as tg:
            await tg.start(recorder.run)
            start = time.perf_counter_ns() + 50_000_000
            for i in range(int(seconds * rate)):
                deadline = start + i * step
                await sleep_until(deadline)
                late.append(time.perf_counter_ns() - deadline)
                _fill(recorder, 1, chunks, f"lag{i}", convert=False)
            tg.cancel_scope.cancel()
    return late


def _lag_run(kind: str, rate: float, chunks: int, seconds: float, tmp: Path) -> tuple[list[int], float | None]:
    import anyio

    sink = PartProcess() if kind == "process" else None
    if sink is not None:
        sink.wait_ready()  # as the driver does, before its clock starts
    writer = RunWriter(tmp / f"lag-{kind}-{time.monotonic_ns()}", Manifest(), flush_rows=1 << 60)
    recorder = Recorder(writer, part_process=sink)
    try:
        late = anyio.run(_paced, recorder, rate, chunks, seconds, backend="asyncio", backend_options=_uvloop())
    finally:
        recorder.finish()
        writer.close()
    return late, sink.cpu_s if sink is not None else None


def _uvloop() -> dict[str, bool]:
    try:
        import uvloop  # noqa: F401
    except ImportError:
        return {}
    return {"use_uvloop": True}


def _lateness(late: list[int]) -> str:
    ordered = sorted(late)
    p = lambda q: ordered[min(len(ordered) - 1, int(q * len(ordered)))] / 1e3
    over = sum(v > 1_000_000 for v in late)
    return f"p50 {p(0.5):7.1f} µs  p99 {p(0.99):8.1f} µs  max {ordered[-1] / 1e3:8.1f} µs  >1 ms: {over}"


def _line(name: str, values: list[float]) -> str:
    return f"{name} median {statistics.median(values):7.2f}  range {min(values):7.2f}-{max(values):7.2f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=2500, help="requests per flush (default 2500)")
    parser.add_argument("--chunks", type=int, default=16, help="chunks per request (default 16)")
    parser.add_argument("--repeats", type=int, default=15, help="flushes counted per kind (default 15)")
    parser.add_argument("--lag-s", type=float, default=5.0, help="seconds per paced run (default 5; 0: none)")
    parser.add_argument("--lag-repeats", type=int, default=3, help="paced runs per kind (default 3)")
    args = parser.parse_args()
    warm_up_arrow()
    sink = PartProcess()
    sink.wait_ready()
    figures: dict[str, dict[str, list[float]]] = {k: {"loop": [], "cpu": [], "wall": []} for k in ("thread", "process")}
    with tempfile.TemporaryDirectory() as tmp:
        writers = {kind: RunWriter(Path(tmp) / kind, Manifest(), flush_rows=1 << 60) for kind in figures}
        recorders = {
            "thread": Recorder(writers["thread"]),
            "process": Recorder(writers["process"], part_process=sink),
        }
        for rep in range(args.repeats + 1):
            for kind, recorder in recorders.items():
                _fill(recorder, args.requests, args.chunks, f"{kind}{rep}", convert=False)
                loop_ms = _convert(recorder)
                cpu_ms, wall_ms = _flush(recorder)
                if rep:
                    for key, value in (("loop", loop_ms), ("cpu", cpu_ms), ("wall", wall_ms)):
                        figures[kind][key].append(value)
        sink.close()
        for writer in writers.values():
            writer.close()
    rows = args.requests * args.chunks
    print(f"one flush of {args.requests} requests and {rows} chunk rows, {args.repeats} flushes per kind (CPU ms)")
    for kind, fig in figures.items():
        print(f"  {kind:8s} on the loop (converting or packing, {SLICE_ROWS}-row slices): {_line('', fig['loop'])}")
        print(f"  {kind:8s} in the writer thread: {_line('', fig['cpu'])}   its wall ms: {_line('', fig['wall'])}")
    if sink.cpu_s is not None:
        per = 1e3 * sink.cpu_s / (args.repeats + 1)
        print(f"  process  the child's CPU: {sink.cpu_s:.3f} s in all, {per:.2f} ms per flush (start-up included)")
    if sink.warning:
        print(f"  note: {sink.warning}")
    if args.lag_s <= 0:
        return
    print(
        f"lateness of deadlines at {args.requests} req/s x {args.chunks} chunks, flushing every 1 s, {args.lag_s} s a run"
    )
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(args.lag_repeats):
            for kind in ("thread", "process"):
                late, child_cpu_s = _lag_run(kind, args.requests, args.chunks, args.lag_s, Path(tmp))
                extra = f"  (child CPU {child_cpu_s:.2f} s)" if child_cpu_s is not None else ""
                print(f"  {rep + 1} {kind:8s} {_lateness(late)}{extra}")


if __name__ == "__main__":
    from docs_page import recorded  # why: run as a script, benchmarks/ is on sys.path

    with recorded(__file__):  # its figures into docs/benchmarks.md
        main()
