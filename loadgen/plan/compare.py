"""Candidate comparison: hold package and workload fixed, vary one choice, judge in a fixed order.

Candidates are run directories or plan directories. First their manifests must agree on everything
but the declared variable (default ``target.engine``: the engine and its configuration); otherwise the
comparison refuses with one line naming each differing key, unless ``allow_differences``. Then, for a
route (``interactive`` = the scenario's streaming classes, ``all``, or class names), each candidate is
judged in order:

1. hard budgets: a run whose client fell behind its schedule (send-lag p99 above ``SEND_LAG_BOUND_MS``, the
   plan's bound) did not apply the load it was meant to, and every latency counted from the scheduled instant
   carries the client's error: its budgets are not judged, and the candidate is "unmeasured" (neither chosen
   nor rejected on budgets: rerun it on a quieter host). So is a run that stopped before completing (a
   signal, a kill, a write error: it applied part of its workload), and a plan paused before every line's
   boundary was found (its highest passing steps are lower bounds). Otherwise a conclusive breach (the 95% interval of
   the percentile, or the Wilson interval of the error share, lies above the limit) rejects the candidate
   for the route, with class, percentile, measured value, interval, limit and sample count; a check whose
   interval straddles its limit rejects nothing but leaves the step inconclusive, saying "about N more
   requests of class C are needed"; among eligible candidates those shown to pass rank first;
2. behaviour contract: a failed (or, against the reference candidate, regressed) contract rejects
   before any throughput or cost is looked at; "not configured" / "not evaluated" are said, not hidden;
3. throughput and cost: output tokens/s (over the run and at its peak second), requests/s, goodput and
   cost per million tokens from the user's price table decide among the candidates still standing.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from loadgen.rundir.io import read_run_manifest
from loadgen.rundir.manifest import Manifest, read_manifest
from loadgen.rundir.schema import MANIFEST_FILE
from loadgen.targets.base import WarmStateResult
from loadgen.util.errors import PlanError, RunDirError
from loadgen.util.flat import flatten
from loadgen.util.limits import MAX_PARAM, is_finite
from loadgen.workload.scenario import Scenario, scenario_from_manifest

from ..analysis import Analysis, analyze_run
from ..analysis.budgets import SEND_LAG_BOUND_MS, Check, client_lag_line
from ..analysis.metrics import rate_window_s
from ..analysis.model import stop_sentence
from ..analysis.whole_run import engine_busy_output_rate, whole_run_rates
from .contract_hook import CONTRACT_FILE, contract_status_from_file
from .files import PLAN_FILE, REGION_FILE, cell_run_manifests, read_plan_state
from .prices import PriceTable, cost_per_million, load_prices
from .region import load_region
from .results import (
    COMPARISON_SCHEMA_VERSION,
    ComparisonResult,
    Decision,
    HeadlineThroughput,
    Identity,
    PriceInfo,
    Rejection,
    Unsure,
)

__all__ = [
    "DEFAULT_VARIABLE",
    "Candidate",
    "Comparison",
    "compare_candidates",
    "format_comparison",
    "identity_differences",
    "identity_of",
    "load_candidate",
    "needed_lines",
    "route_classes",
]

DEFAULT_VARIABLE = "target.engine"

#: Manifest subtrees that define what was run; everything else (paths, ports, pids, times) may differ.
IDENTITY_ROOTS = (
    "run_kind",
    "harness",
    "host",
    "scenario.sha256",
    "scenario.name",
    "trace.sha256",
    "trace.seed",
    "trace.name",
    "target.kind",
    "target.model",
    "target.version",
    "target.engine",
    "warm_state.state",
    "options",
    "behavior_relevant",
)
#: Keys under those roots that do not change what was measured.
IGNORED_KEYS = (
    "harness.pid",
    "harness.monotonic_clock",
    "options.out_dir",
    "options.trace_path",
    "options.target_url",
    "options.scenario_path",
    "options.order_index",
    "options.repeat",
    "options.plan_cell",
    "options.warm_actions",
    "options.warm_state",
    "options.extra_manifest",
    "options.progress",
    "options.flush_interval_s",
    "options.engine",
    "options.deadline_s",
    "options.seed",
    "options.prompt_salt",  # other texts of the same token counts, one per run (targets.base.run_salt)
    "host.memory_bytes",
)


_IGNORED_PREFIXES = tuple(k + "." for k in IGNORED_KEYS)


def _get(manifest: dict[str, Any], dotted: str) -> Any:
    cur: Any = manifest
    for part in dotted.split("."):
        if not isinstance(cur, dict) or part not in cur:
            return _MISSING
        cur = cur[part]
    return cur


_MISSING = object()


def identity_of(manifest: Manifest) -> dict[str, Any]:
    """The flattened identity keys of a manifest, as recorded on disk (see IDENTITY_ROOTS / IGNORED_KEYS)."""
    recorded = manifest.to_dict()
    out: dict[str, Any] = {}
    for root in IDENTITY_ROOTS:
        value = _get(recorded, root)
        if value is _MISSING:
            continue
        for key, leaf in flatten(value, root).items():  # a list (or empty dict) compared as its JSON text
            out[key] = json.dumps(leaf, sort_keys=True, default=str) if isinstance(leaf, (list, dict)) else leaf
    return {k: v for k, v in out.items() if k not in IGNORED_KEYS and not k.startswith(_IGNORED_PREFIXES)}


def _covered(key: str, variable: str) -> bool:
    if key == variable or key.startswith(variable + "."):
        return True
    # a named configuration is the unit that varies: its name covers its whole subtree
    if variable.endswith(".name"):
        parent = variable[: -len(".name")]
        if key.startswith(parent + "."):
            return True
    # the engine's self-description (/version) varies with the engine
    return variable.startswith("target.engine") and key.startswith("target.version")


def identity_differences(identities: list[dict[str, Any]], variable: str) -> tuple[list[str], list[str]]:
    """(keys that differ and the variable covers, keys that differ outside it) across candidates."""
    keys = sorted(set().union(*identities)) if identities else []
    covered: list[str] = []
    other: list[str] = []
    for key in keys:
        values = [ident.get(key, "<absent>") for ident in identities]
        if all(v == values[0] for v in values):
            continue
        (covered if _covered(key, variable) else other).append(key)
    return covered, other


@dataclass
class Candidate:
    """One candidate: a run directory (with its analysis) or a plan directory (with its region)."""

    path: Path
    kind: str  # "run" | "plan"
    label: str
    manifest: Manifest
    identity: dict[str, Any]
    analysis: Analysis | None = None  # run
    region: dict[str, Any] | None = None  # plan
    scenario: Scenario | None = None
    contract: dict[str, Any] | None = None


def _label(manifest: Manifest, path: Path) -> str:
    engine = manifest.target.engine.model_dump() if manifest.target.engine else {}
    config = engine.get("config") or {}
    for value in (
        (manifest.practice or {}).get("candidate"),
        config.get("name") if isinstance(config, dict) else None,
        engine.get("label"),
        manifest.plan_target.engine if manifest.plan_target is not None else None,
        engine.get("name"),
    ):
        if value and value not in ("loadgen-sim", "vllm"):  # generic engine names say nothing about the candidate
            return str(value)
    return path.name


def _distinct_labels(candidates: Sequence[Candidate]) -> list[str]:
    """Each candidate's label as the report shows it: two that share one (the same engine under other settings, or
    against another endpoint) get their directory beside it, so "X is chosen" and "X rejected" name one each."""
    counts = Counter(c.label for c in candidates)
    shown = [c.label if counts[c.label] == 1 else f"{c.label} ({c.path})" for c in candidates]
    seen = Counter(shown)
    return [s if seen[s] == 1 else f"{s} #{i + 1}" for i, s in enumerate(shown)]


def load_candidate(path: str | Path) -> Candidate:
    """A run directory (manifest.json) or a plan directory (plan.json + region.json)."""
    path = Path(path)
    if (path / PLAN_FILE).is_file():
        state = read_plan_state(path / PLAN_FILE)
        if not (path / REGION_FILE).is_file():
            raise PlanError(f"{path}: plan has no {REGION_FILE} yet: expected a finished (or paused) plan directory")
        region = load_region(path)
        run_dirs = cell_run_manifests(path)
        if not run_dirs:
            raise PlanError(f"{path}: plan directory holds no runs: expected at least one finished cell")
        manifest = read_manifest(run_dirs[0].parent)
        ident = identity_of(manifest)
        ident = {k: v for k, v in ident.items() if not k.startswith(("trace.", "options.", "warm_state."))}
        ident["plan.sha256"] = state.get("plan_sha256")
        cand = Candidate(
            path,
            "plan",
            _label(manifest, path),
            manifest,
            ident,
            region=region,
            scenario=scenario_from_manifest(manifest),
        )
        cand.contract = contract_status_from_file(path / CONTRACT_FILE)
        return cand
    try:
        manifest = read_run_manifest(path)  # a killed run: its recovered view (state killed)
    except RunDirError as exc:
        if (path / MANIFEST_FILE).is_file():  # a run directory whose manifest is damaged: say what is wrong in it
            raise PlanError(str(exc)) from None
        raise PlanError(
            f"{path}: neither a run directory ({MANIFEST_FILE}) nor a plan directory ({PLAN_FILE})"
        ) from None
    scenario = scenario_from_manifest(manifest)
    cold = manifest.warm_state.state == "cold"
    analysis = analyze_run(path, scenario=scenario, include_cold=cold)
    cand = Candidate(
        path, "run", _label(manifest, path), manifest, identity_of(manifest), analysis=analysis, scenario=scenario
    )
    cand.contract = contract_status_from_file(path / CONTRACT_FILE)
    return cand


def route_classes(route: str, scenario: Scenario | None, present: list[str]) -> list[str]:
    """Classes a route is judged on: ``interactive`` = streaming classes, ``all``, or a comma list."""
    if route == "all":
        return sorted(present)
    if route == "interactive":
        if scenario is None:
            return sorted(present)
        return sorted(c for c in present if c in scenario.classes and scenario.classes[c].stream)
    names = [n.strip() for n in route.split(",") if n.strip()]
    unknown = [n for n in names if scenario is not None and n not in scenario.classes]
    if unknown:
        raise PlanError(
            f"--route {route!r}: {unknown[0]!r} is not a class of the scenario; expected 'interactive', 'all' or class names"
        )
    return names


@dataclass
class Comparison:
    """The candidates as judged and the decision; ``result()`` is the typed document."""

    route: str
    variable: str
    candidates: list[dict[str, Any]]
    decision: Decision
    identity: Identity
    prices: PriceInfo | None
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """The comparison document (``loadgen compare --json``)."""
        return self.result().document()

    def result(self) -> ComparisonResult:
        """The typed comparison document (``loadgen schema decision``)."""
        return ComparisonResult.from_document(
            {
                "kind": "loadgen.comparison",
                "version": COMPARISON_SCHEMA_VERSION,
                "route": self.route,
                "variable": self.variable,
                "judgement_order": ["hard budgets", "behaviour contract", "throughput and cost"],
                "identity": self.identity.document(),
                "candidates": self.candidates,
                "decision": self.decision.document(),
                "prices": self.prices.document() if self.prices is not None else None,
                "notes": self.notes,
            }
        )


def _num(value: Any) -> float | None:
    if value in (None, "inf"):
        return math.inf if value == "inf" else None
    return float(value)


def _peak(analysis: Analysis, key: str) -> float | None:
    series = (analysis.timeseries or {}).get(key) or []
    vals = [float(v) for v in series if v is not None]
    return max(vals) if vals else None


def _engine_rate(run_dir: Path, manifest: Manifest) -> float | None:
    """Output tokens per second of engine busy time (the engine's own capacity), when the engine says.

    The worksheet records it in the manifest's ``engine_notes``; the live simulated engine exports it as
    counters, read by the analysis (``engine_busy_output_rate``). Real engines do not expose busy time: None.
    """
    notes = manifest.engine_notes
    if notes.output_tokens_per_busy_s:  # a worksheet that recorded the busy time behind it is held to the rule
        busy = notes.busy_s
        return float(notes.output_tokens_per_busy_s) if busy is None or rate_window_s(busy) else None
    return engine_busy_output_rate(run_dir)


def _check_item(check: Check) -> dict[str, Any]:
    """A hard check as the comparison shows it: where, measured value and its 95% interval, limit, n, verdict."""
    return {
        "class": check.class_name,
        "metric": check.metric,
        "percentile": check.percentile,
        "observed": check.observed if check.observed is None or math.isfinite(check.observed) else "inf",
        "ci": [v if math.isfinite(v) else ("inf" if v > 0 else "-inf") for v in check.ci] if check.ci else None,
        "limit": check.limit,
        "n": check.n,
        "outcome": check.outcome,
        "more_requests": check.more_requests,
        "needed": check.needed_text(),
        "reason": check.reason,
    }


def _judge_run(c: Candidate, route: str) -> dict[str, Any]:
    a = c.analysis
    assert a is not None, "a run candidate carries its analysis"
    classes = route_classes(route, c.scenario, list(a.classes))
    on_route = [ch for ch in a.checks if ch.hard and (ch.class_name in classes or ch.class_name == "overall")]
    breaches = [_check_item(ch) for ch in on_route if ch.failed]
    breaches.sort(
        key=lambda b: (b["class"] == "overall", b["metric"] != "ttft_ms", b["percentile"] != "p99")
    )  # p99 TTFT leads
    inconclusive = [_check_item(ch) for ch in on_route if ch.inconclusive]
    tails: dict[str, dict[str, Any]] = {}
    for name in classes:
        group = a.classes.get(name)
        if group is None:
            continue
        tails[name] = {
            m: {q: group.metrics.get(m, {}).get(q) for q in ("p50", "p95", "p99", "n")}
            for m in ("ttft_ms", "itl_ms", "e2e_ms")
        }
        tails[name]["p99_low_sample"] = bool(group.metrics.get("ttft_ms", {}).get("p99_low_sample"))
        budgets = c.scenario.classes[name].budgets if c.scenario is not None and name in c.scenario.classes else None
        tails[name]["limits"] = {
            m: (getattr(budgets, m).limits() if budgets is not None and getattr(budgets, m) else {})
            for m in ("ttft_ms", "itl_ms", "e2e_ms")
        }
        tails[name]["checks"] = {
            f"{ch.metric}.{ch.percentile}": _check_item(ch) for ch in a.checks if ch.class_name == name and ch.evaluated
        }
    o = a.overall
    return {
        "stop": stop_sentence(a.run.get("stop") or {}),
        "route_classes": classes,
        "breaches": breaches,
        "inconclusive": inconclusive,
        "tails": tails,
        "status_counts": dict(o.status_counts),
        "error_kinds": dict(o.error_kinds),
        "error_share": a.error_share,
        "throughput": {
            "output_tok_s": o.output_tok_s,
            "prompt_tok_s": o.prompt_tok_s,
            "completed_rps": o.completed_rps,
            "offered_rps": o.offered_rps,
            "send_rps": o.send_rps,
            "goodput_rps": o.goodput_rps,
            "attainment": o.attainment,
            "peak_output_tok_s": _peak(a, "output_tok_s"),
            "peak_completed_rps": _peak(a, "completed_rps"),
            "peak_bin_s": (a.timeseries or {}).get("bin_s"),
            "window_s": (a.window or {}).get("duration_s"),
            "rates_unmeasured": (a.window or {}).get("rates_unmeasured"),
            **whole_run_rates(c.path),
            "output_tok_per_engine_busy_s": _engine_rate(c.path, c.manifest),
        },
    }


#: The throughputs a candidate may be ranked and priced by, best first, and what each is.
_HEADLINE_BASES = (
    ("output_tok_per_engine_busy_s", "output tokens per second of engine busy time (capacity)"),
    ("output_tok_s_whole_run", "output tokens/s over the whole run (first scheduled → last done)"),
)


def _headline_basis(judged: list[dict[str, Any]]) -> str | None:
    """The one throughput every candidate is ranked and priced by: the first of ``_HEADLINE_BASES`` that every
    candidate has (None: each one's analysis window). Engine capacity (output tokens per engine-busy second) comes
    first, since an open-loop run below capacity completes what was offered whatever the candidate; but an engine
    that reports no busy time (a vLLM, a managed API) puts every candidate on the whole run, never one on each."""
    for key, _ in _HEADLINE_BASES:
        if all(j["throughput"].get(key) for j in judged):
            return key
    return None


def _headline_rate(tp: dict[str, Any], basis: str | None) -> tuple[float | None, str]:
    """A candidate's figure on the comparison's ``basis`` (``_headline_basis``), and what it is."""
    for key, what in _HEADLINE_BASES:
        if key == basis:
            return tp.get(key), what
    return tp.get("output_tok_s"), tp.get("basis", "output tokens/s over the analysis window")


def _judge_plan(c: Candidate, route: str) -> dict[str, Any]:
    region = c.region or {}
    present = [k for k in region.get("classes", {}) if k != "mixed"]
    if "mixed" in region.get("classes", {}) and c.scenario is not None:
        present = sorted(set(present) | set(c.scenario.classes))
    classes = route_classes(route, c.scenario, present)
    breaches: list[dict[str, Any]] = []
    unsure: list[dict[str, Any]] = []
    capacity: dict[str, Any] = {}
    best_cell: dict[str, Any] | None = None
    for name in classes:
        key = name if name in region.get("classes", {}) else ("mixed" if "mixed" in region.get("classes", {}) else None)
        if key is None:
            breaches.append(
                {
                    "class": name,
                    "metric": "region",
                    "percentile": None,
                    "observed": None,
                    "limit": None,
                    "n": 0,
                    "reason": f"{name}: the plan has no cells for this class",
                }
            )
            continue
        inside = []
        lowest_out = lowest_unsure = None
        for data in region["classes"][key].values():
            for cell in data["cells"]:
                status = (
                    cell["status"]
                    if key != "mixed"
                    else (cell.get("per_class", {}).get(name, {}).get("status", cell["status"]))
                )
                if status == "inside":
                    inside.append(cell)
                elif status in ("outside", "stopped") and lowest_out is None:
                    lowest_out = cell
                elif status == "inconclusive" and lowest_unsure is None:
                    lowest_unsure = cell
        if not inside and lowest_unsure is not None:  # not shown to fail: an inconclusive load step may be inside
            unsure.append(
                {
                    "class": name,
                    "metric": "region",
                    "percentile": None,
                    "observed": None,
                    "limit": None,
                    "n": 0,
                    "outcome": "inconclusive",
                    "more_requests": None,
                    "needed": f"more requests at {lowest_unsure['cell_id']} (raise [confidence] max_requests)",
                    "reason": f"{name}: no load step is conclusively inside ({lowest_unsure.get('limiting')})",
                }
            )
            continue
        if not inside:
            reason = (lowest_out or {}).get("limiting") or "no cell inside the region"
            breaches.append(
                {
                    "class": name,
                    "metric": "region",
                    "percentile": None,
                    "observed": None,
                    "limit": None,
                    "n": 0,
                    "outcome": "fail",
                    "reason": f"{name}: no load step satisfies every hard budget ({reason})",
                }
            )
            continue
        top = max(inside, key=lambda cell: cell.get("offered_rps") or 0.0)
        capacity[name] = {
            "max_inside_offered_rps": top.get("offered_rps"),
            "cell": top["cell_id"],
            "completed_rps": top.get("completed_rps"),
            "output_tok_s": top.get("output_tok_s"),
        }
        if best_cell is None or (top.get("output_tok_s") or 0) > (best_cell.get("output_tok_s") or 0):
            best_cell = top
    return {
        "route_classes": classes,
        "breaches": breaches,
        "inconclusive": unsure,
        "capacity": capacity,
        "tails": {},
        "status_counts": {},
        "error_kinds": {},
        "error_share": None,
        "throughput": {
            "output_tok_s": (best_cell or {}).get("output_tok_s"),
            "prompt_tok_s": None,
            "completed_rps": (best_cell or {}).get("completed_rps"),
            "offered_rps": (best_cell or {}).get("offered_rps"),
            "goodput_rps": (best_cell or {}).get("goodput_rps"),
            "peak_output_tok_s": None,
            "basis": "output tokens/s of the best inside cell",
        },
    }


def _gpus(gpus: list[Any] | None) -> list[dict[str, Any]] | None:
    """The host's GPUs as the decision types them: each record's scalar values as they are, a nested value
    (an imported tool's record may hold one) as its JSON text."""
    if gpus is None:
        return None
    scalar = (str, int, float, bool, type(None))
    return [
        {k: v if isinstance(v, scalar) else json.dumps(v, default=str) for k, v in g.items()}
        for g in gpus
        if isinstance(g, dict)
    ]


def _warm_state(section: dict[str, Any] | None) -> dict[str, Any] | None:
    """The manifest's warm state, the keys the decision names (a section keeps keys a newer loadgen wrote)."""
    return None if section is None else {k: section.get(k) for k in WarmStateResult.model_fields if k in section}


def _context(c: Candidate) -> dict[str, Any]:
    m = c.manifest.to_dict()  # the sections as recorded
    harness = m.get("harness") or {}
    host = m.get("host") or {}
    target = m.get("target") or {}
    scen = m.get("scenario") or {}
    trace = m.get("trace") or {}
    return {
        "workload": {
            "scenario": scen.get("name"),
            "scenario_sha256": scen.get("sha256"),
            "trace": trace.get("name"),
            "trace_sha256": trace.get("sha256"),
            "seed": trace.get("seed"),
            "requests": (trace.get("metadata") or {}).get("requests"),
        },
        "package": {
            "harness_version": harness.get("version"),
            "git_sha": harness.get("git_sha"),
            "python": harness.get("python"),
        },
        "hardware": {
            "cpu_model": host.get("cpu_model"),
            "cpu_count": host.get("cpu_count"),
            "gpus": _gpus(host.get("gpus")),
            "os": host.get("os"),
        },
        "runtime": {
            "target_kind": target.get("kind"),
            "model": target.get("model"),
            "engine": (target.get("engine") or {}).get("name"),
            "engine_version": (target.get("engine") or {}).get("version"),
            "engine_config": c.label,
            "run_kind": m.get("run_kind"),
            "modelExecuted": m.get("modelExecuted"),
            "benchmarkExecuted": m.get("benchmarkExecuted"),
        },
        "warm_state": _warm_state(m.get("warm_state")),
        "measurement": {
            "send_lag_p99_ms": c.manifest.send_lag_p99_ms,
            "warnings": list(m.get("warnings") or []),
            "state": m.get("state"),
        },
        "order_index": m.get("order_index"),
        "started_utc": m.get("started_utc"),
    }


def _shown(value: Any, limit: int = 64) -> str:
    """An identity value in a refusal, cut only past ``limit`` (a git sha's ``-dirty`` is 46 characters in all, and
    cutting it at 40 showed two different values as the same)."""
    text = str(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _identity_notes(
    candidates: list[Candidate], variable: str, allow_differences: bool
) -> tuple[list[str], list[str], list[str]]:
    """(keys the variable covers, other differing keys, notes); refuses when more than the variable differs."""
    covered, other = identity_differences([c.identity for c in candidates], variable)
    notes: list[str] = []
    if other:
        shown = "; ".join(
            f"{k} ({' vs '.join(_shown(c.identity.get(k, '<absent>')) for c in candidates)})" for k in other[:4]
        )
        more = f" (+{len(other) - 4} more)" if len(other) > 4 else ""
        if not allow_differences:
            raise PlanError(
                f"compare: candidates differ in more than the declared variable {variable}: {shown}{more}; "
                "hold package and workload fixed, declare the variable with --variable, or pass --allow-differences"
            )
        notes.append(
            f"--allow-differences: candidates also differ in {', '.join(other)}; the comparison is not one-variable"
        )
    if not covered:
        notes.append(f"the candidates do not differ in {variable}: the comparison compares repeats of one candidate")
    return covered, other, notes


def needed_lines(inconclusive: list[dict[str, Any]]) -> list[str]:
    """One "inconclusive: about N more requests of class C are needed" per class (the largest N of its checks)."""
    by_class: dict[str, dict[str, Any]] = {}
    for item in inconclusive:
        have = by_class.get(item["class"])
        if have is None or (item.get("more_requests") or 0) > (have.get("more_requests") or 0):
            by_class[item["class"]] = item
    return [
        f"inconclusive: {item['needed']} ({item['reason'].split('; inconclusive:')[0]})" for item in by_class.values()
    ]


def check_send_lag_bound(bound_ms: float, who: str) -> None:
    """Refuse, in one line, a send-lag bound that is not a positive, finite number of milliseconds."""
    if not (is_finite(bound_ms) and 0 < bound_ms <= MAX_PARAM):
        raise PlanError(f"{who}: max send lag {bound_ms!r} ms: expected a number of milliseconds in (0, {MAX_PARAM:g}]")


def _unfinished_lines(region: dict[str, Any]) -> list[str]:
    """The region's lines (class, state, concurrency) whose search the plan stopped before finishing."""
    return [
        f"{name} {state} c{line.get('concurrency')}"
        for name, states in (region.get("classes") or {}).items()
        for state, data in states.items()
        for line in data.get("boundary") or []
        if line.get("line_status") == "unfinished"
    ]


def _stopped_line(c: Candidate) -> str | None:
    """Why a candidate did not measure its whole workload, or None: a run that stopped before completing (a
    signal, a kill, a write error, or it is still running); a plan paused before every line's boundary was found
    (``--max-runs``: its highest passing steps are lower bounds, not boundaries)."""
    if c.kind == "plan":
        lines = _unfinished_lines(c.region or {})
        if not lines:
            return None
        shown = ", ".join(lines[:3]) + (f" and {len(lines) - 3} more" if len(lines) > 3 else "")
        return (
            f"the plan did not finish: {len(lines)} line(s) unfinished ({shown}), whose highest passing steps are "
            "lower bounds, not boundaries; resume it (the same loadgen plan command and --out) before comparing"
        )
    m = c.manifest
    if m.state == "complete":
        return None
    by = f" by {m.interrupted_by}" if m.interrupted_by else ""
    recorded = (
        f"; {m.requests_recorded:,} of {m.scheduled_requests:,} scheduled requests recorded"
        if m.requests_recorded is not None and m.scheduled_requests is not None
        else ""
    )
    return (
        f"the run did not complete (state {m.state}{by}{recorded}): it did not apply the whole workload, so it is "
        "not judged against candidates that did; rerun it to completion"
    )


def _budget_step(j: dict[str, Any], max_send_lag_ms: float, stopped: str | None = None) -> dict[str, Any]:
    """Judgement step 1: a run that stopped before completing, or whose client fell behind, is unmeasured;
    otherwise a conclusive hard-budget breach on the route rejects (95% interval above the limit), and a check
    whose interval straddles its limit leaves the step inconclusive, with the requests it needs."""
    lagged = client_lag_line(j["context"]["measurement"]["send_lag_p99_ms"], max_send_lag_ms)
    if stopped or lagged:
        shown = [f"not judged: {b['reason']}" for b in j["breaches"]]
        return {"step": "hard budgets", "result": "unmeasured", "why": [w for w in (stopped, lagged) if w] + shown}
    if j["breaches"]:
        return {"step": "hard budgets", "result": "rejected", "why": [b["reason"] for b in j["breaches"]]}
    if "capacity" not in j and not (j["route_classes"] and sum(j["status_counts"].values())):  # a run, empty
        why = "no request of the route's classes in the analysis window: nothing to judge"
        return {"step": "hard budgets", "result": "unmeasured", "why": [why]}
    if j.get("inconclusive"):
        return {"step": "hard budgets", "result": "inconclusive", "why": needed_lines(j["inconclusive"])}
    why = (
        f"every hard budget of {', '.join(j['route_classes'])} met (95% intervals within the limits)"
        if _has_budgets(j)
        else f"no budget on {', '.join(j['route_classes'])} (no scenario with budgets): nothing to fail"
    )
    return {"step": "hard budgets", "result": "passed", "why": [why]}


def _contract_step(c: Candidate) -> tuple[dict[str, Any], dict[str, Any]]:
    """Judgement step 2: a failed behaviour contract rejects; (the step, the contract result shown)."""
    contract = c.contract
    configured = bool(c.scenario is not None and c.scenario.behavior.cases)
    if contract is None:
        contract = (
            {
                "status": "not_evaluated",
                "summary": f"behaviour cases configured but no {CONTRACT_FILE} beside "
                f"the candidate: replay them (loadgen contract) to judge behaviour",
            }
            if configured
            else {
                "status": "not_configured",
                "summary": "behaviour contract not configured (scenario [behavior] cases is empty)",
            }
        )
    contract = {k: v for k, v in contract.items() if not k.startswith("_")}
    step = {
        "step": "behaviour contract",
        "result": "rejected" if contract["status"] == "failed" else contract["status"],
        "why": [contract["summary"]]
        + [
            f"{f.get('case_id')}: {f.get('kind')} expected {f.get('expected')!r}, got {str(f.get('got'))[:60]!r}"
            for f in contract.get("failures", [])[:5]
        ],
    }
    return step, contract


def _cost(c: Candidate, tp: dict[str, Any], table: PriceTable | None, basis: str | None) -> dict[str, Any] | None:
    """Step 3's cost: per million tokens at the candidate's headline rate, from the matching price (None without a table)."""
    if table is None:
        return None
    matched, price = table.price_for(c.label, c.manifest.target.model, c.path.name)
    if price is None:
        return {"matched": None, "note": f"no price for {c.label!r} and no [default] in {table.source_path}"}
    out_rate, what = _headline_rate(tp, basis)
    scale = (out_rate / tp["output_tok_s"]) if tp.get("output_tok_s") and out_rate else 1.0
    prompt_tok_s = tp.get("prompt_tok_s")
    prompt_rate = prompt_tok_s * scale if prompt_tok_s is not None else None
    return {
        "matched": matched,
        "example_prices": table.example,
        "currency": table.currency,
        "throughput_basis": what,
        **cost_per_million(price, prompt_tok_s=prompt_rate, output_tok_s=out_rate),
    }


def _judge_candidate(
    index: int, c: Candidate, route: str, table: PriceTable | None, max_send_lag_ms: float
) -> dict[str, Any]:
    """One candidate through the judgement order: its steps, verdict, contract, cost, figures and context."""
    j = _judge_run(c, route) if c.kind == "run" else _judge_plan(c, route)
    j["context"] = _context(c)
    contract_step, contract = _contract_step(c)
    steps = [_budget_step(j, max_send_lag_ms, _stopped_line(c)), contract_step]
    rejected = any(s["result"] == "rejected" for s in steps)
    unmeasured = steps[0]["result"] == "unmeasured"
    return {
        "index": index,
        "label": c.label,
        "path": str(c.path),
        "kind": c.kind,
        "verdict": "rejected" if rejected else "unmeasured" if unmeasured else "eligible",
        "budgets": steps[0]["result"],
        "rejected_at": next((s["step"] for s in steps if s["result"] == "rejected"), None),
        "steps": steps,
        "contract": contract,
        "cost": None,  # set by compare_candidates once every candidate's basis is known
        **j,
    }


def _has_budgets(j: dict[str, Any]) -> bool:
    """Whether a judged candidate had a hard budget to meet (a plan's region always has)."""
    return "capacity" in j or any(lim for t in j["tails"].values() for lim in t["limits"].values())


def _rank_key(j: dict[str, Any], basis: str | None) -> tuple[int, float, int, float]:
    """Among eligible candidates: budgets shown to pass before inconclusive ones, then the lowest cost per million
    output tokens, then the highest headline rate; one whose rate is not measured is not ranked on it (after
    every one that has a rate)."""
    cost = (j.get("cost") or {}).get("per_million_output_tokens")
    rate = _headline_rate(j["throughput"], basis)[0]
    return (
        0 if j.get("budgets") == "passed" else 1,
        cost if cost is not None else math.inf,
        0 if rate is not None else 1,
        -(rate or 0.0),
    )


def _unranked_lines(judged: list[dict[str, Any]], basis: str | None) -> list[str]:
    """One line per candidate whose headline rate is not measured, saying why it is not ranked on it."""
    lines = []
    for j in judged:
        rate, what = _headline_rate(j["throughput"], basis)
        if rate is None:
            why = j["throughput"].get("rates_unmeasured") or "no figure"
            lines.append(f"{j['label']}: not ranked on throughput: {what} not measured ({why})")
    return lines


def _rejection_line(
    j: dict[str, Any], route: str, headline: dict[str, Any], chosen: dict[str, Any] | None, basis: str | None
) -> str:
    """Why one candidate was rejected; the headline-throughput candidate says what it had and lost."""
    reasons = next(s["why"] for s in j["steps"] if s["result"] == "rejected")
    lead = f"{j['label']} rejected for {route} routing at '{j['rejected_at']}'"
    if j is headline and chosen is not None and j is not chosen:
        rate, what = _headline_rate(j["throughput"], basis)
        chosen_rate = _headline_rate(chosen["throughput"], basis)[0]
        lead += (
            f" although it has the headline throughput ({_f(rate)} vs {_f(chosen_rate)} for {chosen['label']}: {what})"
        )
    return lead + ": " + "; ".join(reasons)


def _decide(judged: list[dict[str, Any]], route: str, basis: str | None) -> Decision:
    """Choose among the eligible candidates and say why, rejections included."""
    eligible = [j for j in judged if j["verdict"] == "eligible"]
    measured = [j for j in judged if _headline_rate(j["throughput"], basis)[0] is not None] or judged
    headline = max(measured, key=lambda j: _headline_rate(j["throughput"], basis)[0] or 0.0)
    chosen: dict[str, Any] | None
    if eligible:
        chosen = min(eligible, key=lambda j: _rank_key(j, basis))
        rate, what = _headline_rate(chosen["throughput"], basis)
        by = (
            "lowest cost per million output tokens"
            if (chosen.get("cost") or {}).get("per_million_output_tokens") is not None
            else "highest " + what
            if rate is not None
            else f"first place in the order given: none has a measured {what}"
            if len(eligible) > 1
            else f"only place: its {what} is not measured"
        )
        meets = (
            "meets every hard budget of "
            if chosen.get("budgets") == "passed" and _has_budgets(chosen)
            else "has no budget to fail on "
            if chosen.get("budgets") == "passed"
            else "fails no hard budget conclusively (some are inconclusive, see below) of "
        )
        why = [
            (
                f"{chosen['label']} is chosen for {route} routing: it {meets}"
                f"{', '.join(chosen['route_classes'])}, its behaviour contract is {chosen['contract']['status']}, "
                f"and among the {len(eligible)} eligible candidate(s) it has the {by}"
            )
        ]
    else:
        chosen = None
        why = [f"no candidate is eligible for {route} routing"]
    why += [_rejection_line(j, route, headline, chosen, basis) for j in judged if j["verdict"] == "rejected"]
    why += _unranked_lines(judged, basis)
    unsure = [
        Unsure(label=j["label"], why=j["steps"][0]["why"])
        for j in judged
        if j["verdict"] == "eligible" and j.get("budgets") == "inconclusive"
    ]
    why += [f"{u.label}: {line}" for u in unsure for line in u.why]
    unmeasured = [Unsure(label=j["label"], why=j["steps"][0]["why"]) for j in judged if j["verdict"] == "unmeasured"]
    why += [f"{u.label}: unmeasured: {u.why[0]}" for u in unmeasured]
    rate, what = _headline_rate(headline["throughput"], basis)
    return Decision(
        route=route,
        chosen=chosen["label"] if chosen else None,
        chosen_path=chosen["path"] if chosen else None,
        rejected=[
            Rejection(
                label=j["label"],
                step=j["rejected_at"],
                why=next(s["why"] for s in j["steps"] if s["result"] == "rejected"),
            )
            for j in judged
            if j["verdict"] == "rejected"
        ],
        inconclusive=unsure,
        unmeasured=unmeasured,
        headline_throughput=HeadlineThroughput(label=headline["label"], value=rate, basis=what),
        why=why,
    )


def _price_info(table: PriceTable | None, notes: list[str]) -> PriceInfo | None:
    """The price table's description for the comparison (an example table adds a note)."""
    if table is None:
        return None
    if table.example:
        notes.append(f"prices from {table.source_path} are an EXAMPLE (made-up numbers), not real prices")
    return PriceInfo(
        path=table.source_path, example=table.example, currency=table.currency, description=table.description
    )


def compare_candidates(
    paths: Sequence[str | Path],
    *,
    route: str = "interactive",
    variable: str | None = None,
    prices: str | Path | PriceTable | None = None,
    allow_differences: bool = False,
    max_send_lag_ms: float = SEND_LAG_BOUND_MS,
) -> Comparison:
    """Load, check identity, judge in order, decide. Raises PlanError (one line) on a refused comparison.

    ``max_send_lag_ms``: a candidate whose client send-lag p99 exceeds it is unmeasured (its budgets not judged)."""
    check_send_lag_bound(max_send_lag_ms, "compare")
    if len(paths) < 2:
        raise PlanError(f"compare: got {len(paths)} candidate(s): expected at least two run or plan directories")
    variable = variable or DEFAULT_VARIABLE
    candidates = [load_candidate(p) for p in paths]
    kinds = {c.kind for c in candidates}
    if len(kinds) > 1:
        raise PlanError("compare: candidates mix run directories and plan directories: expected all runs or all plans")
    covered, other, notes = _identity_notes(candidates, variable, allow_differences)
    table = load_prices(prices) if isinstance(prices, (str, Path)) else prices
    judged = [_judge_candidate(index, c, route, table, max_send_lag_ms) for index, c in enumerate(candidates)]
    for j, shown in zip(judged, _distinct_labels(candidates), strict=True):
        j["label"] = shown
    basis = _headline_basis(judged)
    for j, c in zip(judged, candidates, strict=True):
        j["cost"] = _cost(c, j["throughput"], table, basis)
    decision = _decide(judged, route, basis)
    for j in judged:
        j["status_line"] = f"{j['label']}: {j['verdict']}" + (f" at {j['rejected_at']}" if j["rejected_at"] else "")
    identity = Identity(
        variable=variable,
        varies=covered,
        also_differs=other,
        held_fixed=sorted(k for k in candidates[0].identity if k not in covered and k not in other)[:200],
    )
    price_info = _price_info(table, notes)
    return Comparison(route, variable, judged, decision, identity, price_info, notes)


def _f(value: Any, digits: int = 1) -> str:
    if value is None:
        return "–"
    if value == "inf" or (isinstance(value, float) and math.isinf(value)):
        return "inf"
    if isinstance(value, float):
        return f"{value:,.{digits}f}"
    return str(value)


def _tail_cell(t: dict[str, Any], metric: str, q: str) -> str | None:
    """'measured [low, high] / limit (n=N) ✗|?' for a budgeted percentile (the check's sample); None without a limit."""
    lim = (t.get("limits", {}).get(metric) or {}).get(q)
    if lim is None:
        return None
    check = (t.get("checks") or {}).get(f"{metric}.{q}")
    if check is None:
        obs, n = (t.get(metric) or {}).get(q), (t.get(metric) or {}).get("n")
        return f"{_f(obs, 0)} / {_f(lim, 0)} (n={n})"
    ci = check.get("ci") or []
    shown_ci = f" [{_f(ci[0], 0)}, {_f(ci[1], 0)}]" if ci else ""
    flag = {"fail": " ✗", "inconclusive": " ?"}.get(check["outcome"], "")
    return f"{_f(check['observed'], 0)}{shown_ci} / {_f(lim, 0)} (n={check['n']}){flag}"


def format_comparison(comp: Comparison) -> str:
    """Console report: candidates side by side, judgement steps in order, the decision and why."""
    cands = comp.candidates
    width = max(38, *(len(c["label"]) + 2 for c in cands), *(len(c["status_line"]) - len(c["label"]) for c in cands))
    lines = [
        f"Candidate comparison — route: {comp.route}; declared variable: {comp.variable}",
        "Judgement order: hard budgets → behaviour contract → throughput and cost",
        "",
    ]

    def row(name: str, values: list[str]) -> str:
        return f"  {name:<44}" + "".join(f"{v:<{width}}" for v in values)

    lines.append(row("", [c["label"] for c in cands]))
    lines.append(row("verdict", [c["status_line"].split(": ", 1)[1] for c in cands]))
    stopped = [c for c in cands if c.get("stop")]
    if stopped:
        lines.append(row("run state", [c["context"]["measurement"]["state"] or "–" for c in cands]))
        lines += [f"  {c['label']}: {c['stop']}" for c in stopped]
    lines.append("")
    lines.append("  1. hard budgets (class metric pctl: measured [95% CI] / limit, n; ✗ fails, ? inconclusive)")
    classes = sorted({n for c in cands for n in c.get("tails", {})})
    for name in classes:
        for metric in ("ttft_ms", "itl_ms"):
            for q in ("p50", "p99"):
                vals = [_tail_cell(c.get("tails", {}).get(name, {}), metric, q) for c in cands]
                if any(v is not None for v in vals):
                    lines.append(row(f"{name} {metric} {q}", [v or "–" for v in vals]))
    if any(c.get("capacity") for c in cands):
        for name in sorted({n for c in cands for n in c.get("capacity", {})}):
            lines.append(
                row(
                    f"{name} max inside offered rps",
                    [_f((c.get("capacity", {}).get(name) or {}).get("max_inside_offered_rps"), 2) for c in cands],
                )
            )
    lines.append(
        row(
            "errors (error/timeout/not_sent)",
            [
                f"{sum(v for k, v in c['status_counts'].items() if k in ('error', 'timeout', 'not_sent'))} of {sum(c['status_counts'].values())}"
                if c["status_counts"]
                else "–"
                for c in cands
            ],
        )
    )
    lines.append(
        row(
            "client send-lag p99 ms (measurement)",
            [_f(c["context"]["measurement"]["send_lag_p99_ms"], 2) for c in cands],
        )
    )
    lines.append(row("result", [c["steps"][0]["result"] for c in cands]))
    lines.append("")
    lines.append("  2. behaviour contract")
    lines.append(row("result", [c["steps"][1]["result"] for c in cands]))
    lines.append("")
    lines.append("  3. throughput and cost")
    tp = [c["throughput"] for c in cands]
    lines.append(row("output tok/s (analysis window)", [_f(t.get("output_tok_s")) for t in tp]))
    lines.append(row("output tok/s (whole run, incl. drain)", [_f(t.get("output_tok_s_whole_run")) for t in tp]))
    bins = {t.get("peak_bin_s") for t in tp if t.get("peak_bin_s") is not None}
    peak = f"peak {_f(bins.pop(), 3)} s bin" if len(bins) == 1 else "peak time-series bin"
    lines.append(row(f"output tok/s ({peak})", [_f(t.get("peak_output_tok_s")) for t in tp]))
    lines.append(
        row("output tok per engine-busy s (capacity)", [_f(t.get("output_tok_per_engine_busy_s")) for t in tp])
    )
    # the analyzer's figures under the analyzer's names (README "Metric definitions")
    lines.append(row("offered req/s (scheduled in the window)", [_f(t.get("offered_rps"), 2) for t in tp]))
    lines.append(row("sent req/s (bytes on the socket)", [_f(t.get("send_rps"), 2) for t in tp]))
    lines.append(row("completed req/s (ok, done in the window)", [_f(t.get("completed_rps"), 2) for t in tp]))
    lines.append(row("goodput req/s (completed, hard budgets met)", [_f(t.get("goodput_rps"), 2) for t in tp]))
    lines.append(
        row(
            "attainment (scheduled in the window)",
            ["–" if t.get("attainment") is None else f"{t['attainment']:.1%}" for t in tp],
        )
    )
    if any(c.get("cost") for c in cands):
        cur = next((c["cost"].get("currency") for c in cands if c.get("cost")), "USD")
        example = any((c.get("cost") or {}).get("example_prices") for c in cands)
        label = f"{cur} per M output tokens" + (" (EXAMPLE prices)" if example else "")
        lines.append(row(label, [_f((c.get("cost") or {}).get("per_million_output_tokens"), 3) for c in cands]))
    lines.append("")
    chosen = comp.decision.chosen
    lines.append(f"Decision ({comp.route}): " + (f"{chosen}" if chosen else "no candidate eligible"))
    for why in comp.decision.why:
        lines.append(f"  - {why}")
    for note in comp.notes:
        lines.append(f"  note: {note}")
    return "\n".join(lines)
