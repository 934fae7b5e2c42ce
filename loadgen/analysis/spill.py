"""Samples larger than memory, kept exact: ascending runs spilled to disk and memory-mapped.

The chunk pass yields one value per token gap and one per chunk gap: 10^9 chunk rows make ~17 GB of
int64/float64, more than the machine holds. ``SortedRuns`` buffers every sample in memory up to one
shared budget (``--memory-mib``, ``LOADGEN_ANALYZE_MEMORY_MIB``); when the buffers hold more, the
largest one is sorted and written as a *run* (a raw native-endian array) into a private temporary
directory (``--spill-dir``, ``LOADGEN_ANALYZE_SPILL_DIR``, else the system's), and its sum is kept.
``finish`` returns each sample as its ascending runs: the spilled ones as ``RunFile`` (read a block
at a time, never mapped, so their pages are not this process's memory), the rest in memory.
``percentiles.SortedParts`` selects order statistics from them by binary search over the value
space: the very element of each rank, so the linear rule gives the same bits as one sorted array,
reading one block per run per search. A run that fits the budget writes nothing and yields one
in-memory array per sample, exactly as before.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Hashable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import RunDirError

__all__ = ["DEFAULT_MEMORY_MIB", "MEMORY_ENV", "SPILL_DIR_ENV", "RunFile", "SortedRuns", "SpillConfig"]

#: Default budget for the buffered samples (MiB); sorting a buffer briefly needs twice its size.
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

    __slots__ = ("dtype", "fd", "n", "path", "sample")

    def __init__(self, path: Path, run: np.ndarray) -> None:
        self.path, self.dtype, self.n = path, run.dtype, len(run)
        self.sample = run[::_BLOCK].copy()  # sample[i] = run[i * _BLOCK]
        self.fd = os.open(path, os.O_RDONLY)

    def __len__(self) -> int:
        return self.n

    def _read(self, start: int, count: int) -> np.ndarray:
        size = self.dtype.itemsize
        data = os.pread(self.fd, count * size, start * size)
        return np.frombuffer(data, dtype=self.dtype, count=count)

    def __getitem__(self, i: int) -> Any:
        if i < 0:
            i += self.n
        if not 0 <= i < self.n:
            raise IndexError(i)
        return self._read(i, 1)[0]

    def searchsorted(self, x: Any, side: str = "left") -> Any:
        if np.ndim(x):
            return self._searchsorted_many(np.asarray(x), side)
        # the block that holds the answer: after the last sampled value before x (side rule kept)
        b = int(np.searchsorted(self.sample, x, side=side))  # type: ignore[call-overload]
        if b == 0:
            return 0
        start = (b - 1) * _BLOCK
        block = self._read(start, min(_BLOCK, self.n - start))
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
            block = self._read(start, min(_BLOCK, self.n - start))
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

    def take(self) -> np.ndarray:
        """The buffered values as one ascending array (the buffer is emptied)."""
        pieces, self.pieces, self.nbytes = self.pieces, [], 0
        if not pieces:
            return np.empty(0, dtype=self.dtype)
        v = pieces[0] if len(pieces) == 1 else np.concatenate(pieces)
        del pieces
        v.sort()
        return v


class SortedRuns:
    """Samples keyed by any hashable, gathered under one memory budget (see module docstring)."""

    def __init__(self, config: SpillConfig, dtypes: dict[Hashable, Any]) -> None:
        self.config = config
        self.samples = {key: _Sample(dtype) for key, dtype in dtypes.items()}
        self.buffered = 0
        self.spilled_bytes = 0
        self.n_runs = 0
        self._dir: Path | None = None

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
        run = s.take()
        if self._dir is None:
            where = str(self.config.spill_dir) if self.config.spill_dir is not None else None
            try:
                self._dir = Path(tempfile.mkdtemp(prefix="loadgen-analyze-", dir=where))
            except OSError as exc:
                raise RunDirError(f"spill directory {where or tempfile.gettempdir()!r}: {exc.strerror}") from None
        path = self._dir / f"run-{self.n_runs:06d}.bin"
        try:
            run.tofile(path)
        except OSError as exc:
            raise RunDirError(
                f"{path}: {exc.strerror}: spilling {run.nbytes / _MIB:.0f} MiB of analysis samples "
                f"(free space under --spill-dir / {SPILL_DIR_ENV}, or raise --memory-mib)"
            ) from None
        s.runs.append(RunFile(path, run))
        s.sums.append(float(np.sum(run, dtype=np.float64)))
        self.n_runs += 1
        self.spilled_bytes += run.nbytes

    @property
    def spilled(self) -> bool:
        return self.spilled_bytes > 0

    def finish(self, key: Hashable) -> tuple[list[np.ndarray], list[float] | None]:
        """Sample ``key`` as ascending parts (arrays or ``RunFile``) and their sums (None when nothing of it was spilled: one
        in-memory array, summed by the caller as before)."""
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
        """Delete every run (idempotent)."""
        for s in self.samples.values():
            for run in s.runs:
                run.close()
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None
