"""Which target a command runs against, and the one way to open it.

A :class:`TargetSpec` names exactly one of: a URL loadgen did not launch, the simulated engine as a
live server (``--sim``: a preset name or an engine TOML, calibrated or not), the simulated engine in
virtual time (``--sim-worksheet``), or a vLLM loadgen launches (``--vllm``: a model directory, a
config.json or a shipped model name). :func:`open_target` turns it into a ready :class:`Target`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from loadgen.util.errors import TargetError
from loadgen.vllm import VllmConfig, make_model_dir

from ..driver.options import RunSettings
from .base import Target
from .sim import SimServerTarget, WorksheetTarget
from .url import UrlTarget
from .vllm import VllmTarget

__all__ = ["TargetSpec", "open_target"]


@dataclass(frozen=True)
class TargetSpec:
    """Exactly one target: ``url``, ``sim``, ``worksheet`` or ``vllm`` (see the module docstring)."""

    url: str | None = None
    sim: str | None = None
    worksheet: str | None = None
    vllm: str | None = None
    model: str | None = None
    vllm_args: tuple[str, ...] = field(default_factory=tuple)
    api_key_env: str | None = None
    workers: int = 1  # >1: every measured run spread over this many worker processes (live targets)

    def __post_init__(self) -> None:
        chosen = [
            flag
            for flag, value in (
                ("--target", self.url),
                ("--sim", self.sim),
                ("--sim-worksheet", self.worksheet),
                ("--vllm", self.vllm),
            )
            if value
        ]
        if len(chosen) != 1:
            raise TargetError(
                f"target: got {', '.join(chosen) or 'no target'}: expected exactly one of --target URL, "
                "--sim ENGINE, --sim-worksheet ENGINE, --vllm MODEL"
            )

    @property
    def kind(self) -> str:
        return "url" if self.url else "sim" if self.sim else "worksheet" if self.worksheet else "vllm"


def open_target(spec: TargetSpec, work_dir: Path) -> Target:
    """Launch (or point at) the target; the caller closes it (``with open_target(...) as target:``)."""
    work_dir = Path(work_dir)
    if spec.worksheet:
        if spec.workers > 1:
            raise TargetError(
                f"--workers {spec.workers} with --sim-worksheet: the worksheet runs in virtual time, in one process: "
                "expected --workers with a live target (--target, --sim, --vllm)"
            )
        return WorksheetTarget(spec.worksheet)
    target = _open_live(spec, work_dir)
    if spec.workers > 1:
        target.run_defaults = RunSettings(workers=spec.workers)
    return target


def _open_live(spec: TargetSpec, work_dir: Path) -> Target:
    if spec.sim:
        return SimServerTarget(spec.sim, work_dir, api_key_env=spec.api_key_env)
    if spec.vllm:
        model_dir = Path(spec.vllm)
        if not model_dir.is_dir():
            model_dir = make_model_dir(spec.vllm, work_dir / "model")
        config = VllmConfig(model_dir=model_dir, served_model_name=spec.model, extra_args=list(spec.vllm_args))
        return VllmTarget(config, work_dir / "vllm-logs", model=spec.model)
    return UrlTarget(str(spec.url), spec.model, spec.api_key_env)
