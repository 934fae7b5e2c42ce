"""Running a load plan: the plan state, the predicted start, and one invocation of the walk.

``run_plan`` opens (or resumes) the plan directory's ``plan.json``, predicts where each line starts
(on a worksheet of a simulated engine), lets the walk (``walk``: which cell next, repeats at the
boundary, stop conditions, budgets — pure policy) drive the executor (``execute``: one run of a cell
against the target), and writes the region.

The walk is a pure function of the plan and the results already on disk. Every run writes
``cell_result.json`` into its run directory last; a rerun of the same command reads those and skips
finished runs, so an interrupted plan resumes where it stopped and ends with the same region as an
uninterrupted one (the worksheet is deterministic; live targets are as repeatable as the target).
Runs without the marker (interrupted mid-cell) are removed and redone.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loadgen.rundir.identity import harness_identity, utc_now_iso
from loadgen.rundir.io import load_run
from loadgen.rundir.manifest import read_manifest
from loadgen.util.errors import LoadgenError, PlanError
from loadgen.util.flat import flatten
from loadgen.util.outputfile import make_output_dir
from loadgen.workload.scenario import Scenario, load_scenario, scenario_from_manifest

from ..analysis import analyze_run
from ..ledger import EngineSettings, compute_ledger, read_model_config
from ..sim import EngineConfig, load_engine_config, run_worksheet
from ..targets import Target, TargetSpec, WorksheetTarget, open_target
from .cells import CellCoord, build_cell_trace
from .checks import judge_run
from .execute import CellExecutor
from .files import (
    ANALYSIS_FILE,
    PLAN_FILE,
    RESULT_FILE,
    read_cell_result,
    read_plan_state,
    write_plan_state,
)
from .fleet import build_fleet, write_fleet
from .region import build_region, write_region
from .spec import PlanSpec, load_plan
from .walk import (
    BudgetExhausted,
    CellOutcome,
    RunLimitReached,
    RunRecord,
    Walk,
    bisect_last_pass,
    predicted_start,
    start_index,
)

__all__ = [
    "ANALYSIS_FILE",
    "PLAN_FILE",
    "RESULT_FILE",
    "BudgetExhausted",
    "CellOutcome",
    "PlanResult",
    "RunRecord",
    "run_plan",
    "run_plan_file",
]

#: Target keys that must match for a plan directory to be resumed against a target.
_RESUME_TARGET_KEYS = ("kind", "engine", "engine_sha256", "base_url", "replicas", "route_policy")


@dataclass
class PlanResult:
    plan_dir: Path
    state: dict[str, Any]
    region: dict[str, Any]
    fleet: dict[str, Any] | None = None  # fleet sizing (plan [fleet]): the smallest replica count per rate step


class _Planner:
    """One invocation of a plan: its state file, the predicted start, the walk and the executor."""

    def __init__(
        self,
        spec: PlanSpec,
        target: Target,
        plan_dir: Path,
        *,
        max_new_runs: int | None,
        time_budget_s: float | None,
        log: Callable[[str], None],
        prediction_engine: EngineConfig | str | None,
    ) -> None:
        self.spec = spec
        self.target = target
        self.plan_dir = Path(plan_dir)
        self.scenario_path = spec.scenario_path()
        self.scenario = load_scenario(self.scenario_path)
        self.max_new_runs = max_new_runs
        self.time_budget_s = time_budget_s if time_budget_s is not None else spec.budget.time_s
        self.log = log
        self.prediction_engine = prediction_engine
        self.state: dict[str, Any] = {}

    # ---- state file -------------------------------------------------------------------------------
    def open_state(self) -> None:
        """Resume the plan directory's state (same plan, same target) or start a new one."""
        make_output_dir(self.plan_dir, "a plan directory (plan --out)", PlanError)
        path = self.plan_dir / PLAN_FILE
        if path.is_file():
            state = read_plan_state(path)
            self._check_resumable(state)
            self.state = state
        else:
            self.state = {
                "kind": "loadgen.plan",
                "version": 1,
                "plan": self.spec.model_dump(mode="json", by_alias=True),
                "plan_path": self.spec.source_path,
                "plan_sha256": self.spec.sha256,
                "scenario": {
                    "name": self.scenario.name,
                    "path": str(self.scenario_path),
                    "sha256": self.scenario.sha256,
                },
                "target": self.target.describe(),
                "rate_steps": self.spec.rate_steps,
                "harness": harness_identity().model_dump(mode="json"),
                "created_utc": utc_now_iso(),
                "invocations": [],
            }
        self.state["invocations"].append({"started_utc": utc_now_iso(), "pid": os.getpid()})
        self.state["status"] = "running"
        self.save_state()

    def _check_resumable(self, state: dict[str, Any]) -> None:
        """The same plan, scenario and target as the directory's first invocation, else one line naming what changed."""
        if state.get("plan_sha256") != self.spec.sha256:
            changed = changed_settings(state.get("plan") or {}, self.spec.model_dump(mode="json", by_alias=True))
            raise PlanError(
                f"{self.plan_dir}: holds plan {state.get('plan', {}).get('name')!r} (sha256 "
                f"{str(state.get('plan_sha256'))[:12]}), not {self.spec.source_path} ({str(self.spec.sha256)[:12]}): "
                + (
                    f"changed {'; '.join(changed)}"
                    if changed
                    else "its bytes changed but no setting did (comments or layout)"
                )
                + ": expected the same plan file to resume, or a new --out"
            )
        old_scenario = state.get("scenario") or {}
        if old_scenario.get("sha256") and old_scenario["sha256"] != self.scenario.sha256:
            recorded = self._recorded_scenario(old_scenario["sha256"])
            changed = changed_settings(recorded, self.scenario.model_dump(mode="json")) if recorded else []
            raise PlanError(
                f"{self.plan_dir}: its cells were judged against scenario {old_scenario.get('path')} (sha256 "
                f"{str(old_scenario['sha256'])[:12]}), which now differs ({str(self.scenario.sha256)[:12]}"
                + (f": changed {'; '.join(changed)}" if changed else "")
                + "): expected the same scenario to resume (its budgets judge every cell), or a new --out"
            )
        old_target = {k: v for k, v in state.get("target", {}).items() if k in _RESUME_TARGET_KEYS}
        new_target = {k: v for k, v in self.target.describe().items() if k in old_target}
        if old_target != new_target:
            raise PlanError(
                f"{self.plan_dir}: was run against {old_target}, not {new_target}: expected the same target to resume"
            )

    def _recorded_scenario(self, sha256: str) -> dict[str, Any]:
        """The scenario of that sha256 as a recorded run's manifest holds it ({} when none is readable)."""
        for marker in sorted((self.plan_dir / "cells").glob(f"*/rep*/{RESULT_FILE}")):
            try:
                scenario = scenario_from_manifest(read_manifest(self.plan_dir / read_cell_result(marker)["run_dir"]))
            except (LoadgenError, KeyError):
                continue
            if scenario is not None and scenario.sha256 == sha256:
                return scenario.model_dump(mode="json")
        return {}

    def save_state(self) -> None:
        write_plan_state(self.plan_dir / PLAN_FILE, self.state)

    # ---- start point -------------------------------------------------------------------------------
    def predict_start(self) -> None:
        """Per (class, concurrency): the highest rate step a worksheet passes, and the start below it."""
        if "start" in self.state:
            return
        spec = self.spec
        info: dict[str, Any] = {"mode": spec.start.mode, "steps_below": spec.start.steps_below, "lines": {}}
        engine = self.prediction_engine
        if spec.start.mode == "lowest" or engine is None:
            info["note"] = "start at the lowest rate step: " + (
                "plan start.mode = 'lowest'"
                if spec.start.mode == "lowest"
                else "no simulated engine to predict capacity from (give start.worksheet_engine)"
            )
            self.state["start"] = info
            self.save_state()
            return
        if spec.search.dimension == "concurrency":
            info["note"] = "concurrency lines start at the largest concurrency (no prediction needed)"
            self.state["start"] = info
            self.save_state()
            return
        predict_dir = self.plan_dir / "predict"
        info["engine"] = getattr(engine, "name", str(engine))
        for cls in spec.classes:
            for conc in spec.concurrency:
                best = self._predicted_last_pass(engine, cls, conc, predict_dir)
                info["lines"][f"{cls}.c{conc}"] = {
                    "predicted_last_pass": best,
                    "start_index": predicted_start(best, spec.start.steps_below),
                }
        shutil.rmtree(predict_dir, ignore_errors=True)
        info["note"] = (
            f"start {spec.start.steps_below} rate step(s) below the highest step the worksheet of "
            f"{info['engine']} passes (virtual time, same cell traces)"
        )
        self.state["start"] = info
        self.save_state()

    def _predicted_last_pass(self, engine: EngineConfig | str, cls: str, conc: int, predict_dir: Path) -> int:
        """The highest rate step a worksheet run passes (from the lowest, stopping at the first failure; by
        bisection in ``search.mode = "bisect"``); -1 if none."""
        spec = self.spec

        def passes(i: int) -> bool:
            coord = CellCoord(cls, "warm", conc, i, spec.rate_steps[i], spec.rate_kind)
            trace, _ = build_cell_trace(
                spec, self.scenario, coord, self.plan_dir / "traces" / f"{coord.cell_id}.parquet"
            )
            out = predict_dir / coord.cell_id
            if out.exists():
                shutil.rmtree(out)
            run_worksheet(
                trace,
                engine,
                out,
                seed=0,
                scenario=self.scenario_path,
                replicas=getattr(self.target, "replicas", 1),
                route_policy=getattr(self.target, "route_policy", "round-robin"),
            )
            analysis = analyze_run(out, scenario=self.scenario)
            judged = judge_run(analysis, load_run(out), spec.stops)
            shutil.rmtree(out)
            return not judged.conclusive_failure  # inconclusive (a short cell) still predicts a pass

        if spec.search.mode == "bisect":
            return bisect_last_pass(len(spec.rate_steps), passes)
        best = -1
        for i in range(len(spec.rate_steps)):
            if not passes(i):
                break
            best = i
        return best

    def start_at(self, cls: str, conc: int) -> int:
        return start_index(self.state.get("start", {}), cls, conc)

    # ---- one invocation ----------------------------------------------------------------------------
    def run(self) -> PlanResult:
        """Open the state, predict the start, walk until done, out of budget or run limit; write the region."""
        self.open_state()
        executor = CellExecutor(
            self.spec,
            self.scenario,
            self.scenario_path,
            self.target,
            self.plan_dir,
            self.state,
            max_new_runs=self.max_new_runs,
            time_budget_s=self.time_budget_s,
            log=self.log,
        )
        walk = Walk(self.spec, executor.run_once, self.start_at)
        ended = "complete"
        t0 = time.monotonic()
        try:
            self.predict_start()
            self.state["ledger"] = self.state.get("ledger") or _ledger_summary(self.spec, self.scenario)
            ended = walk.walk()
        except BudgetExhausted as exc:
            ended = f"budget exhausted: {exc}"
        except RunLimitReached:
            ended = (
                f"paused: this invocation's run limit ({self.max_new_runs}) reached; rerun the same command to resume"
            )
        except KeyboardInterrupt:
            self.state["status"] = "interrupted"
            self.state["invocations"][-1].update(
                ended_utc=utc_now_iso(), wall_s=time.monotonic() - t0, ended="interrupted"
            )
            self.save_state()
            raise
        self._finish(ended, time.monotonic() - t0, executor, walk)
        region = build_region(self.plan_dir, self.state)
        write_region(self.plan_dir, region)
        return PlanResult(self.plan_dir, self.state, region)

    def _finish(self, ended: str, wall_s: float, executor: CellExecutor, walk: Walk) -> None:
        """Record how the invocation ended, the budget consumed, the walk's lines and cells; save the state."""
        self.state["status"] = "complete" if ended == "complete" else "incomplete"
        self.state["ended"] = ended
        consumed_s, consumed_req = executor.consumed()
        self.state["budget"] = {
            "time_s": self.time_budget_s,
            "requests": self.spec.budget.requests,
            "consumed_time_s": round(consumed_s, 3),
            "consumed_requests": consumed_req,
        }
        self.state["invocations"][-1].update(
            ended_utc=utc_now_iso(), wall_s=round(wall_s, 3), new_runs=executor.new_runs, ended=ended
        )
        self.state["lines"] = walk.lines
        self.state["probes"] = walk.probes
        self.state["cells"] = {
            cid: {
                "coord": o.coord.to_dict(),
                "runs": [r.data["run_dir"] for r in o.runs],
                "extra_stops": o.extra_stops,
                "skipped_reason": o.skipped_reason,
            }
            for cid, o in sorted(walk.cells.items())
        }
        self.save_state()


def changed_settings(old: Any, new: Any, limit: int = 4) -> list[str]:
    """The settings that differ between two JSON documents, as ``dotted.key old → new`` (at most ``limit``,
    then a count of the rest); a key only one side has counts as changed."""
    a, b = flatten(old), flatten(new)
    out = [f"{k} {_short(a.get(k))} → {_short(b.get(k))}" for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]
    return out if len(out) <= limit else [*out[:limit], f"and {len(out) - limit} more"]


def _short(value: Any, width: int = 40) -> str:
    text = json.dumps(value, default=str)
    return text if len(text) <= width else text[: width - 1] + "…"


def _default_prediction_engine(spec: PlanSpec, target: Target) -> EngineConfig | None:
    """The target's own engine when it is simulated, else the plan's ``start.worksheet_engine``, else None."""
    if isinstance(target, WorksheetTarget):
        return target.engine
    engine_config: EngineConfig | None = getattr(target, "engine_config", None)  # a live simulated engine
    if engine_config is not None:
        return engine_config
    if spec.start.worksheet_engine:
        engine_ref = spec.start.worksheet_engine
        candidate = spec.base_dir() / engine_ref
        return load_engine_config(candidate if candidate.exists() else engine_ref)
    return None


def run_plan(
    spec: PlanSpec,
    target: Target,
    plan_dir: str | Path,
    *,
    max_new_runs: int | None = None,
    time_budget_s: float | None = None,
    prediction_engine: EngineConfig | str | None = None,
    log: Callable[[str], None] | None = None,
) -> PlanResult:
    """Run (or resume) ``spec`` against ``target`` into ``plan_dir``; write the region; return it.

    ``max_new_runs`` caps the runs this invocation may start (the rest is left for a resume);
    ``time_budget_s`` overrides the plan's total time budget (e.g. to extend it on resume);
    ``prediction_engine`` (a sim engine preset/config) predicts the start; by default the target's own
    engine when it is simulated, else the plan's ``start.worksheet_engine``.
    """
    if prediction_engine is None:
        prediction_engine = _default_prediction_engine(spec, target)
    if spec.fleet.sizing:
        return _run_fleet(spec, target, Path(plan_dir), max_new_runs, time_budget_s, prediction_engine, log)
    planner = _Planner(
        spec,
        target,
        Path(plan_dir),
        max_new_runs=max_new_runs,
        time_budget_s=time_budget_s,
        log=log or (lambda _m: None),
        prediction_engine=prediction_engine,
    )
    return planner.run()


def _run_fleet(
    spec: PlanSpec,
    target: Target,
    plan_dir: Path,
    max_new_runs: int | None,
    time_budget_s: float | None,
    prediction_engine: EngineConfig | str | None,
    log: Callable[[str], None] | None,
) -> PlanResult:
    """Walk the plan once per replica count (``replicas-N/``, each resumable) and size the fleet.

    Only on the worksheet: N engines in virtual time are what the simulated engine can honestly stand for.
    The time and request budgets apply to each replica count's walk."""
    if not isinstance(target, WorksheetTarget):
        raise PlanError(
            f"{spec.source_path or spec.name}: fleet.replicas = {list(spec.fleet.replicas)}: fleet sizing runs on "
            "the simulated engine's worksheet only: expected --sim-worksheet ENGINE"
        )
    profile = target.engine.cost.profile
    ep = profile.ep if profile is not None else 1
    if partial := [n for n in spec.fleet.replicas if n % ep]:
        raise PlanError(
            f"{spec.source_path or spec.name}: fleet.replicas = {list(spec.fleet.replicas)}: {partial[0]}: engine "
            f"{target.engine.name} is one data-parallel rank of an expert-parallel group of {ep} GPUs: expected "
            f"multiples of {ep} (whole vLLM servers)"
        )
    regions: dict[int, dict[str, Any]] = {}
    states: dict[str, Any] = {}
    left = max_new_runs
    for n in spec.fleet.replicas:
        fleet_target = WorksheetTarget(target.engine, n, spec.fleet.route_policy)
        planner = _Planner(
            spec,
            fleet_target,
            plan_dir / f"replicas-{n}",
            max_new_runs=left,
            time_budget_s=time_budget_s,
            log=log or (lambda _m: None),
            prediction_engine=prediction_engine,
        )
        result = planner.run()
        regions[n], states[str(n)] = result.region, result.state
        if left is not None:
            left = max(0, left - int(result.state["invocations"][-1].get("new_runs") or 0))
    fleet = build_fleet(regions, spec.fleet.route_policy)
    write_fleet(plan_dir, fleet)
    status = "complete" if all(s.get("status") == "complete" for s in states.values()) else "incomplete"
    return PlanResult(plan_dir, {"status": status, "replicas": states}, regions[spec.fleet.replicas[-1]], fleet)


def _ledger_summary(spec: PlanSpec, scenario: Scenario) -> dict[str, Any] | None:
    """When the plan names a model config: the KV-limited concurrency per class, to read the steps against."""
    ref = spec.start.model_config_path
    if not ref:
        return None
    path = Path(ref)
    if not path.is_absolute():
        path = spec.base_dir() / path
    ledger = compute_ledger(read_model_config(path), EngineSettings(), scenario)
    classes = {c.name: {"max_seqs_p99": c.max_seqs_p99, "limit_p99": c.limit_p99} for c in ledger.classes}
    beyond = [c for c in spec.concurrency if any(c > v["limit_p99"] for v in classes.values())]
    return {
        "model_config": str(path),
        "kv_cache_tokens": ledger.kv_cache_tokens,
        "classes": classes,
        "note": (
            f"concurrency steps {beyond} exceed the KV-limited concurrency of some class (default engine settings)"
            if beyond
            else "every concurrency step fits the KV pool at p99 lengths (default engine settings)"
        ),
    }


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
    workers: int = 1,
) -> PlanResult:
    """Load a plan file, build exactly one target (URL, live sim server, worksheet, or a vLLM it launches) and run it.

    ``vllm`` is a model directory, a config.json or a shipped model name (a tokenizer and dummy weights are
    made for the latter two); ``vllm_args`` are extra vLLM flags (e.g. ``--max-num-seqs=8``).
    """
    target_spec = TargetSpec(
        url=target_url,
        sim=sim,
        worksheet=sim_worksheet,
        vllm=vllm,
        model=model,
        vllm_args=tuple(vllm_args or ()),
        api_key_env=api_key_env,
        workers=workers,
    )
    spec = load_plan(plan_path)
    out = Path(out)
    target = open_target(target_spec, out)
    with target:
        return run_plan(spec, target, out, max_new_runs=max_new_runs, time_budget_s=time_budget_s, log=log)
