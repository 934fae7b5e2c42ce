"""RunOptions: every knob of one replay, validated once (pydantic, extra fields forbidden); RunSettings: the same
knobs as a typed template, before the replay's trace, target and output directory are known.

Plans, targets, calibration and practice carry a ``RunSettings`` (a target's defaults, a plan cell's labels, a
calibration's tokenizer), layer them with ``over`` (the fields one layer set win) and derive variants with
``model_copy(update=...)``; ``RunSettings.options(...)`` makes the ``RunOptions`` of one replay.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from loadgen.util.inputs import api_key_env_problem, header_problem, target_url_problem
from loadgen.util.redact import redact_url
from loadgen.workload.routing import RoutePolicy

from .sse import DEFAULT_MAX_LINE_BYTES

__all__ = ["DEFAULT_TOTAL_TIMEOUT_S", "DEFAULT_TTFT_TIMEOUT_S", "RunOptions", "RunSettings"]

#: Timeouts when neither the options nor a scenario set them (the scenario's own defaults, too).
DEFAULT_TTFT_TIMEOUT_S = 60.0
DEFAULT_TOTAL_TIMEOUT_S = 600.0


class RunSettings(BaseModel):
    """Every knob of ``RunOptions``; where the replay reads and writes (trace, target, output) may be unknown yet.

    None means "take it from the scenario / trace / target"."""

    model_config = ConfigDict(extra="forbid", hide_input_in_errors=True)  # a URL may carry a password

    trace_path: Path | None = None
    target_url: str | None = Field(default=None, min_length=1)
    replica_urls: list[str] = []  # more target URLs serving the same model (replicas), after target_url
    route_policy: RoutePolicy = "round-robin"  # with replicas (loadgen.workload.routing)
    replica_down_after: int = Field(default=3, ge=0)  # consecutive connect errors that mark a replica down (0: never)
    out_dir: Path | None = None
    model: str | None = None  # default: scenario.model, else the first of GET /v1/models
    scenario_path: Path | None = None  # budgets, timeouts, privacy, endpoint
    endpoint: Literal["completions", "chat"] | None = None  # default: scenario.endpoint, else completions
    max_concurrency: int | None = Field(default=None, ge=1)  # default: trace max_in_flight / closed concurrency
    tokenizer: str = "auto"  # auto (server, else cl100k_base with a warning) | cl100k_base | hf:PATH | chars:N | server
    # enters every prompt's seed: the same trace gets other texts, so no earlier run's prompt is in a prefix cache
    prompt_salt: str = Field(default="", max_length=200)
    api_key_env: str | None = None  # NAME of the env var holding the key; the key is never recorded
    ttft_timeout_s: float | None = Field(default=None, gt=0)
    total_timeout_s: float | None = Field(default=None, gt=0)
    scrape_metrics: Literal["auto", "on", "off"] = "auto"  # auto: when GET /metrics answers
    scrape_interval_s: float = Field(default=1.0, gt=0)
    gpu_telemetry: Literal["auto", "on", "off"] = "auto"  # NVML samples of this host's GPUs (loadgen[gpu])
    metrics_prefixes: list[str] | None = None  # keep only these metric-name prefixes
    warm_state: Literal["warm", "cold", "unknown"] = "unknown"
    warm_actions: list[str] = []
    order_index: int | None = None
    repeat: int | None = None
    plan_cell: dict[str, Any] | None = None
    extra_manifest: dict[str, Any] = {}  # merged into the manifest (one level deep) by plan/vLLM layers
    progress: Literal["auto", "on", "off"] = "auto"  # auto: only on a TTY
    deadline_s: float | None = Field(default=None, gt=0)  # stop after N s; unsent become not_sent
    rate_limit_rps: float | None = Field(default=None, gt=0)  # client-side cap; the wait is client queue
    vllm_extensions: Literal["auto", "on", "off"] = (
        "auto"  # ignore_eos + continuous_usage_stats; auto: off for managed APIs
    )
    max_tokens_field: Literal["max_tokens", "max_completion_tokens"] = "max_tokens"
    extra_body: dict[str, Any] = {}  # merged into every request body (e.g. temperature)
    headers: dict[str, str] = {}  # extra headers on every request (names recorded, values not)
    request_headers: dict[str, dict[str, str]] = {}  # per request_id headers (e.g. X-Loadgen-Fault in tests)
    run_kind: Literal["measured", "simulated"] = "measured"
    flush_interval_s: float = Field(default=1.0, gt=0, le=60)  # records reach disk at least this often
    # who converts and writes the flushes: a child at low priority (loadgen.rundir.part_process; keeps the loop's core
    # for the schedule), or the writer thread
    part_writer: Literal["thread", "process"] = "process"
    max_sse_line_bytes: int = Field(default=DEFAULT_MAX_LINE_BYTES, ge=1024, le=1 << 30)  # longer: malformed_sse
    check_model: bool = True  # fail fast when /v1/models lists models and not this one
    workers: int = Field(default=1, ge=1, le=1024)  # >1: spread over worker processes (loadgen.driver.workers)
    ray: str | None = None  # spread over Ray actors: "local" (start a local Ray) or a cluster address

    @field_validator("target_url")
    @classmethod
    def _url(cls, value: str | None) -> str | None:
        if value is None:
            return None
        problem = target_url_problem(value)
        if problem:
            raise ValueError(problem)
        return value.rstrip("/")

    @field_validator("replica_urls")
    @classmethod
    def _replicas(cls, value: list[str]) -> list[str]:
        for url in value:
            problem = target_url_problem(url)
            if problem:
                raise ValueError(problem)
        return [url.rstrip("/") for url in value]

    @model_validator(mode="after")
    def _distinct(self) -> RunSettings:
        seen: set[str] = set()
        for url in [u for u in (self.target_url, *self.replica_urls) if u is not None]:
            key = redact_url(url).lower()
            if key in seen:
                raise ValueError(f"target URL {key} given twice: expected distinct replica URLs")
            seen.add(key)
        return self

    @field_validator("headers")
    @classmethod
    def _headers(cls, value: dict[str, str]) -> dict[str, str]:
        for name, text in value.items():
            problem = header_problem(name, text)
            if problem:
                raise ValueError(f"header {name[:40]!r}: {problem}")
        return value

    @field_validator("api_key_env")
    @classmethod
    def _env_name(cls, value: str | None) -> str | None:
        problem = None if value is None else api_key_env_problem(value)
        if problem:
            raise ValueError(problem)
        return value

    def over(self, layer: RunSettings | None) -> RunSettings:
        """These settings with every field ``layer`` set (explicitly, even to its default) taking its value."""
        if layer is None:
            return self
        return self.model_copy(update={name: getattr(layer, name) for name in layer.model_fields_set})

    def options(self, **where: Any) -> RunOptions:
        """The ``RunOptions`` of one replay: these settings, with ``where`` (trace_path, target_url, out_dir and
        any other field) set; validated once, here."""
        return RunOptions.model_validate(self.model_copy(update=where), from_attributes=True)


class RunOptions(RunSettings):
    """Options of ``run_trace``: ``RunSettings`` with the trace, the target and the output directory known."""

    trace_path: Path
    target_url: str = Field(min_length=1)
    out_dir: Path

    @property
    def target_urls(self) -> list[str]:
        """Every target URL, the first (``target_url``) then the replicas: the order of ``target_index``."""
        return [self.target_url, *self.replica_urls]

    def manifest(self) -> dict[str, Any]:
        """The options as recorded: URL without credentials, header values dropped."""

        data = self.model_dump(mode="json")
        data["target_url"] = redact_url(self.target_url)
        data["replica_urls"] = [redact_url(url) for url in self.replica_urls]
        data["headers"] = sorted(self.headers)
        data["request_headers"] = {rid: sorted(h) for rid, h in self.request_headers.items()}
        return data
