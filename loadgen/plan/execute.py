"""Executing the cells of a load plan: one (cell, repeat) → a judged run with its ``cell_result.json``.

For each run the walk asks for, the executor loads the stored result when the run finished before
(resume), discards a run directory left without one (interrupted mid-run: its time counts, its data
does not), refuses when the budget or this invocation's run limit says so (``walk`` decides), and
otherwise builds the cell's trace, brings the target to the cell's warm/cold state, runs it, analyses
and judges it, replays the behaviour contract when configured, and writes ``cell_result.json`` last.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..analysis import analyze_run
from ..errors import RunDirError
from ..manifest import read_manifest
from ..rundir import load_run
from ..scenario import Scenario
from ..targets import StateResult, Target
from .cells import CellCoord, build_cell_trace, build_warmup_trace
from .checks import judge_run
from .contract_hook import CONTRACT_FILE, replay_contract
from .files import ANALYSIS_FILE, RESULT_FILE, read_cell_result, write_json_atomic
from .spec import PlanSpec
from .walk import (
    BudgetExhausted,
    RunLimitReached,
    RunRecord,
    budget_refusal,
    run_deadline,
    run_limit_reached,
)

__all__ = ["CellExecutor"]


class CellExecutor:
    """Runs the cells of one plan invocation against ``target`` into ``plan_dir``.

    ``state`` is the plan state (``plan.json``) of this invocation: the executor reads its invocation
    count and adds discarded (interrupted) runs to it; the caller saves it.
    """

    def __init__(self, spec: PlanSpec, scenario: Scenario, scenario_path: Path, target: Target, plan_dir: Path,
                 state: dict[str, Any], *, max_new_runs: int | None, time_budget_s: float,
                 log: Callable[[str], None]) -> None:
        self.spec = spec
        self.scenario = scenario
        self.scenario_path = scenario_path
        self.target = target
        self.plan_dir = plan_dir
        self.state = state
        self.max_new_runs = max_new_runs
        self.time_budget_s = time_budget_s
        self.log = log
        self.order_index = 0
        self.new_runs = 0
        self.overhead_s = 0.0

    def consumed(self) -> tuple[float, int]:
        """(wall seconds, requests sent) spent by every finished run of the plan, across invocations,
        plus the time of discarded runs."""
        seconds = 0.0
        requests = 0
        for cell_dir in sorted((self.plan_dir / "cells").glob("*/rep*")):
            result = cell_dir / RESULT_FILE
            if result.is_file():
                data = read_cell_result(result)
                seconds += float(data.get("wall_s") or 0.0)
                requests += int(data.get("requests_sent") or 0)
        seconds += float(self.state.get("discarded_wall_s", 0.0))
        return seconds, requests

    def trace(self, coord: CellCoord) -> tuple[Path, dict[str, Any]]:
        """The cell's trace (built once, deterministically) and its metadata."""
        return build_cell_trace(self.spec, self.scenario, coord, self.plan_dir / "traces" / f"{coord.cell_id}.parquet")

    def run_once(self, coord: CellCoord, repeat: int) -> RunRecord:
        """Load the stored result of (cell, repeat) or run it now."""
        self.order_index += 1
        rep_dir = self.plan_dir / "cells" / coord.cell_id / f"rep{repeat}"
        marker = rep_dir / RESULT_FILE
        if marker.is_file():
            return RunRecord(read_cell_result(marker))
        if rep_dir.exists():
            self._discard_interrupted(rep_dir)
        if run_limit_reached(self.new_runs, self.max_new_runs):
            raise RunLimitReached()
        trace, meta = self.trace(coord)
        n_requests = int(meta.get("requests") or 0)
        consumed_s, consumed_req = self.consumed()
        duration = float(meta.get("duration_s") or 0.0) if self.target.real_time else 0.0
        refusal = budget_refusal(consumed_s=consumed_s, consumed_requests=consumed_req, time_budget_s=self.time_budget_s,
                                 request_budget=self.spec.budget.requests, duration_s=duration, n_requests=n_requests,
                                 overhead_s=self.overhead_s, real_time=self.target.real_time)
        if refusal is not None:
            raise BudgetExhausted(refusal)
        self.new_runs += 1
        rep_dir.parent.mkdir(parents=True, exist_ok=True)
        t0 = time.monotonic()
        state = self._prepare(coord, trace, rep_dir, repeat)
        base = {"coord": coord.to_dict(), "cell_id": coord.cell_id, "repeat": repeat, "order_index": self.order_index,
                "run_dir": str(rep_dir.relative_to(self.plan_dir)), "warm_state": state.to_dict(),
                "invocation": len(self.state["invocations"]), "trace": str(trace.relative_to(self.plan_dir))}
        if not state.achieved:
            record = {**base, "skipped": True, "skip_reason": state.reason, "failed": [], "stops": [],
                      "figures": {}, "wall_s": time.monotonic() - t0, "requests_sent": 0}
            rep_dir.mkdir(parents=True, exist_ok=True)
            write_json_atomic(marker, record)
            return RunRecord(record)
        deadline = run_deadline(cell_timeout_s=self.spec.stops.cell_timeout_s, duration_s=duration,
                                remaining_s=self.time_budget_s - consumed_s, overhead_s=self.overhead_s,
                                real_time=self.target.real_time)
        self.log(f"plan: run {self.order_index}: {coord.cell_id} (rate step {coord.rate_step:g} {coord.rate_kind}, "
                 f"{n_requests} requests) repeat {repeat} [{state.label}]")
        run_dir = self.target.run(trace, rep_dir, scenario_path=self.scenario_path, state=state,
                                  order_index=self.order_index, repeat=repeat,
                                  plan_cell={**coord.to_dict(), "plan": self.spec.name, "plan_sha256": self.spec.sha256},
                                  deadline_s=deadline, seed=repeat - 1)
        judged, verdict = self._judge(coord, run_dir)
        wall_s = time.monotonic() - t0
        record = {**base, **judged, "wall_s": wall_s}
        write_json_atomic(marker, record)
        self.overhead_s = max(self.overhead_s, wall_s - duration)
        self.log(f"plan:   → {verdict}")
        return RunRecord(record)

    def _discard_interrupted(self, rep_dir: Path) -> None:
        """A run directory without its result was interrupted mid-run: count its time, remove its data."""
        try:
            lost = float(read_manifest(rep_dir).duration_s or 0.0)
        except RunDirError:
            lost = 0.0
        self.state["discarded_wall_s"] = float(self.state.get("discarded_wall_s", 0.0)) + lost
        self.state.setdefault("discarded_runs", []).append({"run_dir": str(rep_dir.relative_to(self.plan_dir)),
                                                            "duration_s": lost, "reason": "interrupted before its result"})
        shutil.rmtree(rep_dir)

    def _prepare(self, coord: CellCoord, trace: Path, rep_dir: Path, repeat: int) -> StateResult:
        """Bring the target to the cell's warm/cold state (a warm cell first gets the plan's warm-up set)."""
        warmup_trace = None
        if coord.state == "warm" and self.spec.warmup.requests > 0 and self.target.kind != "worksheet":
            warmup_trace = build_warmup_trace(trace, self.spec.warmup.requests, self.spec.warmup.rate_rps,
                                              self.plan_dir / "traces" / f"{coord.cell_id}.warmup.parquet")
        return self.target.prepare(coord.state, warmup_trace, rep_dir.parent / f"rep{repeat}-warmup", self.scenario_path)

    def _judge(self, coord: CellCoord, run_dir: Path) -> tuple[dict[str, Any], str]:
        """Analyse and judge a finished run (recovering the target after a server failure): the record's
        judged fields, and the verdict for the log."""
        alive = self.target.check_alive()
        analysis = analyze_run(run_dir, scenario=self.scenario, include_cold=coord.state == "cold")
        write_json_atomic(run_dir / ANALYSIS_FILE, analysis.to_dict())
        run = load_run(run_dir)
        contract = self._contract_after(run_dir)
        judged = judge_run(analysis, run, self.spec.stops, deadline_hit=run.manifest.stopped_by_deadline,
                           alive_problem=alive, contract=contract)
        recovered: list[str] = []
        if any(s.kind == "server_failure" for s in judged.stops):
            recovered = self.target.recover()
        counts = run.manifest.status_counts
        verdict = "pass" if judged.passed else ("STOP " + ",".join(s.kind for s in judged.stops) if judged.stops
                                                  else "fail: " + judged.failed[0].reason)
        fields = {
            "skipped": False,
            "passed": judged.passed,
            "failed": [f.to_dict() for f in judged.failed],
            "per_class_failed": {k: [f.to_dict() for f in v] for k, v in judged.per_class_failed.items()},
            "stops": [s.to_dict() for s in judged.stops],
            "figures": judged.figures,
            "contract": {k: v for k, v in (contract or {}).items() if not k.startswith("_")},
            "recovery": recovered,
            "requests_sent": int(sum(v for k, v in counts.items() if k != "not_sent")),
            "requests_scheduled": run.requests.num_rows,
            "run_kind": run.manifest.run_kind,
        }
        return fields, verdict

    def _contract_after(self, run_dir: Path) -> dict[str, Any] | None:
        if not self.spec.stops.contract_every_cell or not self.scenario.behavior.cases:
            return None
        return replay_contract(self.scenario, self.target.url, self.target.model, out_path=run_dir / CONTRACT_FILE)
