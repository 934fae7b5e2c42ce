"""Running a load plan: the step-up walk, repeats at the boundary, stop conditions, budgets, resume.

The walk is a pure function of the plan and the results already on disk: for each class, then each
warm/cold state, then each concurrency step (ascending), the rate is raised one step at a time from a
start below the expected capacity until a cell fails a hard budget or hits a declared stop; when the
start itself fails the walk steps down instead. The last passing cell is repeated (default 3 runs) and
is inside only if every repeat passes every hard budget; the first failing cell is repeated too, so
its failure is shown to be stable. A fatal stop (server failure, invalid output, behaviour drift) ends
the class/state: raising concurrency would only add load to a target already failing.

Every run writes ``cell_result.json`` into its run directory last; a rerun of the same command reads
those and skips finished runs, so an interrupted plan resumes where it stopped and ends with the same
region as an uninterrupted one (the worksheet is deterministic; live targets are as repeatable as
the target). Runs without the marker (interrupted mid-cell) are removed and redone.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from ..errors import PlanError
from ..identity import harness_identity, utc_now_iso
from ..jsonfile import read_json_object
from .cells import CellCoord, build_cell_trace, build_warmup_trace
from .checks import FATAL_STOPS, Stop, judge_run, unstable_tail
from .spec import PlanSpec
from .targets import CellTarget, WorksheetTarget

__all__ = ["PLAN_FILE", "RESULT_FILE", "read_plan_state", "read_cell_result", "ANALYSIS_FILE", "RunRecord", "CellOutcome", "PlanResult", "run_plan", "run_plan_file", "BudgetExhausted"]

PLAN_FILE = "plan.json"
RESULT_FILE = "cell_result.json"
ANALYSIS_FILE = "analysis.json"


class BudgetExhausted(Exception):
    """Raised inside the walk when the next run would exceed the plan's time or request budget."""


class _RunLimitReached(Exception):
    """Raised inside the walk when this invocation may start no more runs (``max_new_runs``)."""


def read_plan_state(path: Path) -> dict[str, Any]:
    """plan.json of an earlier invocation, checked before resuming from it (one PlanError line if damaged)."""
    state = read_json_object(path, "the plan state loadgen wrote (or a new --out)", PlanError)
    shapes = {"kind": str, "plan": dict, "target": dict, "invocations": list, "start": dict, "discarded_wall_s": (int, float)}
    for key, kind in shapes.items():
        if key in state and not isinstance(state[key], kind):
            raise PlanError(f"{path}: {key} = {str(state[key])[:60]!r}: expected a plan state written by loadgen "
                            f"(or a new --out)")
    if state.get("kind") != "loadgen.plan" or "invocations" not in state:
        raise PlanError(f"{path}: kind = {state.get('kind')!r}: expected a plan state written by loadgen (or a new --out)")
    return state


def read_cell_result(path: Path) -> dict[str, Any]:
    """A stored cell result; one PlanError line when it is damaged (delete its rep directory to rerun it)."""
    data = read_json_object(path, "a cell result loadgen wrote (delete its directory to rerun the cell)", PlanError)
    ok = (isinstance(data.get("failed", []), list) and isinstance(data.get("stops", []), list)
          and all(isinstance(data.get(k, 0) or 0, (int, float)) for k in ("wall_s", "requests_sent")))
    if not ok or "failed" not in data or "stops" not in data:
        raise PlanError(f"{path}: not a cell result: expected one loadgen wrote (delete {path.parent} to rerun the cell)")
    return data


@dataclass
class RunRecord:
    """One run of a cell as stored in ``cell_result.json``."""

    data: dict[str, Any]

    @property
    def passed(self) -> bool:
        return not self.data["failed"] and not self.data["stops"]

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


@dataclass
class PlanResult:
    plan_dir: Path
    state: dict[str, Any]
    region: dict[str, Any]


def _atomic_json(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True, default=str) + "\n")
    os.replace(tmp, path)


class _Planner:
    def __init__(self, spec: PlanSpec, target: CellTarget, plan_dir: Path, *, max_new_runs: int | None,
                 time_budget_s: float | None, log: Callable[[str], None], prediction_engine: Any | None) -> None:
        from ..scenario import load_scenario

        self.spec = spec
        self.target = target
        self.plan_dir = Path(plan_dir)
        self.scenario_path = spec.scenario_path()
        self.scenario = load_scenario(self.scenario_path)
        self.max_new_runs = max_new_runs
        self.time_budget_s = time_budget_s if time_budget_s is not None else spec.budget.time_s
        self.log = log
        self.prediction_engine = prediction_engine
        self.order_index = 0
        self.new_runs = 0
        self.overhead_s = 0.0
        self.invocation_started = time.monotonic()
        self.cells: dict[str, CellOutcome] = {}
        self.lines: list[dict[str, Any]] = []
        self.state: dict[str, Any] = {}

    # ---- state file -------------------------------------------------------------------------------
    def open_state(self) -> None:
        self.plan_dir.mkdir(parents=True, exist_ok=True)
        path = self.plan_dir / PLAN_FILE
        if path.is_file():
            state = read_plan_state(path)
            if state.get("plan_sha256") != self.spec.sha256:
                raise PlanError(
                    f"{self.plan_dir}: holds plan {state.get('plan', {}).get('name')!r} (sha256 "
                    f"{str(state.get('plan_sha256'))[:12]}), not {self.spec.source_path} ({str(self.spec.sha256)[:12]}): "
                    "expected the same plan file to resume, or a new --out"
                )
            old_target = {k: v for k, v in state.get("target", {}).items() if k in ("kind", "engine", "engine_sha256", "base_url")}
            new_target = {k: v for k, v in self.target.describe().items() if k in old_target}
            if old_target != new_target:
                raise PlanError(f"{self.plan_dir}: was run against {old_target}, not {new_target}: expected the same target to resume")
            self.state = state
        else:
            self.state = {
                "kind": "loadgen.plan",
                "version": 1,
                "plan": self.spec.model_dump(mode="json", by_alias=True),
                "plan_path": self.spec.source_path,
                "plan_sha256": self.spec.sha256,
                "scenario": {"name": self.scenario.name, "path": str(self.scenario_path), "sha256": self.scenario.sha256},
                "target": self.target.describe(),
                "harness": harness_identity(),
                "created_utc": utc_now_iso(),
                "invocations": [],
            }
        self.state["invocations"].append({"started_utc": utc_now_iso(), "pid": os.getpid()})
        self.state["status"] = "running"
        self.save_state()

    def save_state(self) -> None:
        _atomic_json(self.plan_dir / PLAN_FILE, self.state)

    # ---- budget ------------------------------------------------------------------------------------
    def consumed(self) -> tuple[float, int]:
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

    # ---- start point -------------------------------------------------------------------------------
    def predict_start(self) -> None:
        """Per (class, concurrency): the highest rate step a worksheet passes, and the start below it."""
        if "start" in self.state:
            return
        spec = self.spec
        info: dict[str, Any] = {"mode": spec.start.mode, "steps_below": spec.start.steps_below, "lines": {}}
        engine = self.prediction_engine
        if spec.start.mode == "lowest" or engine is None:
            info["note"] = ("start at the lowest rate step: " + ("plan start.mode = 'lowest'" if spec.start.mode == "lowest"
                            else "no simulated engine to predict capacity from (give start.worksheet_engine)"))
            self.state["start"] = info
            self.save_state()
            return
        from ..analysis import analyze_run
        from ..rundir import load_run
        from ..sim import run_worksheet

        predict_dir = self.plan_dir / "predict"
        info["engine"] = getattr(engine, "name", str(engine))
        for cls in spec.classes:
            for conc in spec.concurrency:
                best = -1
                for i, step in enumerate(spec.rate_steps):
                    coord = CellCoord(cls, "warm", conc, i, step, spec.rate_kind)
                    trace, _ = build_cell_trace(spec, self.scenario, coord, self.plan_dir / "traces" / f"{coord.cell_id}.parquet")
                    out = predict_dir / coord.cell_id
                    if out.exists():
                        shutil.rmtree(out)
                    run_worksheet(trace, engine, out, seed=0, scenario=self.scenario_path)
                    analysis = analyze_run(out, scenario=self.scenario)
                    judged = judge_run(analysis, load_run(out), spec.stops)
                    shutil.rmtree(out)
                    if not judged.passed:
                        break
                    best = i
                start = max(0, best - spec.start.steps_below) if best >= 0 else 0
                info["lines"][f"{cls}.c{conc}"] = {"predicted_last_pass": best, "start_index": start}
        shutil.rmtree(predict_dir, ignore_errors=True)
        info["note"] = (f"start {spec.start.steps_below} rate step(s) below the highest step the worksheet of "
                        f"{info['engine']} passes (virtual time, same cell traces)")
        self.state["start"] = info
        self.save_state()

    def start_index(self, cls: str, conc: int) -> int:
        line = self.state.get("start", {}).get("lines", {}).get(f"{cls}.c{conc}")
        return int(line["start_index"]) if line else 0

    # ---- one run -----------------------------------------------------------------------------------
    def _trace(self, coord: CellCoord) -> tuple[Path, dict[str, Any]]:
        return build_cell_trace(self.spec, self.scenario, coord, self.plan_dir / "traces" / f"{coord.cell_id}.parquet")

    def run_once(self, coord: CellCoord, repeat: int) -> RunRecord:
        """Load the stored result of (cell, repeat) or run it now."""
        self.order_index += 1
        order_index = self.order_index
        rep_dir = self.plan_dir / "cells" / coord.cell_id / f"rep{repeat}"
        marker = rep_dir / RESULT_FILE
        if marker.is_file():
            return RunRecord(read_cell_result(marker))
        if rep_dir.exists():  # interrupted mid-run: its time counts, its data does not
            try:
                lost = float(json.loads((rep_dir / "manifest.json").read_text()).get("duration_s") or 0.0)
            except (OSError, ValueError):
                lost = 0.0
            self.state["discarded_wall_s"] = float(self.state.get("discarded_wall_s", 0.0)) + lost
            self.state.setdefault("discarded_runs", []).append({"run_dir": str(rep_dir.relative_to(self.plan_dir)),
                                                                "duration_s": lost, "reason": "interrupted before its result"})
            shutil.rmtree(rep_dir)
        if self.max_new_runs is not None and self.new_runs >= self.max_new_runs:
            raise _RunLimitReached()
        trace, meta = self._trace(coord)
        n_requests = int(meta.get("requests") or 0)
        consumed_s, consumed_req = self.consumed()
        duration = float(meta.get("duration_s") or 0.0) if self.target.real_time else 0.0
        cell_timeout = self.spec.stops.cell_timeout_s or (duration * 3 + 30)
        remaining_s = self.time_budget_s - consumed_s
        needed_s = duration + self.overhead_s  # trace time + the largest per-run overhead seen so far
        if remaining_s <= 0 or (self.target.real_time and needed_s > remaining_s):
            raise BudgetExhausted(f"time budget: {consumed_s:.1f} s of {self.time_budget_s:.0f} s used; "
                                  f"the next cell needs about {needed_s:.1f} s")
        if consumed_req + n_requests > self.spec.budget.requests:
            raise BudgetExhausted(f"request budget: {consumed_req} of {self.spec.budget.requests} requests used; "
                                  f"the next cell sends {n_requests}")
        self.new_runs += 1
        rep_dir.parent.mkdir(parents=True, exist_ok=True)
        t0 = time.monotonic()
        warmup_trace = None
        if coord.state == "warm" and self.spec.warmup.requests > 0 and self.target.kind != "worksheet":
            warmup_trace = build_warmup_trace(trace, self.spec.warmup.requests, self.spec.warmup.rate_rps,
                                              self.plan_dir / "traces" / f"{coord.cell_id}.warmup.parquet")
        state = self.target.prepare(coord.state, warmup_trace, rep_dir.parent / f"rep{repeat}-warmup", self.scenario_path)
        base = {"coord": coord.to_dict(), "cell_id": coord.cell_id, "repeat": repeat, "order_index": order_index,
                "run_dir": str(rep_dir.relative_to(self.plan_dir)), "warm_state": state.to_dict(),
                "invocation": len(self.state["invocations"]), "trace": str(trace.relative_to(self.plan_dir))}
        if not state.achieved:
            record = {**base, "skipped": True, "skip_reason": state.reason, "failed": [], "stops": [],
                      "figures": {}, "wall_s": time.monotonic() - t0, "requests_sent": 0}
            rep_dir.mkdir(parents=True, exist_ok=True)
            _atomic_json(marker, record)
            return RunRecord(record)
        # the run may not outlast what is left of the plan's time (less the overhead around a run)
        deadline = min(cell_timeout, max(1.0, remaining_s - self.overhead_s)) if self.target.real_time else None
        self.log(f"plan: run {order_index}: {coord.cell_id} (rate step {coord.rate_step:g} {coord.rate_kind}, "
                 f"{n_requests} requests) repeat {repeat} [{state.label}]")
        run_dir = self.target.run(trace, rep_dir, scenario_path=self.scenario_path, state=state, order_index=order_index,
                                  repeat=repeat, plan_cell={**coord.to_dict(), "plan": self.spec.name,
                                                            "plan_sha256": self.spec.sha256},
                                  deadline_s=deadline, seed=repeat - 1)
        alive = self.target.check_alive()
        from ..analysis import analyze_run
        from ..rundir import load_run

        analysis = analyze_run(run_dir, scenario=self.scenario, include_cold=coord.state == "cold")
        _atomic_json(run_dir / ANALYSIS_FILE, analysis.to_dict())
        run = load_run(run_dir)
        contract = self._contract_after(run_dir)
        judged = judge_run(analysis, run, self.spec.stops, deadline_hit=bool(run.manifest.get("stopped_by_deadline")),
                           alive_problem=alive, contract=contract)
        recovered: list[str] = []
        if any(s.kind == "server_failure" for s in judged.stops):
            recovered = self.target.recover()
        counts = run.manifest.get("status_counts", {})
        record = {
            **base,
            "skipped": False,
            "passed": judged.passed,
            "failed": [f.to_dict() for f in judged.failed],
            "per_class_failed": {k: [f.to_dict() for f in v] for k, v in judged.per_class_failed.items()},
            "stops": [s.to_dict() for s in judged.stops],
            "figures": judged.figures,
            "contract": {k: v for k, v in (contract or {}).items() if not k.startswith("_")},
            "recovery": recovered,
            "wall_s": time.monotonic() - t0,
            "requests_sent": int(sum(v for k, v in counts.items() if k != "not_sent")),
            "requests_scheduled": run.requests.num_rows,
            "run_kind": run.manifest.get("run_kind"),
        }
        _atomic_json(marker, record)
        self.overhead_s = max(self.overhead_s, record["wall_s"] - duration)
        verdict = "pass" if judged.passed else ("STOP " + ",".join(s.kind for s in judged.stops) if judged.stops
                                                  else "fail: " + judged.failed[0].reason)
        self.log(f"plan:   → {verdict}")
        return RunRecord(record)

    def _contract_after(self, run_dir: Path) -> dict[str, Any] | None:
        if not self.spec.stops.contract_every_cell or not self.scenario.behavior.cases:
            return None
        from .contract_hook import CONTRACT_FILE, replay_contract

        return replay_contract(self.scenario, self.target.url, self.target.model, out_path=run_dir / CONTRACT_FILE)

    # ---- cells -------------------------------------------------------------------------------------
    def cell(self, coord: CellCoord, repeats: int, early_exit: bool = True) -> CellOutcome:
        outcome = self.cells.setdefault(coord.cell_id, CellOutcome(coord))
        for r in range(1, repeats + 1):
            if r <= len(outcome.runs):
                record = outcome.runs[r - 1]
            else:
                record = self.run_once(coord, r)
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

    def walk_line(self, cls: str, state: str, conc: int) -> dict[str, Any]:
        spec = self.spec
        steps = spec.rate_steps
        n = len(steps)
        R = spec.repeats

        def coord(i: int) -> CellCoord:
            return CellCoord(cls, state, conc, i, steps[i], spec.rate_kind)

        start = self.start_index(cls, conc)
        line: dict[str, Any] = {"class": cls, "state": state, "concurrency": conc, "start_index": start}
        first = self.cell(coord(start), 1)
        if first.skipped_reason:
            line.update(status="not_achievable", reason=first.skipped_reason)
            return line
        last_pass: int | None
        first_fail: int | None = None
        fatal: Stop | None = None
        if not first.failed:
            last_pass = start
            for j in range(start + 1, n):
                o = self.cell(coord(j), 1)
                if o.failed:
                    first_fail, fatal = j, o.fatal
                    break
                last_pass = j
        else:
            last_pass, first_fail, fatal = None, start, first.fatal
            if fatal is None:
                for j in range(start - 1, -1, -1):
                    o = self.cell(coord(j), 1)
                    if not o.failed:
                        last_pass = j
                        break
                    first_fail, fatal = j, o.fatal
                    if fatal is not None:
                        break
        # confirm the boundary: the last passing cell must pass every repeat (and converge)
        while last_pass is not None:
            o = self.cell(coord(last_pass), R)
            if not o.failed:
                break
            first_fail, fatal = last_pass, fatal or o.fatal
            last_pass = last_pass - 1 if last_pass > 0 and o.fatal is None else None
        if first_fail is not None and fatal is None and R > 1:
            o = self.cells[coord(first_fail).cell_id]
            if o.budget_failure:
                self.cell(coord(first_fail), R, early_exit=False)
        line.update(status="done", last_pass=last_pass, first_fail=first_fail,
                    fatal=fatal.to_dict() if fatal else None)
        return line

    def walk(self) -> str:
        """Walk every line; returns why it ended ("complete", or the budget/run-limit reason)."""
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


def run_plan(
    spec: PlanSpec,
    target: CellTarget,
    plan_dir: str | Path,
    *,
    max_new_runs: int | None = None,
    time_budget_s: float | None = None,
    prediction_engine: Any | None = None,
    log: Callable[[str], None] | None = None,
) -> PlanResult:
    """Run (or resume) ``spec`` against ``target`` into ``plan_dir``; write the region; return it.

    ``max_new_runs`` caps the runs this invocation may start (the rest is left for a resume);
    ``time_budget_s`` overrides the plan's total time budget (e.g. to extend it on resume);
    ``prediction_engine`` (a sim engine preset/config) predicts the start; by default the target's own
    engine when it is simulated, else the plan's ``start.worksheet_engine``.
    """
    from .region import build_region, write_region

    if prediction_engine is None:
        if isinstance(target, WorksheetTarget):
            prediction_engine = target.engine
        elif getattr(target, "engine_config", None) is not None:
            prediction_engine = target.engine_config
        elif spec.start.worksheet_engine:
            from ..sim import load_engine_config

            engine_ref = spec.start.worksheet_engine
            candidate = spec.base_dir() / engine_ref
            prediction_engine = load_engine_config(candidate if candidate.exists() else engine_ref)
    planner = _Planner(spec, target, Path(plan_dir), max_new_runs=max_new_runs, time_budget_s=time_budget_s,
                       log=log or (lambda _m: None), prediction_engine=prediction_engine)
    planner.open_state()
    ended = "complete"
    t0 = time.monotonic()
    try:
        planner.predict_start()
        planner.state["ledger"] = planner.state.get("ledger") or _ledger_summary(spec, planner.scenario)
        ended = planner.walk()
    except BudgetExhausted as exc:
        ended = f"budget exhausted: {exc}"
    except _RunLimitReached:
        ended = f"paused: this invocation's run limit ({max_new_runs}) reached; rerun the same command to resume"
    except KeyboardInterrupt:
        planner.state["status"] = "interrupted"
        planner.state["invocations"][-1].update(ended_utc=utc_now_iso(), wall_s=time.monotonic() - t0, ended="interrupted")
        planner.save_state()
        raise
    planner.state["status"] = "complete" if ended == "complete" else "incomplete"
    planner.state["ended"] = ended
    consumed_s, consumed_req = planner.consumed()
    planner.state["budget"] = {"time_s": planner.time_budget_s, "requests": spec.budget.requests,
                               "consumed_time_s": round(consumed_s, 3), "consumed_requests": consumed_req}
    planner.state["invocations"][-1].update(ended_utc=utc_now_iso(), wall_s=round(time.monotonic() - t0, 3),
                                            new_runs=planner.new_runs, ended=ended)
    planner.state["lines"] = planner.lines
    planner.state["cells"] = {cid: {"coord": o.coord.to_dict(), "runs": [r.data["run_dir"] for r in o.runs],
                                    "extra_stops": o.extra_stops, "skipped_reason": o.skipped_reason}
                              for cid, o in sorted(planner.cells.items())}
    planner.save_state()
    region = build_region(planner.plan_dir, planner.state)
    write_region(planner.plan_dir, region)
    return PlanResult(planner.plan_dir, planner.state, region)


def _ledger_summary(spec: PlanSpec, scenario: Any) -> dict[str, Any] | None:
    """When the plan names a model config: the KV-limited concurrency per class, to read the steps against."""
    ref = spec.start.model_config_path
    if not ref:
        return None
    from ..ledger import EngineSettings, compute_ledger, read_model_config

    path = Path(ref)
    if not path.is_absolute():
        path = spec.base_dir() / path
    ledger = compute_ledger(read_model_config(path), EngineSettings(), scenario)
    classes = {c.name: {"max_seqs_p99": c.max_seqs_p99, "limit_p99": c.limit_p99} for c in ledger.classes}
    beyond = [c for c in spec.concurrency if any(c > v["limit_p99"] for v in classes.values())]
    return {"model_config": str(path), "kv_cache_tokens": ledger.kv_cache_tokens, "classes": classes,
            "note": (f"concurrency steps {beyond} exceed the KV-limited concurrency of some class (default engine settings)"
                     if beyond else "every concurrency step fits the KV pool at p99 lengths (default engine settings)")}


def run_plan_file(
    plan_path: str | Path,
    out: str | Path,
    *,
    target_url: str | None = None,
    model: str | None = None,
    sim: str | None = None,
    sim_worksheet: str | None = None,
    vllm: str | None = None,
    vllm_args: list[str] | None = None,
    api_key_env: str | None = None,
    max_new_runs: int | None = None,
    time_budget_s: float | None = None,
    log: Callable[[str], None] | None = None,
) -> PlanResult:
    """Load a plan file, build exactly one target (URL, live sim server, worksheet, or a vLLM it launches) and run it.

    ``vllm`` is a model directory, a config.json or a shipped model name (a tokenizer and dummy weights are
    made for the latter two); ``vllm_args`` are extra vLLM flags (e.g. ``--max-num-seqs=8``).
    """
    from .spec import load_plan
    from .targets import SimServerTarget, UrlTarget, VllmTarget

    chosen = [name for name, value in (("--target", target_url), ("--sim", sim), ("--sim-worksheet", sim_worksheet),
                                       ("--vllm", vllm)) if value]
    if len(chosen) != 1:
        raise PlanError(f"plan: got {', '.join(chosen) or 'no target'}: expected exactly one of --target URL, "
                        "--sim ENGINE, --sim-worksheet ENGINE, --vllm MODEL")
    spec = load_plan(plan_path)
    out = Path(out)
    if sim_worksheet:
        target: CellTarget = WorksheetTarget(sim_worksheet)
    elif sim:
        target = SimServerTarget(sim, out)
    elif vllm:
        from ..engines.vllm import VllmConfig, make_model_dir

        model_dir = Path(vllm)
        if not model_dir.is_dir():
            model_dir = make_model_dir(vllm, out / "model")
        target = VllmTarget(VllmConfig(model_dir=model_dir, served_model_name=model, extra_args=list(vllm_args or [])),
                            out / "vllm-logs", model=model)
    else:
        target = UrlTarget(str(target_url), model, api_key_env)
    with target:
        return run_plan(spec, target, out, max_new_runs=max_new_runs, time_budget_s=time_budget_s, log=log)
