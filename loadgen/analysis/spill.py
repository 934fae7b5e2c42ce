"""Samples larger than memory, kept exact: ascending runs spilled to disk and memory-mapped.

The chunk pass yields one value per token gap and one per chunk gap: 10^9 chunk rows make ~17 GB of
int64/float64, more than the machine holds. ``SortedRuns`` buffers every sample in memory up to one
shared budget (``--memory-mib``, ``LOADGEN_ANALYZE_MEMORY_MIB``); when the buffers hold more, the
largest one is sorted and written as a *run* (a raw native-endian array) into a private temporary
directory (``--spill-dir``, ``LOADGEN_ANALYZE_SPILL_DIR``, else the system's), and its sum is kept.
``finish`` returns each sample as its ascending runs: the spilled ones as ``RunFile`` (read a block
at a time, never mapped, so their pages are not this process's memory), the rest in memory.
``percentiles.SortedParts`` selects order statistics from them (a search over every run's sample of
each 1,024th value, then one block per run): the very element of each rank, so the linear rule gives
the same bits as one sorted array. Runs are sorted and written on a background thread, one at a time,
so memory holds the buffers (up to the budget) plus the one run being written (up to the budget
again). A run that fits the budget writes nothing and yields one in-memory array per sample.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Hashable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from loadgen.util.errors import RunDirError

__all__ = ["DEFAULT_MEMORY_MIB", "MEMORY_ENV", "SPILL_DIR_ENV", "RunFile", "SortedRuns", "SpillConfig"]

#: Default budget for the buffered samples (MiB); the one run being sorted and written counts apart.
DEFAULT_MEMORY_MIB = 256.0
MEMORY_ENV = "LOADGEN_ANALYZE_MEMORY_MIB"
SPILL_DIR_ENV = "LOADGEN_ANALYZE_SPILL_DIR"
_MIB = 1 << 20


@dataclass(frozen=True)
class SpillConfig:
    """How much the analysis buffers in memory before it spills, and where it spills."""

    memory_bytes: int
    spill_dir: Path | None = None

    @classmethod
    def resolve(cls, memory_mib: float | None = None, spill_dir: Path | str | None = None) -> SpillConfig:
        """Arguments first, then the environment, then the defaults; a bad value is one line."""
        source = "--memory-mib"
        if memory_mib is None and os.environ.get(MEMORY_ENV):
            source = MEMORY_ENV
            try:
                memory_mib = float(os.environ[MEMORY_ENV])
            except ValueError:
                raise RunDirError(
                    f"{MEMORY_ENV}={os.environ[MEMORY_ENV]!r}: expected a positive number of MiB"
                ) from None
        mib = DEFAULT_MEMORY_MIB if memory_mib is None else float(memory_mib)
        if not mib > 0 or not np.isfinite(mib):
            raise RunDirError(f"{source} {memory_mib!r}: expected a positive number of MiB")
        where = spill_dir if spill_dir is not None else os.environ.get(SPILL_DIR_ENV) or None
        if where is not None and not Path(where).is_dir():
            raise RunDirError(f"spill directory {str(where)!r}: not a directory: expected an existing directory")
        return cls(max(int(mib * _MIB), 1), Path(where) if where is not None else None)


#: Every this many values of a run, one is kept in memory: a search reads one block of the file.
_BLOCK = 1024


class RunFile:
    """One ascending run on disk, read by blocks (never mapped: its pages do not count as this process's RSS).

    Offers what ``SortedParts`` uses of an array: ``len``, ``dtype``, indexing by one position and
    ``searchsorted``, which finds the block in an in-memory sample of every ``_BLOCK``-th value and
    reads that block alone (one ``pread``).
    """

    __slots__ = ("disk_dtype", "dtype", "fd", "n", "path", "sample")

    stride = _BLOCK  # sample[i] = run[i * stride]

    def __init__(self, path: Path, run: np.ndarray, disk_dtype: np.dtype[Any] | None = None) -> None:
        self.path, self.dtype, self.n = path, run.dtype, len(run)
        self.disk_dtype = run.dtype if disk_dtype is None else disk_dtype  # narrower on disk: see ``_narrowest``
        self.sample = run[::_BLOCK].copy()  # sample[i] = run[i * _BLOCK]
        self.fd = os.open(path, os.O_RDONLY)

    def __len__(self) -> int:
        return self.n

    def read(self, start: int, count: int) -> np.ndarray:
        """``count`` values from position ``start`` (one ``pread``)."""
        size = self.disk_dtype.itemsize
        data = os.pread(self.fd, count * size, start * size)
        return np.frombuffer(data, dtype=self.disk_dtype, count=count).astype(self.dtype, copy=False)

    def __getitem__(self, i: int) -> Any:
        if i < 0:
            i += self.n
        if not 0 <= i < self.n:
            raise IndexError(i)
        return self.read(i, 1)[0]

    def searchsorted(self, x: Any, side: str = "left") -> Any:
        if np.ndim(x):
            return self._searchsorted_many(np.asarray(x), side)
        # the block that holds the answer: after the last sampled value before x (side rule kept)
        b = int(np.searchsorted(self.sample, x, side=side))  # type: ignore[call-overload]
        if b == 0:
            return 0
        start = (b - 1) * _BLOCK
        block = self.read(start, min(_BLOCK, self.n - start))
        return start + int(np.searchsorted(block, x, side=side))  # type: ignore[call-overload]

    def _searchsorted_many(self, xs: np.ndarray, side: str) -> np.ndarray:
        """``searchsorted`` of every value in ``xs``: each block any of them falls in is read once."""
        blocks = np.searchsorted(self.sample, xs, side=side)  # type: ignore[call-overload]
        out = np.zeros(len(xs), dtype=np.int64)
        order = np.argsort(blocks, kind="stable")
        ids, starts = np.unique(blocks[order], return_index=True)
        for b, group in zip(ids.tolist(), np.split(order, starts[1:]), strict=True):
            if b == 0:
                continue  # before the first value: position 0
            start = (b - 1) * _BLOCK
            block = self.read(start, min(_BLOCK, self.n - start))
            out[group] = start + np.searchsorted(block, xs[group], side=side)  # type: ignore[call-overload]
        return out

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


class _Sample:
    """One sample being gathered: in-memory pieces plus the runs already on disk."""

    __slots__ = ("dtype", "nbytes", "pieces", "runs", "sums")

    def __init__(self, dtype: Any) -> None:
        self.dtype = np.dtype(dtype)
        self.pieces: list[np.ndarray] = []
        self.nbytes = 0
        self.runs: list[RunFile] = []
        self.sums: list[float] = []

    def take_pieces(self) -> list[np.ndarray]:
        """The buffered pieces, unsorted (the buffer is emptied)."""
        pieces, self.pieces, self.nbytes = self.pieces, [], 0
        return pieces

    def take(self) -> np.ndarray:
        """The buffered values as one ascending array (the buffer is emptied)."""
        return _ascending(self.take_pieces(), self.dtype)


def _ascending(pieces: list[np.ndarray], dtype: np.dtype[Any], scratch: np.ndarray | None = None) -> np.ndarray:
    """``pieces`` as one ascending array; the list is emptied, so the pieces are freed once copied.
    With ``scratch`` (bytes) large enough, the array is laid out in it rather than in fresh memory."""
    if not pieces:
        return np.empty(0, dtype=dtype)
    n = sum(len(p) for p in pieces)
    if len(pieces) == 1:
        v = pieces[0]
    elif scratch is not None and n * dtype.itemsize <= scratch.nbytes:
        v = np.concatenate(pieces, out=scratch[: n * dtype.itemsize].view(dtype))
    else:
        v = np.concatenate(pieces)
    pieces.clear()
    v.sort()
    return v


class SortedRuns:
    """Samples keyed by any hashable, gathered under one memory budget (see module docstring).

    A spill sorts and writes its run on one background thread (numpy's sort and the write release
    the GIL), so on a machine with a second core the chunk pass goes on meanwhile. One spill is in
    flight at a time, and runs are recorded in the order they were started: the runs, their sums
    and so every figure are the same as with the writes done in line.
    """

    def __init__(self, config: SpillConfig, dtypes: dict[Hashable, Any]) -> None:
        self.config = config
        self.samples = {key: _Sample(dtype) for key, dtype in dtypes.items()}
        self.buffered = 0
        self.spilled_bytes = 0
        self.n_runs = 0
        self._dir: Path | None = None
        self._writer: ThreadPoolExecutor | None = None
        self._pending: tuple[_Sample, Future[tuple[RunFile, float]]] | None = None
        self._scratch = np.empty(0, dtype=np.uint8)  # the run in flight is laid out here

    def add(self, key: Hashable, values: np.ndarray) -> None:
        if not len(values):
            return
        s = self.samples[key]
        piece = np.asarray(values, dtype=s.dtype)
        if piece.base is not None:  # a view (of a batch): keep a copy, not the batch
            piece = piece.copy()
        s.pieces.append(piece)
        s.nbytes += piece.nbytes
        self.buffered += piece.nbytes
        while self.buffered > self.config.memory_bytes:
            self._spill(max(self.samples.values(), key=lambda x: x.nbytes))

    def _spill(self, s: _Sample) -> None:
        self.buffered -= s.nbytes
        pieces = s.take_pieces()
        path = self._run_dir() / f"run-{self.n_runs:06d}.bin"
        self.n_runs += 1
        self._settle()  # one spill in flight: memory holds the buffers plus this one run being written
        if self._writer is None:
            self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="loadgen-spill")
        nbytes = sum(p.nbytes for p in pieces)
        if self._scratch.nbytes < nbytes:  # grown to the largest run so far (the budget, at most about)
            self._scratch = np.empty(nbytes, dtype=np.uint8)
        self._pending = (s, self._writer.submit(_write_run, pieces, s.dtype, path, self._scratch))
        del pieces

    def _run_dir(self) -> Path:
        if self._dir is None:
            where = str(self.config.spill_dir) if self.config.spill_dir is not None else None
            try:
                self._dir = Path(tempfile.mkdtemp(prefix="loadgen-analyze-", dir=where))
            except OSError as exc:
                raise RunDirError(f"spill directory {where or tempfile.gettempdir()!r}: {exc.strerror}") from None
        return self._dir

    def _settle(self) -> None:
        """Wait for the spill in flight and record its run (its error, such as a full disk, raises here)."""
        if self._pending is None:
            return
        s, future = self._pending
        self._pending = None
        run, total = future.result()
        s.runs.append(run)
        s.sums.append(total)
        self.spilled_bytes += run.n * run.disk_dtype.itemsize

    def finish(self, key: Hashable) -> tuple[list[np.ndarray], list[float] | None]:
        """Sample ``key`` as ascending parts (arrays or ``RunFile``) and their sums (None when nothing of it was spilled: one
        in-memory array, summed by the caller as before)."""
        self._settle()
        self._scratch = np.empty(0, dtype=np.uint8)  # no more spills once samples are taken
        s = self.samples[key]
        self.buffered -= s.nbytes
        last = s.take()
        if not s.runs:
            return [last], None
        parts: list[Any] = list(s.runs)
        sums = list(s.sums)
        if len(last):
            parts.append(last)
            sums.append(float(np.sum(last, dtype=np.float64)))
        return parts, sums

    def close(self) -> None:
        """Stop the writer and delete every run (idempotent)."""
        if self._writer is not None:
            self._writer.shutdown(wait=True)
            self._writer = None
        self._scratch = np.empty(0, dtype=np.uint8)
        if self._pending is not None:
            s, future = self._pending
            self._pending = None
            if future.exception() is None:
                s.runs.append(future.result()[0])
        for s in self.samples.values():
            for run in s.runs:
                run.close()
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None


def _write_run(
    pieces: list[np.ndarray], dtype: np.dtype[Any], path: Path, scratch: np.ndarray
) -> tuple[RunFile, float]:
    """Sort ``pieces`` into one run, write it to ``path``: the run on disk and its sum (on the writer thread).
    The run is laid out in ``scratch``, reused from spill to spill (one is in flight at a time), so each
    spill does not fault in and zero a fresh run's worth of pages."""
    run = _ascending(pieces, dtype, scratch)
    disk = _narrowest(run)
    try:
        with open(path, "wb") as f:
            if disk == run.dtype:
                f.write(run.data.cast("B"))  # raises with its errno, even when the write was short
            else:  # converted block by block: no run-sized temporary
                for a in range(0, len(run), _BLOCK * 1024):
                    f.write(run[a : a + _BLOCK * 1024].astype(disk).data.cast("B"))
    except OSError as exc:
        raise RunDirError(
            f"{path}: {exc.strerror or exc}: spilling {run.nbytes / _MIB:.1f} MiB of analysis samples "
            f"(free space under --spill-dir / {SPILL_DIR_ENV}, or raise --memory-mib)"
        ) from None
    return RunFile(path, run, disk), float(np.sum(run, dtype=np.float64))


def _narrowest(run: np.ndarray) -> np.dtype[Any]:
    """The dtype ``run`` (ascending) is written in: for integers whose range fits, the narrowest unsigned
    type that holds it (inter-chunk gaps in ns under 4.3 s fit 32 bits: half the bytes written and read
    back), else its own. Values are unchanged: read back, they are cast to the run's dtype."""
    if run.dtype.kind != "i" or not len(run) or run[0] < 0:
        return run.dtype
    for narrow in (np.uint8, np.uint16, np.uint32):
        if run[-1] <= np.iinfo(narrow).max and np.dtype(narrow).itemsize < run.dtype.itemsize:
            return np.dtype(narrow)
    return run.dtype
