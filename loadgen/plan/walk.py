"""The walk policy of a load plan: which cell runs next, how often, and when a line or a class stops.

For each class, then each warm/cold state, then each concurrency step (ascending), the rate is raised
one step at a time from a start below the expected capacity until a cell fails a hard budget or hits
a declared stop; when the start itself fails the walk steps down instead. The last passing cell is
repeated (default 3 runs) and is inside only if every repeat passes every hard budget; the first
failing cell is repeated too, so its failure is shown to be stable. A fatal stop (server failure,
invalid output, behaviour drift) ends the class/state: raising concurrency would only add load to a
target already failing.

This module is pure policy: it touches no target and no file. The walk asks a ``RunCell`` callable
for the record of (cell, repeat) — the executor loads a finished one or runs it — and decides from
the records alone, so it can be tested with records made up in memory. The budget, deadline and
run-limit decisions the executor takes before starting a run are pure functions here too.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .cells import CellCoord
from .checks import FATAL_STOPS, Stop, unstable_tail
from .spec import PlanSpec

__all__ = [
    "BudgetExhausted",
    "CellOutcome",
    "RunCell",
    "RunLimitReached",
    "RunRecord",
    "Walk",
    "budget_refusal",
    "extension_factor",
    "needs_extension",
    "predicted_start",
    "run_deadline",
    "run_limit_reached",
    "start_index",
]


class BudgetExhausted(Exception):
    """Raised inside the walk when the next run would exceed the plan's time or request budget."""


class RunLimitReached(Exception):
    """Raised inside the walk when this invocation may start no more runs (``max_new_runs``)."""


@dataclass
class RunRecord:
    """One run of a cell as stored in ``cell_result.json``."""

    data: dict[str, Any]

    @property
    def passed(self) -> bool:
        """Every hard budget passed conclusively (95% intervals within the limits) and no stop fired."""
        return not self.data["failed"] and not self.data["stops"] and not self.inconclusive

    @property
    def inconclusive(self) -> list[dict[str, Any]]:
        """Hard checks still straddling their limit after any extension (the cell is not inside)."""
        return self.data.get("inconclusive") or []

    @property
    def stops(self) -> list[dict[str, Any]]:
        return self.data["stops"]

    @property
    def failed(self) -> list[dict[str, Any]]:
        return self.data["failed"]

    @property
    def skipped(self) -> bool:
        return bool(self.data.get("skipped"))


@dataclass
class CellOutcome:
    """The runs of one cell so far, and what they say together."""

    coord: CellCoord
    runs: list[RunRecord] = field(default_factory=list)
    extra_stops: list[dict[str, Any]] = field(default_factory=list)  # judged across repeats (unstable tail)
    skipped_reason: str | None = None

    @property
    def stops(self) -> list[dict[str, Any]]:
        return [s for r in self.runs for s in r.stops] + self.extra_stops

    @property
    def failed(self) -> bool:
        return any(not r.passed for r in self.runs) or bool(self.extra_stops)

    @property
    def fatal(self) -> Stop | None:
        for s in self.stops:
            if s["kind"] in FATAL_STOPS:
                return Stop(s["kind"], s["detail"])
        return None

    @property
    def budget_failure(self) -> bool:
        """Failed on budgets/error rate only (no stop condition)."""
        return self.failed and not self.stops


#: The record of (cell, repeat): loaded when it finished before, else run now (repeats are 1-based).
RunCell = Callable[[CellCoord, int], RunRecord]


def start_index(start: dict[str, Any], cls: str, conc: int) -> int:
    """The rate step a line starts at: the predicted start of (class, concurrency), else the lowest."""
    line = start.get("lines", {}).get(f"{cls}.c{conc}")
    return int(line["start_index"]) if line else 0


def predicted_start(predicted_last_pass: int, steps_below: int) -> int:
    """Start ``steps_below`` steps below the highest step predicted to pass (-1: none passes → the lowest)."""
    return max(0, predicted_last_pass - steps_below) if predicted_last_pass >= 0 else 0


def needs_extension(record: dict[str, Any]) -> bool:
    """An inconclusive run: some hard check straddles its limit, none failed, no stop fired, not skipped."""
    return bool(record.get("inconclusive")) and not record.get("failed") and not record.get("stops") \
        and not record.get("skipped")


def extension_factor(record: dict[str, Any], margin: float = 1.25) -> float:
    """How much longer to run an inconclusive cell: for each inconclusive check, (requests of its class +
    the more requests it needs) / requests of its class; the largest, times ``margin``, at least 2."""
    figures = record.get("figures") or {}
    ratios = []
    for check in record.get("inconclusive") or []:
        name = check.get("class")
        have = (figures.get("n_scheduled") if name == "overall"
                else ((figures.get("classes") or {}).get(name) or {}).get("n_scheduled"))
        more = check.get("more_requests")
        ratios.append((have + more) / have if have and more is not None else 2.0)
    return max(2.0, margin * max(ratios, default=2.0))


def run_limit_reached(new_runs: int, max_new_runs: int | None) -> bool:
    """Whether this invocation has started all the runs it may (the rest is left for a resume)."""
    return max_new_runs is not None and new_runs >= max_new_runs


def budget_refusal(*, consumed_s: float, consumed_requests: int, time_budget_s: float, request_budget: int,
                   duration_s: float, n_requests: int, overhead_s: float, real_time: bool) -> str | None:
    """Why the next run may not start (it would exceed the time or request budget), or None.

    The next run needs its trace time (``duration_s``, 0 in virtual time) plus the largest overhead
    around a run seen so far; in virtual time only an exhausted budget refuses.
    """
    remaining_s = time_budget_s - consumed_s
    needed_s = duration_s + overhead_s
    if remaining_s <= 0 or (real_time and needed_s > remaining_s):
        return (f"time budget: {consumed_s:.1f} s of {time_budget_s:.0f} s used; "
                f"the next cell needs about {needed_s:.1f} s")
    if consumed_requests + n_requests > request_budget:
        return (f"request budget: {consumed_requests} of {request_budget} requests used; "
                f"the next cell sends {n_requests}")
    return None


def run_deadline(*, cell_timeout_s: float | None, duration_s: float, remaining_s: float, overhead_s: float,
                 real_time: bool) -> float | None:
    """Wall deadline of one run: the cell timeout (default trace duration × 3 + 30 s), and no longer than
    what is left of the plan's time less the overhead around a run; None in virtual time."""
    if not real_time:
        return None
    timeout = cell_timeout_s or (duration_s * 3 + 30)
    return min(timeout, max(1.0, remaining_s - overhead_s))


class Walk:
    """The step-up walk over every (class, state, concurrency) line of a plan.

    ``run`` gives the record of (cell, repeat); ``start_at(class, concurrency)`` the rate step index a
    line starts at (see ``start_index``). ``cells`` and ``lines`` hold what the walk saw, for the plan state.
    """

    def __init__(self, spec: PlanSpec, run: RunCell, start_at: Callable[[str, int], int]) -> None:
        self.spec = spec
        self.run = run
        self.start_at = start_at
        self.cells: dict[str, CellOutcome] = {}
        self.lines: list[dict[str, Any]] = []

    def cell(self, coord: CellCoord, repeats: int, early_exit: bool = True) -> CellOutcome:
        """Run ``coord`` up to ``repeats`` times (reusing runs it already has) and judge the repeats together.

        A skipped run (state not achievable) ends the cell; a failing run ends it when ``early_exit``;
        a stop always ends it. With two or more runs and no stop, a p99 TTFT that does not converge
        across them is an unstable-tail stop.
        """
        outcome = self.cells.setdefault(coord.cell_id, CellOutcome(coord))
        for r in range(1, repeats + 1):
            if r <= len(outcome.runs):
                record = outcome.runs[r - 1]
            else:
                record = self.run(coord, r)
                outcome.runs.append(record)
            if record.skipped:
                outcome.skipped_reason = record.data.get("skip_reason")
                return outcome
            if early_exit and not record.passed:
                break
            if record.stops:
                break
        outcome.extra_stops = []
        if len(outcome.runs) >= 2 and all(r.passed or not r.stops for r in outcome.runs):
            p99s = [{name: c.get("ttft_p99_ms") for name, c in (r.data.get("figures") or {}).get("classes", {}).items()}
                    for r in outcome.runs]
            stop = unstable_tail(p99s, self.spec.stops.p99_spread, self.spec.stops.p99_spread_floor_ms)
            if stop is not None:
                outcome.extra_stops = [stop.to_dict()]
        return outcome

    def _step_up(self, coord: Callable[[int], CellCoord], start: int) -> tuple[int, int | None, Stop | None]:
        """From a passing start: raise the rate until a cell fails → (last pass, first fail, its fatal stop)."""
        last_pass = start
        for j in range(start + 1, len(self.spec.rate_steps)):
            o = self.cell(coord(j), 1)
            if o.failed:
                return last_pass, j, o.fatal
            last_pass = j
        return last_pass, None, None

    def _step_down(self, coord: Callable[[int], CellCoord], start: int,
                   fatal: Stop | None) -> tuple[int | None, int | None, Stop | None]:
        """From a failing start: lower the rate until a cell passes, unless a failure is fatal."""
        last_pass, first_fail = None, start
        if fatal is not None:
            return last_pass, first_fail, fatal
        for j in range(start - 1, -1, -1):
            o = self.cell(coord(j), 1)
            if not o.failed:
                return j, first_fail, fatal
            first_fail, fatal = j, o.fatal
            if fatal is not None:
                break
        return last_pass, first_fail, fatal

    def _confirm(self, coord: Callable[[int], CellCoord], last_pass: int | None, first_fail: int | None,
                 fatal: Stop | None) -> tuple[int | None, int | None, Stop | None]:
        """Repeat the boundary: the last passing cell must pass every repeat (and converge), else step
        down; a budget-only first failure is repeated too, so it is shown to be stable."""
        repeats = self.spec.repeats
        while last_pass is not None:
            o = self.cell(coord(last_pass), repeats)
            if not o.failed:
                break
            first_fail, fatal = last_pass, fatal or o.fatal
            last_pass = last_pass - 1 if last_pass > 0 and o.fatal is None else None
        if first_fail is not None and fatal is None and repeats > 1:
            o = self.cells[coord(first_fail).cell_id]
            if o.budget_failure:
                self.cell(coord(first_fail), repeats, early_exit=False)
        return last_pass, first_fail, fatal

    def walk_line(self, cls: str, state: str, conc: int) -> dict[str, Any]:
        """Walk one (class, state, concurrency) line; returns its line entry for the plan state."""
        spec = self.spec

        def coord(i: int) -> CellCoord:
            return CellCoord(cls, state, conc, i, spec.rate_steps[i], spec.rate_kind)

        start = self.start_at(cls, conc)
        line: dict[str, Any] = {"class": cls, "state": state, "concurrency": conc, "start_index": start}
        first = self.cell(coord(start), 1)
        if first.skipped_reason:
            line.update(status="not_achievable", reason=first.skipped_reason)
            return line
        last_pass: int | None
        if not first.failed:
            last_pass, first_fail, fatal = self._step_up(coord, start)
        else:
            last_pass, first_fail, fatal = self._step_down(coord, start, first.fatal)
        last_pass, first_fail, fatal = self._confirm(coord, last_pass, first_fail, fatal)
        line.update(status="done", last_pass=last_pass, first_fail=first_fail,
                    fatal=fatal.to_dict() if fatal else None)
        return line

    def walk(self) -> str:
        """Walk every line; returns why it ended ("complete"; a budget or run limit raises instead)."""
        spec = self.spec
        for cls in spec.classes:
            for state in spec.states:
                fatal_line: dict[str, Any] | None = None
                for conc in spec.concurrency:
                    if fatal_line is not None:
                        self.lines.append({"class": cls, "state": state, "concurrency": conc, "status": "not_run",
                                           "reason": f"stopped: {fatal_line['fatal']['kind']} at concurrency "
                                                     f"{fatal_line['concurrency']} ({fatal_line['fatal']['detail']})"})
                        continue
                    line = self.walk_line(cls, state, conc)
                    self.lines.append(line)
                    if line.get("fatal"):
                        fatal_line = line
        return "complete"
