"""The load-plan file: which cells to run, how to step up, when to stop, and what the plan may spend.

A plan is a TOML file (see ``scenarios/plans/*.toml``). It names a scenario and one of its traces whose
rate fields are scaled (``rate_scales``) or set (``rates_rps``), the classes to cover (each class alone via
a shares override, or ``mixed`` for the scenario's own shares), warm/cold states, the client concurrency
steps (max in flight), repeats near the boundary, the stop limits and the total time/request budget.
Loading validates everything into one ``ScenarioError`` line naming file, field, value and expectation.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Literal

from pydantic import ConfigDict, Field, ValidationError, field_validator, model_validator

from loadgen.util.errors import ScenarioError
from loadgen.util.limits import (
    MAX_CONCURRENCY,
    MAX_DURATION_S,
    MAX_PARAM,
    MAX_RATE_RPS,
    MAX_SEED,
    MAX_TIMEOUT_S,
    InputModel,
)
from loadgen.util.tomlfile import read_toml
from loadgen.util.validation import format_validation_error
from loadgen.workload.routing import RoutePolicy
from loadgen.workload.scenario import class_name_problem

from ..analysis.budgets import SEND_LAG_BOUND_MS

__all__ = [
    "PlanSpec",
    "StartSpec",
    "StopLimits",
    "PlanBudget",
    "WarmupSpec",
    "ConfidenceSpec",
    "SearchSpec",
    "SearchMode",
    "SearchDimension",
    "StartMode",
    "FleetSpec",
    "load_plan",
    "parse_plan",
    "rate_ladder",
    "MIXED",
]

#: The class coordinate of a cell that keeps the scenario's own class shares.
MIXED = "mixed"


class _Model(InputModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


#: Where a rate line starts: below a worksheet's predicted boundary, or at the lowest rate step.
StartMode = Literal["auto", "lowest"]


class StartSpec(_Model):
    """Where the rate walk begins: below the capacity a worksheet predicts (``auto``) or at the lowest rate."""

    mode: StartMode = "auto"
    steps_below: int = Field(default=1, ge=0, le=1000)  # start this many rate steps below the predicted boundary
    worksheet_engine: str | None = None  # engine preset/TOML for the prediction when the target is not simulated
    model_config_path: str | None = Field(default=None, alias="model_config")  # HF config.json for the ledger

    model_config = ConfigDict(
        extra="forbid", frozen=True, populate_by_name=True, protected_namespaces=(), allow_inf_nan=False
    )


class StopLimits(_Model):
    """Declared limits: crossing one ends a direction (never "until the server crashes")."""

    send_lag_p99_ms: float = Field(default=SEND_LAG_BOUND_MS, gt=0, le=MAX_PARAM)  # measurement corruption
    error_rate_limit: float | None = Field(default=None, ge=0, le=1)  # default: the scenario's errors.error_rate_limit
    server_failure_rate: float = Field(default=0.05, ge=0, le=1)  # connect/5xx/reset share → OOM or server failure
    invalid_output_rate: float = Field(default=0.01, ge=0, le=1)  # malformed/empty/truncated share
    timeout_rate: float = Field(default=0.01, ge=0, le=1)  # timed-out share → timeout budget
    p99_spread: float = Field(
        default=0.5, gt=0, le=MAX_PARAM
    )  # (max − min) / median of p99 TTFT across repeats → unstable tail
    p99_spread_floor_ms: float = Field(
        default=50.0, ge=0, le=MAX_PARAM
    )  # ... and max − min above this (ms jitter is not instability)
    cell_timeout_s: float | None = Field(
        default=None, gt=0, le=MAX_TIMEOUT_S
    )  # wall deadline per cell; default trace duration × 3 + 30
    contract_every_cell: bool = True  # replay behaviour cases after each cell when the scenario configures them


class PlanBudget(_Model):
    """What the whole plan may spend, across resumes."""

    time_s: float = Field(default=3600.0, gt=0, le=366 * 86400)
    requests: int = Field(default=1_000_000, ge=1, le=1 << 40)


class WarmupSpec(_Model):
    """The fixed warm-up set sent before each warm cell (first requests of the cell's trace at a low rate)."""

    requests: int = Field(default=8, ge=0, le=100_000)
    rate_rps: float = Field(default=8.0, gt=0, le=MAX_RATE_RPS)


class ConfidenceSpec(_Model):
    """Inconclusive runs (a 95% interval straddles a hard limit) are extended: rerun longer at the cell's rate,
    with the estimated number of requests, until conclusive or the cell's request budget is spent."""

    extend: bool = True
    max_requests: int = Field(default=4000, ge=1)  # the most requests one (extended) run of a cell may schedule
    max_extensions: int = Field(default=3, ge=0)  # extension runs per cell repeat


#: How a line is searched: one step at a time from the start, or bracket and bisect.
SearchMode = Literal["grid", "bisect"]
#: The ladder a line searches: the rate steps of one concurrency, or the concurrency steps of one rate step.
SearchDimension = Literal["rate", "concurrency"]


class SearchSpec(_Model):
    """How each line of cells is searched for its capacity boundary.

    ``mode = "grid"`` steps one cell at a time from the start; ``"bisect"`` brackets the boundary by
    doubling the step from the start, then bisects, then repeats the boundary cells (same stop
    conditions and repeats as the grid). ``dimension = "rate"`` searches the rate steps of each
    concurrency; ``"concurrency"`` searches the concurrency steps of each rate step, from the largest
    down, for the fewest client slots that meet every hard budget (fewer queue requests in the client).
    ``precision`` (relative, e.g. 0.05) replaces the declared rate steps by a geometric ladder from the
    first to the last with that spacing: the boundary is then known to within one such step.
    """

    mode: SearchMode = "grid"
    dimension: SearchDimension = "rate"
    precision: float | None = Field(default=None, gt=0, lt=1)


class FleetSpec(_Model):
    """Fleet sizing, on the simulated engine's worksheet only: the whole plan is walked once per replica
    count (N independent engines behind ``route_policy``, in virtual time, each in ``replicas-N/``), and
    ``fleet.md`` says, per class, state, concurrency and rate step, the smallest count meeting every budget."""

    replicas: list[int] = Field(default=[1], min_length=1)  # ascending replica counts
    route_policy: RoutePolicy = "round-robin"

    @field_validator("replicas")
    @classmethod
    def _ascending(cls, value: list[int]) -> list[int]:
        if any(not 1 <= n <= 1024 for n in value) or list(value) != sorted(set(value)):
            raise ValueError("expected strictly ascending replica counts in 1..1024")
        return value

    @property
    def sizing(self) -> bool:
        """True when the plan sizes a fleet (anything but the one engine)."""
        return list(self.replicas) != [1]


class PlanSpec(_Model):
    name: str = Field(min_length=1)
    description: str = ""
    scenario: str  # path, relative to the plan file
    trace: str  # named trace of the scenario whose rates are stepped
    duration_s: float | None = Field(
        default=None, gt=0, le=MAX_DURATION_S
    )  # override the trace's duration for every cell
    seed: int | None = Field(
        default=None, ge=0, le=MAX_SEED, description="the trace's random seed (null: the scenario's)"
    )
    classes: list[str] = [MIXED]
    states: list[Literal["warm", "cold"]] = ["warm"]
    concurrency: list[int] = Field(
        default=[64], min_length=1, description="client slots: requests in flight at most (a count), ascending"
    )
    rate_scales: list[float] | None = Field(default=None, description="multiples of the trace's rate fields")
    rates_rps: list[float] | None = None  # or set the mean offered rate directly
    repeats: int = Field(default=3, ge=1, le=1000, description="runs of each cell near the boundary (a count)")
    start: StartSpec = StartSpec()
    stops: StopLimits = StopLimits()
    budget: PlanBudget = PlanBudget()
    warmup: WarmupSpec = WarmupSpec()
    confidence: ConfidenceSpec = ConfidenceSpec()
    search: SearchSpec = SearchSpec()
    fleet: FleetSpec = FleetSpec()
    # set by load_plan, not by the file
    source_path: str | None = Field(default=None, exclude=True)
    sha256: str | None = Field(default=None, exclude=True)

    @model_validator(mode="after")
    def _checks(self) -> PlanSpec:
        if (self.rate_scales is None) == (self.rates_rps is None):
            raise ValueError("expected exactly one of rate_scales or rates_rps")
        steps = self.rate_scales if self.rate_scales is not None else self.rates_rps
        field = "rate_scales" if self.rate_scales is not None else "rates_rps"
        if not steps:
            raise ValueError(f"{field}: expected at least one rate step")
        top = MAX_RATE_RPS if field == "rates_rps" else 1e6
        bad = next((v for v in steps if not 0 < v <= top), None)
        if bad is not None:
            raise ValueError(f"{field} = {bad:g}: expected every step in (0, {top:g}]")
        if list(steps) != sorted(set(steps)):
            raise ValueError(f"{field}: expected strictly ascending steps (low to burst)")
        if any(not 1 <= c <= MAX_CONCURRENCY for c in self.concurrency) or list(self.concurrency) != sorted(
            set(self.concurrency)
        ):
            raise ValueError("concurrency: expected strictly ascending steps >= 1")
        if not self.classes or len(set(self.classes)) != len(self.classes):
            raise ValueError("classes: expected a non-empty list without repeats")
        for name in self.classes:
            problem = class_name_problem(name) if name != MIXED else None
            if problem is not None:
                raise ValueError(f"classes: {name!r}: {problem}, or {MIXED!r}")
        if not self.states or len(set(self.states)) != len(self.states):
            raise ValueError("states: expected a non-empty list of 'warm'/'cold' without repeats")
        return self

    @property
    def declared_rate_steps(self) -> list[float]:
        return list(self.rate_scales if self.rate_scales is not None else self.rates_rps or [])

    @property
    def rate_steps(self) -> list[float]:
        """The rate ladder cells index into: the declared steps, or with ``search.precision`` a geometric
        ladder from the first to the last declared step whose ratio is at most 1 + precision."""
        declared = self.declared_rate_steps
        if self.search.precision is None or len(declared) < 2:
            return declared
        return rate_ladder(declared[0], declared[-1], self.search.precision)

    @property
    def rate_kind(self) -> str:
        return "scale" if self.rate_scales is not None else "rps"

    def base_dir(self) -> Path:
        return Path(self.source_path).parent if self.source_path else Path.cwd()

    def scenario_path(self) -> Path:
        path = Path(self.scenario)
        return path if path.is_absolute() else (self.base_dir() / path)


def rate_ladder(low: float, high: float, precision: float) -> list[float]:
    """Geometric steps from ``low`` to ``high`` (both kept), neighbours at most ``1 + precision`` apart
    (6 significant digits, deterministic)."""
    n = max(1, math.ceil(math.log(high / low) / math.log1p(precision) - 1e-9))
    return [float(f"{low * (high / low) ** (k / n):.6g}") for k in range(n + 1)]


def parse_plan(data: dict[str, Any], source: str = "<plan>") -> PlanSpec:
    """Validate a plan mapping; raise ScenarioError with one line on the first problem."""
    try:
        return PlanSpec.model_validate(data)
    except ValidationError as exc:
        raise ScenarioError(format_validation_error(source, exc, PlanSpec)) from None


def load_plan(path: str | Path) -> PlanSpec:
    """Read and validate a plan TOML file (its sha256 identifies the plan for resuming)."""

    path = Path(path)
    data, sha256 = read_toml(path, "a plan TOML file")
    spec = parse_plan(data, str(path))
    return spec.model_copy(update={"source_path": str(path.resolve()), "sha256": sha256})
