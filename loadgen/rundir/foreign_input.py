"""The other tools' result files that ``loadgen import`` reads, as typed input: each is checked whole before a
run directory is started, so a broken file is one line (file, field, value, what was expected), exit 2, and
leaves no half-written run.

* ``VllmBenchResult``: vLLM ``bench serve --save-detailed`` (the per-request lists, one entry per request:
  as many as ``ttfts``). Its other keys (vLLM's summary figures) are kept as written.
* ``LlmperfRecord``: one record of an LLMPerf ``individual`` file, and ``LlmperfSummary`` the ``summary`` file
  beside it. Their other keys are kept as written.
* ``LlmservingsimTick``: one row of an LLMServingSim bench run's ``timeseries.csv`` (per-second engine figures),
  and ``LlmservingsimMeta`` its ``meta.json`` (what the import takes from it; other keys kept as written).
* ``MeasuredEngineConfig``: the same engine facts as an imported run's manifest keeps them
  (``target.engine.config``), checked again when ``sim validate --measured`` replays the run: the manifest may
  have been edited since the import.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

from pydantic import BeforeValidator, ConfigDict, Field, TypeAdapter, ValidationError, model_validator

from loadgen.rundir.plausible import MAX_PLAUSIBLE_TOKENS
from loadgen.util.errors import RunDirError
from loadgen.util.limits import MAX_CONCURRENCY, MAX_OFFSET_NS, MAX_PARALLEL, InputModel
from loadgen.util.validation import format_validation_error

__all__ = [
    "LlmperfRecord",
    "LlmperfSummary",
    "LlmservingsimMeta",
    "LlmservingsimTick",
    "MeasuredEngineConfig",
    "VllmBenchResult",
    "read_llmperf_records",
    "read_llmperf_summary",
    "read_llmservingsim_meta",
    "read_llmservingsim_ticks",
    "read_measured_engine_config",
    "read_vllm_bench_result",
]


def _not_boolean(value: Any) -> Any:
    if isinstance(value, bool):  # pydantic would take true as 1
        raise ValueError(f"expected a number, got the boolean {str(value).lower()}")
    return value


#: A finite number (seconds, an instant on the bench's clock); NaN and infinities refused.
Finite = Annotated[float, Field(allow_inf_nan=False), BeforeValidator(_not_boolean)]
#: A finite number, 0 or more.
NonNegative = Annotated[float, Field(ge=0, allow_inf_nan=False), BeforeValidator(_not_boolean)]
#: A duration, s: 0 to a year (the longest span a run's clock holds; 1e300 is a damaged file, not a latency).
Seconds = Annotated[float, Field(ge=0, le=MAX_OFFSET_NS / 1e9, allow_inf_nan=False), BeforeValidator(_not_boolean)]
#: A token count, 0 to the most a run's reader takes (a recorded request may exceed a trace's MAX_TOKENS).
Tokens = Annotated[int, Field(ge=0, le=MAX_PLAUSIBLE_TOKENS), BeforeValidator(_not_boolean)]

#: The per-request lists of a vLLM result besides ``ttfts``: each holds one entry per request.
_VLLM_PER_REQUEST = ("itls", "input_lens", "output_lens", "errors", "latencies", "start_times", "queue_times")


class VllmBenchResult(InputModel):
    """A vLLM ``bench serve --save-detailed`` result: per request (index i of every list), its TTFT, inter-token
    gaps, token counts, error text and, where the version writes them, E2E, send instant and client queue time.
    A null count or time is a request that failed before it (read as 0), as vLLM writes them."""

    model_config = ConfigDict(extra="allow")

    ttfts: list[Seconds | None] = Field(description="time to first token per request, s")
    itls: list[list[Seconds] | None] = Field(description="per request, the gaps between its chunks, s")
    input_lens: list[Tokens | None] = Field(description="prompt tokens per request")
    output_lens: list[Tokens | None] = Field(description="output tokens per request")
    errors: list[str | None] | None = Field(None, description="per request, its error text ('' when it succeeded)")
    latencies: list[Seconds | None] | None = Field(None, description="end-to-end latency per request, s")
    start_times: list[Finite] | None = Field(None, description="per request, its send instant on the bench's clock, s")
    queue_times: list[Seconds | None] | None = Field(None, description="per request, its client queue time, s")
    max_concurrency: int | None = Field(
        None, ge=1, le=MAX_CONCURRENCY, description="the bench's concurrency cap (requests)"
    )
    duration: Seconds | None = Field(None, description="the bench's duration, s")

    @model_validator(mode="after")
    def _one_entry_per_request(self) -> VllmBenchResult:
        n = len(self.ttfts)
        for key in _VLLM_PER_REQUEST:
            values = getattr(self, key)
            if values is not None and len(values) != n:
                raise ValueError(f"{key} has {len(values)} entries: expected one per request ({n}, as ttfts)")
        if self.start_times and max(self.start_times) - min(self.start_times) > MAX_OFFSET_NS / 1e9:
            span = max(self.start_times) - min(self.start_times)
            raise ValueError(f"start_times span {span:.6g} s: expected at most a year ({MAX_OFFSET_NS / 1e9:.0f} s)")
        return self


class LlmperfRecord(InputModel):
    """One LLMPerf per-request record: TTFT and E2E in seconds, token counts, an error code and message."""

    model_config = ConfigDict(extra="allow")

    ttft_s: Seconds | None = Field(description="time to first token, s (0 or null: no token came)")
    end_to_end_latency_s: Seconds | None = Field(description="end-to-end latency, s")
    number_input_tokens: Tokens | None = Field(None, description="prompt tokens")
    number_output_tokens: Tokens | None = Field(None, description="output tokens")
    error_code: int | float | str | None = Field(None, description="LLMPerf's error code (HTTP status or its own)")
    error_msg: str | None = Field(None, description="the error's text")


class LlmperfSummary(InputModel):
    """The LLMPerf ``summary`` file beside an ``individual`` one: what the import takes from it."""

    model_config = ConfigDict(extra="allow")

    num_concurrent_requests: int | None = Field(
        None, ge=1, le=MAX_CONCURRENCY, description="the run's concurrency (requests)"
    )
    mean_output_tokens: NonNegative | None = Field(None, description="the mean output tokens requested")
    api: str | None = Field(None, description="the endpoint's URL")
    model: str | None = None
    name: str | None = None
    framework: str | None = None


class LlmservingsimTick(InputModel):
    """One row of an LLMServingSim ``timeseries.csv``: the engine's logged figures at one tick. Its other
    columns are kept as written."""

    model_config = ConfigDict(extra="allow")

    t: Annotated[Seconds, Field(le=MAX_OFFSET_NS / 1e9)] = Field(description="seconds from the bench start")
    prompt_throughput: NonNegative = Field(description="logged prompt throughput, tokens/s")
    gen_throughput: NonNegative = Field(description="logged generation throughput, tokens/s")
    running: NonNegative = Field(description="requests running")
    waiting: NonNegative = Field(description="requests waiting")
    kv_cache_pct: Annotated[NonNegative, Field(le=100)] = Field(description="KV cache in use, % (0..100)")


#: A count as JSON writes it: an integer, never a string or a boolean (the raw value is kept in the manifest).
_Count = Annotated[int, Field(strict=True, ge=0)]
_Flag = Annotated[bool, Field(strict=True)]


class LlmservingsimEngineArgs(InputModel):
    """The engine arguments of a bench run (``engine_kwargs``) a replay takes: types checked, other keys kept."""

    model_config = ConfigDict(extra="allow")

    model: str | None = None
    tensor_parallel_size: Annotated[_Count, Field(ge=1, le=MAX_PARALLEL)] | None = Field(
        None, description="GPUs per replica"
    )
    data_parallel_size: Annotated[_Count, Field(ge=1, le=MAX_PARALLEL)] | None = Field(
        None, description="engine replicas"
    )
    enable_expert_parallel: _Flag | None = None
    max_num_seqs: Annotated[_Count, Field(ge=1)] | None = Field(None, description="sequences per step")
    max_num_batched_tokens: Annotated[_Count, Field(ge=1)] | None = Field(None, description="tokens per step")
    max_model_len: Annotated[_Count, Field(ge=1)] | None = Field(None, description="tokens")
    enforce_eager: _Flag | None = None


class LlmservingsimKvCache(InputModel):
    """The KV cache vLLM resolved (``kv_cache``) as a replay takes it: types checked, other keys kept."""

    model_config = ConfigDict(extra="allow")

    num_gpu_blocks: _Count | None = Field(None, description="KV blocks on the GPU")
    block_size: Annotated[_Count, Field(ge=1)] | None = Field(None, description="tokens per block")
    enable_prefix_caching: _Flag | None = None
    num_kv_tokens: _Count | None = Field(None, description="tokens")


class LlmservingsimSchedulerConfig(InputModel):
    """vLLM's resolved ``scheduler_config`` as a replay takes it: types checked, other keys kept."""

    model_config = ConfigDict(extra="allow")

    enable_chunked_prefill: _Flag | None = None
    scheduler_reserve_full_isl: _Flag | None = None


class LlmservingsimCacheConfig(InputModel):
    """vLLM's resolved ``cache_config`` as a replay takes it: types checked, other keys kept."""

    model_config = ConfigDict(extra="allow")

    max_model_len: Annotated[_Count, Field(ge=1)] | None = Field(None, description="tokens")


class MeasuredEngineConfig(InputModel):
    """An imported run's ``target.engine.config`` (``llmservingsim._engine_config`` writes it): the engine
    arguments, the KV cache vLLM resolved and its resolved scheduler and cache configs. Other keys kept."""

    model_config = ConfigDict(extra="allow")

    engine_kwargs: LlmservingsimEngineArgs | None = None
    kv_cache: LlmservingsimKvCache | None = None
    scheduler_config: LlmservingsimSchedulerConfig | None = None
    cache_config: LlmservingsimCacheConfig | None = None


class LlmservingsimMeta(InputModel):
    """An LLMServingSim bench run's ``meta.json``: what the import records in the manifest."""

    model_config = ConfigDict(extra="allow")

    model: str | None = Field(None, description="the model served")
    vllm_version: str | None = None
    started_at: str | None = Field(None, description="UTC start, ISO 8601")
    finished_at: str | None = Field(None, description="UTC end, ISO 8601")
    tick_seconds: Seconds | None = Field(None, description="timeseries.csv's tick, s")
    dataset_path: str | None = Field(None, description="the workload file the run replayed")
    dataset_hash: str | None = Field(None, description="its sha256")
    engine_kwargs: LlmservingsimEngineArgs | None = Field(None, description="the engine arguments")
    kv_cache: LlmservingsimKvCache | None = Field(None, description="the KV cache vLLM resolved")
    resolved_config: dict[str, Any] | None = Field(None, description="vLLM's resolved configuration")
    hardware: dict[str, Any] | None = Field(None, description="the GPU it ran on")


_LLMPERF_FILE = TypeAdapter(list[LlmperfRecord])


def read_vllm_bench_result(path: Path, data: Any) -> VllmBenchResult:
    """``data`` (the file's JSON) as a vLLM result; RunDirError with one line on its first problem."""
    if not isinstance(data, dict):
        raise RunDirError(f"{path}: expected a vLLM bench serve result object")
    for key in ("ttfts", "itls", "input_lens", "output_lens"):
        if not isinstance(data.get(key), list):
            raise RunDirError(f"{path}: no per-request {key!r} list: expected a result saved with --save-detailed")
    try:
        return VllmBenchResult.model_validate(data)
    except ValidationError as exc:
        raise RunDirError(format_validation_error(str(path), exc, VllmBenchResult)) from None


def read_llmperf_summary(path: Path, data: Any) -> LlmperfSummary:
    """``data`` (the summary file's JSON) as an LLMPerf summary; RunDirError with one line on its first problem."""
    if not isinstance(data, dict):
        raise RunDirError(f"{path}: expected an LLMPerf summary object")
    try:
        return LlmperfSummary.model_validate(data)
    except ValidationError as exc:
        raise RunDirError(format_validation_error(str(path), exc, LlmperfSummary)) from None


def read_llmperf_records(path: Path, data: Any) -> list[LlmperfRecord]:
    """``data`` (the file's JSON) as LLMPerf per-request records; RunDirError with one line on the first
    problem (``[i].field``)."""
    if not isinstance(data, list) or not all(isinstance(r, dict) for r in data):
        raise RunDirError(f"{path}: expected a JSON list of LLMPerf per-request records")
    for i, r in enumerate(data):
        for key in ("ttft_s", "end_to_end_latency_s"):
            if key not in r:
                raise RunDirError(f"{path}: record [{i}] has no {key}: expected an LLMPerf individual record")
    try:
        return _LLMPERF_FILE.validate_python(data)
    except ValidationError as exc:
        raise RunDirError(format_validation_error(str(path), exc, LlmperfRecord)) from None


def read_llmservingsim_ticks(path: Path, rows: list[dict[str | None, Any]]) -> list[LlmservingsimTick]:
    """``rows`` (``csv.DictReader`` of the file) as ticks; RunDirError with one line on the first problem
    (``row N``, counting the header as row 1)."""
    ticks = []
    for row_no, row in enumerate(rows, start=2):
        header = sum(k is not None for k in row)
        short = sum(v is None for k, v in row.items() if k is not None)  # DictReader: a short row's missing cells
        extra = len(row.get(None) or [])  # and a long row's rest
        if short or extra:
            raise RunDirError(
                f"{path}: row {row_no}: {header - short + extra} fields: expected {header}, as the header"
            )
        try:
            ticks.append(LlmservingsimTick.model_validate(row))
        except ValidationError as exc:
            raise RunDirError(format_validation_error(f"{path}: row {row_no}", exc, LlmservingsimTick)) from None
    return ticks


def read_llmservingsim_meta(path: Path, data: dict[str, Any]) -> dict[str, Any]:
    """``data`` (the meta.json object) checked as ``LlmservingsimMeta``, returned as it was written; RunDirError
    with one line on its first problem."""
    try:
        LlmservingsimMeta.model_validate(data)
    except ValidationError as exc:
        raise RunDirError(format_validation_error(str(path), exc, LlmservingsimMeta)) from None
    return data


def read_measured_engine_config(source: str, config: Any) -> dict[str, Any]:
    """``config`` (a manifest's ``target.engine.config``) checked as ``MeasuredEngineConfig``, returned as it was
    written; RunDirError with one line (``source: field = value: expected ...``) on its first problem."""
    try:
        MeasuredEngineConfig.model_validate(config or {})
    except ValidationError as exc:
        raise RunDirError(format_validation_error(source, exc, MeasuredEngineConfig)) from None
    return dict(config or {})
