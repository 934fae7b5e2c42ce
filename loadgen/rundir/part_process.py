"""The part writer process: a child at low CPU priority that converts a run's rows and writes its part files.

Why: a flush's Parquet encoding, compression and ``fsync`` cost a writer thread 5-11 ms of CPU per 2,500
requests (40,000 chunk rows), and converting the rows to Arrow cost the event loop 20-35 ms more
(``benchmarks/bench_flush_cpu.py``). That CPU comes from the loop's core whenever they share it (one core per
worker): the schedule fell 6-52 ms behind at each flush (send-lag p99 at 2,500 req/s on one core). A thread
cannot simply run at a lower priority: when the OS holds it back while it holds the GIL, the loop waits for
it too (1 s stalls were measured at nice 19 beside a busy process). A child process holds no GIL of ours,
so it can run at a low priority (``priority_for``):

- ``idle``, where this process may run on one CPU only (pinned: one core per worker): ``SCHED_IDLE`` (nice 19
  where that policy is missing). The kernel gives it only CPU that nothing else wants, and a waking event loop
  preempts it at once.
- ``low``, where it may run on several: nice 10. At idle priority it would starve on a host whose every core
  is busy (measured: the suite beside two busy loops, flushes late by seconds), while here the kernel places
  it on another core whenever one has time.

It starts at normal priority (imports, Parquet's set-up), and says it is ready once it has lowered itself:
the driver waits for that (a little) before its clock starts.

The parent's writer thread sends each request and waits for the child's answer (so parts reach disk in
order, and a write error stops the run as before): a 4-byte header length, the JSON header, an 8-byte body
length and the body. ``{"op": "convert"}``: the body is the pickled list of ``rowtables.pack_slice``
slices; the answer is ``{"ok": true, "sizes": [R, C]}`` and, after its newline, the requests and chunks
tables as Arrow IPC streams of R and C bytes (0: no table). ``{"op": "write", "path", "meta", "fsync"}``:
the body is the table as an Arrow IPC stream; the answer ``{"ok": true}`` or ``{"path", "reason"}`` (a
``RecordWriteError``). The child writes with ``loadgen.rundir.parts.write_part_file`` and converts with
``loadgen.rundir.rowtables``, the one definitions of a part file and of the row tables; a conversion it cannot
do is done again in the parent, which then raises what it would have without a child.

The child ignores SIGINT, SIGTERM and SIGHUP (a Ctrl-C reaches the whole process group, and the parent
decides when the run ends) and exits at EOF: when the parent closes its end, or dies (SIGKILL), once the
part it is writing is whole. When the child cannot be started, dies, or is abandoned (``abandon``), the
writer thread converts and writes itself, as before, and ``warning`` says from which part on.
"""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import select
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any, Literal, cast, get_args

import psutil
import pyarrow as pa
import pyarrow.parquet as pq

from loadgen.rundir.parts import write_part_file
from loadgen.rundir.rowtables import unpack_slices
from loadgen.util.errors import RecordWriteError
from loadgen.util.pinning import affinity

__all__ = ["LOW_NICE", "PartProcess", "Priority", "priority_for"]

_READY = b'{"ready": true}'
#: How long a starting child may take (imports, Parquet's set-up) before the parts are written here instead.
READY_TIMEOUT_S = 120.0
#: How long a request may wait for the child's answer before the writer thread takes over (``_watch``). A
#: flush of 2,500 requests took the child 0.13-1.3 s at 2,500 req/s on the loop's own core.
ANSWER_TIMEOUT_S = 2.0
_PIPE_BYTES = 1 << 20  # a flush's IPC body in few pipe round trips (Linux's unprivileged maximum)
#: How long ``close`` waits for the killed child to be gone before a daemon thread reaps it (at idle priority
#: on a busy host, even dying waits for CPU).
_REAP_WAIT_S = 0.5

Priority = Literal["idle", "low", "normal"]
#: The child's nice value at ``low`` priority.
LOW_NICE = 10


def priority_for(cpus: frozenset[int] | None) -> Priority:
    """The child's priority for a process that may run on ``cpus`` (None: not known): ``idle`` on one CPU,
    where the only CPU it may take is what the loop leaves; ``low`` on several, where idle priority could starve
    it behind other busy processes (see module)."""
    return "idle" if cpus is not None and len(cpus) == 1 else "low"


def _lower_priority(priority: Priority) -> None:
    """This process at ``priority`` (a process may always lower its own)."""
    if priority == "normal":
        return
    if priority == "idle":
        try:
            os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
            return
        except (AttributeError, OSError):
            pass
    with contextlib.suppress(AttributeError, OSError):
        os.nice((19 if priority == "idle" else LOW_NICE) - os.nice(0))


class PartProcess:
    """The parent's end: ``write`` as ``loadgen.rundir.parts.write_part_file``, done by the child (see module).

    ``with PartProcess() as child:`` ends the child on leaving (as ``close``)."""

    def __init__(self, priority: Priority | None = None) -> None:
        """``priority``: what the child lowers itself to once started; None: ``priority_for`` this process's
        CPUs (a run's choice)."""
        self.priority: Priority = priority or priority_for(affinity())
        self.warning: str | None = None
        self.cpu_s: float | None = None  # the child's user + system CPU, once closed
        self.parts = 0  # written by the child
        self.thread_parts = 0  # written by the calling thread (the child not ready yet, or lost)
        self._ready = False
        self._reading = threading.Lock()
        self._abandoned: str | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        try:
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "loadgen.rundir.part_process", self.priority],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                close_fds=True,
                env=_same_loadgen_env(),
            )
        except OSError as exc:
            self.warning = f"part writer process not started ({exc}): parts written in the writer thread"
            return
        for pipe in (self._proc.stdin, self._proc.stdout):
            with contextlib.suppress(ImportError, AttributeError, OSError):
                import fcntl  # POSIX only (F_SETPIPE_SZ: Linux)

                fcntl.fcntl(pipe.fileno(), fcntl.F_SETPIPE_SZ, _PIPE_BYTES)  # type: ignore[union-attr]

    def wait_ready(self, timeout_s: float = READY_TIMEOUT_S) -> bool:
        """Wait up to ``timeout_s`` until the child has started (imports, Parquet's set-up, at normal
        priority: the driver waits a little before its clock starts) and lowered its priority; True once it
        has. Until then parts are written in the calling thread; a child that has not started within
        ``READY_TIMEOUT_S`` (or cannot) is not used."""
        with self._reading:
            return self._poll_ready(timeout_s)

    def _poll_ready(self, timeout_s: float) -> bool:
        proc = self._proc
        if proc is None or self._ready:
            return self._ready and proc is not None
        assert proc.stdout is not None
        try:
            started, _, _ = select.select([proc.stdout], [], [], timeout_s)
            if not started and timeout_s < READY_TIMEOUT_S:
                return False
            line = proc.stdout.readline() if started else b""
        except (OSError, ValueError):
            line = b""
        if line.strip() != _READY:
            self._lost(proc)
            return False
        self._ready = True
        return True

    @property
    def running(self) -> bool:
        """Started, ready, and not lost: conversions and parts go to it (checked without waiting)."""
        if self._proc is None:
            return False
        if self._ready:
            return True
        if not self._reading.acquire(blocking=False):  # the writer thread is asking it
            return False
        try:
            return self._poll_ready(0.0)
        finally:
            self._reading.release()

    @property
    def kind(self) -> str:
        """What wrote the parts: ``process``, ``thread`` (the child never did), or ``both`` (it was not ready
        yet, or was lost: ``warning`` says why)."""
        if self.thread_parts == 0:
            return "process"
        return "both" if self.parts else "thread"

    def write(self, final: Path, table: pa.Table, meta: dict[str, str], fsync: bool) -> None:
        """Write one part (``write_part_file``'s contract); the child's write error is raised here."""
        proc = self._proc
        if proc is None or not self.running:
            write_part_file(final, table, meta, fsync)
            self.thread_parts += 1
            return
        header = {"op": "write", "path": os.path.abspath(final), "meta": meta, "fsync": fsync}
        with self._watch():
            reply = self._ask(proc, header, _ipc_bytes(table))
        if reply is None:  # the child is gone: this part and the rest, here
            self._lost(proc)
            write_part_file(final, table, meta, fsync)
            self.thread_parts += 1
            return
        if not reply.get("ok"):  # named by the path as this process knows it
            raise RecordWriteError(final, str(reply.get("reason", "part writer failed")))
        self.parts += 1

    def convert(self, packed: list[bytes]) -> tuple[pa.Table | None, pa.Table | None]:
        """``rowtables.unpack_slices(packed)``, done by the child (it holds no GIL of ours); here when it is
        gone, or when it could not (the same error is then raised here, as without a child)."""
        proc = self._proc
        if proc is None or not self.running:
            return unpack_slices(packed)
        assert proc.stdout is not None
        with self._watch():
            reply = self._ask(proc, {"op": "convert"}, pickle.dumps(packed, 5))
            try:
                sizes = reply["sizes"] if reply is not None and reply.get("ok") else []
                tables = [_from_ipc(proc.stdout.read(size)) if size else None for size in sizes]
            except (OSError, ValueError, pa.ArrowInvalid):
                reply = None
        if reply is None:
            self._lost(proc)
            return unpack_slices(packed)
        if not reply.get("ok"):
            return unpack_slices(packed)
        return tables[0], tables[1]

    def _ask(self, proc: subprocess.Popen[bytes], header: dict, body: Any) -> dict | None:
        """Send one request (``header``, ``body``: bytes or a ``pa.Buffer``); its answer, None if the child died
        or was abandoned meanwhile (see ``_watch``)."""
        head = json.dumps(header).encode()
        assert proc.stdin is not None and proc.stdout is not None
        size = body.size if isinstance(body, pa.Buffer) else len(body)
        try:
            proc.stdin.write(len(head).to_bytes(4, "big") + head + size.to_bytes(8, "big"))
            proc.stdin.write(body)  # a pa.Buffer has the buffer protocol
            proc.stdin.flush()
            line = proc.stdout.readline()
        except OSError:  # BrokenPipeError: it died
            return None
        try:
            return json.loads(line) if line else None
        except ValueError:
            return None

    @contextlib.contextmanager
    def _watch(self) -> Iterator[None]:
        """A request that the child has not answered within ``ANSWER_TIMEOUT_S`` abandons it: at idle priority on
        a host with no idle CPU (every core busy) it may not run for a long time, and the rows would wait in
        memory meanwhile. Its request then fails, and the writer thread does the work, from then on."""
        timer = threading.Timer(
            ANSWER_TIMEOUT_S,
            self.abandon,
            (f"it had not answered within {ANSWER_TIMEOUT_S:g} s: idle priority on a host with no idle CPU",),
        )
        timer.daemon = True
        timer.start()
        try:
            yield
        finally:
            timer.cancel()

    def abandon(self, why: str) -> None:
        """Stop the child from another thread; a ``write`` waiting for it writes its part in its own thread,
        and so does every later one. ``why`` goes into ``warning``."""
        proc = self._proc
        if proc is None:
            return
        self._abandoned = why
        with contextlib.suppress(OSError):
            proc.kill()

    def _lost(self, proc: subprocess.Popen[bytes]) -> None:
        self._proc = None
        _end(proc)
        if self._abandoned:
            self.warning = (
                f"the part writer process was stopped after {self.parts} part(s) ({self._abandoned}): the rest "
                "were written in the writer thread"
            )
        elif self._ready:
            self.warning = (
                f"the part writer process ended (exit status {proc.returncode}) after {self.parts} part(s): "
                "the rest were written in the writer thread"
            )
        else:
            self.warning = (
                f"the part writer process did not start (exit status {proc.returncode}): parts written in the "
                "writer thread"
            )

    def __enter__(self) -> PartProcess:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        """End the child; its CPU time so far goes to ``cpu_s``. Idempotent.

        Every part it wrote was answered, so it holds nothing: it is killed rather than left to exit, which
        at idle priority on a saturated host could take seconds."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        with contextlib.suppress(psutil.Error):
            times = psutil.Process(proc.pid).cpu_times()
            self.cpu_s = round(times.user + times.system, 4)
        _end(proc)


def _end(proc: subprocess.Popen[bytes]) -> None:
    """Kill the child and close our ends; reaped here within ``_REAP_WAIT_S``, else by a daemon thread (a killed
    process at idle priority dies only once it gets CPU, which a saturated host may not give it for seconds)."""
    with contextlib.suppress(OSError):
        proc.kill()
    for pipe in (proc.stdin, proc.stdout):
        with contextlib.suppress(OSError):
            pipe.close()  # type: ignore[union-attr]
    try:
        proc.wait(timeout=_REAP_WAIT_S)
    except subprocess.TimeoutExpired:
        threading.Thread(target=proc.wait, name="loadgen-part-writer-reaper", daemon=True).start()


def _ipc_stream(sink: pa.NativeFile, table: pa.Table) -> None:
    with pa.ipc.new_stream(sink, table.schema) as stream:
        stream.write_table(table)


def _ipc_bytes(table: pa.Table) -> pa.Buffer:
    """``table`` as an Arrow IPC stream, copied once (sized first: a growing buffer would copy it again
    at every doubling)."""
    size = pa.MockOutputStream()
    _ipc_stream(size, table)
    data = pa.allocate_buffer(size.size())
    _ipc_stream(pa.FixedSizeBufferWriter(data), table)
    return data


def _from_ipc(data: bytes) -> pa.Table:
    if len(data) < 8:
        raise ValueError("short read")
    return pa.ipc.open_stream(pa.py_buffer(data)).read_all()


def _same_loadgen_env() -> dict[str, str]:
    """This environment, with this loadgen's package directory first on the child's path (it runs the same
    code as its parent, also when the parent found loadgen through a path set at run time)."""
    root = str(Path(__file__).resolve().parent.parent)
    path = os.environ.get("PYTHONPATH")
    return {**os.environ, "PYTHONPATH": root + (os.pathsep + path if path else "")}


# ---- the child ---------------------------------------------------------------------------------------------


def _exact(stream: IO[bytes], n: int) -> bytes:
    data = stream.read(n)
    if len(data) < n:
        raise EOFError
    return data


def _serve(inp: IO[bytes], out: IO[bytes]) -> None:
    """Answer requests until EOF (see module docstring for the framing)."""
    while True:
        try:
            header = json.loads(_exact(inp, int.from_bytes(_exact(inp, 4), "big")))
            body = _exact(inp, int.from_bytes(_exact(inp, 8), "big"))
        except EOFError:
            return
        payload = b""
        try:
            if header["op"] == "convert":
                tables = unpack_slices(pickle.loads(body))  # our parent's bytes
                blobs = [_ipc_bytes(t).to_pybytes() if t is not None else b"" for t in tables]
                reply: dict = {"ok": True, "sizes": [len(b) for b in blobs]}
                payload = b"".join(blobs)
            else:
                table = pa.ipc.open_stream(pa.py_buffer(body)).read_all()
                write_part_file(Path(header["path"]), table, header["meta"], bool(header["fsync"]))
                reply = {"ok": True}
        except RecordWriteError as exc:
            reply = {"path": exc.path, "reason": exc.reason}
        except Exception as exc:  # a write: stops the run in one line; a conversion: the parent converts
            reply = {"reason": f"part writer: {type(exc).__name__}: {exc}"}
        out.write(json.dumps(reply).encode() + b"\n" + payload)
        out.flush()


def _priority_arg(argv: list[str]) -> Priority:
    return cast(Priority, argv[0]) if argv and argv[0] in get_args(Priority) else "idle"


def main() -> None:
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    warm = pa.table({"x": pa.array([0], pa.int64())})  # Parquet's one-time set-up, before the first part
    pq.write_table(warm, pa.BufferOutputStream(), compression="zstd")
    _lower_priority(_priority_arg(sys.argv[1:]))
    sys.stdout.buffer.write(_READY + b"\n")
    sys.stdout.buffer.flush()
    _serve(sys.stdin.buffer, sys.stdout.buffer)
    os._exit(0)  # nothing to tear down: every part was answered


if __name__ == "__main__":
    main()
