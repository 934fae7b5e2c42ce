"""The target interface: what every kind of target offers a run, a plan, a practice or a bench.

A target is "something a trace can be replayed against": the virtual-time worksheet, a simulated
engine loadgen launched on loopback, a real vLLM loadgen launched, or any URL it did not launch.
Each one can be brought to a known state (``prepare``: warm = a fixed warm-up set, cold = a fresh
process where the target can be restarted), measured (``run``: one run directory), checked
(``check_alive``), brought back after a failure (``recover``) and torn down (``close``).
"""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Literal, Self

from pydantic import Field

from loadgen.util.resultmodel import ResultModel

from ..driver.options import RunSettings

__all__ = ["RunRequest", "StateResult", "Target", "WarmStateResult", "run_salt"]


class WarmStateResult(ResultModel):
    """The state a target was in when a measured run started, and what was done to reach it (a run's
    manifest ``warm_state``; a plan cell's first run). A run started outside a plan or practice
    (``loadgen run``, ``sim run``) has ``requested``, ``achieved``, ``reason`` and ``method`` null."""

    state: Literal["warm", "cold", "unknown"] = Field(
        description="unknown: no state requested, or the requested one not reached"
    )
    requested: str | None = Field(description="warm or cold")
    achieved: bool | None
    actions: list[str] = Field(description="what was done to reach it (warm-up sent, server restarted ...)")
    reason: str | None = Field(description="why the requested state was not achievable")
    method: str | None = Field(
        None,
        description="how a cold state was reached: restart or prefix_cache_reset (absent: recorded before "
        "loadgen named it, 2026-12-01)",
    )


@dataclass
class StateResult:
    """What was done to reach a requested warm/cold state, and whether it was reached."""

    requested: str
    achieved: bool
    actions: list[str] = field(default_factory=list)
    reason: str | None = None  # why not achievable
    method: str | None = None  # how a cold state was reached: "restart" | "prefix_cache_reset" (None: warm / unknown)

    @property
    def label(self) -> Literal["warm", "cold", "unknown"]:
        """The state the run is recorded in: the requested one when reached, else unknown."""
        if self.achieved and self.requested == "warm":
            return "warm"
        if self.achieved and self.requested == "cold":
            return "cold"
        return "unknown"

    def manifest_extra(self) -> dict[str, Any]:
        """What the driver's own ``warm_state`` (state, actions) lacks: requested, achieved, reason, method."""
        return {
            "warm_state": {
                "requested": self.requested,
                "achieved": self.achieved,
                "reason": self.reason,
                "method": self.method,
            }
        }

    def to_dict(self) -> dict[str, Any]:
        """The manifest's ``warm_state`` section."""
        return WarmStateResult(
            state=self.label,
            requested=self.requested,
            achieved=self.achieved,
            actions=list(self.actions),
            reason=self.reason,
            method=self.method,
        ).document()


#: Differs from process to process, so a target measured again (a resumed plan, another validation) gets
#: new prompts too; each run's manifest records its salt (``driver.prompt_salt``), which reproduces them.
_SESSION = secrets.token_hex(4)


def run_salt(out_dir: Path) -> str:
    """The prompt salt of the measured run written to ``out_dir``: the last parts of its path (a plan's
    ``cells/<cell>/rep1``; their sha256 when that is long) and this process's token."""
    where = "/".join(Path(out_dir).parts[-3:])
    if len(where) > 120:
        where = hashlib.sha256(where.encode()).hexdigest()[:16]
    return f"{where}/{_SESSION}"


@dataclass
class RunRequest:
    """One measured run a target is asked for: the trace, where to write, the state reached, and labels."""

    trace_path: Path
    out_dir: Path
    state: StateResult
    scenario_path: Path | None = None
    order_index: int | None = None  # position in a plan's run order
    repeat: int | None = None
    plan_cell: dict[str, Any] | None = None
    deadline_s: float | None = None  # stop after this long; unsent requests become not_sent
    seed: int = 0  # the worksheet's noise seed
    extra_manifest: dict[str, Any] = field(default_factory=dict)  # sections the caller adds (practice, handoff)
    settings: RunSettings | None = None  # any other driver options (endpoint, ...)

    def driver_labels(self) -> RunSettings:
        """The driver options that label the run (order index, repeat, plan cell, deadline), then ``settings``."""
        labels = RunSettings(
            order_index=self.order_index, repeat=self.repeat, plan_cell=self.plan_cell, deadline_s=self.deadline_s
        )
        return labels.over(self.settings)


class Target:
    """Interface of every target kind (see the module docstring); a context manager that closes it."""

    kind = "abstract"
    #: True when a run's wall time is the trace duration (live); False for virtual time.
    real_time = True
    #: Driver options every measured run of this target gets (``workers``); a request's own options win.
    run_defaults: RunSettings | None = None

    def driver_options(self, request: RunRequest) -> RunSettings:
        """The driver options of one measured run: the target's defaults, then the request's labels. Unless
        given, each run's prompts are salted with its own ``prompt_salt``, so no earlier run on this target (a
        warm-up of the same requests, another cell, a repeat) left its prompts in the server's prefix cache."""
        return RunSettings(prompt_salt=run_salt(request.out_dir)).over(self.run_defaults).over(request.driver_labels())

    def describe(self) -> dict[str, Any]:
        """Identity of the target for the manifest's ``plan_target`` section and plan files."""
        raise NotImplementedError

    @property
    def url(self) -> str | None:
        """Live base URL (for contract replay), None when there is none."""
        return None

    @property
    def model(self) -> str | None:
        return None

    def prepare(self, state: str, warmup_trace: Path | None, work_dir: Path, scenario_path: Path | None) -> StateResult:
        """Bring the target to ``state`` (warm | cold) before a measured run."""
        raise NotImplementedError

    def run(self, request: RunRequest) -> Path:
        """One measured run of ``request.trace_path`` into ``request.out_dir``; returns the run directory."""
        raise NotImplementedError

    def check_alive(self) -> str | None:
        """None when the target still answers, else one line saying what failed."""
        return None

    def recover(self) -> list[str]:
        """Bring the target back after a server failure; returns the actions taken."""
        return []

    def close(self) -> None:
        pass

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
