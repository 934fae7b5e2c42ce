"""The identity of a target loadgen launched (the simulated engine's server, a vLLM server), and a run manifest's
``plan_target``: that identity with the server process the run measured.

Defined here, below the manifest that records them (``Manifest.plan_target``); ``loadgen.targets.identity`` holds
the union of every kind of target (``TargetIdentity``) and re-exports these two.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from loadgen.util.resultmodel import ResultModel

__all__ = ["PlanTarget", "SimServerIdentity", "SimServerPlanTarget", "VllmIdentity", "VllmPlanTarget"]


class SimServerIdentity(ResultModel):
    """The simulated engine as a live server loadgen launched (``--sim``)."""

    kind: Literal["sim"]
    engine: str = Field(description="the engine config's name")
    engine_sha256: str | None = Field(description="sha256 of the engine config TOML")
    engine_path: str | None = Field(description="the engine config TOML read")
    launched_by_loadgen: Literal[True]


class VllmIdentity(ResultModel):
    """A vLLM server loadgen launched (``--vllm``); ``engine_sha256`` hashes its arguments."""

    kind: Literal["vllm"]
    engine: str = Field(description="vllm:<model directory name>")
    engine_sha256: str = Field(description="sha256 of the JSON of args")
    args: list[str] = Field(description="the server's command line without --port (it changes at every start)")
    launched_by_loadgen: Literal[True]


_SERVER_PID = "the server's process id when the run started (null: not running)"
_SERVER_STARTS = "times loadgen started the server so far (a count; a cold cell restarts it)"


class SimServerPlanTarget(SimServerIdentity):
    """A run manifest's ``plan_target`` of a launched simulated engine: its identity and which server process."""

    server_pid: int | None = Field(description=_SERVER_PID)
    server_starts: int = Field(description=_SERVER_STARTS)


class VllmPlanTarget(VllmIdentity):
    """A run manifest's ``plan_target`` of a launched vLLM server: its identity and which server process."""

    server_pid: int | None = Field(description=_SERVER_PID)
    server_starts: int = Field(description=_SERVER_STARTS)


#: A run manifest's ``plan_target``: written by the targets loadgen launches (sim, vllm), told apart by ``kind``.
PlanTarget = Annotated[SimServerPlanTarget | VllmPlanTarget, Field(discriminator="kind")]
