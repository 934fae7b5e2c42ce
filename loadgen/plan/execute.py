"""Executing the cells of a load plan: one (cell, repeat) → a judged run with its ``cell_result.json``.

For each run the walk asks for, the executor loads the stored result when the run finished before
(resume), discards a run directory left without one (interrupted mid-run: its time counts, its data
does not), refuses when the budget or this invocation's run limit says so (``walk`` decides), and
otherwise builds the cell's trace, brings the target to the cell's warm/cold state, runs it, analyses
and judges it, replays the behaviour contract when configured, and writes ``cell_result.json`` last.

A run whose verdict is inconclusive (a hard check's 95% interval straddles its limit, nothing failed
conclusively, no stop) is extended: the cell is run again with its duration scaled up to about the
requests the estimate asks for (``rep<n>-ext<k>/``), until conclusive, ``[confidence]``
``max_requests`` / ``max_extensions`` are reached, or the plan's budget would be exceeded. One
continuous longer run at the cell's rate (not pooled short ones) keeps warm-up and drain effects what
they were; the record is that last run's, with every run's time and requests counted.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from loadgen.rundir.io import load_run
from loadgen.rundir.manifest import read_manifest
from loadgen.util.errors import RunDirError
from loadgen.workload.scenario import Scenario

from ..analysis import analyze_run
from ..targets import RunRequest, StateResult, Target
from .cells import CellCoord, build_cell_trace, build_warmup_trace, cell_classes
from .checks import judge_run
from .contract_hook import CONTRACT_FILE, replay_contract
from .files import ANALYSIS_FILE, RESULT_FILE, read_cell_result, write_cell_result, write_json_atomic
from .spec import PlanSpec
from .walk import (
    BudgetExhausted,
    RunLimitReached,
    RunRecord,
    budget_refusal,
    extension_factor,
    needs_extension,
    run_deadline,
    run_limit_reached,
)

__all__ = ["CellExecutor"]


class CellExecutor:
    """Runs the cells of one plan invocation against ``target`` into ``plan_dir``.

    ``state`` is the plan state (``plan.json``) of this invocation: the executor reads its invocation
    count and adds discarded (interrupted) runs to it; the caller saves it.
    """

    def __init__(
        self,
        spec: PlanSpec,
        scenario: Scenario,
        scenario_path: Path,
        target: Target,
        plan_dir: Path,
        state: dict[str, Any],
        *,
        max_new_runs: int | None,
        time_budget_s: float,
        log: Callable[[str], None],
    ) -> None:
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

    def trace(self, coord: CellCoord, duration_scale: float = 1.0) -> tuple[Path, dict[str, Any]]:
        """The cell's trace (built once, deterministically; ``duration_scale`` × longer for an extension) and its metadata."""
        name = coord.cell_id if duration_scale == 1.0 else f"{coord.cell_id}.x{duration_scale:.4g}"
        return build_cell_trace(
            self.spec, self.scenario, coord, self.plan_dir / "traces" / f"{name}.parquet", duration_scale
        )

    def run_once(self, coord: CellCoord, repeat: int) -> RunRecord:
        """Load the stored result of (cell, repeat) or run it now (extended while inconclusive)."""
        self.order_index += 1
        rep_dir = self.plan_dir / "cells" / coord.cell_id / f"rep{repeat}"
        marker = rep_dir / RESULT_FILE
        if marker.is_file():
            return RunRecord(read_cell_result(marker))
        if rep_dir.exists():
            self._discard_interrupted(rep_dir)
        for stale in sorted(rep_dir.parent.glob(f"rep{repeat}-ext*")) if rep_dir.parent.exists() else []:
            shutil.rmtree(stale)  # extensions of a run that never wrote its result
        if run_limit_reached(self.new_runs, self.max_new_runs):
            raise RunLimitReached()
        trace, meta = self.trace(coord)
        refusal = self._refusal(meta, 0.0, 0)
        if refusal is not None:
            raise BudgetExhausted(refusal)
        self.new_runs += 1
        rep_dir.parent.mkdir(parents=True, exist_ok=True)
        record = self._attempt(coord, repeat, trace, meta, rep_dir)
        if not record.get("skipped"):
            record = self._extend(coord, repeat, rep_dir, record, int(meta.get("requests") or 0))
        write_cell_result(marker, record)
        return RunRecord(record)

    def _refusal(self, meta: dict[str, Any], pending_s: float, pending_requests: int) -> str | None:
        """Why a run of this trace may not start (time or request budget), counting runs not yet recorded."""
        consumed_s, consumed_req = self.consumed()
        duration = float(meta.get("duration_s") or 0.0) if self.target.real_time else 0.0
        return budget_refusal(
            consumed_s=consumed_s + pending_s,
            consumed_requests=consumed_req + pending_requests,
            time_budget_s=self.time_budget_s,
            request_budget=self.spec.budget.requests,
            duration_s=duration,
            n_requests=int(meta.get("requests") or 0),
            overhead_s=self.overhead_s,
            real_time=self.target.real_time,
        )

    def _attempt(
        self, coord: CellCoord, repeat: int, trace: Path, meta: dict[str, Any], run_dir: Path
    ) -> dict[str, Any]:
        """Bring the target to the cell's state, run ``trace`` into ``run_dir``, analyse and judge it."""
        t0 = time.monotonic()
        duration = float(meta.get("duration_s") or 0.0) if self.target.real_time else 0.0
        state = self._prepare(coord, trace, run_dir)
        base = {
            "coord": coord.to_dict(),
            "cell_id": coord.cell_id,
            "repeat": repeat,
            "order_index": self.order_index,
            "run_dir": str(run_dir.relative_to(self.plan_dir)),
            "warm_state": state.to_dict(),
            "invocation": len(self.state["invocations"]),
            "trace": str(trace.relative_to(self.plan_dir)),
        }
        if not state.achieved:
            run_dir.mkdir(parents=True, exist_ok=True)
            return {
                **base,
                "skipped": True,
                "skip_reason": state.reason,
                "failed": [],
                "stops": [],
                "inconclusive": [],
                "figures": {},
                "wall_s": time.monotonic() - t0,
                "requests_sent": 0,
            }
        consumed_s, _ = self.consumed()
        deadline = run_deadline(
            cell_timeout_s=self.spec.stops.cell_timeout_s,
            duration_s=duration,
            remaining_s=self.time_budget_s - consumed_s,
            overhead_s=self.overhead_s,
            real_time=self.target.real_time,
        )
        self.log(
            f"plan: run {self.order_index}: {coord.cell_id} (rate step {coord.rate_step:g} {coord.rate_kind}, "
            f"{int(meta.get('requests') or 0)} requests) repeat {repeat} [{state.label}]"
        )
        plan_cell = {**coord.to_dict(), "plan": self.spec.name, "plan_sha256": self.spec.sha256}
        run_dir = self.target.run(
            RunRequest(
                trace,
                run_dir,
                state,
                scenario_path=self.scenario_path,
                order_index=self.order_index,
                repeat=repeat,
                plan_cell=plan_cell,
                deadline_s=deadline,
                seed=repeat - 1,
            )
        )
        judged, verdict = self._judge(coord, run_dir)
        wall_s = time.monotonic() - t0
        self.overhead_s = max(self.overhead_s, wall_s - duration)
        self.log(f"plan:   → {verdict}")
        return {**base, **judged, "wall_s": wall_s}

    def _extend(
        self, coord: CellCoord, repeat: int, rep_dir: Path, first: dict[str, Any], base_requests: int
    ) -> dict[str, Any]:
        """While the run is inconclusive (and no budget failed or stop fired): rerun the cell longer, with about the
        requests the estimate asks for, within ``[confidence]`` limits and the plan's budget. The last run is the
        record; every run's time and requests count."""
        conf = self.spec.confidence
        current, scale, runs, note = first, 1.0, [first], None
        for k in range(1, conf.max_extensions + 1):
            if not conf.extend or not needs_extension(current):
                break
            wanted = scale * extension_factor(current)
            new_scale = min(wanted, conf.max_requests / max(base_requests, 1))
            if new_scale <= scale * 1.05:
                note = (
                    f"cell budget spent: the next run would need about {wanted * base_requests:,.0f} requests "
                    f"> [confidence] max_requests {conf.max_requests:,}"
                )
                break
            trace, meta = self.trace(coord, new_scale)
            refusal = self._refusal(meta, sum(r["wall_s"] for r in runs), sum(r["requests_sent"] for r in runs))
            if refusal is not None:
                note = f"plan budget: {refusal}"
                break
            self.order_index += 1
            self.log(f"plan:   inconclusive: extending {coord.cell_id} repeat {repeat} to {new_scale:g}× its duration")
            current = self._attempt(coord, repeat, trace, meta, rep_dir.parent / f"rep{repeat}-ext{k}")
            runs.append(current)
            scale = new_scale
            if current.get("skipped"):
                break
        if needs_extension(current) and note is None:
            note = (
                "extension off ([confidence] extend = false)"
                if not conf.extend
                else f"{conf.max_extensions} extension(s) used ([confidence] max_extensions)"
            )
        extensions = [
            {
                "run_dir": r["run_dir"],
                "trace": r["trace"],
                "requests_sent": r["requests_sent"],
                "wall_s": r["wall_s"],
                "inconclusive": len(r.get("inconclusive") or []),
                "failed": len(r.get("failed") or []),
                "stops": len(r.get("stops") or []),
            }
            for r in runs[1:]
        ]
        return {
            **current,
            "base_run_dir": first["run_dir"],
            "extensions": extensions,
            "extension_note": note,
            "wall_s": sum(r["wall_s"] for r in runs),
            "requests_sent": sum(r["requests_sent"] for r in runs),
        }

    def _discard_interrupted(self, rep_dir: Path) -> None:
        """A run directory without its result was interrupted mid-run: count its time, remove its data."""
        try:
            lost = float(read_manifest(rep_dir).duration_s or 0.0)
        except RunDirError:
            lost = 0.0
        self.state["discarded_wall_s"] = float(self.state.get("discarded_wall_s", 0.0)) + lost
        self.state.setdefault("discarded_runs", []).append(
            {
                "run_dir": str(rep_dir.relative_to(self.plan_dir)),
                "duration_s": lost,
                "reason": "interrupted before its result",
            }
        )
        shutil.rmtree(rep_dir)

    def _prepare(self, coord: CellCoord, trace: Path, run_dir: Path) -> StateResult:
        """Bring the target to the cell's warm/cold state (a warm cell first gets the plan's warm-up set)."""
        warmup_trace = None
        if coord.state == "warm" and self.spec.warmup.requests > 0 and self.target.kind != "worksheet":
            warmup_trace = build_warmup_trace(
                trace,
                self.spec.warmup.requests,
                self.spec.warmup.rate_rps,
                self.plan_dir / "traces" / f"{trace.stem}.warmup.parquet",
            )
        return self.target.prepare(
            coord.state, warmup_trace, run_dir.parent / f"{run_dir.name}-warmup", self.scenario_path
        )

    def _judge(self, coord: CellCoord, run_dir: Path) -> tuple[dict[str, Any], str]:
        """Analyse and judge a finished run (recovering the target after a server failure): the record's
        judged fields, and the verdict for the log."""
        alive = self.target.check_alive()
        analysis = analyze_run(run_dir, scenario=self.scenario, include_cold=coord.state == "cold")
        write_json_atomic(run_dir / ANALYSIS_FILE, analysis.to_dict())
        run = load_run(run_dir)
        contract = self._contract_after(run_dir)
        judged = judge_run(
            analysis,
            run,
            self.spec.stops,
            deadline_hit=run.manifest.stopped_by_deadline,
            alive_problem=alive,
            contract=contract,
            expected_classes=cell_classes(self.spec, self.scenario, coord),
        )
        recovered: list[str] = []
        if any(s.kind == "server_failure" for s in judged.stops):
            recovered = self.target.recover()
        counts = run.manifest.status_counts
        verdict = (
            "pass"
            if judged.passed
            else "STOP " + ",".join(s.kind for s in judged.stops)
            if judged.stops
            else "fail: " + judged.failed[0].reason
            if judged.failed
            else "inconclusive: " + judged.inconclusive[0].reason
        )
        fields = {
            "skipped": False,
            "passed": judged.passed,
            "failed": [f.to_dict() for f in judged.failed],
            "per_class_failed": {k: [f.to_dict() for f in v] for k, v in judged.per_class_failed.items()},
            "inconclusive": [f.to_dict() for f in judged.inconclusive],
            "per_class_inconclusive": {k: [f.to_dict() for f in v] for k, v in judged.per_class_inconclusive.items()},
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
