"""Does an engine TOML describe the deployment a measured run ran? Model, parallelism and GPU, side by side.

``sim validate --measured`` replays a run's workload on an engine; the comparison only means something when the
engine models what ran. A profiled engine names its model, its TP and EP degrees and the GPU its profile came
from; an imported run's manifest names the model, its engine arguments and (where the run logged it) the GPU.
Each difference is one line; a figure the run did not log is not compared (and says so).
"""

from __future__ import annotations

from typing import Any

from loadgen.rundir.manifest import Manifest
from loadgen.sim.config import EngineConfig

__all__ = ["deployment_unchecked", "engine_mismatches", "measured_engine_config", "not_recorded", "run_deployment"]


def measured_engine_config(manifest: Manifest) -> dict[str, Any]:
    """What an imported run's manifest records of the engine that ran (``target.engine.config``: engine_kwargs,
    kv_cache, scheduler_config, cache_config as the importer wrote them); {} when nothing."""
    return (manifest.target.engine.config if manifest.target.engine else None) or {}


def run_deployment(manifest: Manifest) -> dict[str, Any]:
    """What the measured run ran: model, tp, ep (the expert-parallel group: dp × tp with expert parallelism, else
    1) and the GPU's name; None where the run did not log it."""
    target = manifest.target
    kwargs = measured_engine_config(manifest).get("engine_kwargs") or {}
    tp = kwargs.get("tensor_parallel_size")
    dp = kwargs.get("data_parallel_size") or 1
    ep = None if tp is None else (int(dp) * int(tp) if kwargs.get("enable_expert_parallel") else 1)
    gpus = (manifest.host.gpus if manifest.host else None) or []
    gpu = next((g.get("device_name") for g in gpus if isinstance(g, dict) and g.get("device_name")), None)
    tags = (manifest.source or {}).get("cluster_hardware") or None
    return {"model": target.model or kwargs.get("model"), "tp": tp, "ep": ep, "gpu": gpu, "hardware": tags}


def _profile_hardware(path: str) -> str | None:
    """The hardware tag of a profile folder laid out as LLMServingSim writes it: <HARDWARE>/<org>/<model>/<dtype>."""
    parts = [p for p in path.replace("\\", "/").split("/") if p]
    return parts[-4] if len(parts) >= 4 else None


def _same_model(engine_model: str, run_model: str) -> bool:
    """The same model, by its Hugging Face id, or by its last part when one side drops the organisation."""
    a, b = engine_model.strip().lower(), run_model.strip().lower()
    return a == b or a.rsplit("/", 1)[-1] == b.rsplit("/", 1)[-1]


def engine_mismatches(config: EngineConfig, manifest: Manifest) -> list[str]:
    """One line per way the engine differs from the run's deployment (empty: it models what ran).

    Only a profiled engine claims a deployment (its profile's GPU, model, TP and EP); a hand-set engine's ``model``
    is the name it serves under, so it is held to nothing."""
    profile = config.cost.profile
    if profile is None:
        return []
    run = run_deployment(manifest)
    out: list[str] = []
    if config.model and run["model"] and not _same_model(config.model, str(run["model"])):
        out.append(f"model: engine {config.model!r}, run {run['model']!r}")
    if run["tp"] is not None and int(run["tp"]) != profile.tp:
        out.append(f"tensor parallel: engine tp {profile.tp}, run tp {run['tp']}")
    if run["ep"] is not None and int(run["ep"]) != profile.ep:
        out.append(f"expert parallel: engine ep {profile.ep}, run ep {run['ep']}")
    if run["gpu"] and profile.gpu.strip().lower() != str(run["gpu"]).strip().lower():
        out.append(f"GPU: engine profiled on {profile.gpu!r}, run on {run['gpu']!r}")
    elif not run["gpu"] and run["hardware"] and (tag := _profile_hardware(profile.path)):
        if tag.lower() not in {str(t).lower() for t in run["hardware"]}:
            out.append(f"GPU: engine profiled on {tag} ({profile.gpu}), run on {', '.join(run['hardware'])}")
    return out


def deployment_unchecked(config: EngineConfig) -> str | None:
    """Why nothing checks that ``config`` models a run's deployment (None for a profiled engine, which is checked):
    an engine without an operator profile names no GPU, TP or EP degree."""
    if config.cost.profile is not None:
        return None
    kind = "calibrated by sim calibrate" if config.calibrated else "a hand-set preset"
    return (
        f"engine {config.name} has no operator profile ({kind}): it names no GPU, TP or EP degree, so nothing "
        "checks that it models this run"
    )


def not_recorded(config: EngineConfig, mismatches: list[list[str]]) -> str | None:
    """Why ``sim validate --measured`` must not write a validated error into ``config``'s TOML (None: it may):
    an engine that does not model a run's deployment, or an uncalibrated preset, whose label never states one."""
    if any(mismatches):
        return "the engine does not model every run's deployment (above)"
    if config.cost.profile is None and not config.calibrated:
        return "an uncalibrated preset states no validated error (its label says so), so none is written into it"
    return None
