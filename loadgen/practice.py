"""The practice, end to end: KV ledger, both candidates on the burst trace, the decision and its owners.

``run_practice()`` with no arguments launches the simulated engine twice on loopback, once per profiled GPU
engine of ``SIM_CANDIDATES`` (vLLM 0.19 serving Llama-3.1-8B on an RTX PRO 6000 and on an RTX 4090: step times
from each GPU's operator profile, validated against a measured vLLM run of it), warms each with a fixed warm-up
set, replays a window of the canonical burst trace through the real driver, replays the behaviour cases when the
scenario configures them, prints the memory ledger of a shipped model config under each candidate's settings
on its GPU (``loadgen.practice_ledger``), and compares the two for interactive routing: hard budgets first,
then behaviour, then throughput and cost. It shows workload, package, hardware, runtime, warm state, tails with
counts, errors, behaviour constraints, each engine's label (where its costs came from) and who owns which part
of the decision, and writes every run directory plus ``decision.json`` under ``out``. ``PracticeOptions
(candidates=PRESET_CANDIDATES)`` compares the two uncalibrated presets instead (an illustration, not evidence).
``PracticeOptions(targets=(URL, URL))`` does the same against two running endpoints; ``engine="vllm"``
launches two real vLLM configurations (``loadgen.vllm``), reads each one's scheduler limits while it is up and,
once both have stopped, runs the worksheet on the same trace with ``predict_with``'s cost terms under those
limits: ``decision["prediction"]`` holds, per candidate and class, the predicted and measured figures and the
error between them (as ``loadgen sim validate``).
"""

from __future__ import annotations

import json
import shlex
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pyarrow as pa
import pyarrow.compute as pc
from pydantic import ValidationError

from loadgen.rundir.identity import sha256_file
from loadgen.rundir.manifest import read_manifest
from loadgen.util.errors import LoadgenError, PlanError
from loadgen.util.outputfile import make_output_dir, write_output_text
from loadgen.util.pinning import engine_cpus, shared_cpus_warning
from loadgen.util.validation import format_validation_error
from loadgen.vllm import VllmConfig, make_model_dir, shipped_model_path
from loadgen.workload import presets
from loadgen.workload.scenario import Scenario, TraceSettings, load_scenario

from .analysis.budgets import SEND_LAG_BOUND_MS, client_lag_line
from .calibration.calibrate import EngineLimits, engine_limits
from .calibration.validate import QUANTITIES, FidelityRow, predict_beside, with_engine_limits
from .driver.options import RunSettings
from .ledger import EngineSettings, compute_ledger, format_ledger, read_model_config
from .plan.cells import build_warmup_trace
from .plan.compare import Comparison, check_send_lag_bound, compare_candidates, format_comparison
from .plan.contract_hook import CONTRACT_FILE, replay_contract
from .plan.prices import load_prices
from .practice_ledger import candidate_ledgers
from .practice_result import PRACTICE_SCHEMA_VERSION, PracticeDecision
from .sim import EngineConfig, load_engine_config
from .targets import RunRequest, SimServerTarget, Target, UrlTarget, VllmTarget
from .trace.generate import generate_trace_file
from .trace.io import read_trace, write_trace
from .util.redact import redact_url

__all__ = [
    "SIM_CANDIDATES",
    "PRESET_CANDIDATES",
    "DEFAULT_PREDICTOR",
    "OWNERSHIP",
    "PracticeOptions",
    "PracticeResult",
    "run_practice",
    "practice_trace",
    "format_practice",
]

#: The canonical comparison: two profiled engines validated against measured vLLM 0.19 runs, the same model
#: (Llama-3.1-8B, as DEFAULT_MODEL_CONFIG) on two GPUs, each under the scheduler limits its measured run logged.
#: Under the burst the RTX 4090's 2,048-token prefill steps (about 198 ms, its profile) breach the 150 ms p99 ITL
#: budgets; the RTX PRO 6000's (about 85 ms) do not. The first is the reference for behaviour diffs.
SIM_CANDIDATES = ("rtxpro6000-llama-3.1-8b-tp1", "rtx4090-llama-3.1-8b-tp1")
#: The uncalibrated presets (hand-set cost terms; an illustration, not evidence): ``--candidate`` each of them.
PRESET_CANDIDATES = ("interactive-small-batch", "throughput-large-batch")
DEFAULT_MODEL_CONFIG = "llama-3.1-8b"
#: The engine TOML whose cost terms predict the real-vLLM candidates (each under its own scheduler limits).
#: An uncalibrated preset on purpose: ``--engine vllm`` launches the shipped tiny model (on a CPU build in CI),
#: and no profiled engine measured that model on that device; a profiled engine's GPU step times would
#: predict it no better. Give ``--predict-with`` a profiled engine when the vLLM candidates run its GPU and model.
DEFAULT_PREDICTOR = "interactive-small-batch"
#: The two real vLLM configurations of ``--engine vllm`` (small vs large batch), by label.
VLLM_CONFIGS: dict[str, dict[str, int]] = {
    "vllm-small-batch": {"max_num_seqs": 8, "max_num_batched_tokens": 1024},
    "vllm-large-batch": {"max_num_seqs": 128, "max_num_batched_tokens": 16384},
}
#: How often a candidate is measured, each time launched fresh, while its client falls behind its schedule (a busy
#: host); the last attempt stands, and the comparison shows it as unmeasured if it fell behind too.
MEASURE_ATTEMPTS = 3

#: What the practice decides (decision.json "question", the report's title).
QUESTION = (
    "which serving candidate takes interactive traffic? (reject any candidate that violates a hard p99 budget, "
    "TTFT or ITL, whatever its throughput or cost)"
)
#: Who owns what (the seed's division of authority), printed with every decision.
OWNERSHIP = {
    "llm_engineering": "owns the workload definitions, behaviour constraints, package identity and the user-visible "
    "interpretation: this routing decision",
    "platform_sre": "owns fleet capacity and reliability: how many replicas of the chosen candidate, headroom, "
    "failover; the capacity region (loadgen plan) is their input",
    "kernel_specialists": "own low-level optimisation (attention/GEMM kernels, batching internals); when a p99 "
    "latency budget (TTFT, ITL) or memory fails they get a reproducible handoff (loadgen handoff), not a prescribed "
    "kernel rewrite",
}


#: Measures one candidate into (run directory, warm-up directory): launch, warm-up, measured run, contract.
MeasureOnce = Callable[[Path, Path], None]
#: Warms ``target`` up and runs the practice trace on it: (target, run dir, warm-up dir, label, launch note).
WarmAndRun = Callable[[Target, Path, Path, str, str], Path]


@dataclass
class PracticeResult:
    out_dir: Path
    decision: dict[str, Any]
    comparison: Comparison
    ledgers: dict[str, str] = field(default_factory=dict)
    run_dirs: dict[str, Path] = field(default_factory=dict)


def practice_trace(source: Path, out: Path, window_s: float | None) -> Path:
    """The burst trace, cut to its first ``window_s`` seconds (None: whole) so the practice stays short."""
    return _write_cut(source, out, window_s, _cut(source, window_s))


def _cut(source: Path, window_s: float | None) -> tuple[pa.Table, dict[str, Any]] | None:
    """``source`` read and checked, cut to its first ``window_s`` seconds (None: whole, nothing to cut)."""
    table, meta = read_trace(source)
    _check_settings(source, meta.get("settings"))
    if window_s is None:
        return None
    keep = pc.less(table.column("scheduled_offset_ns"), int(window_s * 1e9))
    cut = table.filter(keep)
    if cut.num_rows == 0:
        raise PlanError(f"{source}: no request in the first {window_s:g} s: expected a longer window")
    return cut, meta


def _check_settings(source: Path, settings: Any) -> None:
    """The trace's recorded arrival setting, which decision.json carries typed: one line when it is not one the
    trace generator writes (another tool's metadata), before anything is measured."""
    if settings is None:
        return
    try:
        TraceSettings.model_validate(settings)
    except ValidationError as exc:
        raise PlanError(
            format_validation_error(f"{source}: metadata settings", exc, TraceSettings)
            + " (the arrival setting loadgen's trace generator records)"
        ) from None


def _write_cut(source: Path, out: Path, window_s: float | None, cut: tuple[pa.Table, dict[str, Any]] | None) -> Path:
    """Write ``_cut``'s result to ``out`` (the whole file copied when nothing was cut)."""
    if window_s is None or cut is None:
        shutil.copyfile(source, out)
        return out
    table, meta = cut
    meta = {
        **meta,
        "duration_s": min(float(meta.get("duration_s") or window_s), window_s),
        "requests": table.num_rows,
        "derived_from": {
            "path": str(source),
            "sha256": sha256_file(source),
            "window_s": [0.0, window_s],
            "how": "kept requests scheduled in the window; nothing re-timed",
        },
    }
    return write_trace(table, out, meta)


def _canonical_trace(scenario_path: Path, out_dir: Path) -> Path:
    shipped = presets.canonical_trace("burst")
    if shipped is not None:
        return shipped

    return generate_trace_file(load_scenario(scenario_path), "burst", out_dir / "canonical-burst.parquet")


def _warm_and_run(
    target: Target,
    trace: Path,
    scenario_path: Path,
    run_dir: Path,
    warm_dir: Path,
    label: str,
    launch_note: str,
    workers: int = 1,
) -> Path:
    """Fixed warm-up set (first 8 requests of the trace at 8 rps), then the measured run (over ``workers``
    worker processes when more than one)."""
    if workers > 1:
        target.run_defaults = RunSettings(workers=workers)
    warm_trace = build_warmup_trace(trace, 8, 8.0, warm_dir.parent / f"{warm_dir.name}.parquet")
    state = target.prepare("warm", warm_trace, warm_dir, scenario_path)
    state.actions.insert(0, launch_note)
    return target.run(
        RunRequest(
            trace, run_dir, state, scenario_path=scenario_path, extra_manifest={"practice": {"candidate": label}}
        )
    )


@dataclass
class _Attempts:
    """Each candidate measured until its client kept the schedule (``MEASURE_ATTEMPTS`` at most); every attempt's
    directories stay on disk, and the discarded ones are listed with the reason."""

    out_dir: Path
    say: Callable[[str], None]
    max_send_lag_ms: float = SEND_LAG_BOUND_MS
    discarded: dict[str, list[dict[str, Any]]] = field(default_factory=dict)

    def measure(self, label: str, once: MeasureOnce, most: int = MEASURE_ATTEMPTS) -> Path:
        """``once`` until its run kept the schedule, ``most`` times at most; the last attempt's run directory."""
        for attempt in range(1, most + 1):
            name = label if attempt == 1 else f"{label}-attempt{attempt}"
            run_dir = self.out_dir / name
            once(run_dir, self.out_dir / f"{name}-warmup")
            why = client_lag_line(read_manifest(run_dir).send_lag_p99_ms, self.max_send_lag_ms)
            if why is None or attempt == most:
                return run_dir
            self.discarded.setdefault(label, []).append({"run_dir": str(run_dir), "why": why})
            self.say(f"practice: {label}: measuring again, launched fresh (attempt {attempt + 1}): {why}")
        raise AssertionError("unreachable")


@dataclass(frozen=True)
class PracticeOptions:
    """What the practice compares, and how (``run_practice``; every field has the CLI's default).

    ``targets``: two running endpoints to compare instead of launched engines (``model`` and ``api_key_env``:
    their served model, and the NAME of the env var holding their key, never recorded); ``engine``: ``sim``
    (the two ``candidates`` engines, presets or TOMLs) or ``vllm`` (two real vLLM configurations, predicted with
    ``predict_with``'s cost terms; ``vllm_args``: extra flags for both, e.g. ``--enforce-eager``);
    ``window_s``: replay the first N s of the trace (None: all of it); ``max_send_lag_ms``: a measured run
    whose client send-lag p99 exceeds it is measured again, launched fresh (``MEASURE_ATTEMPTS`` in all), and
    the comparison shows a candidate whose last attempt exceeds it as unmeasured.
    """

    scenario: str | Path | None = None
    trace: str | Path | None = None
    window_s: float | None = 40.0
    candidates: tuple[str, ...] = SIM_CANDIDATES
    targets: tuple[str, ...] = ()
    model: str | None = None
    engine: str = "sim"
    model_config: str | None = None  # None: the profiled candidates' own model, else DEFAULT_MODEL_CONFIG
    prices: str | Path | None = None
    route: str = "interactive"
    api_key_env: str | None = None
    workers: int = 1
    predict_with: str | Path = DEFAULT_PREDICTOR
    vllm_args: tuple[str, ...] = ()
    max_send_lag_ms: float = SEND_LAG_BOUND_MS


@dataclass
class _Practice:
    """One practice as it runs: its inputs on disk, and what the candidates share (attempts, contract reference)."""

    options: PracticeOptions
    out_dir: Path
    scenario_path: Path
    scen: Scenario
    trace_path: Path
    say: Callable[[str], None]
    attempts: _Attempts
    contract_ref: Any = None

    def warm_and_run(self, target: Target, run_dir: Path, warm_dir: Path, label: str, note: str) -> Path:
        return _warm_and_run(
            target, self.trace_path, self.scenario_path, run_dir, warm_dir, label, note, self.options.workers
        )

    def contract_for(self, label: str, url: str, served: str | None, run_dir: Path) -> None:
        """The behaviour cases against ``url``; the first candidate's answers are the reference."""
        result = replay_contract(
            self.scen,
            url,
            served,
            out_path=run_dir / CONTRACT_FILE,
            reference=self.contract_ref,
            api_key_env=self.options.api_key_env,
        )
        if self.contract_ref is None and result.get("_result") is not None:
            self.contract_ref = result["_result"]
        self.say(f"practice: {label}: {result['summary']}")


def run_practice(
    out: str | Path | None = None, options: PracticeOptions | None = None, log: Callable[[str], None] | None = None
) -> PracticeResult:
    """Run the practice (see the module docstring); returns the decision and writes ``out``/decision.json
    (default ``runs/practice-<utc>``). ``log``: where progress lines go (default: nowhere)."""
    opts = options or PracticeOptions()
    check_send_lag_bound(opts.max_send_lag_ms, "practice")  # before any work
    vllm = opts.engine == "vllm" and not opts.targets
    predictor = load_engine_config(opts.predict_with) if vllm else None  # before any work
    prices = load_prices(opts.prices if opts.prices is not None else presets.prices_example())  # before any work
    sims = opts.engine == "sim" and not opts.targets
    # the simulated candidates (their calibration labels go in the decision), checked before any work
    configs: list[EngineConfig] = sim_candidates(opts.candidates) if sims else []
    practice = _start(out, opts, log or (lambda _m: None))
    t0 = time.monotonic()
    ledgers: dict[str, str] = {}
    ledger_data: dict[str, Any] = {}
    prediction: dict[str, Any] | None = None
    if opts.targets:
        run_dirs = _measure_targets(practice)
    elif vllm and predictor is not None:
        run_dirs, ledgers, ledger_data, limits = _run_vllm(
            practice.out_dir,
            practice.scen,
            practice.say,
            practice.warm_and_run,
            practice.contract_for,
            practice.attempts,
            opts.vllm_args,
        )
        prediction = _predict(
            predictor, limits, run_dirs, practice.trace_path, practice.scen, practice.out_dir, practice.say
        )
    elif sims:
        ledgers, ledger_data = candidate_ledgers(
            ledger_model_config(opts.model_config, configs), configs, practice.scen
        )
        run_dirs = _measure_sims(practice, configs)
    else:
        raise PlanError(f"practice --engine {opts.engine!r}: expected 'sim' or 'vllm'")
    comparison = compare_candidates(
        [run_dirs[k] for k in run_dirs], route=opts.route, prices=prices, max_send_lag_ms=opts.max_send_lag_ms
    )
    decision = _decision(practice, comparison, run_dirs, ledger_data, configs, round(time.monotonic() - t0, 1))
    if prediction is not None:
        decision["prediction"] = prediction
    decision = PracticeDecision.from_document(decision).document()  # every key named by the published schema
    write_output_text(practice.out_dir / "decision.json", json.dumps(decision, indent=2) + "\n")
    return PracticeResult(practice.out_dir, decision, comparison, ledgers, run_dirs)


def sim_candidates(names: tuple[str, ...]) -> list[EngineConfig]:
    """The simulated candidates, loaded; refused in one line (before anything runs) when they serve different
    models: the practice compares two ways of serving one model, and its comparison refuses any other pair."""
    configs = [load_engine_config(name) for name in names]
    models = {cfg.model for cfg in configs}
    if len(models) > 1:
        served = ", ".join(f"{name} serves {cfg.model!r}" for name, cfg in zip(names, configs, strict=True))
        raise PlanError(f"practice --candidate: {served}: expected two candidates serving the same model")
    return configs


def ledger_model_config(given: str | None, configs: list[EngineConfig]) -> str:
    """The model config the candidates' ledgers are computed for: ``given``; else the model every profiled
    candidate's profile composes (its config.json); else ``DEFAULT_MODEL_CONFIG`` (the shipped Llama-3.1-8B)."""
    if given is not None:
        return given
    paths = {cfg.cost.profile.model_config_path for cfg in configs if cfg.cost.profile is not None}
    if len(paths) == 1 and all(cfg.cost.profile is not None for cfg in configs):
        return paths.pop()
    return DEFAULT_MODEL_CONFIG


def _start(out: str | Path | None, opts: PracticeOptions, say: Callable[[str], None]) -> _Practice:
    """The output directory (new or empty), the scenario, and the practice trace cut from the burst trace."""
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    out_dir = Path(out) if out else Path("runs") / f"practice-{stamp}"
    if out_dir.is_dir() and any(out_dir.iterdir()):
        raise PlanError(f"{out_dir}: not empty: expected a new output directory for the practice")
    scenario_path = Path(opts.scenario) if opts.scenario else presets.canonical_scenario()
    scen = load_scenario(scenario_path)  # the inputs before the directory: a refusal leaves nothing behind
    given = Path(opts.trace) if opts.trace else presets.canonical_trace("burst")
    cut = _cut(given, opts.window_s) if given is not None else None
    make_output_dir(out_dir, "a new output directory for the practice", PlanError)
    source = given if given is not None else _canonical_trace(scenario_path, out_dir)
    if given is None:
        cut = _cut(source, opts.window_s)
    trace_path = _write_cut(source, out_dir / "trace.parquet", opts.window_s, cut)
    attempts = _Attempts(out_dir, say, opts.max_send_lag_ms)
    return _Practice(opts, out_dir, scenario_path, scen, trace_path, say, attempts)


def _target_label(i: int) -> str:
    """The label of the ``i``-th ``--target``: candidate-a, candidate-b."""
    return f"candidate-{chr(ord('a') + i)}"


def _measure_targets(practice: _Practice) -> dict[str, Path]:
    """Two running endpoints, candidate-a and candidate-b, each warmed up and measured."""
    opts, run_dirs = practice.options, {}
    if len(opts.targets) < 2:
        raise PlanError(f"practice --target: got {len(opts.targets)} URL(s): expected two (one per candidate)")
    for i, url in enumerate(opts.targets):
        label = _target_label(i)
        practice.say(f"practice: {label}: warm-up then the burst trace against {redact_url(url)}")

        def on_url(run_dir: Path, warm_dir: Path, label: str = label, url: str = url) -> None:
            with UrlTarget(url, opts.model, opts.api_key_env) as target:
                note = "target not launched by loadgen: its load/compile state is whatever it was"
                practice.warm_and_run(target, run_dir, warm_dir, label, note)
            practice.contract_for(label, url, opts.model, run_dir)

        run_dirs[label] = practice.attempts.measure(label, on_url)
    return run_dirs


def _measure_sims(practice: _Practice, configs: list[EngineConfig]) -> dict[str, Path]:
    """Each simulated candidate launched fresh on loopback, warmed up and measured."""
    run_dirs = {}
    for cfg, name in zip(configs, practice.options.candidates):

        def on_sim(run_dir: Path, warm_dir: Path, cfg: EngineConfig = cfg, name: str = name) -> None:
            with SimServerTarget(name, practice.out_dir / f"{run_dir.name}-server") as sim:
                pid, url = sim.server.pid, sim.url or ""
                practice.say(
                    f"practice: {cfg.name}: sim server pid {pid} on {url}; warm-up, then {practice.trace_path.name}"
                    f" ({cfg.calibration_label()})"
                )
                note = f"sim server launched fresh by loadgen (pid {pid}): empty KV and prefix cache"
                practice.warm_and_run(sim, run_dir, warm_dir, cfg.name, note)
                practice.contract_for(cfg.name, url, cfg.model, run_dir)

        run_dirs[cfg.name] = practice.attempts.measure(cfg.name, on_sim)
    return run_dirs


def _decision(
    practice: _Practice,
    comparison: Comparison,
    run_dirs: dict[str, Path],
    ledger_data: dict[str, Any],
    configs: list[EngineConfig],
    wall_s: float,
) -> dict[str, Any]:
    """decision.json: the question, the workload, the ledger, the comparison and its decision, the owners."""
    out_dir, engine = practice.out_dir, practice.options.engine
    cdict = comparison.to_dict()
    return {
        "kind": "loadgen.practice",
        "version": PRACTICE_SCHEMA_VERSION,
        "question": QUESTION,
        "out_dir": str(out_dir),
        "wall_s": wall_s,
        "engine": engine,
        "workload": _workload(practice.scen, practice.trace_path),
        "ledger": ledger_data or {"note": "not computed: real engines report their own KV cache (see engine_notes)"},
        "candidates": {k: str(v) for k, v in run_dirs.items()},
        "discarded_runs": practice.attempts.discarded,
        "comparison": cdict,
        "decision": cdict["decision"],
        "ownership": OWNERSHIP,
        "next_steps": _next_steps(cdict, run_dirs, out_dir, _plan_flags(practice, configs)),
        "modelExecuted": any(c["context"]["runtime"].get("modelExecuted") for c in cdict["candidates"]),
        "engine_calibration": (
            {cfg.name: cfg.calibration_label() for cfg in configs}
            if engine == "sim"
            else {"vllm": "real engine: measured, not predicted"}
        ),
    }


def _plan_flags(practice: _Practice, configs: list[EngineConfig]) -> dict[str, str]:
    """Per candidate label, the ``loadgen plan`` flags that reach the same engine: the simulated engine as it was
    named (preset or TOML path), the endpoint, or the vLLM configuration on the practice's model."""
    opts = practice.options
    if opts.targets:
        extra = (f" --model {shlex.quote(opts.model)}" if opts.model else "") + (
            f" --api-key-env {shlex.quote(opts.api_key_env)}" if opts.api_key_env else ""
        )
        return {
            _target_label(i): f"--target {shlex.quote(redact_url(url))}{extra}" for i, url in enumerate(opts.targets)
        }
    if opts.engine == "vllm":
        model_dir = shlex.quote(str(practice.out_dir / "model"))
        return {
            label: f"--vllm {model_dir} "
            + " ".join(f"--vllm-arg=--{k.replace('_', '-')}={v}" for k, v in knobs.items())
            + "".join(f" --vllm-arg={shlex.quote(a)}" for a in opts.vllm_args)
            for label, knobs in VLLM_CONFIGS.items()
        }
    return {cfg.name: f"--sim-worksheet {shlex.quote(str(name))}" for cfg, name in zip(configs, opts.candidates)}


def _next_steps(
    cdict: dict[str, Any], run_dirs: dict[str, Path], out_dir: Path, plan_flags: dict[str, str]
) -> list[str]:
    """A reproducible handoff per candidate rejected at hard budgets (naming what failed), then fleet sizing on
    the chosen one (``plan_flags``: how ``loadgen plan`` reaches each candidate)."""
    failed = {c["label"]: c.get("breaches") or [] for c in cdict["candidates"]}
    steps = []
    for r in cdict["decision"]["rejected"]:
        label = r["label"]
        if r["step"] != "hard budgets" or label not in run_dirs:
            continue
        run_dir, bundle = shlex.quote(str(run_dirs[label])), shlex.quote(str(out_dir / f"{label}-handoff"))
        steps.append(
            f"specialist handoff for {label} (the failing {_breached(failed.get(label, []))}, reproducible): "
            f"loadgen handoff {run_dir} --out {bundle}"
        )
    chosen = cdict["decision"]["chosen"]
    flags = plan_flags.get(chosen or "", "<the chosen engine's flags>")
    return steps + [
        f"fleet sizing for the chosen candidate (platform/SRE): loadgen plan canonical-region {flags} --out runs/region"
    ]


def _breached(breaches: list[dict[str, Any]]) -> str:
    """The hard budgets a candidate failed, named once each: ``itl_ms p99, ttft_ms p99``."""
    names = list(dict.fromkeys(f"{b['metric']} {b['percentile']}" for b in breaches))
    return ", ".join(names) or "hard budgets"


def _workload(scen: Scenario, trace_path: Path) -> dict[str, Any]:

    table, meta = read_trace(trace_path)
    classes = table.column("request_class").to_pylist()
    return {
        "scenario": scen.name,
        "scenario_path": scen.source_path,
        "scenario_sha256": scen.sha256,
        "trace": str(trace_path),
        "trace_sha256": sha256_file(trace_path),
        "trace_name": meta.get("trace_name"),
        "seed": meta.get("seed"),
        "requests": table.num_rows,
        "duration_s": meta.get("duration_s"),
        "derived_from": meta.get("derived_from"),
        "settings": meta.get("settings"),
        "requests_per_class": {c: classes.count(c) for c in sorted(set(classes))},
        "budgets": {name: cls.budgets.model_dump(mode="json", exclude_none=True) for name, cls in scen.classes.items()},
        "behavior_cases": list(scen.behavior.cases),
    }


def _run_vllm(
    out_dir: Path,
    scen: Scenario,
    say: Callable[[str], None],
    warm_and_run: WarmAndRun,
    contract_for: Callable[..., None],
    attempts: _Attempts,
    vllm_args: tuple[str, ...] = (),
) -> tuple[dict[str, Path], dict[str, str], dict[str, Any], dict[str, EngineLimits | str]]:
    """Two real vLLM configurations (small vs large batch) on the shipped tiny model, same trace; each one's
    scheduler limits are read while it is up (a string says why they could not be)."""
    # the shipped tiny model, with a context long enough for the canonical threads (prompt + reply < 4096)
    base = json.loads(shipped_model_path("tiny-llama-gqa").read_text())
    base["max_position_embeddings"] = max(int(base.get("max_position_embeddings") or 0), 4096)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "model-config.json").write_text(json.dumps(base, indent=2))
    model_dir = make_model_dir(out_dir / "model-config.json", out_dir / "model")
    kv_gib = 2
    configs = VLLM_CONFIGS
    model = read_model_config(model_dir / "config.json")
    ledgers, ledger_data = {}, {}
    for label, knobs in configs.items():
        ledger = compute_ledger(
            model,
            EngineSettings(
                device="cpu",
                kv_cache_gib=kv_gib,
                max_model_len=4096,
                max_num_seqs=knobs["max_num_seqs"],
                max_num_batched_tokens=knobs["max_num_batched_tokens"],
            ),
            scen,
        )
        ledgers[label] = format_ledger(ledger)
        ledger_data[label] = ledger.result().document() | {"model_config": str(model_dir / "config.json")}
    run_dirs: dict[str, Path] = {}
    limits: dict[str, EngineLimits | str] = {}
    # an engine on the client's own cores makes the client fall behind by construction (a CPU vLLM on 2 shared
    # cores: 240-1,045 ms in CI), and another launch would not change that: measured once, shown unmeasured
    most = 1 if shared_cpus_warning(engine_cpus()) is not None else MEASURE_ATTEMPTS
    for label, knobs in configs.items():
        cfg = VllmConfig(
            model_dir=model_dir,
            served_model_name="loadgen-practice",
            max_model_len=4096,
            kv_cache_gib=kv_gib,
            extra_args=list(vllm_args),
            max_num_seqs=knobs["max_num_seqs"],
            max_num_batched_tokens=knobs["max_num_batched_tokens"],
        )

        def on_vllm(run_dir: Path, warm_dir: Path, cfg: VllmConfig = cfg, label: str = label) -> None:
            with VllmTarget(cfg, out_dir / f"{run_dir.name}-logs", model="loadgen-practice") as target:
                say(f"practice: {label}: vLLM healthy after {target.ready_s or 0:.0f} s on {target.url}")
                note = f"vLLM launched fresh by loadgen ({label}); ready in {target.ready_s or 0:.0f} s"
                warm_and_run(target, run_dir, warm_dir, label, note)
                contract_for(label, target.url or "", "loadgen-practice", run_dir)
                limits[label] = _live_limits(target)

        run_dirs[label] = attempts.measure(label, on_vllm, most)
    return run_dirs, ledgers, ledger_data, limits


def _live_limits(target: VllmTarget) -> EngineLimits | str:
    """The running engine's scheduler limits, read as ``sim validate`` reads them, or why they could not be."""
    notes = target.server.engine_notes() if target.server is not None else None
    try:
        return engine_limits(target.url or "", notes)
    except (LoadgenError, httpx.HTTPError, ValueError, KeyError) as exc:
        return f"scheduler limits not readable from {target.url}: {exc}"


def _predict(
    predictor: EngineConfig,
    limits: dict[str, EngineLimits | str],
    run_dirs: dict[str, Path],
    trace_path: Path,
    scen: Scenario,
    out_dir: Path,
    say: Callable[[str], None],
) -> dict[str, Any]:
    """Per candidate: the worksheet (``predictor``'s cost terms, the candidate's own limits) beside its measured run."""
    out: dict[str, Any] = {}
    for label, lim in limits.items():
        entry = {
            "engine": predictor.name,
            "engine_path": predictor.source_path,
            "engine_sha256": predictor.sha256,
            "calibrated": predictor.calibrated,
            "label": predictor.calibration_label(),
        }
        if isinstance(lim, str):
            out[label] = {**entry, "skipped": lim}
            continue
        say(f"practice: {label}: predicting it with the worksheet ({predictor.name}) on the same trace")
        sim_dir = out_dir / f"{label}-predicted"
        rows = predict_beside(label, run_dirs[label], trace_path, with_engine_limits(predictor, lim), sim_dir, scen)
        out[label] = {
            **entry,
            "limits": lim.to_dict(),
            "worksheet": str(sim_dir),
            "classes": {r.request_class: _class_prediction(r) for r in rows},
        }
    return out


def _class_prediction(row: FidelityRow) -> dict[str, Any]:
    """One class: predicted and measured figures (ms, req/s, attainment share), error % and attainment points."""
    return {
        "n_measured": row.n_measured,
        "n_predicted": row.n_simulated,
        "predicted": row.simulated,
        "measured": row.measured,
        "error_pct": row.errors_pct,
        "attainment_diff_points": row.attainment_diff_points,
        "send_lag_p99_ms": row.send_lag_p99_ms,
        "client_lagged": row.client_lagged,
    }


def format_practice(result: PracticeResult) -> str:
    """The console report: ledger, workload, each candidate's identity, the comparison, the owners."""

    d = result.decision
    lines = ["=" * 100, f"Practice: {QUESTION}", "=" * 100]
    lines += _verdict_lines(d)
    lines.append("")
    lines += _workload_lines(d["workload"])
    lines.append("")
    labels = d.get("engine_calibration") or {}
    if result.ledgers:
        for name, text in result.ledgers.items():
            lines.append(f"KV LEDGER — {name} settings" + (f" on {_gpu(d, name)}" if _gpu(d, name) else ""))
            lines += [f"  {labels[name]}"] if name in labels else []
            lines += ["  " + ln for ln in text.splitlines()]
            lines.append("")
    lines.append("CANDIDATES (package, hardware, runtime, warm state)")
    for c in d["comparison"]["candidates"]:
        lines += _candidate_lines(c, labels.get(c["label"]))
    lines.append("")
    lines.append(format_comparison(result.comparison))
    lines.append("")
    lines += _format_prediction(d.get("prediction") or {})
    lines.append("WHO OWNS THE DECISION")
    for who, what in OWNERSHIP.items():
        lines.append(f"  {who.replace('_', ' ')}: {what}")
    for step in d.get("next_steps", []):
        lines.append(f"  next: {step}")
    lines.append("")
    lines.append(
        f"modelExecuted: {d['modelExecuted']} (simulated engine: no model produced these tokens)"
        if d["engine"] == "sim"
        else f"modelExecuted: {d['modelExecuted']}"
    )
    for label in (d.get("engine_calibration") or {}).values():
        lines.append(label)
    lines.append(f"written: {result.out_dir}/decision.json and one run directory per candidate ({d['wall_s']} s)")
    return "\n".join(lines)


def _verdict_lines(d: dict[str, Any]) -> list[str]:
    """The verdict: who takes the route, who was rejected at which step and why, what was measured again."""
    dec = d["decision"]
    head = dec.get("headline_throughput") or {}
    lines = [
        f"VERDICT ({dec['route']} routing): "
        + (f"{dec['chosen']} takes it" if dec["chosen"] else "no candidate eligible")
    ]
    for rej in dec["rejected"]:
        tag = " (the headline-throughput configuration)" if rej["label"] == head.get("label") else ""
        lines.append(f"  rejected: {rej['label']}{tag} at {rej['step']}: {rej['why'][0]}")
    for unsure in dec.get("inconclusive", []):
        for why in unsure["why"]:
            lines.append(f"  {unsure['label']}: {why}")
    for unmeasured in dec.get("unmeasured", []):
        lines.append(f"  unmeasured: {unmeasured['label']}: {unmeasured['why'][0]}")
    for label, runs in d.get("discarded_runs", {}).items():
        for run in runs:
            lines.append(f"  measured again: {label}: {run['run_dir']} discarded: {run['why']}")
    return lines


def _workload_lines(w: dict[str, Any]) -> list[str]:
    """The workload: scenario, trace and window with their hashes, each class's budgets, the behaviour cases."""
    lines = [
        "WORKLOAD (owned by LLM engineering)",
        f"  scenario {w['scenario']} (sha256 {str(w['scenario_sha256'])[:12]}), trace {w['trace_name']} seed {w['seed']} "
        f"(sha256 {w['trace_sha256'][:12]}): {w['requests']} requests over {w['duration_s']} s "
        f"{w['requests_per_class']}",
    ]
    if w.get("derived_from"):
        src = w["derived_from"]
        lines.append(f"  window {src['window_s']} s of {src['path']} (sha256 {src['sha256'][:12]}): {src['how']}")
    for name, budgets in w["budgets"].items():
        shown = ", ".join(
            f"{m} "
            + "/".join(f"{q} {v:g}" for q, v in b.items() if q != "hard")
            + (" hard" if b.get("hard", True) else " soft")
            for m, b in budgets.items()
        )
        lines.append(f"  {name}: {shown}")
    lines.append(f"  behaviour constraints: {', '.join(w['behavior_cases']) or 'not configured'}")
    return lines


def _gpu(d: dict[str, Any], name: str) -> str | None:
    """The GPU a candidate's ledger was computed on (its decision.json ledger entry), if any."""
    entry = (d.get("ledger") or {}).get(name) or {}
    return entry.get("gpu")


def _candidate_lines(c: dict[str, Any], engine_label: str | None = None) -> list[str]:
    """One candidate's identity: engine label, package, hardware, runtime, warm state, errors and behaviour."""
    ctx = c["context"]
    pkg, hw, rt, ws = ctx["package"], ctx["hardware"], ctx["runtime"], ctx["warm_state"] or {}
    gpus = ", ".join(g.get("name", "?") for g in hw.get("gpus") or []) or "no GPU"
    counts = c["status_counts"]
    return [
        f"  {c['label']}  ({c['path']})",
        *([f"    {engine_label}"] if engine_label else []),
        f"    package: loadgen {pkg['harness_version']} git {pkg['git_sha']}, python {pkg['python']}",
        f"    hardware: {hw['cpu_model']} × {hw['cpu_count']} cores, {gpus}",
        f"    runtime: target {rt['target_kind']} engine {rt['engine']} {rt['engine_version']} config "
        f"{rt['engine_config']}, run_kind {rt['run_kind']}, modelExecuted {rt['modelExecuted']}, "
        f"benchmarkExecuted {rt['benchmarkExecuted']}",
        f"    warm state: {ws.get('state')}: " + " / ".join(ws.get("actions") or []),
        f"    errors: {counts.get('error', 0)} error, {counts.get('timeout', 0)} timeout, "
        f"{counts.get('not_sent', 0)} not sent, {counts.get('cancelled', 0)} cancelled by the client "
        f"(of {sum(counts.values())}); kinds {c['error_kinds'] or 'none'}",
        f"    behaviour: {c['contract']['summary']}",
    ]


_SHOWN = (*QUANTITIES, "attainment")


def _format_prediction(prediction: dict[str, Any]) -> list[str]:
    """``PREDICTED vs MEASURED: <engine label>`` with, per candidate and class, predicted / measured / error."""
    by_label: dict[str, list[str]] = {}
    for label, entry in prediction.items():
        by_label.setdefault(entry["label"], []).append(label)
    lines: list[str] = []
    for engine_label, labels in by_label.items():
        path = prediction[labels[0]]["engine_path"]
        lines.append(f"PREDICTED vs MEASURED: {engine_label}")
        lines.append(
            f"  the worksheet ({path}) on the same trace, under each candidate's limits read from its live engine"
        )
        lines.append("  ms, req/s, attainment %; error % = (predicted − measured) / measured, attainment in points")
        for label in labels:
            lines += _format_candidate_prediction(label, prediction[label])
        lines.append("")
    return lines


def _format_candidate_prediction(label: str, entry: dict[str, Any]) -> list[str]:
    if "skipped" in entry:
        return [f"  {label}: not predicted: {entry['skipped']}"]
    lim = entry["limits"]
    lines = [
        f"  {label}: max_num_seqs {lim['max_num_seqs']}, max_num_batched_tokens {lim['max_num_batched_tokens']}, "
        f"max_model_len {lim['max_model_len']}, block {lim['block_size']}, {lim['num_kv_blocks']} KV blocks",
        f"    {'class':<14} {'':<9} " + " ".join(f"{c:>13}" for c in _SHOWN),
    ]
    for cls, c in entry["classes"].items():
        lag = f"  FLAGGED: send lag p99 {c['send_lag_p99_ms']:.1f} ms" if c["client_lagged"] else ""
        lines.append(
            f"    {cls:<14} {'predicted':<9} " + " ".join(f"{_fig(k, c['predicted'].get(k)):>13}" for k in _SHOWN)
        )
        lines.append(
            f"    {'':<14} {'measured':<9} " + " ".join(f"{_fig(k, c['measured'].get(k)):>13}" for k in _SHOWN)
        )
        errs = [_err_cell(c["error_pct"].get(k)) for k in QUANTITIES] + [_pts(c["attainment_diff_points"])]
        lines.append(f"    {'':<14} {'error':<9} " + " ".join(f"{e:>13}" for e in errs) + lag)
    return lines


def _fig(key: str, value: float | None) -> str:
    if value is None:
        return "-"
    if key == "attainment":
        return f"{value * 100:.1f}%"
    return f"{value:.2f}" if key == "completed_rps" else f"{value:.1f}"


def _err_cell(value: float | None) -> str:
    return "-" if value is None else f"{value:+.1f}%"


def _pts(value: float | None) -> str:
    return "-" if value is None else f"{value:+.1f} pts"
