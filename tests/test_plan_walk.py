"""The walk policy on its own: made-up run records in memory, no target, no files."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from loadgen.plan.cells import CellCoord
from loadgen.plan.spec import PlanSpec, parse_plan
from loadgen.plan.walk import (
    RunRecord,
    Walk,
    budget_refusal,
    predicted_start,
    run_deadline,
    run_limit_reached,
    start_index,
)


def spec(**extra: object) -> PlanSpec:
    return parse_plan(
        {
            "name": "p",
            "scenario": "s.toml",
            "trace": "steady",
            "rates_rps": [1, 2, 3, 4, 5, 6],
            "concurrency": [4, 16],
            "repeats": 3,
            **extra,
        },
        "p.toml",
    )


def record(
    *, failed: bool = False, stop: str | None = None, p99: float = 100.0, skipped: str | None = None
) -> RunRecord:
    return RunRecord(
        {
            "failed": [{"reason": "ttft_ms p99 over budget"}] if failed else [],
            "stops": [{"kind": stop, "detail": "made up"}] if stop else [],
            "figures": {"classes": {"chat": {"ttft_p99_ms": p99}}},
            "skipped": skipped is not None,
            "skip_reason": skipped,
        }
    )


class FakeRuns:
    """Stands in for the executor: records the runs asked for; ``outcome(coord, repeat)`` says how each went."""

    def __init__(self, outcome: Callable[[CellCoord, int], RunRecord]) -> None:
        self.outcome = outcome
        self.asked: list[tuple[int, int, int]] = []  # (concurrency, rate index, repeat)

    def __call__(self, coord: CellCoord, repeat: int) -> RunRecord:
        self.asked.append((coord.concurrency, coord.rate_index, repeat))
        return self.outcome(coord, repeat)


def passes_below(limit: int, *, failed: bool = False, stop: str | None = None) -> Callable[[CellCoord, int], RunRecord]:
    """Every cell below rate step ``limit`` passes; the others fail a budget or hit ``stop``."""
    return lambda coord, _r: record() if coord.rate_index < limit else record(failed=failed, stop=stop)


def test_steps_up_from_the_start_and_repeats_both_sides_of_the_boundary() -> None:
    run = FakeRuns(passes_below(3, failed=True))
    walk = Walk(spec(), run, lambda _cls, conc: 1)
    assert walk.walk() == "complete"
    line = walk.lines[0]
    assert (line["start_index"], line["last_pass"], line["first_fail"], line["fatal"]) == (1, 2, 3, None)
    c4 = [a for a in run.asked if a[0] == 4]
    # up from step 1 one run each, then the last pass and the budget-only first failure three times
    assert c4 == [(4, 1, 1), (4, 2, 1), (4, 3, 1), (4, 2, 2), (4, 2, 3), (4, 3, 2), (4, 3, 3)]


def test_a_failing_start_steps_down_until_a_cell_passes() -> None:
    run = FakeRuns(passes_below(1, failed=True))
    walk = Walk(spec(concurrency=[4]), run, lambda _cls, _conc: 3)
    walk.walk()
    assert (walk.lines[0]["last_pass"], walk.lines[0]["first_fail"]) == (0, 1)
    assert [a[1] for a in run.asked][:4] == [3, 2, 1, 0]


def test_a_fatal_stop_ends_the_class_and_state() -> None:
    run = FakeRuns(passes_below(2, stop="server_failure"))
    walk = Walk(spec(), run, lambda _cls, _conc: 0)
    walk.walk()
    first, second = walk.lines
    assert first["fatal"]["kind"] == "server_failure" and first["first_fail"] == 2
    assert second["status"] == "not_run" and "server_failure at concurrency 4" in second["reason"]
    assert all(a[0] == 4 for a in run.asked)  # nothing ran at concurrency 16
    assert not any(a[1] == 2 and a[2] > 1 for a in run.asked)  # a stop is not repeated


def test_a_p99_that_does_not_converge_across_repeats_is_an_unstable_tail() -> None:
    run = FakeRuns(lambda coord, r: record(p99=100.0 * r) if coord.rate_index == 0 else record(failed=True))
    walk = Walk(spec(concurrency=[4]), run, lambda _cls, _conc: 0)
    walk.walk()
    outcome = walk.cells["mixed.warm.c4.r0"]
    assert [s["kind"] for s in outcome.extra_stops] == ["unstable_tail"] and outcome.failed
    assert walk.lines[0]["last_pass"] is None and walk.lines[0]["first_fail"] == 0


def test_a_state_the_target_cannot_reach_ends_the_line() -> None:
    walk = Walk(
        spec(states=["warm", "cold"], concurrency=[4]),
        FakeRuns(lambda coord, _r: record(skipped="cold not achievable") if coord.state == "cold" else record()),
        lambda *_: 0,
    )
    walk.walk()
    cold = next(ln for ln in walk.lines if ln["state"] == "cold")
    assert cold["status"] == "not_achievable" and cold["reason"] == "cold not achievable"


def test_runs_already_recorded_are_not_asked_for_again() -> None:
    run = FakeRuns(passes_below(3, failed=True))
    walk = Walk(spec(concurrency=[4]), run, lambda *_: 0)
    walk.cell(CellCoord("mixed", "warm", 4, 0, 1.0, "rps"), 3)
    asked = len(run.asked)
    walk.cell(CellCoord("mixed", "warm", 4, 0, 1.0, "rps"), 3)
    assert len(run.asked) == asked == 3


def test_start_budget_deadline_and_run_limit_decisions() -> None:
    assert start_index({"lines": {"chat.c4": {"start_index": 2}}}, "chat", 4) == 2
    assert start_index({}, "chat", 4) == 0
    assert (predicted_start(4, 2), predicted_start(1, 2), predicted_start(-1, 2)) == (2, 0, 0)
    common = {"consumed_requests": 0, "request_budget": 1000, "n_requests": 100, "overhead_s": 5.0}
    assert budget_refusal(consumed_s=50, time_budget_s=100, duration_s=40, real_time=True, **common) is None
    assert "time budget" in budget_refusal(consumed_s=60, time_budget_s=100, duration_s=40, real_time=True, **common)
    assert budget_refusal(consumed_s=60, time_budget_s=100, duration_s=0, real_time=False, **common) is None
    assert "time budget" in budget_refusal(consumed_s=100, time_budget_s=100, duration_s=0, real_time=False, **common)
    over = {**common, "consumed_requests": 950}
    assert "request budget" in budget_refusal(consumed_s=0, time_budget_s=100, duration_s=0, real_time=False, **over)
    assert run_deadline(cell_timeout_s=None, duration_s=10, remaining_s=1000, overhead_s=0, real_time=True) == 60
    assert run_deadline(cell_timeout_s=None, duration_s=10, remaining_s=20, overhead_s=5, real_time=True) == 15
    assert run_deadline(cell_timeout_s=None, duration_s=10, remaining_s=1000, overhead_s=0, real_time=False) is None
    assert (run_limit_reached(3, 3), run_limit_reached(2, 3), run_limit_reached(99, None)) == (True, False, False)


@pytest.mark.parametrize("repeats", [1, 2])
def test_fewer_repeats_confirm_with_fewer_runs(repeats: int) -> None:
    run = FakeRuns(passes_below(2, failed=True))
    walk = Walk(spec(concurrency=[4], repeats=repeats), run, lambda *_: 0)
    walk.walk()
    assert sum(1 for a in run.asked if a[1] == 1) == repeats
    assert sum(1 for a in run.asked if a[1] == 2) == repeats  # the budget-only failure is repeated when repeats > 1


def test_extension_size_follows_the_estimate() -> None:
    from loadgen.plan.walk import extension_factor, needs_extension

    unsure = {
        "failed": [],
        "stops": [],
        "inconclusive": [{"class": "chat", "more_requests": 249}, {"class": "overall", "more_requests": 40}],
        "figures": {"n_scheduled": 60, "classes": {"chat": {"n_scheduled": 50}}},
    }
    assert needs_extension(unsure) and extension_factor(unsure) == pytest.approx(1.25 * (50 + 249) / 50)
    assert extension_factor({**unsure, "inconclusive": [{"class": "chat", "more_requests": 5}]}) == 2.0  # at least 2×
    assert extension_factor({**unsure, "inconclusive": [{"class": "chat", "more_requests": None}]}) == 2.5
    assert not needs_extension({**unsure, "failed": [{"reason": "x"}]})  # a conclusive failure needs no more data
    assert not needs_extension({**unsure, "inconclusive": []})
    assert not RunRecord({"failed": [], "stops": [], "inconclusive": [{"reason": "straddles"}]}).passed


def test_bisection_brackets_then_halves_and_logs_why() -> None:
    rates = list(range(1, 65))  # 64 steps; cells below step 41 pass
    run = FakeRuns(passes_below(41, failed=True))
    walk = Walk(spec(rates_rps=rates, concurrency=[4], search={"mode": "bisect"}), run, lambda _cls, _conc: 0)
    walk.walk()
    line = walk.lines[0]
    assert (line["last_pass"], line["first_fail"]) == (40, 41)
    singles = [i for _, i, r in run.asked if r == 1]
    assert singles[:7] == [0, 1, 3, 7, 15, 31, 63]  # bracket: the step doubles until a cell fails
    assert len(set(singles)) <= 2 * 6 + 1  # about 2·log2(64) cells, where the grid would run 42
    kinds = [p["why"].split(":")[0] for p in walk.probes]
    assert kinds[0] == "start" and set(kinds) == {"start", "bracket", "bisect", "boundary"}
    assert all(p["result"] in ("pass", "fail") for p in walk.probes)


def test_concurrency_search_finds_the_fewest_slots() -> None:
    # at every rate, 16 client slots or more pass; fewer queue requests in the client and fail
    run = FakeRuns(lambda coord, _r: record() if coord.concurrency >= 16 else record(failed=True))
    walk = Walk(
        spec(concurrency=[2, 4, 8, 16, 32, 64], search={"mode": "bisect", "dimension": "concurrency"}),
        run,
        lambda _cls, _conc: 0,
    )
    walk.walk()
    assert len(walk.lines) == 6 and all(ln["dimension"] == "concurrency" for ln in walk.lines)
    assert all((ln["last_pass_concurrency"], ln["first_fail_concurrency"]) == (16, 8) for ln in walk.lines)
