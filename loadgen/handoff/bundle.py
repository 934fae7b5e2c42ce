"""Building a bundle: pick the run to hand off, gather what reproduces it, write the files and the tar.gz.

The run handed off is the first with a failed hard budget or a memory signal (KV cache saturation,
preemptions, an engine OOM), else the first run found. Originals (scenario, engine config, trace) are
copied when they are still there unchanged, else rebuilt from the run's manifest.
"""

from __future__ import annotations

import errno
import json
import math
import os
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow.compute as pc

from loadgen.rundir.identity import sha256_file, utc_now_iso
from loadgen.rundir.io import has_run, read_run_manifest, read_run_table
from loadgen.rundir.manifest import Manifest, ScenarioRef
from loadgen.rundir.schema import MANIFEST_FILE, REQUESTS_FILE, SERVER_METRICS_FILE
from loadgen.util.errors import RunDirError
from loadgen.util.outputfile import make_output_dir
from loadgen.util.redact import redact_url
from loadgen.util.resultmodel import ResultModel
from loadgen.util.tomlfile import dumps_toml
from loadgen.workload.scenario import class_order, load_scenario, scenario_from_manifest

from .. import __version__
from ..analysis import Analysis, Check, analyze_run
from ..contract import CONTRACT_FILE
from ..plan.files import PLAN_FILE, REGION_FILE, read_plan_state, read_region
from ..sim.config import PRESETS_DIR
from ..trace.generate import generate_trace_file
from ..trace.io import read_trace
from . import layout
from .experiment import inner_engine_config, propose_experiment
from .findings import Experiment, FailureFile
from .observed_file import ObservedAnalysis
from .readme import ReadmeFacts, readme_text, rerun_instructions
from .verify import write_sums, write_tar
from .workload_file import WorkloadFile

__all__ = ["BundleInfo", "build_bundle", "find_run_dirs"]


@dataclass
class BundleInfo:
    bundle_dir: Path
    tarball: Path
    run_dir: Path
    failures: list[dict[str, Any]]
    experiment: dict[str, Any]
    files: list[str] = field(default_factory=list)


# ------------------------------------------------------------------------------------------ finding


def find_run_dirs(path: str | Path) -> list[Path]:
    """Run directories at or under ``path`` (a run dir, or a plan dir holding run dirs), sorted."""
    path = Path(path)
    if not path.exists():
        raise RunDirError(f"{path}: no such directory: expected a run or plan directory")
    if has_run(path):
        return [path]
    found = sorted({p.parent for p in path.rglob(REQUESTS_FILE) if has_run(p.parent)})
    if not found:
        raise RunDirError(
            f"{path}: no run directory ({MANIFEST_FILE} + {REQUESTS_FILE}) at or under it: "
            "expected a run or plan directory"
        )
    return found


def _metric_sample_counts(run_dir: Path) -> dict[str, int]:
    """Samples per server metric name (the sample count behind a memory signal)."""
    table = read_run_table(run_dir, SERVER_METRICS_FILE, ["name"])
    if table is None:
        return {}
    counts = pc.value_counts(table.column("name")).to_pylist()
    return {c["values"]: int(c["counts"]) for c in counts}


def _memory_signals(manifest: Manifest, analysis: Analysis, run_dir: Path | None = None) -> list[dict[str, Any]]:
    """Memory evidence a run holds: KV cache saturation, preemptions, OOM notes from the engine."""
    signals: list[dict[str, Any]] = []
    server = getattr(analysis, "server", None) or {}
    counts = _metric_sample_counts(run_dir) if run_dir is not None and server else {}
    kv = server.get("kv_cache_usage") if isinstance(server, dict) else None
    pre = server.get("preemptions") if isinstance(server, dict) else None
    if kv and kv.get("peak") is not None and kv["peak"] >= 0.99:
        signals.append(
            {
                "signal": "kv_cache_saturated",
                "metric": kv.get("metric"),
                "observed": kv["peak"],
                "limit": 0.99,
                "samples": counts.get(kv.get("metric")),
                "reason": f"KV cache usage peaked at {kv['peak']:.1%} ({kv.get('metric')})",
            }
        )
    if pre and (pre.get("increase") or 0) > 0:
        signals.append(
            {
                "signal": "preemptions",
                "metric": pre.get("metric"),
                "observed": pre["increase"],
                "limit": 0,
                "samples": counts.get(pre.get("metric")),
                "reason": f"{pre['increase']:g} preemptions during the run ({pre.get('metric')})",
            }
        )
    notes = json.dumps(manifest.engine_notes.model_dump(mode="json")).lower()
    if "out of memory" in notes or "oom" in re.findall(r"[a-z]+", notes):
        signals.append(
            {
                "signal": "engine_oom",
                "observed": None,
                "limit": None,
                "samples": None,
                "reason": "the engine reported running out of memory (manifest engine_notes)",
            }
        )
    return signals


@dataclass(frozen=True)
class _Source:
    """The run handed off, what was found about it, and every run the source held."""

    run_dir: Path
    manifest: Manifest
    analysis: Analysis
    memory: list[dict[str, Any]]
    runs: list[Path]


def _check_plan_files(path: Path) -> None:
    """A plan directory's plan.json and region.json (when there is one) read as ``loadgen compare`` reads them:
    a damaged one is one PlanError line before anything is bundled."""
    if (path / PLAN_FILE).exists():
        read_plan_state(path / PLAN_FILE)
    if (path / REGION_FILE).exists():
        read_region(path)


def _select(path: Path) -> _Source:
    """The run to hand off: the first with a failed hard budget (or memory signal), else the first."""
    runs = find_run_dirs(path)
    if runs != [path]:
        _check_plan_files(path)
    first: _Source | None = None
    for run_dir in runs:
        analysis = analyze_run(run_dir)
        manifest = read_run_manifest(run_dir)
        source = _Source(run_dir, manifest, analysis, _memory_signals(manifest, analysis, run_dir), runs)
        if first is None:
            first = source
        if analysis.hard_failures or source.memory:
            return source
    assert first is not None
    return first


def _check_dict(check: Check) -> dict[str, Any]:
    d = check.to_dict()
    obs = d.get("observed")
    if isinstance(obs, float) and math.isinf(obs):
        d["observed"] = "inf"
    return {
        "class": d.get("class"),
        "metric": d.get("metric"),
        "percentile": d.get("percentile"),
        "limit": d.get("limit"),
        "observed": d.get("observed"),
        "samples": d.get("n"),
        "failures_as_inf": d.get("failures_as_inf", 0),
        "hard": d.get("hard"),
        "reason": d.get("reason"),
    }


def _failures(analysis: Analysis, memory: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Failed hard budgets and memory signals, TTFT and memory first: those are what the handoff is for."""
    failures = [_check_dict(c) for c in analysis.hard_failures]
    for m in memory:
        failures.append(
            {
                "class": "overall",
                "metric": m["signal"],
                "percentile": None,
                "limit": m.get("limit"),
                "observed": m.get("observed"),
                "samples": m.get("samples"),
                "hard": True,
                "reason": m["reason"],
            }
        )
    order = {"ttft_ms": 0, "kv_cache_saturated": 1, "preemptions": 1, "engine_oom": 1}
    failures.sort(key=lambda f: (order.get(f["metric"], 2), 0 if f.get("percentile") == "p99" else 1))
    return failures


# ---------------------------------------------------------------------------- originals or rebuilt


def _scenario_text(manifest: Manifest) -> tuple[str | None, str]:
    """The scenario file's bytes when the original is still there unchanged, else rebuilt from the manifest."""
    entry = manifest.scenario or ScenarioRef()
    path, sha = entry.path, entry.sha256
    if path and Path(path).is_file() and sha and sha256_file(Path(path)) == sha:
        return Path(path).read_text(), "original file (sha256 matches the run's manifest)"
    content = entry.content
    if not content:
        return None, "the run recorded no scenario"
    # manifest JSON has sorted keys, which loses the order of [classes]; the trace generator draws them in
    # class_order (not file order), and the rebuilt file lists them in that order too
    content = dict(content)
    classes = content.get("classes") or {}
    content["classes"] = {n: classes[n] for n in class_order(classes)}
    return (
        "# Rebuilt by loadgen handoff from the run manifest's validated scenario content\n"
        + dumps_toml(content, what="scenario rebuilt from the run manifest")
    ), (
        "rebuilt from the manifest (original file missing or changed); classes are "
        "written in the order the trace generator draws them (canonical names first, then by name), "
        "because the manifest does not keep the file's order"
    )


def _engine(manifest: Manifest) -> dict[str, Any] | None:
    """The manifest's ``target.engine`` section as recorded."""
    return manifest.target.engine.model_dump(mode="json") if manifest.target.engine else None


def _engine_toml(engine: dict[str, Any] | None, version_body: Any = None) -> tuple[str | None, str | None]:
    """The simulated engine's config file (original when unchanged, else rebuilt), when known."""
    if not isinstance(engine, dict):
        engine = {}
    metas = [engine] + ([engine["config"]] if isinstance(engine.get("config"), dict) else [])
    for meta in metas:
        path, sha = meta.get("path"), meta.get("sha256")
        if isinstance(path, str) and Path(path).is_file() and sha and sha256_file(Path(path)) == sha:
            return Path(path).read_text(), "original file"
    config = inner_engine_config(engine)
    if isinstance(config, dict) and config.get("name") and "scheduler" in config:
        return (
            "# Rebuilt by loadgen handoff from the run manifest's engine config\n"
            + dumps_toml(config, what="engine config rebuilt from the run manifest"),
            "rebuilt from the manifest",
        )
    version = version_body if isinstance(version_body, dict) else {}
    name = version.get("engine_config") if version.get("engine") == "loadgen-sim" else None
    if isinstance(name, str) and re.fullmatch(r"[A-Za-z0-9._-]+", name):
        preset = PRESETS_DIR / f"{name}.toml"
        if preset.is_file():
            return preset.read_text(), (
                f"the shipped preset of that name: the live server reported engine_config = "
                f"{name!r} but not its content, so a locally modified config would not show here"
            )
    return None, None


def _case_files(manifest: Manifest) -> list[Path]:
    try:
        scenario = scenario_from_manifest(manifest)
    except Exception:
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


# ----------------------------------------------------------------------------------------- writing


def _write_json(path: Path, data: Any) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=True, default=str) + "\n")


def _write_model(path: Path, model: type[ResultModel], data: dict[str, Any]) -> None:
    """Write ``data`` through its model: a key the model does not declare, or a wrong type, is a bug."""
    _write_json(path, model.from_document(data).document())


def _identity(manifest: Manifest, run_dir: Path) -> dict[str, Any]:
    m = manifest.to_dict()  # the sections as recorded (on-disk key names)
    target = m["target"]
    return {
        "kind": layout.BUNDLE_KIND,
        "version": 1,
        "built_utc": utc_now_iso(),
        "package": {"model": target["model"], "served_models": target["served_models"]},
        "engine": target["engine"],
        "target_kind": target["kind"],
        "target_base_url": redact_url(target["base_url"]) if isinstance(target["base_url"], str) else None,
        "target_version": target["version"],
        "hardware": m["host"],
        "harness": m["harness"],
        "run_kind": m["run_kind"],
        "modelExecuted": m["modelExecuted"],
        "benchmarkExecuted": m["benchmarkExecuted"],
        "warm_state": m["warm_state"],
        "behavior_relevant": m["behavior_relevant"],
        "engine_notes": m["engine_notes"],
        "source_run": {
            "path": str(run_dir),
            "started_utc": m["started_utc"],
            "order_index": m["order_index"],
            "repeat": m["repeat"],
            "plan_cell": m["plan_cell"],
        },
    }


def _write_trace(out: Path, trace: dict[str, Any], have_scenario: bool) -> str:
    """Copy the trace, or regenerate it from the bundled scenario, name and seed; returns how it was obtained."""
    trace_src = Path(trace["path"]) if trace.get("path") else None
    dest = out / layout.TRACE
    if trace_src is not None and trace_src.is_file():
        shutil.copyfile(trace_src, dest)
        got = sha256_file(dest)
        return (
            "copied; sha256 matches the manifest"
            if got == trace.get("sha256")
            else f"copied; sha256 {got[:12]} differs from the manifest's {str(trace.get('sha256'))[:12]}"
        )
    if have_scenario and trace.get("name"):
        generate_trace_file(load_scenario(out / layout.SCENARIO), trace["name"], dest, trace.get("seed"))
        n_new = read_trace(dest)[0].num_rows
        n_old = (trace.get("metadata") or {}).get("requests")
        return f"regenerated from scenario.toml, trace name and seed (original file missing); {n_new} requests" + (
            ""
            if n_old is None
            else f" (the original had {n_old}" + (")" if n_old == n_new else ": NOT the same trace)")
        )
    return "not available"


def _write_workload(out: Path, manifest: Manifest) -> str:
    """scenario.toml, trace.parquet and workload.json; returns how the scenario was obtained."""
    trace = manifest.trace.model_dump(mode="json") if manifest.trace else {}
    scenario_text, scenario_note = _scenario_text(manifest)
    if scenario_text is not None:
        (out / layout.SCENARIO).write_text(scenario_text)
    trace_note = _write_trace(out, trace, scenario_text is not None)
    scenario_entry = manifest.scenario or ScenarioRef()
    _write_model(
        out / layout.WORKLOAD,
        WorkloadFile,
        {
            "scenario": {
                "name": scenario_entry.name,
                "sha256": scenario_entry.sha256,
                "file": layout.SCENARIO,
                "note": scenario_note,
            },
            "trace": {
                "name": trace.get("name"),
                "seed": trace.get("seed"),
                "sha256": trace.get("sha256"),
                "file": layout.TRACE if (out / layout.TRACE).exists() else None,
                "note": trace_note,
                "metadata": trace.get("metadata"),
            },
            "regenerate": (
                f"loadgen trace generate scenario.toml --trace {trace.get('name')} --seed {trace.get('seed')} "
                "--out trace.parquet"
            )
            if trace.get("name")
            else None,
            "prompts": "not included; synthesized deterministically from the trace's token counts and prefix groups",
        },
    )
    return scenario_note


def _redacted_options(options: dict[str, Any]) -> dict[str, Any]:
    """The run options with their URLs redacted again (a run recorded before every query value was redacted
    keeps them in its manifest; the bundle does not pass them on)."""
    out = dict(options)
    if isinstance(out.get("target_url"), str):
        out["target_url"] = redact_url(out["target_url"])
    if isinstance(out.get("replica_urls"), list):
        out["replica_urls"] = [redact_url(u) if isinstance(u, str) else None for u in out["replica_urls"]]
    return out


def _write_runtime(out: Path, manifest: Manifest) -> str | None:
    """engine.toml (when known) and runtime.json; returns how engine.toml was obtained, None without one."""
    engine = _engine(manifest)
    etoml, etoml_note = _engine_toml(engine, manifest.target.version)
    if etoml is not None:
        (out / layout.ENGINE).write_text(etoml)
    _write_json(
        out / layout.RUNTIME,
        {
            "engine": engine,
            "options": _redacted_options(manifest.options),
            "warm_state": manifest.warm_state.model_dump(mode="json"),
            "engine_toml": layout.ENGINE if etoml else None,
        },
    )
    return etoml_note if etoml is not None else None


def _write_contract(out: Path, manifest: Manifest, run_dir: Path) -> bool:
    """contract/: the scenario's behaviour case files and the run's contract result; True when it had one."""
    contract_dir = out / layout.CONTRACT_DIR
    contract_dir.mkdir()
    case_files = _case_files(manifest)
    for path in case_files:
        shutil.copyfile(path, contract_dir / path.name)
    contract_result = run_dir / CONTRACT_FILE
    if contract_result.is_file():
        shutil.copyfile(contract_result, contract_dir / layout.CONTRACT_RESULT)
    if not case_files:
        (contract_dir / layout.NO_CASES).write_text("The scenario names no behaviour cases (behavior.cases).\n")
    return contract_result.is_file()


def _write_findings(
    out: Path,
    analysis: Analysis,
    failures: list[dict[str, Any]],
    memory: list[dict[str, Any]],
    experiment: dict[str, Any],
) -> None:
    """failure.json, experiment.json and observed.json."""
    _write_model(
        out / layout.FAILURE,
        FailureFile,
        {
            "verdict": analysis.verdict,
            "passed": analysis.passed,
            "failures": failures,
            "soft_failures": [_check_dict(c) for c in analysis.soft_failures],
            "memory_signals": memory,
            "error_share": analysis.error_share,
            "note": None if failures else "nothing failed in this run; bundled anyway so the result can be reproduced",
        },
    )
    _write_model(out / layout.EXPERIMENT, Experiment, experiment)
    observed = analysis.to_dict()
    observed.pop("timeseries", None)  # per-second series are re-derivable from a rerun; keep the bundle small
    if isinstance(observed.get("server"), dict):
        observed["server"].pop("timeseries", None)
    _write_model(out / layout.OBSERVED, ObservedAnalysis, observed)


def _check_no_secret(bundle_dir: Path, manifest: Manifest) -> None:
    """Refuse (and delete) the bundle when a file holds the API key named by the run's ``api_key_env``.

    The run recorded only the variable's name; its value is looked up in this process's environment, so
    the check covers a key echoed back by the server (e.g. in the ``/version`` body) into the manifest.
    """
    name = manifest.options.get("api_key_env")
    secret = os.environ.get(name) if name else None
    if not secret or len(secret) < 4:
        return
    needles = {
        secret.encode(),
        json.dumps(secret)[1:-1].encode(),
        json.dumps(secret, ensure_ascii=False)[1:-1].encode(),
    }
    for p in bundle_dir.rglob("*"):
        if p.is_file() and any(needle in p.read_bytes() for needle in needles):
            shutil.rmtree(bundle_dir, ignore_errors=True)
            raise RunDirError(f"{p.name}: would contain the value of ${name}: refusing to write a bundle with a secret")


# ------------------------------------------------------------------------------------------- build


#: The errors of a destination without room (full disk, quota, file size limit, read-only).
_NO_ROOM = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS)


def _bundle_dir(out: str | Path) -> Path:
    out = Path(out)
    if out.name.endswith(".tar.gz"):
        out = out.with_name(out.name[: -len(".tar.gz")])
    if out.is_dir() and any(out.iterdir()):
        raise RunDirError(f"{out}: exists and is not empty: expected a new bundle directory")
    return out


def _write_files(out: Path, src: _Source, failures: list[dict[str, Any]], experiment: dict[str, Any]) -> None:
    """Every file of the bundle but SHA256SUMS."""
    manifest, run_dir = src.manifest, src.run_dir
    _write_json(out / layout.IDENTITY, _identity(manifest, run_dir))
    scenario_note = _write_workload(out, manifest)
    engine_note = _write_runtime(out, manifest)
    contract_result = _write_contract(out, manifest, run_dir)
    _write_findings(out, src.analysis, failures, src.memory, experiment)
    shutil.copyfile(run_dir / MANIFEST_FILE, out / layout.MANIFEST)
    rerun, rerun_note = rerun_instructions(out.name, manifest, manifest.target.model, engine_note is not None)
    (out / layout.README).write_text(
        readme_text(
            ReadmeFacts(
                title=f"{failures[0]['reason']}" if failures else f"run {run_dir.name} (no budget failed)",
                built_utc=utc_now_iso(),
                loadgen_version=__version__,
                run_name=run_dir.name,
                run_kind=manifest.run_kind,
                model_executed=manifest.model_executed,
                benchmark_executed=manifest.benchmark_executed,
                rerun_command=rerun,
                rerun_note=rerun_note,
                bundle_name=out.name,
                failures=failures,
                experiment=experiment,
                scenario_note=scenario_note,
                engine_toml=engine_note,
                contract_result=contract_result,
                other_runs=len(src.runs) if len(src.runs) > 1 else None,
            )
        )
    )
    _check_no_secret(out, manifest)


def build_bundle(source: str | Path, out: str | Path) -> BundleInfo:
    """Build the handoff bundle directory ``out`` and ``out.tar.gz`` from a run or plan directory."""
    out = _bundle_dir(out)
    src = _select(Path(source))
    failures = _failures(src.analysis, src.memory)
    experiment = propose_experiment(
        failures,
        inner_engine_config(_engine(src.manifest)),
        src.manifest.trace.name if src.manifest.trace else None,
        src.analysis.overall.error_kinds,
    )
    make_output_dir(out, "a new bundle directory", RunDirError)
    tarball = out.with_name(out.name + ".tar.gz")
    try:  # whole or nothing: a bundle cut short (a full disk) leaves neither folder nor tarball
        _write_files(out, src, failures, experiment)
        files = write_sums(out)
        write_tar(out, tarball)
    except BaseException as exc:
        shutil.rmtree(out, ignore_errors=True)
        if isinstance(exc, OSError) and exc.errno in _NO_ROOM:  # shutil names the source file: the bundle it is
            raise RunDirError(f"{out}: cannot write the handoff bundle: {exc.strerror}; nothing was kept") from None
        raise
    return BundleInfo(out, tarball, src.run_dir, failures, experiment, files)
