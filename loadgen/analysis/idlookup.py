"""request_id → row of requests.parquet, vectorised.

The ids are laid out as fixed-width byte strings (numpy ``S{w}``, NUL-padded) straight from the Arrow
buffers, sorted once, and each query batch is answered with one ``searchsorted``. At 10^6 requests this
replaces 10^6 Python dict lookups per pass (about 1.1 s) with a few milliseconds of numpy per batch,
and makes a lookup per chunk row (the re-sorting fallback) affordable.

numpy compares ``S`` values without their trailing NULs, so a query matches only where its byte length
also equals the key's; request ids that themselves hold a NUL byte are looked up through a dict instead.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from loadgen.util.errors import RunDirError

__all__ = ["IdLookup"]


def _binary(ids: pa.Array | pa.ChunkedArray) -> pa.Array:
    """``ids`` as one contiguous large_binary array (offsets int64)."""
    if isinstance(ids, pa.ChunkedArray):
        ids = ids.combine_chunks() if ids.num_chunks else pa.array([], type=pa.large_binary())
    if pa.types.is_dictionary(ids.type):
        ids = ids.dictionary_decode()
    return ids.cast(pa.large_binary())


def _layout(ids: pa.Array) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(offsets, lengths, data bytes) of a large_binary array, offsets relative to ``data``."""
    n = len(ids)
    _, off_buf, data_buf = ids.buffers()
    offsets = (
        np.frombuffer(off_buf, dtype=np.int64)[ids.offset : ids.offset + n + 1] if off_buf else np.zeros(1, np.int64)
    )
    data = np.frombuffer(data_buf, dtype=np.uint8) if data_buf is not None else np.zeros(0, np.uint8)
    return offsets, np.diff(offsets), data


def _fixed_width(offsets: np.ndarray, lengths: np.ndarray, data: np.ndarray, width: int) -> np.ndarray:
    """Each value right-padded with NULs to ``width`` bytes (longer ones cut: callers compare lengths), as ``S{width}``."""
    n = len(lengths)
    w = max(width, 1)
    if n and (lengths == width).all() and width:
        flat = data[offsets[0] : offsets[-1]]
    else:
        keep = np.minimum(lengths, w)
        total = int(keep.sum())
        flat = np.zeros(n * w, dtype=np.uint8)
        if total:
            row_of = np.repeat(np.arange(n, dtype=np.int64), keep)
            starts = np.cumsum(keep) - keep  # first byte of each kept value in the kept stream
            within = np.arange(total, dtype=np.int64) - np.repeat(starts, keep)
            flat[row_of * w + within] = data[np.repeat(offsets[:-1], keep) + within]
    return np.ascontiguousarray(flat).view(f"S{w}")


class IdLookup:
    """request_id → row (−1 for an id no request has); duplicate request ids are bad input."""

    def __init__(self, request_ids: pa.Array | pa.ChunkedArray) -> None:
        ids = _binary(request_ids)
        self.n = len(ids)
        offsets, lengths, data = _layout(ids)
        self.width = int(lengths.max()) if self.n else 0
        self._dict: dict[bytes, int] | None = None
        if ids.null_count or (data[offsets[0] : offsets[-1]] == 0).any():  # nulls, or ids holding NUL bytes
            values = ids.to_pylist()
            self._dict = {v: i for i, v in enumerate(values) if v is not None}
            if len(self._dict) != self.n - values.count(None):
                self._duplicate([v for v in values if v is not None])
            return
        keys = _fixed_width(offsets, lengths, data, self.width)
        self.order = np.argsort(keys, kind="stable")
        self.keys = keys[self.order]
        self.key_lengths = lengths[self.order]
        if self.n > 1 and (self.keys[1:] == self.keys[:-1]).any():
            self._duplicate(ids.to_pylist())

    @staticmethod
    def _duplicate(values: list[bytes]) -> None:
        dup = next(v for v, k in Counter(values).items() if k > 1)
        raise RunDirError(
            f"requests.parquet: request_id {dup.decode(errors='replace')!r} appears more than once: expected unique ids"
        )

    def __len__(self) -> int:
        return self.n

    def get_indexer(self, ids: pa.Array | pa.ChunkedArray) -> np.ndarray:
        """The row of every id (−1 for an id no request has, or a null), int64."""
        ids = _binary(ids)
        if self._dict is not None:
            get = self._dict.get
            return np.fromiter((get(v, -1) for v in ids.to_pylist()), dtype=np.int64, count=len(ids))
        if len(ids) == 0 or self.n == 0:
            return np.full(len(ids), -1, dtype=np.int64)
        offsets, lengths, data = _layout(ids)
        query = _fixed_width(offsets, lengths, data, self.width)
        pos = np.minimum(np.searchsorted(self.keys, query), self.n - 1)
        hit = (self.keys[pos] == query) & (self.key_lengths[pos] == lengths)
        if ids.null_count:
            hit &= pc.is_valid(ids).to_numpy(zero_copy_only=False)
        return np.where(hit, self.order[pos], -1).astype(np.int64, copy=False)
