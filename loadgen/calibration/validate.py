"""Held-out validation of an engine TOML: the real target and the worksheet run the same traces.

For each trace (the canonical burst trace, and a public trace imported and scaled to the engine at each
load level) the target is measured through the real driver and the worksheet simulates the same trace
on the engine TOML. Both run dirs are analysed the same way (``loadgen.analysis``) and compared per
class: error % of TTFT, ITL and E2E at p50 and p99 ((worksheet − measured) / measured), of completed
throughput, and the difference in budget attainment in points. Runs whose send lag p99 exceeds
``MAX_SEND_LAG_MS`` are flagged: there the client, not the engine, set the timing.
``with_engine_limits`` and ``predict_beside`` are the two steps of one comparison; ``loadgen practice``
uses them to show its real-vLLM candidates predicted beside measured.
"""

from __future__ import annotations

import html
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from loadgen.calibration.measured import MemoryReport
from loadgen.util.errors import LoadgenError, RunDirError
from loadgen.util.outputfile import make_output_dir, write_output_text
from loadgen.util.redact import redact_url
from loadgen.util.tomlfile import dumps_toml, read_toml
from loadgen.vllm.warmup import warmup_line
from loadgen.workload import presets
from loadgen.workload.scenario import Scenario, load_scenario

from ..analysis.analyze import analyze_run
from ..analysis.result import AnalysisResult, GroupResult
from ..driver.options import RunSettings
from ..sim.config import EngineConfig, load_engine_config
from ..sim.worksheet import run_worksheet
from ..targets import Target, TargetSpec, open_target
from ..targets.base import run_salt
from ..targets.replay import run_driver
from ..trace.importers import import_trace
from ..trace.io import read_trace, write_trace
from .anchor import anchor_line, anchored, measure_anchor
from .boundary import boundary_line, plan_boundary_check
from .calibrate import MAX_SEND_LAG_MS, EngineLimits, engine_limits, send_lag_p99_ms, warm_engine
from .fidelity import FidelityRow, FidelityTable

__all__ = [
    "MAX_SEND_LAG_MS",
    "QUANTITIES",
    "FidelityRow",
    "GOAL_PCT",
    "GOAL_POINTS",
    "goal_check",
    "send_lag_p99_ms",
    "scale_trace_to_engine",
    "with_engine_limits",
    "predict_beside",
    "validate",
    "ValidateOptions",
    "validated_error",
    "configuration_key",
    "format_table",
    "write_html",
]

_METRICS = ("ttft_ms", "itl_ms", "e2e_ms")
#: The compared quantities, in table order (error % of each; attainment is compared in points).
QUANTITIES = ("ttft_p50", "ttft_p99", "itl_p50", "itl_p99", "e2e_p50", "e2e_p99", "completed_rps")
#: The fidelity goal: these quantities within GOAL_PCT %, and attainment within GOAL_POINTS points.
GOAL_QUANTITIES = ("ttft_p50", "ttft_p99", "itl_p50", "itl_p99")
GOAL_PCT = 10.0
GOAL_POINTS = 2.0
_REPO_TRACES = Path(__file__).resolve().parents[1] / "traces"
CANONICAL_BURST = _REPO_TRACES / "canonical-burst.parquet"


def _cut(table: pa.Table, duration_s: float | None) -> pa.Table:
    if duration_s is None:
        return table
    return table.filter(pc.less(table["scheduled_offset_ns"], int(duration_s * 1e9)))


def scale_trace_to_engine(
    table: pa.Table, cfg: EngineConfig, load: float, request_class: str = "short-message"
) -> tuple[pa.Table, float]:
    """Lengths scaled so prompt + output fit max_model_len (p99 at 80%), arrivals time-scaled so the offered
    work is ``load`` × the cost model's capacity (full-batch decode plus prefill per request).

    Returns (table, time_scale). Capacity per request = prefill cost + output × (full-batch step / batch).
    """
    c, s = cfg.cost, cfg.scheduler
    prompts = table["prompt_tokens"].to_numpy().astype(np.float64)
    outputs = table["output_tokens"].to_numpy().astype(np.float64)
    total_p99 = float(np.percentile(prompts + outputs, 99)) or 1.0
    f = min(1.0, 0.8 * s.max_model_len / total_p99)
    prompts = np.maximum(1, np.floor(prompts * f)).astype(np.int64)
    outputs = np.maximum(1, np.floor(outputs * f)).astype(np.int64)
    over = prompts + outputs > s.max_model_len
    prompts[over] = np.maximum(1, s.max_model_len - outputs[over] - 1)
    b = s.max_num_seqs
    ctx = float(np.mean(prompts + outputs / 2))
    step_ms = c.fixed_ms + c.per_decode_seq_ms * b + c.per_kv_token_ms * b * ctx
    per_req_ms = c.per_prefill_token_ms * float(np.mean(prompts)) + float(np.mean(outputs)) * step_ms / b
    capacity_rps = 1000.0 / max(per_req_ms, 1e-9)
    offsets = table["scheduled_offset_ns"].to_numpy().astype(np.float64)
    span_s = (offsets[-1] - offsets[0]) / 1e9 if len(offsets) > 1 else 1.0
    rate = (len(offsets) - 1) / span_s if span_s > 0 else capacity_rps
    time_scale = rate / (load * capacity_rps)
    cols = {name: table[name] for name in table.column_names}
    cols["prompt_tokens"] = pa.array(prompts, pa.int64()).cast(table.schema.field("prompt_tokens").type)
    cols["output_tokens"] = pa.array(outputs, pa.int64()).cast(table.schema.field("output_tokens").type)
    cols["scheduled_offset_ns"] = pa.array(((offsets - offsets[0]) * time_scale).astype(np.int64))
    cols["request_class"] = pa.array([request_class] * len(offsets))
    cols["prefix_group"] = pa.nulls(len(offsets), pa.string())
    cols["prefix_tokens"] = pa.nulls(len(offsets), table.schema.field("prefix_tokens").type)
    return pa.table({k: v.cast(table.schema.field(k).type) for k, v in cols.items()}, schema=table.schema), time_scale


def _err(sim: float | None, real: float | None) -> float | None:
    if sim is None or real is None or not real:
        return None
    return round((sim - real) / real * 100.0, 2)


def _quantile(group: GroupResult, metric: str, q: str) -> float | None:
    summary = group.metrics.get(metric)
    return None if summary is None else getattr(summary, q)


def _compare(trace: str, real: AnalysisResult, sim: AnalysisResult, lag_ms: float | None) -> list[FidelityRow]:
    rows = []
    for cls, rg in real.classes.items():
        sg = sim.classes.get(cls)
        if sg is None or not rg.n_scheduled:
            continue
        row = FidelityRow(
            trace=trace,
            request_class=cls,
            n_measured=rg.n_scheduled,
            n_simulated=sg.n_scheduled,
            send_lag_p99_ms=lag_ms,
        )
        for metric in _METRICS:
            for q in ("p50", "p99"):
                key = f"{metric[:-3]}_{q}"
                m, v = _quantile(rg, metric, q), _quantile(sg, metric, q)
                row.measured[key], row.simulated[key] = m, v
                row.errors_pct[key] = _err(v, m)
        row.measured["completed_rps"], row.simulated["completed_rps"] = rg.completed_rps, sg.completed_rps
        row.errors_pct["completed_rps"] = _err(sg.completed_rps, rg.completed_rps)
        row.measured["attainment"], row.simulated["attainment"] = rg.attainment, sg.attainment
        if rg.attainment is not None and sg.attainment is not None:
            row.attainment_diff_points = round((sg.attainment - rg.attainment) * 100.0, 2)
        row.client_lagged = lag_ms is not None and lag_ms > MAX_SEND_LAG_MS
        rows.append(row)
    return rows


def with_engine_limits(cfg: EngineConfig, limits: EngineLimits) -> EngineConfig:
    """``cfg``'s cost terms under the real engine's scheduler limits (batch, token budget, length, KV blocks)."""
    sched = {
        "max_num_seqs": limits.max_num_seqs,
        "max_num_batched_tokens": limits.max_num_batched_tokens,
        "max_model_len": limits.max_model_len,
    }
    kv = {k: v for k, v in (("block_size", limits.block_size), ("num_kv_blocks", limits.num_kv_blocks)) if v}
    return cfg.model_copy(
        update={"scheduler": cfg.scheduler.model_copy(update=sched), "kv": cfg.kv.model_copy(update=kv)}
    )


def predict_beside(
    name: str,
    real_dir: Path,
    trace: Path,
    cfg: EngineConfig,
    sim_dir: Path,
    scenario: Scenario,
    real: AnalysisResult | None = None,
) -> list[FidelityRow]:
    """The worksheet on ``trace`` with ``cfg`` (into ``sim_dir``), compared per class with the measured ``real_dir``
    (``real``: its analysis, when the caller already has it)."""
    sim_dir = run_worksheet(trace, cfg, sim_dir)
    if real is None:
        real = analyze_run(real_dir, scenario=scenario).result()
    sim = analyze_run(sim_dir, scenario=scenario).result()
    return _compare(name, real, sim, send_lag_p99_ms(real_dir))


@dataclass(frozen=True)
class ValidateOptions:
    """What ``validate`` measures, and what is known of the engine under test (every field has the CLI's default).

    ``traces``: (name, path) pairs (default: the canonical burst trace), each cut to ``duration_s``;
    ``public_trace``: (azure | mooncake, path), imported and scaled to the engine at each of ``loads``;
    ``scenario_path``: the classes and budgets (default: the canonical scenario). ``log_notes``: what the
    engine's startup log reported (its scheduler limits among them). ``engine_manifest``: the sections that
    identify a launched engine, recorded in every measured run. ``engine_memory``: a launched engine's
    memory; its peak is held against the ledger's total with the runtime the TOML's calibration measured
    (``memory`` in the result). ``plan``: a plan (file or shipped name) run against the target
    (``plan_target``, else the URL) and on the worksheet; their capacity boundaries are compared line by line
    (``plan_boundary`` in the result; ``boundary.plan_boundary_check``). ``repeats`` > 1: each trace is
    measured again that many times in all, and every repeat is compared with the first by the same rule
    (``repeatability``: the engine against itself, the floor under any fidelity claim). ``warmup``: before
    any measurement the engine's step sizes are swept (``calibrate.warm_engine``, as calibration does:
    ``shape_warmup`` in the result) and the first trace is replayed once, with prompts of its own, and not
    compared (``warmup``), so no one-time cost of a fresh engine lands in a measurement (the worksheet models
    none). ``anchor`` (opt-in; a calibrated TOML): the calibration workload is run on this launch first and
    two speed factors refitted (``anchor.measure_anchor``); the traces' loads are then shares of this
    launch's capacity, and the worksheet runs twice, as calibrated (``rows``) and anchored to this launch
    (``anchored``), so the model's structural error is shown apart from the host's drift between launches.
    """

    traces: tuple[tuple[str, Path], ...] | None = None
    public_trace: tuple[str, Path] | None = None
    loads: tuple[float, ...] = (0.5, 0.9, 1.3)
    duration_s: float | None = None
    scenario_path: Path | None = None
    log_notes: dict[str, Any] | None = None
    engine_manifest: dict[str, Any] | None = None
    engine_memory: MemoryReport | None = None
    plan: str | Path | None = None
    plan_target: Target | None = None
    repeats: int = 1
    warmup: bool = True
    anchor: bool = False


@dataclass
class _Compared:
    """Every trace measured and simulated: the fidelity rows, and where each run directory is."""

    rows: list[FidelityRow] = field(default_factory=list)
    anchored_rows: list[FidelityRow] = field(default_factory=list)  # the worksheet anchored to this launch
    floor: list[FidelityRow] = field(default_factory=list)  # each repeat against the first measurement
    runs: dict[str, dict[str, str]] = field(default_factory=dict)
    warmup_dir: Path | None = None


def validate(
    engine_toml: Path,
    target_url: str,
    out_dir: Path,
    options: ValidateOptions | None = None,
    settings: RunSettings | None = None,
) -> dict[str, Any]:
    """Run the target and the worksheet on the same traces; the fidelity table as a dict (also fidelity.json).

    Every measurement has prompts of its own (``run_salt``), so none finds an earlier one's in the prefix
    cache, which the worksheet, a fresh engine per run, would not. The worksheet takes the TOML's cost terms
    and the target's own scheduler limits (read from the engine, as calibration does), so a held-out engine
    configuration is predicted, not assumed equal. ``settings``: the driver's, for every measured run.
    """
    opts = options or ValidateOptions()
    limits = engine_limits(target_url, opts.log_notes)
    cfg = with_engine_limits(load_engine_config(engine_toml), limits)
    make_output_dir(out_dir, "a directory for the validation runs (--out)", RunDirError)
    warmed = warm_engine(target_url, limits, opts.warmup)
    speed = (
        measure_anchor(target_url, limits, cfg, out_dir / "anchor", opts.engine_manifest or {}, settings)
        if opts.anchor and cfg.calibrated
        else None
    )
    launch_cfg = anchored(cfg, speed) if speed is not None else None
    scenario_path = opts.scenario_path
    if scenario_path is None:
        scenario_path = presets.presets_root() / "canonical.toml"  # the canonical classes and budgets
    scenario = load_scenario(scenario_path)
    cases = _validation_cases(opts, out_dir, launch_cfg or cfg)
    done = _compare_cases(cases, target_url, out_dir, cfg, launch_cfg, scenario, opts, settings)
    rows, anchored_rows, floor = done.rows, done.anchored_rows, done.floor
    result = {
        "engine_toml": str(engine_toml),
        "engine_label": cfg.calibration_label(),
        "target": redact_url(target_url),
        "runs": done.runs,
        "target_limits": limits.to_dict(),
        "warmup": str(done.warmup_dir) if done.warmup_dir is not None else None,
        "shape_warmup": warmed.to_dict(),
        "rows": [r.to_dict() for r in rows],
        "summary": _summary(rows),
        "repeatability": [r.to_dict() for r in floor] if floor else None,
        "repeatability_summary": _summary(floor) if floor else None,
        "goal": goal_check(rows, floor),
        "anchor": speed.to_dict() if speed is not None else None,
        "anchored": (
            {"rows": [r.to_dict() for r in anchored_rows], "summary": _summary(anchored_rows)}
            | {"goal": goal_check(anchored_rows, floor)}
            if speed is not None
            else None
        ),
        "max_send_lag_ms": MAX_SEND_LAG_MS,
        "memory": memory_check(cfg, opts.engine_memory) if opts.engine_memory is not None else None,
        "plan_boundary": (
            _plan_check(opts.plan, opts.plan_target, target_url, cfg, out_dir) if opts.plan is not None else None
        ),
    }
    document = FidelityTable.from_document(result).document()  # every key named by the published schema
    write_output_text(out_dir / "fidelity.json", json.dumps(document, indent=2, default=str))
    write_html(result, out_dir / "fidelity.html")
    if cfg.calibration:
        _record_validation(engine_toml, result, out_dir)
    return result


def _validation_cases(
    opts: ValidateOptions, out_dir: Path, scale_cfg: EngineConfig
) -> list[tuple[str, pa.Table, dict[str, Any]]]:
    """(name, requests, trace metadata) of every trace to validate on: the given traces (or the canonical burst
    trace), then the public trace imported and scaled to ``scale_cfg`` at each load, each cut to ``duration_s``."""
    cases: list[tuple[str, pa.Table, dict[str, Any]]] = []
    for name, path in opts.traces if opts.traces is not None else [("canonical-burst", CANONICAL_BURST)]:
        table, meta = read_trace(path)
        cases.append((name, _cut(table, opts.duration_s), meta))
    if opts.public_trace is not None:
        kind, path = opts.public_trace
        raw = out_dir / f"{kind}-imported.parquet"
        import_trace(kind, path, raw, max_requests=2000)
        table, meta = read_trace(raw)
        for load in opts.loads:
            scaled, scale = scale_trace_to_engine(_cut(table, None), scale_cfg, load)
            scaled = _cut(scaled, opts.duration_s)
            cases.append((f"{kind}-load{load:g}", scaled, {**meta, "time_scale": scale, "load": load}))
    return cases


def _compare_cases(
    cases: list[tuple[str, pa.Table, dict[str, Any]]],
    target_url: str,
    out_dir: Path,
    cfg: EngineConfig,
    launch_cfg: EngineConfig | None,
    scenario: Scenario,
    opts: ValidateOptions,
    settings: RunSettings | None,
) -> _Compared:
    """Each case measured on the target (after one warm-up replay, when asked) and simulated beside it, as
    calibrated and, with ``launch_cfg``, anchored to this launch; repeats measured against the first."""
    done = _Compared()

    def measure(trace: Path, run_dir: Path) -> Path:
        # every measurement has prompts of its own: a repeat, or the same requests at another load, would
        # otherwise find the earlier ones in the engine's prefix cache, which the worksheet (a fresh engine) has not
        salted = RunSettings(prompt_salt=run_salt(run_dir)).over(settings)
        return run_driver(
            trace,
            target_url,
            run_dir,
            model=None,
            scenario_path=None,
            extra_manifest=opts.engine_manifest,
            settings=salted,
        )

    for name, table, meta in cases:
        if table.num_rows == 0:
            raise LoadgenError(f"{name}: no request in the window: expected a longer --duration-s")
        trace = out_dir / f"{name}.trace.parquet"
        write_trace(table, trace, {**meta, "trace_name": name})
        if opts.warmup and done.warmup_dir is None:
            done.warmup_dir = measure(trace, out_dir / "warmup")
        real_dir = measure(trace, out_dir / f"{name}-measured")
        sim_dir = out_dir / f"{name}-worksheet"
        real = analyze_run(real_dir, scenario=scenario).result()  # once, for each worksheet beside it
        done.rows.extend(predict_beside(name, real_dir, trace, cfg, sim_dir, scenario, real))
        done.runs[name] = {"measured": str(real_dir), "worksheet": str(sim_dir)}
        if launch_cfg is not None:
            anchored_dir = out_dir / f"{name}-worksheet-anchored"
            done.anchored_rows.extend(predict_beside(name, real_dir, trace, launch_cfg, anchored_dir, scenario, real))
            done.runs[name]["worksheet_anchored"] = str(anchored_dir)
        if opts.repeats > 1:
            again = [measure(trace, out_dir / f"{name}-measured-{k}") for k in range(2, opts.repeats + 1)]
            done.floor.extend(_repeat_rows(name, real_dir, again, scenario))
            done.runs[name].update({f"measured_{k}": str(d) for k, d in enumerate(again, start=2)})
    return done


def _repeat_rows(name: str, first: Path, again: list[Path], scenario: Scenario) -> list[FidelityRow]:
    """Each repeat measurement against the first (analysed once), per class, by the fidelity table's rule
    ((repeat − first) / first); the rows are named ``<trace> repeat <k>``."""
    base = analyze_run(first, scenario=scenario).result()
    rows = []
    for k, run_dir in enumerate(again, start=2):
        lags = [x for x in (send_lag_p99_ms(first), send_lag_p99_ms(run_dir)) if x is not None]
        repeat = analyze_run(run_dir, scenario=scenario).result()
        rows.extend(_compare(f"{name} repeat {k}", base, repeat, max(lags) if lags else None))
    return rows


def _plan_check(
    plan: str | Path, target: Target | None, target_url: str, cfg: EngineConfig, out_dir: Path
) -> dict[str, Any]:
    """The plan-boundary check against ``target``, or against the URL when loadgen did not launch the engine."""
    if target is not None:
        return plan_boundary_check(plan, target, cfg, out_dir)
    with open_target(TargetSpec(url=target_url), out_dir) as url_target:
        return plan_boundary_check(plan, url_target, cfg, out_dir)


def memory_check(cfg: EngineConfig, engine_memory: MemoryReport) -> dict[str, Any] | None:
    """The engine's measured peak against the ledger's total, whose runtime line is the one ``cfg``'s calibration
    measured (else the ledger's default); error % = (ledger − measured) / measured, as the fidelity table's."""
    runtime_gib = cfg.measured_runtime_gib()
    memory, reconciliation = engine_memory(runtime_gib)
    peak, total = memory.get("peak_bytes"), reconciliation.get("ledger_total_bytes")
    if not peak or not total:
        return None
    return {
        "ledger_total_bytes": int(total),
        "measured_peak_bytes": int(peak),
        "peak_basis": memory.get("peak_basis"),
        "runtime_gib": runtime_gib,
        "runtime_source": "calibration" if runtime_gib is not None else "ledger default",
        "error_pct": _err(float(total), float(peak)),
        "samples": memory.get("samples"),
    }


def _record_validation(engine_toml: Path, result: dict[str, Any], out_dir: Path) -> None:
    """Record this validation in the calibrated TOML: ``[calibration.validations.<configuration>]``, one table
    per held-out engine configuration (validating the same one again replaces it), and ``validated_error``, the
    worst error over all of them, so every output built on the engine states it."""
    doc, _ = read_toml(engine_toml, "engine TOML")
    cal = doc["calibration"]
    entry: dict[str, Any] = {"fidelity_json": str(out_dir / "fidelity.json"), "summary": result["summary"]}
    if result.get("memory"):
        entry["memory"] = {k: v for k, v in result["memory"].items() if v is not None}
    if result.get("repeatability_summary"):
        entry["repeatability_summary"] = result["repeatability_summary"]
    if (b := result.get("plan_boundary")) and b["max_steps_apart"] is not None:
        entry["plan_boundary_steps"] = int(b["max_steps_apart"])
    if g := result.get("goal"):
        entry["goal"] = _goal_counts(g)
    if (a := result.get("anchor")) and (fit := result.get("anchored")):
        entry["anchored"] = {
            "step_factor": a["step_factor"],
            "prefill_factor": a["prefill_factor"],
            "summary": fit["summary"],
            "goal": _goal_counts(fit["goal"]),
        }
    validations = dict(cal.get("validations") or {})
    validations[configuration_key(result["target_limits"])] = entry
    cal["validations"] = validations
    cal.pop("validation", None)  # one table for the latest validation only, before configurations were kept apart
    cal["validated_error"] = validated_error(validations)
    head = "".join(line + "\n" for line in engine_toml.read_text().splitlines() if line.startswith("#"))
    write_output_text(engine_toml, head + dumps_toml(doc, what=str(engine_toml)))


def _goal_counts(g: dict[str, Any]) -> dict[str, int]:
    return {k: g[k] for k in ("figures", "within", "within_engine_spread")} | {"missed": len(g["missed"])}


def configuration_key(limits: dict[str, Any]) -> str:
    """The held-out engine configuration a validation ran on, as a TOML key: ``seqs4-tokens512-len1000``."""
    return f"seqs{limits['max_num_seqs']}-tokens{limits['max_num_batched_tokens']}-len{limits['max_model_len']}"


def validated_error(validations: dict[str, dict[str, Any]]) -> str:
    """The worst |error| per quantity over every recorded validation, and the engine's worst repeatability."""

    def worst(values: list[Any]) -> float | None:
        kept = [abs(float(v)) for v in values if v is not None]
        return max(kept) if kept else None

    entries = list(validations.values())
    parts = []
    for q in QUANTITIES:
        if "e2e" not in q and (w := worst([e["summary"].get(f"max_abs_{q}_error_pct") for e in entries])) is not None:
            parts.append(f"{q} {w:.1f}%")
    if (w := worst([e["summary"].get("max_abs_attainment_diff_points") for e in entries])) is not None:
        parts.append(f"attainment {w:.1f} pts")
    if (w := worst([(e.get("memory") or {}).get("error_pct") for e in entries])) is not None:
        parts.append(f"peak memory {w:.1f}%")
    floor = [
        v
        for e in entries
        for k, v in (e.get("repeatability_summary") or {}).items()
        if k.endswith("_error_pct") and "e2e" not in k
    ]
    if (w := worst(floor)) is not None:
        parts.append(f"engine repeatability {w:.1f}%")
    if (w := worst([e.get("plan_boundary_steps") for e in entries])) is not None:
        parts.append(f"plan boundary {int(w)} rate step(s)")
    for label, goals in (
        ("goal", [e["goal"] for e in entries if e.get("goal")]),
        ("anchored to each launch", [e["anchored"]["goal"] for e in entries if e.get("anchored")]),
    ):
        if goals:
            total = {k: sum(int(g[k]) for g in goals) for k in ("figures", "within", "within_engine_spread", "missed")}
            parts.append(
                f"{label} {GOAL_PCT:g}%/{GOAL_POINTS:g} pts: {total['within']} of {total['figures']} figures within,"
                f" {total['within_engine_spread']} within the engine's own repeat difference, {total['missed']} missed"
            )
    rows = sum(int(e["summary"].get("rows") or 0) for e in entries)
    where = f"{len(entries)} held-out configuration{'s' if len(entries) != 1 else ''} ({', '.join(validations)})"
    return f"worst |error| {', '.join(parts)} over {rows} class rows on {where}"


def goal_check(rows: list[FidelityRow], floor: list[FidelityRow]) -> dict[str, Any]:
    """Every figure the goal names (``GOAL_QUANTITIES`` within ``GOAL_PCT`` %, attainment within
    ``GOAL_POINTS``), per row the client kept up with, sorted three ways:

    - ``within``: the worksheet's |error| is within the goal;
    - ``within_engine_spread``: it is not, but the engine measured again on the same trace differed from its
      first measurement of the same class by at least as much: this host cannot tell the model's error from
      the engine's own, so that figure can neither meet nor miss the goal here;
    - ``missed``: beyond both, listed as (trace, class, quantity, error, engine's difference or None).
    """
    spread: dict[tuple[str, str, str], float] = {}
    for r in floor:
        if r.client_lagged:
            continue
        trace = r.trace.rsplit(" repeat ", 1)[0]
        for q, v, _ in _goal_figures(r):
            key = (trace, r.request_class, q)
            spread[key] = max(spread.get(key, 0.0), abs(v))
    out: dict[str, Any] = {"goal_pct": GOAL_PCT, "goal_points": GOAL_POINTS, "within": 0, "within_engine_spread": 0}
    missed = []
    for r in rows:
        if r.client_lagged:
            continue
        for q, err, goal in _goal_figures(r):
            engine = spread.get((r.trace, r.request_class, q))
            if abs(err) <= goal:
                out["within"] += 1
            elif engine is not None and abs(err) <= engine:
                out["within_engine_spread"] += 1
            else:
                missed.append([r.trace, r.request_class, q, err, engine])
    out["missed"] = missed
    out["figures"] = out["within"] + out["within_engine_spread"] + len(missed)
    return out


def _goal_figures(r: FidelityRow) -> list[tuple[str, float, float]]:
    """(figure, error, goal) of every figure of ``r`` the goal names and ``r`` has."""
    named = [*((q, r.errors_pct.get(q), GOAL_PCT) for q in GOAL_QUANTITIES)]
    named.append(("attainment", r.attainment_diff_points, GOAL_POINTS))
    return [(q, v, goal) for q, v, goal in named if v is not None]


def goal_line(g: dict[str, Any]) -> str:
    """The goal check in one line."""
    line = (
        f"goal (TTFT and ITL p50/p99 within {g['goal_pct']:g}%, attainment within {g['goal_points']:g} pts):"
        f" {g['within']} of {g['figures']} figures within it, {g['within_engine_spread']} more within the engine's"
        f" own repeat difference, {len(g['missed'])} missed"
    )
    if g["missed"]:
        worst = max(g["missed"], key=lambda m: abs(m[3]) - (m[4] or 0.0))
        unit = " pts" if worst[2] == "attainment" else "%"
        engine = "no repeat" if worst[4] is None else f"engine {worst[4]:.1f}{unit}"
        line += f" (furthest: {worst[0]} {worst[1]} {worst[2]} {worst[3]:+.1f}{unit}, {engine})"
    return line


def _summary(rows: list[FidelityRow]) -> dict[str, Any]:
    """Worst absolute error % per quantity over the rows the client kept up with, and the worst attainment gap."""
    kept = [r for r in rows if not r.client_lagged]
    out: dict[str, Any] = {"rows": len(rows), "rows_flagged_send_lag": len(rows) - len(kept)}
    for key in QUANTITIES:
        vals = [abs(v) for r in kept if (v := r.errors_pct.get(key)) is not None]
        out[f"max_abs_{key}_error_pct"] = max(vals) if vals else None
    att = [abs(r.attainment_diff_points) for r in kept if r.attainment_diff_points is not None]
    out["max_abs_attainment_diff_points"] = max(att) if att else None
    return out


def format_table(result: dict[str, Any]) -> str:
    """The fidelity table for the console: error % per class (worksheet vs measured); with an anchor, the
    same table for the worksheet anchored to the launch, after it."""
    lines = [result["engine_label"]]
    if shapes := result.get("shape_warmup"):
        lines.append(warmup_line(shapes))
    if result.get("warmup"):
        lines.append(
            f"warm-up: the first trace replayed once before any measurement, not compared ({result['warmup']})"
        )
    lines.append("error % = (worksheet − measured) / measured; the worksheet as calibrated:")
    lines += _table_lines(result["rows"], result["summary"])
    if f := result.get("repeatability_summary"):
        lines.append(repeatability_line(f))
    if g := result.get("goal"):
        lines.append(goal_line(g))
    if (a := result.get("anchor")) and (fit := result.get("anchored")):
        lines += ["", anchor_line(a) + "; the worksheet anchored to this launch:"]
        lines += _table_lines(fit["rows"], fit["summary"])
        lines.append(goal_line(fit["goal"]))
    if m := result.get("memory"):
        lines.append(memory_line(m))
    if b := result.get("plan_boundary"):
        lines.extend(boundary_line(b))
    return "\n".join(lines)


def _table_lines(rows: list[dict[str, Any]], summary: dict[str, Any]) -> list[str]:
    """The table's head, one line per row and the worst |error| line."""
    head = f"{'trace':<22} {'class':<14} " + " ".join(f"{c:>13}" for c in QUANTITIES) + f" {'attain pts':>10} lag"
    lines = [head]
    for r in rows:
        cells = " ".join(f"{_pct(r['errors_pct'].get(c)):>13}" for c in QUANTITIES)
        att = r["attainment_diff_points"]
        lag = "FLAGGED" if r["client_lagged"] else "ok"
        lines.append(
            f"{r['trace']:<22} {r['request_class']:<14} {cells} {('-' if att is None else f'{att:+.1f}'):>10} {lag}"
        )
    lines.append(
        "worst |error| (rows the client kept up with): "
        + ", ".join(f"{k[8:-10]} {v:.1f}%" for k, v in summary.items() if k.endswith("_error_pct") and v is not None)
        + (
            f", attainment {summary['max_abs_attainment_diff_points']:.1f} pts"
            if summary.get("max_abs_attainment_diff_points") is not None
            else ""
        )
    )
    return lines


def repeatability_line(f: dict[str, Any]) -> str:
    """The engine against itself: the worst difference between repeat measurements of the same trace."""
    parts = [f"{k[8:-10]} {v:.1f}%" for k, v in f.items() if k.endswith("_error_pct") and v is not None]
    if f.get("max_abs_attainment_diff_points") is not None:
        parts.append(f"attainment {f['max_abs_attainment_diff_points']:.1f} pts")
    return "repeatability (measured again vs first, same engine, same trace): worst |difference| " + ", ".join(parts)


def memory_line(m: dict[str, Any]) -> str:
    """The peak-memory check in one line."""
    runtime = f"{m['runtime_gib']:g} GiB from calibration" if m["runtime_gib"] is not None else "the ledger's default"
    return (
        f"peak memory: ledger {m['ledger_total_bytes'] / 2**30:.3f} GiB (runtime {runtime}) vs measured"
        f" {m['measured_peak_bytes'] / 2**30:.3f} GiB ({m['peak_basis']}): {_pct(m['error_pct'])}"
    )


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{v:+.1f}%"


def write_html(result: dict[str, Any], path: Path) -> Path:
    """The fidelity table as a standalone HTML page (and the anchored one, when there is one)."""
    anchor, fit = result.get("anchor"), result.get("anchored")
    page = (
        "<!doctype html><meta charset='utf-8'><title>loadgen fidelity</title>"
        f"<h1>Fidelity: worksheet vs measured</h1><p>{html.escape(result['engine_label'])}</p>"
        f"<p>target {html.escape(str(result['target']))}; error % = (worksheet − measured) / measured</p>"
        + (f"<p>{html.escape(warmup_line(result['shape_warmup']))}</p>" if result.get("shape_warmup") else "")
        + "<h2>The worksheet as calibrated</h2>"
        + _html_table(result["rows"])
        + (
            f"<p>{html.escape(repeatability_line(result['repeatability_summary']))}</p>"
            if result.get("repeatability_summary")
            else ""
        )
        + (f"<p>{html.escape(goal_line(result['goal']))}</p>" if result.get("goal") else "")
        + (
            "<h2>The worksheet anchored to this launch</h2>"
            f"<p>{html.escape(anchor_line(anchor))}</p>{_html_table(fit['rows'])}"
            f"<p>{html.escape(goal_line(fit['goal']))}</p>"
            if anchor and fit
            else ""
        )
        + (f"<p>{html.escape(memory_line(result['memory']))}</p>" if result.get("memory") else "")
        + (
            "<pre>" + html.escape("\n".join(boundary_line(result["plan_boundary"]))) + "</pre>"
            if result.get("plan_boundary")
            else ""
        )
    )
    return write_output_text(path, page)


def _html_table(rows: list[dict[str, Any]]) -> str:
    head = "".join(f"<th>{html.escape(c)} err %</th>" for c in QUANTITIES)
    body = []
    for r in rows:
        cells = "".join(f"<td>{html.escape(_pct(r['errors_pct'].get(c)))}</td>" for c in QUANTITIES)
        att = r["attainment_diff_points"]
        body.append(
            f"<tr><td>{html.escape(r['trace'])}</td><td>{html.escape(r['request_class'])}</td>{cells}"
            f"<td>{'-' if att is None else f'{att:+.1f}'}</td><td>{'FLAGGED' if r['client_lagged'] else 'ok'}</td></tr>"
        )
    return (
        f"<table border='1'><tr><th>trace</th><th>class</th>{head}<th>attainment pts</th><th>send lag</th></tr>"
        + "".join(body)
        + "</table>"
    )
