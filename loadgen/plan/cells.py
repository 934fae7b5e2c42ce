"""Plan cells: their coordinates (class × state × concurrency × rate) and the trace each one replays.

A cell's trace is the plan's named trace with its rate fields scaled (or set to a mean offered rate),
its class shares overridden when the cell focuses on one class, its duration optionally shortened and
its ``max_in_flight`` set to the cell's concurrency; generation stays a pure function of
(scenario, settings, seed), so a resumed plan regenerates byte-identical traces.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
from pydantic import ValidationError

from loadgen.util.errors import PlanError
from loadgen.util.validation import format_validation_error
from loadgen.workload.scenario import Scenario, TraceSettings

from ..trace.generate import generate_trace
from ..trace.io import read_trace, write_trace
from .spec import MIXED, PlanSpec

__all__ = [
    "CellCoord",
    "mean_rate_rps",
    "cell_classes",
    "cell_trace_settings",
    "build_cell_trace",
    "build_warmup_trace",
]

_NS = 1_000_000_000


@dataclass(frozen=True, order=True)
class CellCoord:
    """Where a cell sits: request class (or ``mixed``), warm/cold, client concurrency, rate step index."""

    request_class: str
    state: str
    concurrency: int
    rate_index: int
    rate_step: float  # the plan's step value (a scale or a rate in rps)
    rate_kind: str  # "scale" | "rps"

    @property
    def cell_id(self) -> str:
        return f"{self.request_class}.{self.state}.c{self.concurrency}.r{self.rate_index}"

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["cell_id"] = self.cell_id
        return out


def mean_rate_rps(settings: TraceSettings) -> float | None:
    """Mean offered arrival rate (requests + sessions per second) of an open-loop trace setting."""
    if settings.process in ("poisson", "gamma", "constant"):
        return float(settings.rate_rps or 0.0)
    if settings.process == "ramp":
        return (float(settings.start_rate_rps or 0.0) + float(settings.end_rate_rps or 0.0)) / 2.0
    if settings.process == "onoff":
        gap, burst = float(settings.gap_s or 0), float(settings.burst_s or 0)
        quiet, high = float(settings.quiet_rate_rps or 0), float(settings.burst_rate_rps or 0)
        return (quiet * gap + high * burst) / (gap + burst) if gap + burst > 0 else None
    return None


def cell_trace_settings(
    spec: PlanSpec, scenario: Scenario, coord: CellCoord, duration_scale: float = 1.0
) -> TraceSettings:
    """The plan trace's settings for one cell (scaled rates, class focus, duration, max in flight);
    ``duration_scale`` lengthens the cell's duration (an extended run: more requests at the same rate)."""
    if spec.trace not in scenario.traces:
        raise PlanError(
            f"{spec.source_path or spec.name}: trace = {spec.trace!r}: not a trace of scenario "
            f"{scenario.name!r}; expected one of {', '.join(scenario.traces)}"
        )
    base = scenario.traces[spec.trace]
    if base.process == "closed":
        raise PlanError(
            f"{spec.source_path or spec.name}: trace = {spec.trace!r}: closed-loop traces have no rate to step; expected an open-loop trace"
        )
    if coord.rate_kind == "scale":
        scale = coord.rate_step
    else:
        mean = mean_rate_rps(base)
        if not mean:
            raise PlanError(
                f"{spec.source_path or spec.name}: trace {spec.trace!r} has a zero mean rate: rates_rps cannot scale it"
            )
        scale = coord.rate_step / mean
    update: dict[str, Any] = {"max_in_flight": coord.concurrency}
    for name in ("rate_rps", "quiet_rate_rps", "burst_rate_rps", "start_rate_rps", "end_rate_rps"):
        value = getattr(base, name)
        if value is not None:
            update[name] = value * scale
    if spec.duration_s is not None:
        update["duration_s"] = spec.duration_s
    if duration_scale != 1.0:
        update["duration_s"] = float(update.get("duration_s", base.duration_s)) * duration_scale
    if coord.request_class != MIXED:
        if coord.request_class not in scenario.classes:
            raise PlanError(
                f"{spec.source_path or spec.name}: classes: {coord.request_class!r} is not a class of scenario {scenario.name!r}"
            )
        focus = {coord.request_class: 1.0}
        update["shares"] = focus
        if base.burst_shares is not None:
            update["burst_shares"] = focus
    try:  # validated, so a scaled rate or a long duration meets the same bounds as a scenario's own trace
        return TraceSettings.model_validate({**base.model_dump(), **update})
    except ValidationError as exc:
        raise PlanError(
            format_validation_error(f"{spec.source_path or spec.name}: cell {coord.cell_id}", exc)
        ) from None


def cell_classes(spec: PlanSpec, scenario: Scenario, coord: CellCoord) -> list[str]:
    """The request classes a cell's trace schedules: share > 0 in its settings, in or out of bursts."""
    settings = cell_trace_settings(spec, scenario, coord)
    shares = settings.shares or {name: cls.share for name, cls in scenario.classes.items()}
    burst = settings.burst_shares or {}
    return sorted(name for name in scenario.classes if shares.get(name, 0) > 0 or burst.get(name, 0) > 0)


def build_cell_trace(
    spec: PlanSpec, scenario: Scenario, coord: CellCoord, path: Path, duration_scale: float = 1.0
) -> tuple[Path, dict[str, Any]]:
    """Generate (or reuse) the cell's trace file (``duration_scale`` × its duration); returns its path and metadata."""

    path = Path(path)
    if path.is_file():
        _, meta = read_trace(path)
        return path, meta
    settings = cell_trace_settings(spec, scenario, coord, duration_scale)
    cell_scenario = scenario.model_copy(update={"traces": {**scenario.traces, spec.trace: settings}})
    table, meta = generate_trace(cell_scenario, spec.trace, spec.seed)
    if table.num_rows == 0:
        raise PlanError(
            f"{spec.source_path or spec.name}: cell {coord.cell_id}: {settings.duration_s:g} s at this rate "
            "gives no request: expected a longer duration_s or higher rates"
        )
    meta = {
        **meta,
        "plan_cell": coord.to_dict(),
        "offered_rate_rps": mean_rate_rps(settings),
        "duration_scale": duration_scale,
    }
    write_trace(table, path, meta)  # whole or not at all
    return path, meta


def build_warmup_trace(cell_trace: Path, requests: int, rate_rps: float, path: Path) -> Path | None:
    """The fixed warm-up set: the cell trace's first ``requests`` rows, re-timed at ``rate_rps`` (None if empty)."""

    if requests <= 0:
        return None
    table, meta = read_trace(cell_trace)
    n = min(requests, table.num_rows)
    if n == 0:
        return None
    head = table.slice(0, n)
    columns = {name: head.column(name).to_pylist() for name in head.column_names}
    columns["request_id"] = [f"w{i:04d}" for i in range(n)]
    columns["scheduled_offset_ns"] = [int(i * _NS / rate_rps) for i in range(n)]
    columns["cancel_after_tokens"] = [None] * n
    columns["conversation_id"] = [None] * n  # each warm-up request stands alone
    columns["turn_index"] = [None] * n
    columns["think_after_reply_ns"] = [None] * n
    columns["wait_for_ids"] = [None] * n
    out = pa.Table.from_pydict(columns, schema=head.schema)
    meta = {**meta, "warmup_of": str(cell_trace), "requests": n, "duration_s": n / rate_rps, "mode": "open"}
    return write_trace(out, Path(path), meta)
