"""Rerunning a bundle: verify it, replay its trace (against a URL or the bundled simulated engine),
analyse the new run and re-measure the checks that failed originally."""

from __future__ import annotations

import math
import os
import tempfile
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from loadgen.util.errors import RunDirError
from loadgen.util.inputs import api_key_env_problem
from loadgen.util.jsonfile import read_json_object
from loadgen.util.outputfile import write_output_text
from loadgen.util.resultmodel import ResultModel
from loadgen.util.tomlfile import dumps_toml
from loadgen.util.validation import format_validation_error
from loadgen.workload.scenario import load_scenario

from ..analysis import Analysis, Check, analyze_run
from ..sim.worksheet import run_worksheet
from ..targets import RunRequest, SimServerTarget, StateResult, Target, UrlTarget
from . import layout
from .experiment import find_key, set_dotted
from .findings import Experiment, FailureFile
from .verify import verify_bundle

__all__ = ["RerunResult", "rerun_bundle"]


@dataclass
class RerunResult:
    run_dir: Path
    reproduced: bool | None  # None: nothing had failed originally
    checks: list[dict[str, Any]]  # the original failing checks re-measured
    experiment_applied: dict[str, Any] | None
    error_kinds: dict[str, dict[str, int]]  # "original" and "rerun": failed requests by error kind


@dataclass(frozen=True)
class _Bundle:
    """The verified bundle's files that a rerun reads."""

    path: Path
    failure: dict[str, Any]
    proposal: dict[str, Any]
    identity: dict[str, Any]
    options: dict[str, Any]  # the original run's options (runtime.json)
    scenario: Path | None
    error_kinds: dict[str, int]  # the original run's failed requests by kind (observed.json)

    @classmethod
    def open(cls, bundle: Path) -> _Bundle:
        if not bundle.is_dir():
            raise RunDirError(f"{bundle}: not a directory: expected an unpacked handoff bundle (tar xzf it first)")
        result = verify_bundle(bundle)
        if not result.ok:
            raise RunDirError(f"{bundle}: bundle does not verify: {result.first_problem}")
        scenario = bundle / layout.SCENARIO

        def read(name: str, model: type[ResultModel] | None = None) -> dict[str, Any]:
            """Summed and verified, yet any JSON: one line, never a traceback (checked against ``model``)."""
            data = read_json_object(bundle / name, f"the bundle's {name}", RunDirError)
            if model is not None:
                try:
                    model.model_validate(data)
                except ValidationError as exc:
                    where = format_validation_error(str(bundle / name), exc, model)
                    raise RunDirError(f"{where} (the bundle's {name} as loadgen handoff writes it)") from None
            return data

        options = (read(layout.RUNTIME).get("options") or {}) if (bundle / layout.RUNTIME).is_file() else {}
        if not isinstance(options, dict):
            raise RunDirError(f"{bundle / layout.RUNTIME}: options: not a JSON object: expected the run's options")
        _check_key_env(bundle, options.get("api_key_env"))
        return cls(
            bundle,
            read(layout.FAILURE, FailureFile),
            read(layout.EXPERIMENT, Experiment),
            read(layout.IDENTITY),
            options,
            scenario if scenario.is_file() else None,
            _failed_kinds(
                (read(layout.OBSERVED).get("overall") or {}).get("error_kinds")
                if (bundle / layout.OBSERVED).is_file()
                else None
            ),
        )


def _check_key_env(bundle: Path, name: object) -> None:
    """Refuse a runtime.json ``options.api_key_env`` that is no variable NAME (a key pasted there, a number), in
    one line that never shows it."""
    problem = None if name is None else api_key_env_problem(name) if isinstance(name, str) else "expected a string"
    if problem:
        raise RunDirError(f"{bundle / layout.RUNTIME}: options.api_key_env: {problem} (value not shown)")


def _key_env_set(b: _Bundle, name: str | None) -> None:
    """The original run's key variable (runtime.json), when the rerun sends a key from it, must hold one here too:
    one line naming where the NAME came from, not an ``--api-key-env`` the user did not pass. Checked where the key
    is sent (a worksheet rerun sends none)."""
    if not name or name != b.options.get("api_key_env"):
        return
    if not os.environ.get(name):
        raise RunDirError(
            f"{b.path / layout.RUNTIME}: options.api_key_env = {name!r}: variable unset or empty: expected the API "
            "key the original run sent in it (or --api-key-env NAME for another)"
        )


def _failed_kinds(kinds: dict[str, int] | None) -> dict[str, int]:
    """An analysis's failed requests by error kind, the kinds with none left out."""
    return {str(k): int(v) for k, v in (kinds or {}).items() if v}


def failed_otherwise(original: dict[str, int], rerun: dict[str, int]) -> bool:
    """True when the rerun's requests failed, and of no kind the original's did (every request refused as
    HTTP 401 where the original met 429s): a check failing again then is not the original failure."""
    return bool(rerun) and not set(rerun) & set(original)


def _apply_experiment(engine_path: Path, proposal: dict[str, Any], out: Path) -> tuple[Path, dict[str, Any]]:
    """Write the engine config with the proposed change beside ``out``; returns its path and the change."""
    variable = str(proposal.get("variable") or "")
    config = tomllib.loads(engine_path.read_text())
    found = find_key(config, (variable.rsplit(".", 1)[-1],)) if variable else None
    if found is None:
        raise RunDirError(
            f"{layout.EXPERIMENT}: variable = {variable or None!r}: not an engine setting this command can apply"
        )
    set_dotted(config, found[0], proposal["to"])
    exp_dir = out.parent / (out.name + ".engine")
    exp_dir.mkdir(parents=True, exist_ok=True)
    path = exp_dir / "engine-experiment.toml"
    write_output_text(path, dumps_toml(config, what=f"{path.name} (the proposed experiment applied)"))
    return path, {"variable": found[0], "from": found[1], "to": proposal["to"]}


def _replay(b: _Bundle, target: Target, out: Path, applied: dict[str, Any] | None) -> Path:
    """Replay the bundled trace against ``target`` into ``out``."""
    return target.run(
        RunRequest(
            b.path / layout.TRACE,
            out,
            StateResult("unknown", False),
            scenario_path=b.scenario,
            extra_manifest={"handoff": {"bundle": str(b.path), "experiment": applied}},
        )
    )


def _model(b: _Bundle, model: str | None) -> str | None:
    return model or (b.identity.get("package") or {}).get("model")


def _rerun_simulated(
    b: _Bundle, out: Path, experiment: bool, model: str | None, api_key_env: str | None
) -> tuple[Path, dict[str, Any] | None]:
    """The bundled simulated engine: in virtual time for a worksheet run, else as a live server."""
    engine_path = b.path / layout.ENGINE
    if not engine_path.is_file():
        raise RunDirError(
            f"{b.path}: no {layout.ENGINE} (the run was not against the simulated engine): expected --target URL"
        )
    applied = None
    if experiment:
        engine_path, applied = _apply_experiment(engine_path, b.proposal, out)
    if b.identity.get("run_kind") == "simulated" and b.options.get("face") == "worksheet":
        run_dir = run_worksheet(
            b.path / layout.TRACE, engine_path, out, seed=int(b.options.get("seed") or 0), scenario=b.scenario
        )
        return Path(run_dir), applied
    _key_env_set(b, api_key_env)
    with SimServerTarget(engine_path, Path(tempfile.mkdtemp(prefix="loadgen-rerun-")), api_key_env=api_key_env) as sim:
        return _replay(b, sim, out, applied), applied


def _remeasure(failures: list[dict[str, Any]], analysis: Analysis) -> list[dict[str, Any]]:
    """Each originally failing check with its value, verdict and sample count in the new run."""
    by_key: dict[tuple[Any, ...], Check] = {(c.class_name, c.metric, c.percentile): c for c in analysis.checks}
    checks = []
    for f in failures:
        c = by_key.get((f.get("class"), f.get("metric"), f.get("percentile")))
        if c is None:
            checks.append({**f, "rerun_observed": None, "rerun_passed": None, "rerun_samples": None})
            continue
        obs = c.observed
        checks.append(
            {
                **f,
                "rerun_observed": "inf" if isinstance(obs, float) and math.isinf(obs) else obs,
                "rerun_passed": c.passed,
                "rerun_samples": c.n,
                "rerun_reason": c.reason,
            }
        )
    return checks


def rerun_bundle(
    bundle: str | Path,
    out: str | Path,
    *,
    target_url: str | None = None,
    model: str | None = None,
    api_key_env: str | None = None,
    experiment: bool = False,
) -> RerunResult:
    """Verify the bundle, replay its trace (against ``target_url`` or the bundled simulated engine),
    analyse the new run and re-measure the originally failing checks."""
    b = _Bundle.open(Path(bundle))
    out = Path(out)
    if api_key_env is None and b.options.get("api_key_env"):  # the name the original run read its key from
        api_key_env = str(b.options["api_key_env"])
    applied = None
    if target_url is not None:
        if experiment:
            raise RunDirError(
                "--experiment: applies only to the bundled simulated engine; "
                "change the variable on the real engine and rerun with --target"
            )
        _key_env_set(b, api_key_env)
        with UrlTarget(target_url, _model(b, model), api_key_env) as url:
            run_dir = _replay(b, url, out, None)
    else:
        run_dir, applied = _rerun_simulated(b, out, experiment, model, api_key_env)
    analysis = analyze_run(run_dir, scenario=load_scenario(b.scenario) if b.scenario else None)
    checks = _remeasure(b.failure.get("failures", []), analysis)
    evaluated = [c for c in checks if c["rerun_passed"] is not None]
    kinds = {"original": b.error_kinds, "rerun": _failed_kinds(analysis.overall.error_kinds)}
    reproduced = (
        None
        if not b.failure.get("failures")
        else (
            any(not c["rerun_passed"] for c in evaluated) and not failed_otherwise(kinds["original"], kinds["rerun"])
            if evaluated
            else False
        )
    )
    return RerunResult(Path(run_dir), reproduced, checks, applied, kinds)
