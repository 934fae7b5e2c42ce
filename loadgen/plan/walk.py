"""The walk policy of a load plan: which cell runs next, how often, and when a line or a class stops.

For each class, then each warm/cold state, then each line — a concurrency step (ascending) whose rate
ladder is searched, or with ``search.dimension = "concurrency"`` a rate step whose concurrency ladder
is searched from the most slots down — the walk looks for the boundary between passing and failing
cells. ``search.mode = "grid"`` raises the load one step at a time from a start below the expected
capacity until a cell fails a hard budget or hits a declared stop (when the start itself fails it
steps down instead). ``"bisect"`` brackets the boundary by doubling the step from the start (or back
from a failing start), then bisects the bracket: about 2·log2(n) cells for a ladder of n, where the
grid runs every cell below the boundary. Either way the last passing cell is repeated (default 3
runs) and is inside only if every repeat passes every hard budget; the first failing cell is
repeated too, so its failure is shown to be stable. A fatal stop (server failure, invalid output,
behaviour drift) ends the class/state: heavier lines would only add load to a target already failing.
Every run asked for is logged in ``probes`` with why it was chosen.

This module is pure policy: it touches no target and no file. The walk asks a ``RunCell`` callable
for the record of (cell, repeat) — the executor loads a finished one or runs it — and decides from
the records alone, so it can be tested with records made up in memory. The budget, deadline and
run-limit decisions the executor takes before starting a run are pure functions here too.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
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
    "bisect_last_pass",
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


def bisect_last_pass(n: int, passes: Callable[[int], bool]) -> int:
    """The highest index in ``range(n)`` that passes, for a monotone ``passes`` (-1 if none), by bisection."""
    lo, hi = -1, n
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if passes(mid):
            lo = mid
        else:
            hi = mid
    return lo


def needs_extension(record: dict[str, Any]) -> bool:
    """An inconclusive run: some hard check straddles its limit, none failed, no stop fired, not skipped."""
    return (
        bool(record.get("inconclusive"))
        and not record.get("failed")
        and not record.get("stops")
        and not record.get("skipped")
    )


def extension_factor(record: dict[str, Any], margin: float = 1.25) -> float:
    """How much longer to run an inconclusive cell: for each inconclusive check, (requests of its class +
    the more requests it needs) / requests of its class; the largest, times ``margin``, at least 2."""
    figures = record.get("figures") or {}
    ratios = []
    for check in record.get("inconclusive") or []:
        name = check.get("class")
        have = (
            figures.get("n_scheduled")
            if name == "overall"
            else ((figures.get("classes") or {}).get(name) or {}).get("n_scheduled")
        )
        more = check.get("more_requests")
        ratios.append((have + more) / have if have and more is not None else 2.0)
    return max(2.0, margin * max(ratios, default=2.0))


def run_limit_reached(new_runs: int, max_new_runs: int | None) -> bool:
    """Whether this invocation has started all the runs it may (the rest is left for a resume)."""
    return max_new_runs is not None and new_runs >= max_new_runs


def budget_refusal(
    *,
    consumed_s: float,
    consumed_requests: int,
    time_budget_s: float,
    request_budget: int,
    duration_s: float,
    n_requests: int,
    overhead_s: float,
    real_time: bool,
) -> str | None:
    """Why the next run may not start (it would exceed the time or request budget), or None.

    The next run needs its trace time (``duration_s``, 0 in virtual time) plus the largest overhead
    around a run seen so far; in virtual time only an exhausted budget refuses.
    """
    remaining_s = time_budget_s - consumed_s
    needed_s = duration_s + overhead_s
    if remaining_s <= 0 or (real_time and needed_s > remaining_s):
        return (
            f"time budget: {consumed_s:.1f} s of {time_budget_s:.0f} s used; the next cell needs about {needed_s:.1f} s"
        )
    if consumed_requests + n_requests > request_budget:
        return (
            f"request budget: {consumed_requests} of {request_budget} requests used; the next cell sends {n_requests}"
        )
    return None


def run_deadline(
    *, cell_timeout_s: float | None, duration_s: float, remaining_s: float, overhead_s: float, real_time: bool
) -> float | None:
    """Wall deadline of one run: the cell timeout (default trace duration × 3 + 30 s), and no longer than
    what is left of the plan's time less the overhead around a run; None in virtual time."""
    if not real_time:
        return None
    timeout = cell_timeout_s or (duration_s * 3 + 30)
    return min(timeout, max(1.0, remaining_s - overhead_s))


#: (index on the searched ladder) → the cell there.
CoordAt = Callable[[int], CellCoord]


class Walk:
    """The search over every line of a plan: (class, state, concurrency) lines along the rate ladder, or
    (class, state, rate) lines along the concurrency ladder (``search.dimension``).

    ``run`` gives the record of (cell, repeat); ``start_at(class, concurrency)`` the rate step index a
    rate line starts at (see ``start_index``). ``cells``, ``lines`` and ``probes`` (every run asked
    for, in order, with why it was chosen) hold what the walk saw, for the plan state.
    """

    def __init__(self, spec: PlanSpec, run: RunCell, start_at: Callable[[str, int], int]) -> None:
        self.spec = spec
        self.run = run
        self.start_at = start_at
        self.cells: dict[str, CellOutcome] = {}
        self.lines: list[dict[str, Any]] = []
        self.probes: list[dict[str, Any]] = []

    def cell(self, coord: CellCoord, repeats: int, early_exit: bool = True, why: str = "") -> CellOutcome:
        """Run ``coord`` up to ``repeats`` times (reusing runs it already has) and judge the repeats together.

        A skipped run (state not achievable) ends the cell; a failing run ends it when ``early_exit``;
        a stop always ends it. With two or more runs and no stop, a p99 TTFT that does not converge
        across them is an unstable-tail stop. ``why`` is recorded with each new run asked for.
        """
        outcome = self.cells.setdefault(coord.cell_id, CellOutcome(coord))
        for r in range(1, repeats + 1):
            if r <= len(outcome.runs):
                record = outcome.runs[r - 1]
            else:
                self.probes.append({"cell_id": coord.cell_id, "repeat": r, "why": why})
                record = self.run(coord, r)
                outcome.runs.append(record)
                self.probes[-1]["result"] = _result(record)
            if record.skipped:
                outcome.skipped_reason = record.data.get("skip_reason")
                return outcome
            if early_exit and not record.passed:
                break
            if record.stops:
                break
        outcome.extra_stops = []
        if len(outcome.runs) >= 2 and all(r.passed or not r.stops for r in outcome.runs):
            p99s = [
                {name: c.get("ttft_p99_ms") for name, c in (r.data.get("figures") or {}).get("classes", {}).items()}
                for r in outcome.runs
            ]
            stop = unstable_tail(p99s, self.spec.stops.p99_spread, self.spec.stops.p99_spread_floor_ms)
            if stop is not None:
                outcome.extra_stops = [stop.to_dict()]
        return outcome

    def _step_up(self, coord: CoordAt, n: int, start: int) -> tuple[int, int | None, Stop | None]:
        """From a passing start: one step further at a time until a cell fails → (last pass, first fail, its fatal stop)."""
        last_pass = start
        for j in range(start + 1, n):
            o = self.cell(coord(j), 1, why=f"grid: step up, {coord(j - 1).cell_id} passed")
            if o.failed:
                return last_pass, j, o.fatal
            last_pass = j
        return last_pass, None, None

    def _step_down(self, coord: CoordAt, start: int, fatal: Stop | None) -> tuple[int | None, int | None, Stop | None]:
        """From a failing start: one step back at a time until a cell passes, unless a failure is fatal."""
        last_pass, first_fail = None, start
        if fatal is not None:
            return last_pass, first_fail, fatal
        for j in range(start - 1, -1, -1):
            o = self.cell(coord(j), 1, why=f"grid: step down, {coord(j + 1).cell_id} failed")
            if not o.failed:
                return j, first_fail, fatal
            first_fail, fatal = j, o.fatal
            if fatal is not None:
                break
        return last_pass, first_fail, fatal

    def _bracket(
        self, coord: CoordAt, n: int, start: int, start_failed: bool, fatal: Stop | None
    ) -> tuple[int | None, int | None, Stop | None]:
        """Double the step from the start until a pass and a fail enclose the boundary (or an end is reached)."""
        lo, hi = (None, start) if start_failed else (start, None)
        step = 1
        while hi is None and lo is not None and lo < n - 1:
            v = min(n - 1, lo + step)
            o = self.cell(coord(v), 1, why=f"bracket: {coord(lo).cell_id} passed, {v - lo} step(s) further")
            if o.failed:
                hi, fatal = v, o.fatal
            else:
                lo, step = v, step * 2
        while lo is None and hi is not None and hi > 0 and fatal is None:
            v = max(0, hi - step)
            o = self.cell(coord(v), 1, why=f"bracket: {coord(hi).cell_id} failed, {hi - v} step(s) back")
            if o.failed:
                hi, fatal, step = v, o.fatal, step * 2
            else:
                lo = v
        return lo, hi, fatal

    def _bisect(
        self, coord: CoordAt, n: int, start: int, start_failed: bool, fatal: Stop | None
    ) -> tuple[int | None, int | None, Stop | None]:
        """Bracket, then halve the bracket until the last pass and the first fail are neighbours."""
        lo, hi, fatal = self._bracket(coord, n, start, start_failed, fatal)
        while lo is not None and hi is not None and hi - lo > 1:
            mid = (lo + hi) // 2
            o = self.cell(
                coord(mid), 1, why=f"bisect: between {coord(lo).cell_id} (passed) and {coord(hi).cell_id} (failed)"
            )
            if o.failed:
                hi, fatal = mid, o.fatal or fatal
            else:
                lo = mid
        return lo, hi, fatal

    def _confirm(
        self, coord: CoordAt, last_pass: int | None, first_fail: int | None, fatal: Stop | None
    ) -> tuple[int | None, int | None, Stop | None]:
        """Repeat the boundary: the last passing cell must pass every repeat (and converge), else step
        down; a budget-only first failure is repeated too, so it is shown to be stable."""
        repeats = self.spec.repeats
        while last_pass is not None:
            o = self.cell(
                coord(last_pass), repeats, why=f"boundary: repeats of the last passing cell ({repeats} in all)"
            )
            if not o.failed:
                break
            first_fail, fatal = last_pass, fatal or o.fatal
            last_pass = last_pass - 1 if last_pass > 0 and o.fatal is None else None
        if first_fail is not None and fatal is None and repeats > 1:
            o = self.cells[coord(first_fail).cell_id]
            if o.budget_failure:
                self.cell(
                    coord(first_fail),
                    repeats,
                    early_exit=False,
                    why=f"boundary: repeats of the first cell that did not pass ({repeats} in all), to show it stays out",
                )
        return last_pass, first_fail, fatal

    def _search(self, coord: CoordAt, n: int, start: int, line: dict[str, Any], start_why: str) -> dict[str, Any]:
        """Search one line of ``n`` cells (index 0 the lightest load) from ``start``; returns its line entry."""
        first = self.cell(coord(start), 1, why=start_why)
        if first.skipped_reason:
            line.update(status="not_achievable", reason=first.skipped_reason)
            return line
        if self.spec.search.mode == "bisect":
            last_pass, first_fail, fatal = self._bisect(coord, n, start, first.failed, first.fatal)
        elif not first.failed:
            last_pass, first_fail, fatal = self._step_up(coord, n, start)
        else:
            last_pass, first_fail, fatal = self._step_down(coord, start, first.fatal)
        last_pass, first_fail, fatal = self._confirm(coord, last_pass, first_fail, fatal)
        line.update(status="done", last_pass=last_pass, first_fail=first_fail, fatal=fatal.to_dict() if fatal else None)
        return line

    def walk_line(self, cls: str, state: str, conc: int) -> dict[str, Any]:
        """Search the rate ladder of one (class, state, concurrency) line; returns its line entry for the plan state."""
        spec = self.spec
        steps = spec.rate_steps

        def coord(i: int) -> CellCoord:
            return CellCoord(cls, state, conc, i, steps[i], spec.rate_kind)

        start = min(self.start_at(cls, conc), len(steps) - 1)
        line: dict[str, Any] = {
            "class": cls,
            "state": state,
            "concurrency": conc,
            "dimension": "rate",
            "start_index": start,
        }
        return self._search(coord, len(steps), start, line, f"start: rate step {start} (the plan's start rule)")

    def walk_concurrency_line(self, cls: str, state: str, rate_index: int) -> dict[str, Any]:
        """Search the concurrency ladder of one (class, state, rate) line, from the most client slots down:
        index v on the searched ladder is the (v+1)-th largest concurrency (fewer slots: more client queueing)."""
        spec = self.spec
        concs = list(reversed(spec.concurrency))

        def coord(v: int) -> CellCoord:
            return CellCoord(cls, state, concs[v], rate_index, spec.rate_steps[rate_index], spec.rate_kind)

        line: dict[str, Any] = {
            "class": cls,
            "state": state,
            "rate_index": rate_index,
            "dimension": "concurrency",
            "start_index": 0,
        }
        line = self._search(coord, len(concs), 0, line, "start: the largest concurrency")
        for key in ("last_pass", "first_fail"):  # report concurrency values, not ladder positions
            if line.get(key) is not None:
                line[key + "_concurrency"] = concs[line[key]]
        return line

    def _lines(self, cls: str, state: str) -> list[tuple[int, Callable[[], dict[str, Any]], dict[str, Any]]]:
        if self.spec.search.dimension == "concurrency":
            return [
                (i, partial(self.walk_concurrency_line, cls, state, i), {"rate_index": i})
                for i in range(len(self.spec.rate_steps))
            ]
        return [(c, partial(self.walk_line, cls, state, c), {"concurrency": c}) for c in self.spec.concurrency]

    def walk(self) -> str:
        """Walk every line; returns why it ended ("complete"; a budget or run limit raises instead)."""
        spec = self.spec
        for cls in spec.classes:
            for state in spec.states:
                fatal_line: dict[str, Any] | None = None
                fatal_at = ""
                for _key, search, where in self._lines(cls, state):
                    if fatal_line is not None:
                        self.lines.append(
                            {
                                "class": cls,
                                "state": state,
                                **where,
                                "status": "not_run",
                                "reason": f"stopped: {fatal_line['fatal']['kind']} at {fatal_at} "
                                f"({fatal_line['fatal']['detail']})",
                            }
                        )
                        continue
                    line = search()
                    self.lines.append(line)
                    if line.get("fatal"):
                        fatal_line = line
                        fatal_at = " ".join(f"{k.replace('_', ' ')} {v}" for k, v in where.items())
        return "complete"


def _result(record: RunRecord) -> str:
    """A run's result in one word for the probe log."""
    if record.skipped:
        return "not achievable"
    if record.stops:
        return "stop " + ",".join(s["kind"] for s in record.stops)
    if record.failed:
        return "fail"
    return "inconclusive" if record.inconclusive else "pass"
