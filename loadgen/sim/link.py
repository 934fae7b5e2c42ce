"""The link between the GPUs of a tensor- or expert-parallel group: what one NCCL collective costs (µs).

The operator profiles time one GPU's kernels, never a collective; ``OperatorProfile`` prices its collectives
here. Two links:

- ``AssumedLink``: latency + the bytes each rank receives / bandwidth, both stated in the engine TOML
  (``[cost.profile] link_latency_us``, ``link_gb_per_s``): an assumption, measured on no machine;
- ``MeasuredLink``: a table of measured collectives (``[cost.profile] collectives``, a CSV of ``collective,
  ranks, bytes, us``), read piecewise-linearly in bytes between its samples; below the smallest sample, the
  smallest sample's time (a collective's fixed latency); above the largest, the last two samples' slope
  continued (a sample-free extrapolation: the table says nothing past its largest size).

Bytes are as NCCL's calls take them (and as the shipped table's source states its samples): an all-reduce's
input, an all-gather's LOCAL input (one rank's share), a reduce-scatter's LOCAL output.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from loadgen.util.errors import ScenarioError
from loadgen.util.inputfile import read_input_csv

from .interp import interp_axis

__all__ = ["COLLECTIVES", "AssumedLink", "Link", "MeasuredLink", "read_collectives"]

#: The collectives a link prices.
COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter")


class Link(Protocol):
    """What one collective over ``ranks`` GPUs costs (µs). Hashable: a profile composed with it is cached."""

    def __hash__(self) -> int: ...

    def all_reduce_us(self, nbytes: float, ranks: int) -> float: ...

    def all_gather_us(self, local_bytes: float, ranks: int) -> float: ...

    def reduce_scatter_us(self, local_bytes: float, ranks: int) -> float: ...

    def describe(self) -> str: ...

    def check(self, collective: str, ranks: int) -> None: ...


@dataclass(frozen=True)
class AssumedLink:
    """Latency + bytes / bandwidth, stated, not measured: an all-reduce's input once (as loadgen has always
    priced it), an all-gather's or reduce-scatter's other ranks' shares ((ranks - 1) x the local bytes)."""

    latency_us: float = 20.0
    gb_per_s: float = 16.0

    def _us(self, nbytes: float) -> float:
        return self.latency_us + nbytes / (self.gb_per_s * 1e3)

    def all_reduce_us(self, nbytes: float, ranks: int) -> float:
        return self._us(nbytes)

    def all_gather_us(self, local_bytes: float, ranks: int) -> float:
        return self._us(local_bytes * (ranks - 1))

    def reduce_scatter_us(self, local_bytes: float, ranks: int) -> float:
        return self._us(local_bytes * (ranks - 1))

    def describe(self) -> str:
        return f"assumed link {self.latency_us:g} us + {self.gb_per_s:g} GB/s"

    def check(self, collective: str, ranks: int) -> None:
        """Any collective at any rank count: the formula has no samples to run out of."""


@dataclass(frozen=True)
class MeasuredLink:
    """A table of measured collectives: per (collective, ranks), sorted bytes and their µs (module docstring
    for how it is read between and beyond its samples)."""

    source: str  # the CSV it was read from
    samples: tuple[tuple[str, int, tuple[float, ...], tuple[float, ...]], ...]  # (collective, ranks, bytes, us)

    def _us(self, collective: str, ranks: int, nbytes: float) -> float:
        for name, n, keys, values in self.samples:
            if name == collective and n == ranks:
                return interp_axis(keys, values, nbytes)
        have = sorted({f"{name} x{n}" for name, n, _, _ in self.samples})
        raise ScenarioError(
            f"{self.source}: collective = {collective!r}, ranks = {ranks}: no such samples: expected one of "
            f"{', '.join(have)}"
        )

    def all_reduce_us(self, nbytes: float, ranks: int) -> float:
        return self._us("all_reduce", ranks, nbytes)

    def all_gather_us(self, local_bytes: float, ranks: int) -> float:
        return self._us("all_gather", ranks, local_bytes)

    def reduce_scatter_us(self, local_bytes: float, ranks: int) -> float:
        return self._us("reduce_scatter", ranks, local_bytes)

    def describe(self) -> str:
        return f"measured link {'/'.join(Path(self.source).parts[-3:])}"

    def check(self, collective: str, ranks: int) -> None:
        """A one-line error now, at load, if the table has no ``collective`` at ``ranks`` GPUs."""
        self._us(collective, ranks, 0.0)


@functools.lru_cache(maxsize=8)
def read_collectives(path: str) -> MeasuredLink:
    """The measured-collectives CSV at ``path`` (``collective,ranks,bytes,us``; at least 2 sizes a collective
    and rank count, each size once)."""
    rows = read_input_csv(Path(path), "a measured-collectives CSV (collective,ranks,bytes,us)", ScenarioError)
    points: dict[tuple[str, int], dict[float, float]] = {}
    for line, row in enumerate(rows, start=2):
        name = row.get("collective")
        if name not in COLLECTIVES:
            raise ScenarioError(f"{path}:{line}: collective = {name!r}: expected one of {', '.join(COLLECTIVES)}")
        ranks, nbytes, us = (_number(path, line, row, k) for k in ("ranks", "bytes", "us"))
        if ranks < 2 or ranks != int(ranks):
            raise ScenarioError(f"{path}:{line}: ranks = {row['ranks']!r}: expected a whole number >= 2")
        group = points.setdefault((name, int(ranks)), {})
        if nbytes in group:
            raise ScenarioError(f"{path}:{line}: bytes = {row['bytes']!r}: expected each size once per {name}")
        group[nbytes] = us
    for (name, ranks), group in points.items():
        if len(group) < 2:
            raise ScenarioError(f"{path}: {name} at {ranks} ranks: {len(group)} sample: expected at least 2")
    if not points:
        raise ScenarioError(f"{path}: no rows: expected collective,ranks,bytes,us samples")
    samples = tuple(
        (name, ranks, tuple(sorted(g)), tuple(g[k] for k in sorted(g))) for (name, ranks), g in sorted(points.items())
    )
    return MeasuredLink(source=path, samples=samples)


def _number(path: str, line: int, row: dict[str, str], key: str) -> float:
    try:
        value = float(row[key])
    except (KeyError, TypeError, ValueError):
        raise ScenarioError(f"{path}:{line}: {key} = {row.get(key)!r}: expected a number") from None
    if value != value or value in (float("inf"), float("-inf")) or value < 0:
        raise ScenarioError(f"{path}:{line}: {key} = {value!r}: expected a finite number >= 0")
    return value
