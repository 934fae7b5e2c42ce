"""Specialist handoff: the smallest reproducible package for a failed budget, and its verification.

``build_bundle(RUN_OR_PLAN_DIR, OUT)`` writes a directory and ``OUT.tar.gz`` holding the identity of
package, engine and hardware; the workload generator settings and seed (the scenario file and trace
name, never raw prompts); the trace Parquet (token counts and timing only, no text); the runtime
configuration; the expected contract (case files); the failing thresholds with measured value and
sample count; one proposed one-variable experiment; a README saying how to rerun it with one command;
and ``SHA256SUMS``. It states what was observed; it does not prescribe kernel work.
``verify_bundle`` checks a bundle (directory or tar.gz) against its checksums; ``rerun_bundle``
replays the bundled trace against a target, or against the simulated engine from the bundled config.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tarfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import RunDirError
from .identity import sha256_file, utc_now_iso
from .records import MANIFEST_FILE, REQUESTS_FILE

__all__ = [
    "SUMS_FILE",
    "BundleInfo",
    "VerifyResult",
    "RerunResult",
    "find_run_dirs",
    "propose_experiment",
    "build_bundle",
    "verify_bundle",
    "rerun_bundle",
    "toml_dumps",
]

SUMS_FILE = "SHA256SUMS"
#: Failure "metrics" that are memory signals rather than latency budgets.
MEMORY_SIGNALS = ("kv_cache_saturated", "preemptions", "engine_oom")
BUNDLE_KIND = "loadgen.handoff_bundle"


# --------------------------------------------------------------------------------------------- TOML


def _toml_key(key: str) -> str:
    return key if re.fullmatch(r"[A-Za-z0-9_-]+", key) else json.dumps(key)


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value) or math.isinf(value):
            return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml_value(v) for v in value if v is not None) + "]"
    if isinstance(value, dict):
        items = [f"{_toml_key(k)} = {_toml_value(v)}" for k, v in value.items() if v is not None]
        return "{ " + ", ".join(items) + " }" if items else "{}"
    raise TypeError(f"cannot write {type(value).__name__} as TOML")


def toml_dumps(data: dict[str, Any]) -> str:
    """A small TOML writer for config dicts (tables, inline tables in lists, scalars; None dropped)."""
    lines: list[str] = []

    def emit(table: dict[str, Any], prefix: str) -> None:
        scalars = {k: v for k, v in table.items() if v is not None and not isinstance(v, dict)}
        tables = {k: v for k, v in table.items() if isinstance(v, dict)}
        if prefix and (scalars or not tables):
            lines.append(f"\n[{prefix}]")
        for k, v in scalars.items():
            lines.append(f"{_toml_key(k)} = {_toml_value(v)}")
        for k, v in tables.items():
            emit(v, f"{prefix}.{_toml_key(k)}" if prefix else _toml_key(k))

    emit(data, "")
    return "\n".join(lines).lstrip("\n") + "\n"


# ------------------------------------------------------------------------------------------ finding


def find_run_dirs(path: str | Path) -> list[Path]:
    """Run directories at or under ``path`` (a run dir, or a plan dir holding run dirs), sorted."""
    path = Path(path)
    if not path.exists():
        raise RunDirError(f"{path}: no such directory: expected a run or plan directory")
    if (path / MANIFEST_FILE).is_file() and (path / REQUESTS_FILE).is_file():
        return [path]
    found = sorted({p.parent for p in path.rglob(REQUESTS_FILE) if (p.parent / MANIFEST_FILE).is_file()})
    if not found:
        raise RunDirError(f"{path}: no run directory (manifest.json + requests.parquet) at or under it: expected a run or plan directory")
    return found


def _metric_sample_counts(run_dir: Path) -> dict[str, int]:
    """Samples per server metric name (the sample count behind a memory signal)."""
    from .records import SERVER_METRICS_FILE

    path = run_dir / SERVER_METRICS_FILE
    if not path.is_file():
        return {}
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    counts = pc.value_counts(pq.read_table(path, columns=["name"]).column("name")).to_pylist()
    return {c["values"]: int(c["counts"]) for c in counts}


def _memory_signals(manifest: dict[str, Any], analysis: Any, run_dir: Path | None = None) -> list[dict[str, Any]]:
    """Memory evidence a run holds: KV cache saturation, preemptions, OOM notes from the engine."""
    signals: list[dict[str, Any]] = []
    server = getattr(analysis, "server", None) or {}
    counts = _metric_sample_counts(run_dir) if run_dir is not None and server else {}
    kv = server.get("kv_cache_usage") if isinstance(server, dict) else None
    pre = server.get("preemptions") if isinstance(server, dict) else None
    if kv and kv.get("peak") is not None and kv["peak"] >= 0.99:
        signals.append({"signal": "kv_cache_saturated", "metric": kv.get("metric"), "observed": kv["peak"],
                        "limit": 0.99, "samples": counts.get(kv.get("metric")),
                        "reason": f"KV cache usage peaked at {kv['peak']:.1%} ({kv.get('metric')})"})
    if pre and (pre.get("increase") or 0) > 0:
        signals.append({"signal": "preemptions", "metric": pre.get("metric"), "observed": pre["increase"],
                        "limit": 0, "samples": counts.get(pre.get("metric")),
                        "reason": f"{pre['increase']:g} preemptions during the run ({pre.get('metric')})"})
    notes = json.dumps(manifest.get("engine_notes") or {}).lower()
    if "out of memory" in notes or "oom" in re.findall(r"[a-z]+", notes):
        signals.append({"signal": "engine_oom", "observed": None, "limit": None, "samples": None,
                        "reason": "the engine reported running out of memory (manifest engine_notes)"})
    return signals


def _select(path: Path) -> tuple[Path, Any, list[dict[str, Any]], list[Path]]:
    """The run to hand off: the first with a failed hard budget (or memory signal), else the first."""
    from .analysis import analyze_run
    from .rundir import read_manifest

    runs = find_run_dirs(path)
    first: tuple[Path, Any, list[dict[str, Any]]] | None = None
    for run_dir in runs:
        analysis = analyze_run(run_dir)
        memory = _memory_signals(read_manifest(run_dir), analysis, run_dir)
        if first is None:
            first = (run_dir, analysis, memory)
        if analysis.hard_failures or memory:
            return run_dir, analysis, memory, runs
    assert first is not None
    return first[0], first[1], first[2], runs


# --------------------------------------------------------------------------------------- experiment


def _find_key(config: Any, names: tuple[str, ...]) -> tuple[str, Any] | None:
    """The first (dotted path, value) whose last key is in ``names``, searching nested dicts."""
    if not isinstance(config, dict):
        return None
    for key, value in config.items():
        if key in names and not isinstance(value, dict) and value is not None:
            return key, value
    for key, value in config.items():
        if isinstance(value, dict):
            found = _find_key(value, names)
            if found:
                return f"{key}.{found[0]}", found[1]
    return None


def _inner_engine_config(engine: Any) -> dict[str, Any] | None:
    """The engine's own settings from a manifest ``target.engine`` entry (unwrapping ``config.config``)."""
    if not isinstance(engine, dict):
        return None
    config = engine.get("config")
    while isinstance(config, dict) and isinstance(config.get("config"), dict):
        config = config["config"]
    return config if isinstance(config, dict) else None


def propose_experiment(failures: list[dict[str, Any]], engine_config: dict[str, Any] | None,
                       trace_name: str | None) -> dict[str, Any]:
    """One variable to change next, derived from the first failure and the engine config (a proposal)."""
    cfg = engine_config or {}
    memory = [f for f in failures if f.get("metric") in MEMORY_SIGNALS]
    first = memory[0] if memory else (failures[0] if failures else None)  # memory pressure explains the rest
    metric = (first or {}).get("metric", "")
    window = _find_key(cfg, ("window_ms", "batching_window_ms"))
    seqs = _find_key(cfg, ("max_num_seqs",))
    tokens = _find_key(cfg, ("max_num_batched_tokens",))
    kv_budget = _find_key(cfg, ("gpu_memory_utilization", "kv_cache_gib", "num_kv_blocks"))

    def change(var: tuple[str, Any], new: Any, why: str) -> dict[str, Any]:
        return {"variable": var[0], "from": var[1], "to": new, "hypothesis": why}

    proposal: dict[str, Any]
    if first is None:
        proposal = {"variable": None, "from": None, "to": None,
                    "hypothesis": "no budget failed in this run; rerun unchanged to confirm the result repeats"}
    elif metric in MEMORY_SIGNALS:
        if seqs and isinstance(seqs[1], (int, float)) and seqs[1] > 1:
            proposal = change(seqs, max(1, int(seqs[1]) // 2),
                              "fewer concurrent sequences lower the KV cache high-water mark and preemptions")
        elif kv_budget:
            new = round(min(0.95, kv_budget[1] + 0.05), 2) if kv_budget[0].endswith("utilization") else kv_budget[1] * 2
            proposal = change(kv_budget, new, "a larger KV budget removes saturation if weights and activations still fit")
        else:
            proposal = {"variable": "max_num_seqs", "from": None, "to": "half the current value",
                        "hypothesis": "fewer concurrent sequences lower the KV cache high-water mark"}
    elif metric in ("ttft_ms", "e2e_ms", "error_share") and window and isinstance(window[1], (int, float)) and window[1] > 0:
        proposal = change(window, window[1] / 2,
                          "the batching window holds new requests before prefill; halving it should cut the queue part of TTFT")
    elif metric == "ttft_ms" and tokens and isinstance(tokens[1], int):
        proposal = change(tokens, tokens[1] * 2,
                          "a larger per-step token budget admits queued prefills sooner (watch ITL, which may rise)")
    elif metric in ("itl_ms", "e2e_ms") and tokens and isinstance(tokens[1], int) and tokens[1] > 2048:
        proposal = change(tokens, tokens[1] // 2,
                          "smaller prefill chunks interleaved with decode shorten the longest decode steps")
    elif metric in ("itl_ms", "e2e_ms") and seqs and isinstance(seqs[1], int) and seqs[1] > 1:
        proposal = change(seqs, seqs[1] // 2, "a smaller decode batch shortens each decode step")
    else:
        proposal = {"variable": "offered load (trace time scale)", "from": 1.0, "to": 2.0,
                    "hypothesis": "replaying the same trace at half the rate locates where the budget starts to hold"}
    proposal.update({
        "status": "proposal (not measured)",
        "target_check": None if first is None else {k: first.get(k) for k in ("class", "metric", "percentile", "limit")},
        "keep_fixed": ["model and weights", "engine version", "hardware", "trace " + repr(trace_name) + " and seed",
                       "every other engine setting", "warm/cold state"],
        "measure": "the failing check above, with its sample count, over at least 3 repeats",
    })
    return proposal


# ------------------------------------------------------------------------------------------- build


@dataclass
class BundleInfo:
    bundle_dir: Path
    tarball: Path
    run_dir: Path
    failures: list[dict[str, Any]]
    experiment: dict[str, Any]
    files: list[str] = field(default_factory=list)


def _check_dict(check: Any) -> dict[str, Any]:
    d = check.to_dict()
    obs = d.get("observed")
    if isinstance(obs, float) and math.isinf(obs):
        d["observed"] = "inf"
    return {
        "class": d.get("class"), "metric": d.get("metric"), "percentile": d.get("percentile"),
        "limit": d.get("limit"), "observed": d.get("observed"), "samples": d.get("n"),
        "failures_as_inf": d.get("failures_as_inf", 0), "hard": d.get("hard"), "reason": d.get("reason"),
    }


def _write_json(path: Path, data: Any) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=True, default=str) + "\n")


def _scenario_text(manifest: dict[str, Any]) -> tuple[str | None, str]:
    """The scenario file's bytes when the original is still there unchanged, else rebuilt from the manifest."""
    entry = manifest.get("scenario") or {}
    path, sha = entry.get("path"), entry.get("sha256")
    if path and Path(path).is_file() and sha and sha256_file(Path(path)) == sha:
        return Path(path).read_text(), "original file (sha256 matches the run's manifest)"
    content = entry.get("content")
    if not content:
        return None, "the run recorded no scenario"
    # manifest JSON has sorted keys, which loses the order of [classes]; the trace generator draws
    # classes in file order, so put them back in the canonical order scenarios are written in
    from .scenario import CLASS_NAMES

    content = dict(content)
    classes = content.get("classes") or {}
    content["classes"] = {n: classes[n] for n in sorted(classes, key=lambda n: (CLASS_NAMES + (n,)).index(n))}
    return ("# Rebuilt by loadgen handoff from the run manifest's validated scenario content\n"
            + toml_dumps(content)), ("rebuilt from the manifest (original file missing or changed); classes are "
                                     "written in canonical order because the manifest does not keep the file's order, "
                                     "and the trace generator depends on it")


def _engine_toml(engine: dict[str, Any] | None, version_body: Any = None) -> tuple[str | None, str | None]:
    """The simulated engine's config file (original when unchanged, else rebuilt), when known."""
    if not isinstance(engine, dict):
        engine = {}
    metas = [engine] + ([engine["config"]] if isinstance(engine.get("config"), dict) else [])
    for meta in metas:
        path, sha = meta.get("path"), meta.get("sha256")
        if isinstance(path, str) and Path(path).is_file() and sha and sha256_file(Path(path)) == sha:
            return Path(path).read_text(), "original file"
    config = _inner_engine_config(engine)
    if isinstance(config, dict) and config.get("name") and "scheduler" in config:
        return ("# Rebuilt by loadgen handoff from the run manifest's engine config\n" + toml_dumps(config),
                "rebuilt from the manifest")
    version = version_body if isinstance(version_body, dict) else {}
    name = version.get("engine_config") if version.get("engine") == "loadgen-sim" else None
    if isinstance(name, str) and re.fullmatch(r"[A-Za-z0-9._-]+", name):
        from .sim.config import PRESETS_DIR

        preset = PRESETS_DIR / f"{name}.toml"
        if preset.is_file():
            return preset.read_text(), (f"the shipped preset of that name: the live server reported engine_config = "
                                        f"{name!r} but not its content, so a locally modified config would not show here")
    return None, None


def _case_files(manifest: dict[str, Any]) -> list[Path]:
    from .scenario import scenario_from_manifest

    try:
        scenario = scenario_from_manifest(manifest)
    except Exception:  # a bad scenario must not stop the handoff; it is reported in the README
        return []
    if scenario is None:
        return []
    files = []
    for ref in scenario.behavior.cases:
        path = Path(ref.partition("#")[0])
        if not path.is_absolute():
            path = scenario.base_dir() / path
        if path.is_file() and path not in files:
            files.append(path)
    return files


def _fmt_observed(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.1f}" if abs(value) >= 100 else f"{value:.4g}"
    return str(value)


def _readme(ctx: dict[str, Any]) -> str:
    f = ctx["failures"]
    lines = [
        f"# Handoff: {ctx['title']}",
        "",
        f"Built {ctx['built_utc']} by loadgen {ctx['loadgen_version']} from run `{ctx['run_name']}` "
        f"({ctx['run_kind']} run; modelExecuted={ctx['model_executed']}, benchmarkExecuted={ctx['benchmark_executed']}).",
        "",
        "## Rerun with one command",
        "",
        "```sh",
        ctx["rerun_command"],
        "```",
        "",
        ctx["rerun_note"],
        "",
        "Check the bundle first: `loadgen handoff verify " + ctx["bundle_name"] + "` (or the .tar.gz).",
        "",
        "## What was observed",
        "",
    ]
    if f:
        lines.append("| class | metric | percentile | limit | measured | samples | note |")
        lines.append("|---|---|---|---|---|---|---|")
        for item in f:
            notes = []
            if item.get("failures_as_inf"):
                notes.append(f"{item.get('failures_as_inf')} failed requests counted as +inf")
            if item.get("percentile") == "p99" and isinstance(item.get("samples"), int) and item["samples"] < 100:
                notes.append("p99 from fewer than 100 samples")
            note = "; ".join(notes)
            lines.append(f"| {item.get('class', '')} | {item.get('metric')} | {item.get('percentile') or ''} | "
                         f"{_fmt_observed(item.get('limit'))} | {_fmt_observed(item.get('observed'))} | "
                         f"{item.get('samples')} | {note} |")
    else:
        lines.append("No hard budget failed and no memory signal was seen in this run. The bundle is still "
                     "complete, so the result can be reproduced or extended.")
    lines += [
        "",
        "Values are in ms for latency metrics, from `loadgen analyze` (failed requests count as +inf; a p99 "
        "from fewer than 100 samples is flagged). This package states what was measured at the client and, "
        "where the engine exposes it, its /metrics; it does not diagnose kernels or prescribe kernel work.",
        "",
        "## Proposed one-variable experiment (a proposal, not a measurement)",
        "",
    ]
    e = ctx["experiment"]
    if e.get("variable"):
        lines.append(f"- change **{e['variable']}** from `{e.get('from')}` to `{e.get('to')}`; keep everything else fixed")
    lines.append(f"- why: {e['hypothesis']}")
    lines.append(f"- keep fixed: {', '.join(e['keep_fixed'])}")
    lines.append(f"- measure: {e['measure']}")
    lines += [
        "",
        "## Contents",
        "",
        "| file | what |",
        "|---|---|",
        "| identity.json | package (model), engine (name, version, config), hardware, harness, warm state, behaviour-relevant settings |",
        "| workload.json | workload generator settings: scenario name + sha256, trace name, seed, generator version; regenerate command |",
        "| scenario.toml | the scenario (classes, budgets, arrivals); " + ctx["scenario_note"] + " |",
        "| trace.parquet | the exact trace replayed (arrival offsets and token counts; no prompt text) |",
        "| runtime.json | engine configuration and every run option (secrets redacted) |",
    ]
    if ctx.get("engine_toml"):
        lines.append("| engine.toml | simulated engine config (" + str(ctx["engine_toml"]) + ") |")
    lines += [
        "| contract/ | the expected behaviour contract (case files" + (", and the run's contract result" if ctx.get("contract_result") else "") + ") |",
        "| failure.json | failing thresholds with measured value and sample count; memory signals |",
        "| experiment.json | the proposed experiment |",
        "| observed.json | the full analysis of the run (per-class percentiles with n, rates, errors) |",
        "| manifest.json | the source run's manifest |",
        "| SHA256SUMS | sha256 of every file above (`sha256sum -c SHA256SUMS` also works) |",
        "",
        "Raw prompts are not included: prompts are regenerated deterministically from the trace (token counts, "
        "prefix groups) by the same loadgen version.",
        "",
        "A candidate that fixes the failure must keep the expected behaviour: replay the contract against it with "
        "`loadgen contract replay contract/*.toml --target URL --model NAME`"
        + (" and compare with `contract/contract_result.json` (`loadgen contract diff`)." if ctx.get("contract_result") else "."),
    ]
    if ctx.get("other_runs"):
        lines += ["", f"The source held {ctx['other_runs']} run directories; this bundle packages the first with a failure."]
    return "\n".join(lines) + "\n"


def _sums(bundle_dir: Path) -> list[str]:
    files = sorted(p for p in bundle_dir.rglob("*") if p.is_file() and p.name != SUMS_FILE)
    rels = [p.relative_to(bundle_dir).as_posix() for p in files]
    (bundle_dir / SUMS_FILE).write_text("".join(f"{sha256_file(bundle_dir / r)}  {r}\n" for r in rels))
    return rels


def _check_no_secret(bundle_dir: Path, manifest: dict[str, Any]) -> None:
    name = (manifest.get("options") or {}).get("api_key_env")
    secret = os.environ.get(name) if name else None
    if not secret or len(secret) < 4:
        return
    needle = secret.encode()
    for p in bundle_dir.rglob("*"):
        if p.is_file() and needle in p.read_bytes():
            shutil.rmtree(bundle_dir, ignore_errors=True)
            raise RunDirError(f"{p.name}: would contain the value of ${name}: refusing to write a bundle with a secret")


def build_bundle(source: str | Path, out: str | Path) -> BundleInfo:
    """Build the handoff bundle directory ``out`` and ``out.tar.gz`` from a run or plan directory."""
    from . import __version__
    from .analysis import analyze_run  # noqa: F401  (import errors surface before writing anything)
    from .rundir import read_manifest

    out = Path(out)
    if out.name.endswith(".tar.gz"):
        out = out.with_name(out.name[: -len(".tar.gz")])
    if out.exists() and any(out.iterdir()):
        raise RunDirError(f"{out}: exists and is not empty: expected a new bundle directory")
    run_dir, analysis, memory, runs = _select(Path(source))
    manifest = read_manifest(run_dir)
    target = manifest.get("target") or {}
    engine = target.get("engine")
    trace = manifest.get("trace") or {}

    failures = [_check_dict(c) for c in analysis.hard_failures]
    for m in memory:
        failures.append({"class": "overall", "metric": m["signal"], "percentile": None, "limit": m.get("limit"),
                         "observed": m.get("observed"), "samples": m.get("samples"), "hard": True, "reason": m["reason"]})
    # TTFT and memory failures first: those are what the handoff is for
    order = {"ttft_ms": 0, "kv_cache_saturated": 1, "preemptions": 1, "engine_oom": 1}
    failures.sort(key=lambda f: (order.get(f["metric"], 2), 0 if f.get("percentile") == "p99" else 1))
    experiment = propose_experiment(failures, _inner_engine_config(engine), trace.get("name"))

    out.mkdir(parents=True, exist_ok=True)
    try:
        _write_json(out / "identity.json", {
            "kind": BUNDLE_KIND, "version": 1, "built_utc": utc_now_iso(),
            "package": {"model": target.get("model"), "served_models": target.get("served_models")},
            "engine": engine, "target_kind": target.get("kind"), "target_base_url": target.get("base_url"),
            "target_version": target.get("version"),
            "hardware": manifest.get("host"), "harness": manifest.get("harness"),
            "run_kind": manifest.get("run_kind"), "modelExecuted": manifest.get("modelExecuted"),
            "benchmarkExecuted": manifest.get("benchmarkExecuted"), "warm_state": manifest.get("warm_state"),
            "behavior_relevant": manifest.get("behavior_relevant"), "engine_notes": manifest.get("engine_notes"),
            "source_run": {"path": str(run_dir), "started_utc": manifest.get("started_utc"),
                           "order_index": manifest.get("order_index"), "repeat": manifest.get("repeat"),
                           "plan_cell": manifest.get("plan_cell")},
        })
        scenario_text, scenario_note = _scenario_text(manifest)
        if scenario_text is not None:
            (out / "scenario.toml").write_text(scenario_text)
        trace_src = Path(trace["path"]) if trace.get("path") else None
        trace_note = "not available"
        if trace_src is not None and trace_src.is_file():
            shutil.copyfile(trace_src, out / "trace.parquet")
            got = sha256_file(out / "trace.parquet")
            trace_note = "copied; sha256 matches the manifest" if got == trace.get("sha256") else \
                f"copied; sha256 {got[:12]} differs from the manifest's {str(trace.get('sha256'))[:12]}"
        elif scenario_text is not None and trace.get("name"):
            from .scenario import load_scenario
            from .trace.generate import generate_trace_file

            from .trace.io import read_trace

            generate_trace_file(load_scenario(out / "scenario.toml"), trace["name"], out / "trace.parquet", trace.get("seed"))
            n_new = read_trace(out / "trace.parquet")[0].num_rows
            n_old = (trace.get("metadata") or {}).get("requests")
            trace_note = (f"regenerated from scenario.toml, trace name and seed (original file missing); {n_new} requests"
                          + ("" if n_old is None else f" (the original had {n_old}"
                             + (")" if n_old == n_new else ": NOT the same trace)")))
        scenario_entry = manifest.get("scenario") or {}
        _write_json(out / "workload.json", {
            "scenario": {"name": scenario_entry.get("name"), "sha256": scenario_entry.get("sha256"), "file": "scenario.toml",
                         "note": scenario_note},
            "trace": {"name": trace.get("name"), "seed": trace.get("seed"), "sha256": trace.get("sha256"),
                      "file": "trace.parquet" if (out / "trace.parquet").exists() else None, "note": trace_note,
                      "metadata": trace.get("metadata")},
            "regenerate": (f"loadgen trace generate scenario.toml --trace {trace.get('name')} --seed {trace.get('seed')} "
                           "--out trace.parquet") if trace.get("name") else None,
            "prompts": "not included; synthesized deterministically from the trace's token counts and prefix groups",
        })
        etoml, etoml_note = _engine_toml(engine, target.get("version"))
        if etoml is not None:
            (out / "engine.toml").write_text(etoml)
        _write_json(out / "runtime.json", {"engine": engine, "options": manifest.get("options"),
                                           "warm_state": manifest.get("warm_state"),
                                           "engine_toml": "engine.toml" if etoml else None})
        contract_dir = out / "contract"
        contract_dir.mkdir()
        case_files = _case_files(manifest)
        for path in case_files:
            shutil.copyfile(path, contract_dir / path.name)
        contract_result = run_dir / "contract.json"
        if contract_result.is_file():
            shutil.copyfile(contract_result, contract_dir / "contract_result.json")
        if not case_files:
            (contract_dir / "NONE.txt").write_text("The scenario names no behaviour cases (behavior.cases).\n")
        _write_json(out / "failure.json", {
            "verdict": analysis.verdict, "passed": analysis.passed, "failures": failures,
            "soft_failures": [_check_dict(c) for c in analysis.soft_failures],
            "memory_signals": memory, "error_share": analysis.error_share,
            "note": None if failures else "nothing failed in this run; bundled anyway so the result can be reproduced",
        })
        _write_json(out / "experiment.json", experiment)
        observed = analysis.to_dict()
        observed.pop("timeseries", None)  # per-second series are re-derivable from a rerun; keep the bundle small
        if isinstance(observed.get("server"), dict):
            observed["server"].pop("timeseries", None)
        _write_json(out / "observed.json", observed)
        shutil.copyfile(run_dir / MANIFEST_FILE, out / "manifest.json")
        options = manifest.get("options") or {}
        worksheet = manifest.get("run_kind") == "simulated" and options.get("face") == "worksheet"
        rerun = f"loadgen handoff rerun {out.name} --out rerun-run"
        if worksheet:
            rerun_note = ("Run it from the directory holding the bundle. It verifies the checksums, replays `trace.parquet` "
                          "through the simulated engine in virtual time (`engine.toml`, seed "
                          f"{options.get('seed')}, as the original run), analyses the new run and prints whether the failing "
                          "check reproduces; `--experiment` applies the proposed change first; `--target URL --model NAME` "
                          "replays against a live server instead. Equivalent by hand: `loadgen sim run trace.parquet "
                          f"--engine engine.toml --seed {options.get('seed')} --scenario scenario.toml --out rerun-run`.")
        elif etoml is not None:
            rerun_note = ("Run it from the directory holding the bundle. It verifies the checksums, starts the simulated "
                          "engine's live server from `engine.toml`, replays `trace.parquet` in real time, analyses the new "
                          "run and prints whether the failing check reproduces; `--experiment` applies the proposed change "
                          "first. Equivalent by hand: `loadgen sim serve --engine engine.toml --port 8000` and "
                          "`loadgen run trace.parquet --target http://127.0.0.1:8000 --scenario scenario.toml --out rerun-run`.")
        else:
            rerun = f"loadgen handoff rerun {out.name} --target URL --model {target.get('model') or 'MODEL'} --out rerun-run"
            rerun_note = ("Start the engine with the configuration in runtime.json on the same hardware first. The command "
                          "verifies the checksums, replays `trace.parquet` against URL, analyses the new run and prints "
                          "whether the failing check reproduces. Equivalent by hand: `loadgen run trace.parquet --target URL "
                          "--scenario scenario.toml --out rerun-run`.")
        title = (f"{failures[0]['reason']}" if failures else f"run {run_dir.name} (no budget failed)")
        (out / "README.md").write_text(_readme({
            "title": title, "built_utc": utc_now_iso(), "loadgen_version": __version__, "run_name": run_dir.name,
            "run_kind": manifest.get("run_kind"), "model_executed": manifest.get("modelExecuted"),
            "benchmark_executed": manifest.get("benchmarkExecuted"), "rerun_command": rerun, "rerun_note": rerun_note,
            "bundle_name": out.name, "failures": failures, "experiment": experiment, "scenario_note": scenario_note,
            "engine_toml": etoml_note, "contract_result": contract_result.is_file(),
            "other_runs": len(runs) if len(runs) > 1 else None,
        }))
        _check_no_secret(out, manifest)
        files = _sums(out)
    except BaseException:
        shutil.rmtree(out, ignore_errors=True)
        raise
    tarball = out.with_name(out.name + ".tar.gz")
    _write_tar(out, tarball)
    return BundleInfo(out, tarball, run_dir, failures, experiment, files)


def _write_tar(bundle_dir: Path, tarball: Path) -> None:
    """A reproducible tar.gz (sorted names, fixed mtimes/owners) with the bundle dir as its top folder."""
    import gzip

    tmp = tarball.with_name(tarball.name + ".tmp")
    with open(tmp, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as gz, \
            tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for path in sorted(bundle_dir.rglob("*")):
            if not path.is_file():
                continue
            info = tarfile.TarInfo(f"{bundle_dir.name}/{path.relative_to(bundle_dir).as_posix()}")
            info.size = path.stat().st_size
            info.mode = 0o644
            info.mtime = 0
            with open(path, "rb") as handle:
                tar.addfile(info, handle)
    os.replace(tmp, tarball)


# ------------------------------------------------------------------------------------------ verify


@dataclass
class VerifyResult:
    ok: bool
    files_checked: int
    problems: list[str]  # "FILE: what is wrong", first is the first bad file

    @property
    def first_problem(self) -> str | None:
        return self.problems[0] if self.problems else None


def _verify_entries(entries: dict[str, bytes | None], label: str, reader) -> VerifyResult:
    if SUMS_FILE not in entries:
        return VerifyResult(False, 0, [f"{SUMS_FILE}: missing from {label}"])
    sums_raw = reader(SUMS_FILE)
    expected: dict[str, str] = {}
    for n, line in enumerate(sums_raw.decode("utf-8", "replace").splitlines(), 1):
        m = re.fullmatch(r"([0-9a-f]{64}) [ *](.+)", line.strip())
        if not m:
            return VerifyResult(False, 0, [f"{SUMS_FILE}: line {n} unreadable: expected '<sha256>  <file>'"])
        expected[m.group(2)] = m.group(1)
    problems: list[str] = []
    for name in sorted(expected):
        if name not in entries:
            problems.append(f"{name}: listed in {SUMS_FILE} but missing")
            continue
        digest = hashlib.sha256(reader(name)).hexdigest()
        if digest != expected[name]:
            problems.append(f"{name}: sha256 {digest[:12]}… does not match {SUMS_FILE} ({expected[name][:12]}…)")
    for name in sorted(set(entries) - set(expected) - {SUMS_FILE}):
        problems.append(f"{name}: not listed in {SUMS_FILE}")
    return VerifyResult(not problems, len(expected), problems)


def verify_bundle(bundle: str | Path) -> VerifyResult:
    """Check every file of a bundle (directory or .tar.gz) against its SHA256SUMS; extra files are problems."""
    bundle = Path(bundle)
    if bundle.is_dir():
        names = {p.relative_to(bundle).as_posix(): None for p in bundle.rglob("*") if p.is_file()}
        return _verify_entries(names, str(bundle), lambda n: (bundle / n).read_bytes())
    if not bundle.is_file():
        raise RunDirError(f"{bundle}: no such file or directory: expected a handoff bundle (directory or .tar.gz)")
    try:
        with tarfile.open(bundle, "r:*") as tar:
            members = [m for m in tar.getmembers() if m.isfile()]
            tops = {m.name.split("/", 1)[0] for m in members}
            strip = tops.pop() + "/" if len(tops) == 1 and all("/" in m.name for m in members) else ""
            data = {m.name[len(strip):]: tar.extractfile(m).read() for m in members}  # type: ignore[union-attr]
    except (tarfile.TarError, OSError, EOFError) as exc:
        raise RunDirError(f"{bundle}: unreadable archive ({exc}): expected a handoff bundle .tar.gz") from None
    return _verify_entries(dict(data), str(bundle), lambda n: data[n])


# ------------------------------------------------------------------------------------------- rerun


@dataclass
class RerunResult:
    run_dir: Path
    reproduced: bool | None  # None: nothing had failed originally
    checks: list[dict[str, Any]]  # the original failing checks re-measured
    experiment_applied: dict[str, Any] | None


def _set_dotted(config: dict[str, Any], dotted: str, value: Any) -> None:
    parts = dotted.split(".")
    node = config
    for p in parts[:-1]:
        node = node.setdefault(p, {})
    node[parts[-1]] = value


class _SimServer:
    """``loadgen sim serve`` as a subprocess on a free port (the bundled engine config)."""

    def __init__(self, engine_path: Path) -> None:
        self.engine_path = engine_path
        self.process: subprocess.Popen[str] | None = None
        self.base_url = ""

    def __enter__(self) -> "_SimServer":
        import tempfile
        import threading

        cmd = [sys.executable, "-m", "loadgen", "sim", "serve", "--engine", str(self.engine_path),
               "--host", "127.0.0.1", "--port", "0"]
        self._stderr = tempfile.TemporaryFile()
        self.process = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=self._stderr, text=True,
                                        cwd=str(Path(__file__).resolve().parent.parent))
        assert self.process.stdout is not None
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            line = self.process.stdout.readline()
            if not line:
                break
            m = re.search(r"listening on (http://\S+)", line)
            if m:
                self.base_url = m.group(1)
                # keep draining stdout so a chatty server never blocks on a full pipe
                threading.Thread(target=self.process.stdout.read, daemon=True).start()
                return self
        self._stderr.seek(0)
        tail = self._stderr.read()[-300:].decode("utf-8", "replace")
        self.__exit__(None, None, None)
        raise RunDirError(f"{self.engine_path}: the simulated engine did not start ({' '.join(tail.split())}): "
                          "expected 'loadgen sim serve' to listen")

    def __exit__(self, *exc: Any) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if getattr(self, "_stderr", None) is not None:
            self._stderr.close()
            self._stderr = None


def rerun_bundle(bundle: str | Path, out: str | Path, *, target_url: str | None = None, model: str | None = None,
                 api_key_env: str | None = None, experiment: bool = False) -> RerunResult:
    """Verify the bundle, replay its trace (against ``target_url`` or the bundled simulated engine),
    analyse the new run and re-measure the originally failing checks."""
    import tomllib

    from .analysis import analyze_run
    from .driver import RunOptions, run_trace_sync
    from .scenario import load_scenario

    bundle = Path(bundle)
    if not bundle.is_dir():
        raise RunDirError(f"{bundle}: not a directory: expected an unpacked handoff bundle (tar xzf it first)")
    result = verify_bundle(bundle)
    if not result.ok:
        raise RunDirError(f"{bundle}: bundle does not verify: {result.first_problem}")
    failure = json.loads((bundle / "failure.json").read_text())
    proposal = json.loads((bundle / "experiment.json").read_text())
    identity = json.loads((bundle / "identity.json").read_text())
    scenario_path = bundle / "scenario.toml" if (bundle / "scenario.toml").is_file() else None
    applied = None
    out = Path(out)

    def run(url: str) -> Path:
        options = RunOptions(trace_path=bundle / "trace.parquet", target_url=url, out_dir=out,
                             model=model or (identity.get("package") or {}).get("model"),
                             scenario_path=scenario_path, api_key_env=api_key_env,
                             extra_manifest={"handoff": {"bundle": str(bundle), "experiment": applied}})
        return Path(run_trace_sync(options))

    if target_url is not None:
        if experiment:
            raise RunDirError("--experiment: applies only to the bundled simulated engine; "
                              "change the variable on the real engine and rerun with --target")
        run_dir = run(target_url)
    else:
        engine_path = bundle / "engine.toml"
        if not engine_path.is_file():
            raise RunDirError(f"{bundle}: no engine.toml (the run was not against the simulated engine): expected --target URL")
        if experiment:
            variable = str(proposal.get("variable") or "")
            config = tomllib.loads(engine_path.read_text())
            found = _find_key(config, (variable.rsplit(".", 1)[-1],)) if variable else None
            if found is None:
                raise RunDirError(f"experiment.json: variable = {variable or None!r}: not an engine setting this command can apply")
            _set_dotted(config, found[0], proposal["to"])
            exp_dir = out.parent / (out.name + ".engine")
            exp_dir.mkdir(parents=True, exist_ok=True)
            engine_path = exp_dir / "engine-experiment.toml"
            engine_path.write_text(toml_dumps(config))
            applied = {"variable": found[0], "from": found[1], "to": proposal["to"]}
        options = (json.loads((bundle / "runtime.json").read_text()).get("options") or {})
        if identity.get("run_kind") == "simulated" and options.get("face") == "worksheet":
            from .sim.worksheet import run_worksheet

            run_dir = run_worksheet(bundle / "trace.parquet", engine_path, out, seed=int(options.get("seed") or 0),
                                    scenario=scenario_path)
        else:
            with _SimServer(engine_path) as server:
                run_dir = run(server.base_url)
    analysis = analyze_run(run_dir, scenario=load_scenario(scenario_path) if scenario_path else None)
    by_key = {(c.class_name, c.metric, c.percentile): c for c in analysis.checks}
    checks = []
    for f in failure.get("failures", []):
        c = by_key.get((f.get("class"), f.get("metric"), f.get("percentile")))
        if c is None:
            checks.append({**f, "rerun_observed": None, "rerun_passed": None, "rerun_samples": None})
            continue
        obs = c.observed
        checks.append({**f, "rerun_observed": "inf" if isinstance(obs, float) and math.isinf(obs) else obs,
                       "rerun_passed": c.passed, "rerun_samples": c.n, "rerun_reason": c.reason})
    evaluated = [c for c in checks if c["rerun_passed"] is not None]
    reproduced = None if not failure.get("failures") else (any(not c["rerun_passed"] for c in evaluated) if evaluated else False)
    return RerunResult(Path(run_dir), reproduced, checks, applied)
