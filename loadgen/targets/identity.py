"""What a target is, as ``Target.describe()`` gives it: one typed model per kind of target.

A plan's ``plan.json`` and ``region.json`` carry it as ``target`` (resuming a plan compares its keys), and a run's
manifest as ``plan_target`` (with the server's pid and start count). ``TargetIdentity`` is the union, told apart
by ``kind``; each ``describe()`` builds its model, so the shape is defined here only (the two launched kinds in
``loadgen.rundir.target_identity``, below the manifest that records them). Keys a target lacks are
absent, not null (a worksheet of one engine has no ``replicas``).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from loadgen.rundir.target_identity import SimServerIdentity, VllmIdentity
from loadgen.util.resultmodel import ResultModel
from loadgen.workload.routing import RoutePolicy

__all__ = ["SimServerIdentity", "TargetIdentity", "UrlIdentity", "VllmIdentity", "WorksheetIdentity"]


class WorksheetIdentity(ResultModel):
    """The simulated engine's virtual-time worksheet (``--sim-worksheet``); a fleet plan's ``replicas-N/`` has
    ``replicas`` engines behind ``route_policy`` (absent: one engine)."""

    kind: Literal["worksheet"]
    engine: str = Field(description="the engine config's name")
    engine_sha256: str | None = Field(description="sha256 of the engine config TOML")
    engine_path: str | None = Field(description="the engine config TOML read")
    replicas: int | None = Field(None, description="engines behind the router (a count; absent: one)")
    route_policy: RoutePolicy | None = Field(None, description="how requests are spread over the replicas")


class UrlIdentity(ResultModel):
    """An OpenAI-compatible endpoint loadgen did not launch (``--target``)."""

    kind: Literal["url"]
    base_url: str = Field(description="the URL, credentials redacted")
    model: str | None = Field(description="the model name given (--model; null: none given)")
    launched_by_loadgen: Literal[False]


#: A target's identity: one of the four kinds, told apart by ``kind``.
TargetIdentity = Annotated[
    WorksheetIdentity | SimServerIdentity | VllmIdentity | UrlIdentity, Field(discriminator="kind")
]
