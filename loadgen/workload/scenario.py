"""Scenario schema and validation: the user's request classes, arrivals, budgets, cache/privacy, errors.

A scenario is a TOML file (see ``scenarios/canonical.toml``). It names request classes with token
distributions, shares, streaming and budgets, and named traces (arrival settings). Loading validates
everything and turns any problem into one ``ScenarioError`` line: ``file: field = value: expected ...``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field, ValidationError, model_validator

from loadgen.rundir.manifest import Manifest, ScenarioRef
from loadgen.util.errors import ScenarioError
from loadgen.util.limits import (
    MAX_CONCURRENCY,
    MAX_DURATION_S,
    MAX_PARAM,
    MAX_RATE_RPS,
    MAX_SEED,
    MAX_TIMEOUT_S,
    MAX_TOKENS,
    MAX_TRACE_REQUESTS,
    MAX_TURNS,
    InputModel,
)
from loadgen.util.tomlfile import read_toml
from loadgen.util.validation import format_validation_error

__all__ = [
    "CLASS_NAMES",
    "CLASS_NAME_RULE",
    "RESERVED_CLASS_NAMES",
    "class_name_problem",
    "class_order",
    "Distribution",
    "Mixture",
    "Budget",
    "Budgets",
    "RequestClass",
    "TraceSettings",
    "PrefixGroup",
    "Scenario",
    "load_scenario",
    "parse_scenario",
    "format_validation_error",
    "scenario_manifest",
    "scenario_from_manifest",
]

#: The canonical scenario's three request classes (the seed's). A scenario names its own classes, any number
#: from one, each following ``CLASS_NAME_RULE``; these come first in ``class_order``.
CLASS_NAMES = ("short-message", "long-thread", "burst")

#: A class name is a file name and an HTML word as it stands: a lower-case letter or digit, then up to 63
#: lower-case letters, digits, ``-`` or ``_`` (no dots, slashes, spaces or upper case, which a case-blind
#: file system would merge).
CLASS_NAME_RULE = re.compile(r"[a-z0-9][a-z0-9_-]{0,63}")
#: Words the reports and routes already use for something else (the all-classes group, plans' mixed cells,
#: ``compare --route``).
RESERVED_CLASS_NAMES = ("overall", "mixed", "all", "interactive")


def class_name_problem(name: object) -> str | None:
    """What is wrong with a class name (None when it is fine): the ``expected ...`` half of a one-line error."""
    if not isinstance(name, str) or not CLASS_NAME_RULE.fullmatch(name):
        return "expected a class name of 1-64 lower-case letters, digits, '-' or '_', starting with a letter or digit"
    if name in RESERVED_CLASS_NAMES:
        return f"expected a class name other than {', '.join(repr(n) for n in RESERVED_CLASS_NAMES)} (reserved)"
    return None


def class_order(names: Iterable[str]) -> list[str]:
    """The one order classes are drawn and listed in: the canonical names first (in ``CLASS_NAMES`` order),
    then the others by name. It does not depend on the file's order, which a manifest (sorted keys) loses."""
    names = list(names)
    canonical = [n for n in CLASS_NAMES if n in names]
    return canonical + sorted(n for n in names if n not in CLASS_NAMES)


class _Model(InputModel):
    # allow_inf_nan=False: inf and nan are never a valid rate, length, share or budget
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


#: Largest distribution parameter (tokens, turns, seconds); the token and turn bounds are checked per use.
_P = MAX_PARAM


class Fixed(_Model):
    dist: Literal["fixed"]
    value: float = Field(ge=0, le=_P)
    min: float | None = Field(default=None, ge=0, le=_P)
    max: float | None = Field(default=None, ge=0, le=_P)


class Uniform(_Model):
    dist: Literal["uniform"]
    low: float = Field(ge=0, le=_P)
    high: float = Field(ge=0, le=_P)
    min: float | None = Field(default=None, ge=0, le=_P)
    max: float | None = Field(default=None, ge=0, le=_P)

    @model_validator(mode="after")
    def _order(self) -> Uniform:
        if self.high < self.low:
            raise ValueError(f"high ({self.high}) must be >= low ({self.low})")
        return self


class Normal(_Model):
    dist: Literal["normal"]
    mean: float = Field(ge=0, le=_P)
    std: float = Field(ge=0, le=_P)
    min: float | None = Field(default=None, ge=0, le=_P)
    max: float | None = Field(default=None, ge=0, le=_P)


class LogNormal(_Model):
    """Log-normal with the given arithmetic ``mean`` and log-space ``sigma``."""

    dist: Literal["lognormal"]
    mean: float = Field(gt=0, le=_P)
    sigma: float = Field(gt=0, le=5)
    min: float | None = Field(default=None, ge=0, le=_P)
    max: float | None = Field(default=None, ge=0, le=_P)


class Empirical(_Model):
    """Values drawn uniformly from a file (one number per line, or a CSV ``column``), path relative to the scenario."""

    dist: Literal["empirical"]
    file: str
    column: str | None = None
    min: float | None = Field(default=None, ge=0, le=_P)
    max: float | None = Field(default=None, ge=0, le=_P)


#: One component of a mixture: any simple distribution (not another mixture).
SimpleDistribution = Annotated[Fixed | Uniform | Normal | LogNormal | Empirical, Field(discriminator="dist")]


class Component(_Model):
    """A mixture's component: its ``weight`` (relative; weights need not sum to 1) and distribution ``of``."""

    weight: float = Field(gt=0, le=_P)
    of: SimpleDistribution


class Mixture(_Model):
    """Each sample comes from one component, picked with probability weight / sum of weights: a bimodal
    length (reasoning that stops early or runs long) is two components."""

    dist: Literal["mixture"]
    components: list[Component] = Field(min_length=1, max_length=16)
    min: float | None = Field(default=None, ge=0, le=_P)
    max: float | None = Field(default=None, ge=0, le=_P)


Distribution = Annotated[Fixed | Uniform | Normal | LogNormal | Empirical | Mixture, Field(discriminator="dist")]


def dist_upper(dist: Fixed | Uniform | Normal | LogNormal | Empirical | Mixture) -> float | None:
    """The largest value a distribution is meant to give (its nominal top, cut by ``max``, raised by ``min``).

    The nominal top is the fixed value, the uniform ``high``, the (log)normal mean or a mixture's largest
    component top; an empirical file has none (its values are checked when sampled). Tails beyond the mean
    are checked on the sampled values.
    """
    top: float | None
    if isinstance(dist, Mixture):
        tops = [dist_upper(c.of) for c in dist.components]
        top = None if any(t is None for t in tops) else max(t for t in tops if t is not None)
    else:
        nominal = {Fixed: "value", Uniform: "high", Normal: "mean", LogNormal: "mean"}.get(type(dist))
        top = getattr(dist, nominal) if nominal else None
    if dist.max is not None:
        top = dist.max if top is None else min(top, dist.max)
    if dist.min is not None:
        top = dist.min if top is None else max(top, dist.min)
    return top


def _check_bound(field: str, dist: Any, limit: float, unit: str) -> None:
    top = dist_upper(dist)
    if top is not None and top > limit:
        raise ValueError(f"{field} = {top:g}: expected at most {limit:g} {unit}")


class Budget(_Model):
    """Limits in ms at p50/p95/p99 (any subset); ``hard`` budgets reject, soft ones only warn."""

    p50: float | None = Field(default=None, gt=0, le=_P)
    p95: float | None = Field(default=None, gt=0, le=_P)
    p99: float | None = Field(default=None, gt=0, le=_P)
    hard: bool = True

    def limits(self) -> dict[str, float]:
        return {q: v for q, v in (("p50", self.p50), ("p95", self.p95), ("p99", self.p99)) if v is not None}


class Budgets(_Model):
    ttft_ms: Budget | None = None  # time to the first token of either kind (reasoning or answer)
    ttfat_ms: Budget | None = None  # time to the first answer token (after any reasoning)
    itl_ms: Budget | None = None
    e2e_ms: Budget | None = None
    makespan_ms: Budget | None = None  # per session: its last step done - its first step scheduled


class Cancellation(_Model):
    """A share of requests the client abandons after N received tokens, as users do."""

    share: float = Field(ge=0, le=1)
    after_tokens: Distribution


class Fanout(_Model):
    """An agent session's sub-agents: after a step, with probability ``share``, ``width`` sub-sessions of
    ``turns`` steps each start (each one tool time after that step's reply, its steps chained the same way),
    and the session's next step waits for that step and the last step of every one of them."""

    share: float = Field(ge=0, le=1)
    width: Distribution
    turns: Distribution

    @model_validator(mode="after")
    def _bounds(self) -> Fanout:
        _check_bound("width", self.width, 64, "sub-sessions")
        _check_bound("turns", self.turns, MAX_TURNS, "turns")
        return self


class ToolCalls(_Model):
    """An agent session's tool calls: a step that is not the session's last ends, with probability ``share``,
    in one tool call of ``tokens`` output tokens, on top of its answer (the trace's ``tool_call_tokens``; the
    simulated engine streams them as ``tool_calls`` deltas; a real model calls tools as it does)."""

    share: float = Field(ge=0, le=1)
    tokens: Distribution

    @model_validator(mode="after")
    def _bounds(self) -> ToolCalls:
        _check_bound("tokens", self.tokens, MAX_TOKENS, "tokens")
        return self


class Thread(_Model):
    """A class's multi-turn conversations: number of turns and think time between a reply and the next turn.

    ``wait_for_reply``: turn k+1 starts one think time after turn k's reply ended (the driver waits for
    it, so context and timing are the user's); otherwise one think time after turn k was scheduled
    (open loop: the trace alone fixes every instant). An agent session is such a thread: its think time is
    the tool time, each step's prompt is the previous one's plus the reply plus the new input (the tool
    result), ``tool_calls`` ends replies in tool calls, and ``fanout`` adds sub-agents.
    """

    turns: Distribution
    think_time_s: Distribution
    wait_for_reply: bool = False
    tool_calls: ToolCalls | None = None
    fanout: Fanout | None = None

    @model_validator(mode="after")
    def _bounds(self) -> Thread:
        _check_bound("turns", self.turns, MAX_TURNS, "turns")
        _check_bound("think_time_s", self.think_time_s, MAX_DURATION_S, "s")
        if self.fanout is not None and not self.wait_for_reply:
            raise ValueError("fanout = {...}: expected wait_for_reply = true (a step waits for its sub-sessions)")
        return self


class RequestClass(_Model):
    share: float = Field(ge=0, le=1)
    stream: bool = True
    input_tokens: Distribution
    output_tokens: Distribution
    budgets: Budgets = Budgets()
    cancel: Cancellation | None = None
    thread: Thread | None = None  # multi-turn conversations (any class)
    # a reasoning model's thinking before its answer: tokens per request, on top of output_tokens (the answer);
    # the trace's output_tokens is their sum and its reasoning_tokens this draw (the simulated engine emits them
    # as reasoning deltas; a real model reasons as it does)
    reasoning_tokens: Distribution | None = None
    ttft_timeout_s: float | None = Field(default=None, gt=0, le=MAX_TIMEOUT_S)
    total_timeout_s: float | None = Field(default=None, gt=0, le=MAX_TIMEOUT_S)

    @model_validator(mode="after")
    def _token_bounds(self) -> RequestClass:
        _check_bound("input_tokens", self.input_tokens, MAX_TOKENS, "tokens")
        _check_bound("output_tokens", self.output_tokens, MAX_TOKENS, "tokens")
        if self.cancel is not None:
            _check_bound("cancel.after_tokens", self.cancel.after_tokens, MAX_TOKENS, "tokens")
        if self.reasoning_tokens is not None:
            _check_bound("reasoning_tokens", self.reasoning_tokens, MAX_TOKENS, "tokens")
        return self


class TraceSettings(_Model):
    """One named arrival setting; ``process`` picks which fields apply."""

    process: Literal["poisson", "gamma", "onoff", "constant", "ramp", "closed"]
    duration_s: float = Field(gt=0, le=MAX_DURATION_S)
    rate_rps: float | None = Field(default=None, gt=0, le=MAX_RATE_RPS)  # poisson, gamma, constant (evenly spaced)
    start_rate_rps: float | None = Field(default=None, ge=0, le=MAX_RATE_RPS)  # ramp: the rate at 0 s ...
    end_rate_rps: float | None = Field(
        default=None, ge=0, le=MAX_RATE_RPS
    )  # ... rising (or falling) linearly to this at duration_s
    cv: float | None = Field(default=None, gt=0, le=100)  # gamma burstiness (coefficient of variation of gaps)
    quiet_rate_rps: float | None = Field(default=None, ge=0, le=MAX_RATE_RPS)  # onoff
    burst_rate_rps: float | None = Field(default=None, gt=0, le=MAX_RATE_RPS)  # onoff
    burst_s: float | None = Field(default=None, gt=0, le=MAX_DURATION_S)  # onoff: length of each burst
    gap_s: float | None = Field(default=None, gt=0, le=MAX_DURATION_S)  # onoff: quiet time between bursts
    concurrency: int | None = Field(default=None, ge=1, le=MAX_CONCURRENCY)  # closed loop
    requests: int | None = Field(default=None, ge=1, le=MAX_TRACE_REQUESTS)  # closed loop: how many requests in total
    max_in_flight: int | None = Field(default=None, ge=1, le=MAX_CONCURRENCY)
    shares: dict[str, float] | None = None  # override class shares for this trace
    burst_shares: dict[str, float] | None = None  # onoff: class shares of arrivals inside bursts

    @model_validator(mode="after")
    def _fields_for_process(self) -> TraceSettings:
        need = {
            "poisson": ("rate_rps",),
            "gamma": ("rate_rps", "cv"),
            "onoff": ("quiet_rate_rps", "burst_rate_rps", "burst_s", "gap_s"),
            "constant": ("rate_rps",),
            "ramp": ("start_rate_rps", "end_rate_rps"),
            "closed": ("concurrency", "requests"),
        }[self.process]
        for name in need:
            if getattr(self, name) is None:
                raise ValueError(f"process {self.process!r} needs {name}")
        if self.process == "ramp" and not (self.start_rate_rps or self.end_rate_rps):
            raise ValueError("process 'ramp' needs start_rate_rps or end_rate_rps above 0")
        peak = max(
            self.rate_rps or 0.0,
            self.quiet_rate_rps or 0.0,
            self.burst_rate_rps or 0.0,
            self.start_rate_rps or 0.0,
            self.end_rate_rps or 0.0,
        )
        if peak * self.duration_s > MAX_TRACE_REQUESTS:
            raise ValueError(
                f"rate {peak:g}/s over duration_s {self.duration_s:g} gives about "
                f"{peak * self.duration_s:.3g} requests: expected at most {MAX_TRACE_REQUESTS:g} per trace"
            )
        return self


class PrefixGroup(_Model):
    """A shared prefix (system prompt, document) reused by a share of a class's requests."""

    name: str = Field(min_length=1)
    share: float = Field(ge=0, le=1)
    prefix_tokens: int = Field(ge=1, le=MAX_TOKENS)
    classes: list[str] | None = None  # default: every class


class Cache(_Model):
    prefix_groups: list[PrefixGroup] = []


class Privacy(_Model):
    retain_prompt_text: bool = False
    retain_completion_text: bool = False


class Errors(_Model):
    ttft_timeout_s: float = Field(default=60.0, gt=0, le=MAX_TIMEOUT_S)
    total_timeout_s: float = Field(default=600.0, gt=0, le=MAX_TIMEOUT_S)
    error_rate_limit: float = Field(default=0.01, ge=0, le=1)  # above this share a run is marked errored


class Behavior(_Model):
    """References to frozen behaviour cases (``file`` or ``file#case``), relative to the scenario."""

    cases: list[str] = []
    under_load_share: float = Field(default=0.0, ge=0, le=1)


class Regression(_Model):
    """What ``loadgen diff`` counts as a change (percent of the base value, per metric; default 5 each)."""

    thresholds_pct: dict[Literal["ttft_ms", "tpot_ms", "e2e_ms"], float] = {}

    @model_validator(mode="after")
    def _bounds(self) -> Regression:
        for metric, value in self.thresholds_pct.items():
            if not 0 <= value <= 1000:
                raise ValueError(f"regression.thresholds_pct.{metric} = {value}: expected 0..1000 (percent)")
        return self


class Scenario(_Model):
    name: str = Field(min_length=1)
    description: str = ""
    seed: int = Field(ge=0, le=MAX_SEED)
    model: str | None = None  # served model name to request, when the scenario pins one
    endpoint: Literal["completions", "chat"] = "completions"
    classes: dict[str, RequestClass]
    traces: dict[str, TraceSettings]
    cache: Cache = Cache()
    privacy: Privacy = Privacy()
    errors: Errors = Errors()
    behavior: Behavior = Behavior()
    regression: Regression = Regression()
    # set by load_scenario, not by the file
    source_path: str | None = Field(default=None, exclude=True)
    sha256: str | None = Field(default=None, exclude=True)

    @model_validator(mode="after")
    def _cross_checks(self) -> Scenario:
        if not self.classes:
            raise ValueError("classes: at least one request class is required")
        for name in self.classes:
            problem = class_name_problem(name)
            if problem is not None:
                raise ValueError(f"classes: name {name!r}: {problem}")
        total = sum(c.share for c in self.classes.values())
        if abs(total - 1.0) > 1e-6:
            raise ValueError(f"classes.*.share: shares sum to {total:g}; expected 1")
        if not self.traces:
            raise ValueError("traces: at least one named trace is required")
        for tname, trace in self.traces.items():
            for label, shares in (("shares", trace.shares), ("burst_shares", trace.burst_shares)):
                if shares is None:
                    continue
                for cname in shares:
                    if cname not in self.classes:
                        raise ValueError(f"traces.{tname}.{label}.{cname}: not a class of this scenario")
                s = sum(shares.values())
                if abs(s - 1.0) > 1e-6:
                    raise ValueError(f"traces.{tname}.{label}: shares sum to {s:g}; expected 1")
        for group in self.cache.prefix_groups:
            for cname in group.classes or []:
                if cname not in self.classes:
                    raise ValueError(
                        f"cache.prefix_groups.{group.name}.classes: {cname!r} is not a class of this scenario"
                    )
        return self

    def class_shares(self, trace: str, in_burst: bool = False) -> dict[str, float]:
        settings = self.traces[trace]
        if in_burst and settings.burst_shares is not None:
            return dict(settings.burst_shares)
        if settings.shares is not None:
            return dict(settings.shares)
        return {name: cls.share for name, cls in self.classes.items()}

    def base_dir(self) -> Path:
        return Path(self.source_path).parent if self.source_path else Path.cwd()


def parse_scenario(data: dict[str, Any], source: str = "<scenario>") -> Scenario:
    """Validate a scenario mapping; raise ScenarioError with one line on the first problem."""
    try:
        return Scenario.model_validate(data)
    except ValidationError as exc:
        raise ScenarioError(format_validation_error(source, exc, Scenario)) from None


def load_scenario(path: str | Path) -> Scenario:
    """Read and validate a scenario TOML file; its sha256 and path are kept for the manifest."""
    data, sha256 = read_toml(path, "a scenario TOML file")
    scenario = parse_scenario(data, str(path))
    return scenario.model_copy(update={"source_path": str(path), "sha256": sha256})


def scenario_manifest(scenario: Scenario) -> ScenarioRef:
    """What a manifest records about a scenario: name, path, sha256 and the full validated content."""
    return ScenarioRef(
        name=scenario.name, path=scenario.source_path, sha256=scenario.sha256, content=scenario.model_dump(mode="json")
    )


def scenario_from_manifest(manifest: Manifest) -> Scenario | None:
    """Rebuild the scenario a run was made with from its manifest (None when the run had none)."""
    entry = manifest.scenario
    if entry is None or not entry.content:
        return None
    scenario = parse_scenario(entry.content, f"manifest scenario {entry.name!r}")
    return scenario.model_copy(update={"source_path": entry.path, "sha256": entry.sha256})
