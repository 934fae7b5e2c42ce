"""What a vLLM startup log reports, and ``loadgen vllm serve``'s ready line, as typed results.

``VllmLogNotes`` (``loadgen vllm parse-log LOG``; schema ``vllm-log``, version ``VLLM_LOG_SCHEMA_VERSION``) is
every key ``parse_vllm_log`` can write, each absent when the log does not print its line; ``parse_vllm_log``
builds its dict through it, so a key it does not declare is a bug caught there. ``VllmEngineNotes`` adds what
the launcher measured (``VllmServer.engine_notes()``: the run manifest's ``engine_notes.log`` and the ready
line's ``engine_notes``). ``VllmServeReady`` is the ready line (schema ``vllm-serve``, version
``VLLM_SERVE_SCHEMA_VERSION``), built by ``ready_document``. Neither document has a ``kind`` or ``version``
field (the notes are also a manifest section, and were written without one); each schema's ``$id`` gives it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, ConfigDict, Field

from loadgen.ledger.settings import MAX_MEMORY_GIB
from loadgen.util.limits import MAX_DURATION_S, MAX_PARAM, check_number
from loadgen.util.resultmodel import Number, ResultModel

__all__ = [
    "VLLM_LOG_SCHEMA_VERSION",
    "VLLM_SERVE_SCHEMA_VERSION",
    "ModelLoading",
    "VllmEngineNotes",
    "VllmLogNotes",
    "VllmServeReady",
    "ready_document",
]

#: The ``vllm-log`` schema's version (the notes have no version field).
VLLM_LOG_SCHEMA_VERSION = 1
#: The ``vllm-serve`` schema's version (the ready line has no version field).
VLLM_SERVE_SCHEMA_VERSION = 1

#: One value of vLLM's engine config line, as ``parse_vllm_log`` reads it (None, True/False, an int, or text).
EngineConfigValue = bool | int | str | None

# The ranges a vLLM log's numbers are read in: a value outside one is a damaged or forged log, refused with one
# line naming the field (parse_vllm_log), never shown as a figure. An int stays an int, a float a float.


def _within(lo: float, hi: float) -> Any:
    """A number in [lo, hi] (check_number's rule and words), published as the schema's minimum and maximum."""

    def check(value: Any) -> Any:
        why = check_number(value, lo, hi)
        if why is not None:
            raise ValueError(why)
        return value

    return (AfterValidator(check), Field(json_schema_extra={"minimum": lo, "maximum": hi}))


#: A count the log prints (KV cache tokens, a token budget, a block size): a whole number in [1, MAX_PARAM].
LogCount = Annotated[int, *_within(1, MAX_PARAM)]
#: Memory the log prints, GiB.
LogGiB = Annotated[Number, *_within(0, MAX_MEMORY_GIB)]
#: A time the log prints, s.
LogSeconds = Annotated[Number, *_within(0, MAX_DURATION_S)]
#: vLLM's maximum concurrency ('x').
LogRatio = Annotated[Number, *_within(0, MAX_PARAM)]


#: The counts among vLLM's non-default args that loadgen reads (the ledger's reconcile, a run's batch limits).
_ARG_COUNTS = ("max_num_seqs", "max_num_batched_tokens", "max_model_len", "block_size")


def _check_arg_counts(args: Any) -> Any:
    """vLLM's non-default args as logged, each count loadgen reads a whole number in [1, MAX_PARAM]."""
    for name in _ARG_COUNTS if isinstance(args, dict) else ():
        value = args.get(name)
        why = check_number(value, 1, MAX_PARAM) if isinstance(value, int) else "expected a whole number"
        if value is not None and why is not None:  # a boolean is no finite number to check_number
            raise ValueError(f"{name} = {value!r:.80}: {why}")
    return args


class ModelLoading(ResultModel):
    """vLLM's "Model loading took X GiB and Y seconds" line."""

    gib: LogGiB = Field(description="memory the weights took, GiB")
    s: LogSeconds = Field(description="time the model took to load, s")


class VllmLogNotes(ResultModel):
    """What a vLLM startup log reports (the first line of each kind); a key is absent when its line is not in
    the log, never guessed."""

    # model_loading, model_init_s: vLLM's names, not pydantic's; parse-log refuses a log that gives no key
    model_config = ConfigDict(protected_namespaces=(), json_schema_extra={"minProperties": 1})

    version: str | None = Field(None, description="the vLLM version the log prints")
    architecture: str | None = Field(None, description="the model architecture vLLM resolved")
    engine_config: dict[str, EngineConfigValue] | None = Field(
        None,
        description="behaviour-relevant keys of the 'Initializing a V1 LLM engine ... with config:' line, as vLLM "
        "names them (dtype, max_seq_len, quantization, enable_prefix_caching, ...)",
    )
    non_default_args: Annotated[dict[str, Any] | str | None, AfterValidator(_check_arg_counts)] = Field(
        None,
        description="the 'non-default args' vLLM logs, as vLLM names them (the line's text when it is no dict)",
    )
    kv_cache_device: Literal["CPU", "GPU", "XPU", "TPU", "HPU"] | None = Field(
        None, description="the device the KV cache is on"
    )
    kv_cache_size_tokens: LogCount | None = Field(None, description="the KV cache's capacity, tokens")
    kv_cache_max_model_len: LogCount | None = Field(
        None, description="the tokens per request vLLM's maximum concurrency line assumes, tokens"
    )
    max_concurrency: LogRatio | None = Field(
        None, description="requests of kv_cache_max_model_len tokens the KV cache holds at once (vLLM's 'x')"
    )
    kv_cache_memory_gib: LogGiB | None = Field(None, description="memory given to the KV cache, GiB")
    host_memory_gib: LogGiB | None = Field(
        None, description="CPU: the node's memory beside the KV cache's in vLLM's 'Explicitly set' line, GiB"
    )
    weights_memory_gib: LogGiB | None = Field(None, description="memory the weights took, GiB")
    weights_loading_s: LogSeconds | None = Field(None, description="time loading the weights took, s")
    model_loading: ModelLoading | None = None
    model_init_s: LogSeconds | None = Field(None, description="time initializing the model took, s")
    init_engine_s: LogSeconds | None = Field(
        None, description="time the engine's init (profile, create KV cache, warm-up) took, s"
    )
    compilation_s: LogSeconds | None = Field(None, description="the compilation part of init_engine_s, s")
    torch_compile_s: LogSeconds | None = Field(None, description="time torch.compile took in total, s")
    dynamo_transform_s: LogSeconds | None = Field(None, description="time Dynamo's bytecode transform took, s")
    warmup_run_s: LogSeconds | None = Field(None, description="time the initial profiling/warm-up run took, s")
    graph_capture_s: LogSeconds | None = Field(None, description="time capturing CUDA graphs took, s")
    graph_memory_gib: LogGiB | None = Field(None, description="memory the captured graphs took, GiB")
    memory_profile_s: LogSeconds | None = Field(None, description="time memory profiling took, s")
    non_kv_memory_gib: LogGiB | None = Field(
        None, description="memory that is not KV cache, as memory profiling found it, GiB"
    )
    torch_peak_increase_gib: LogGiB | None = Field(
        None, description="torch's peak memory increase during profiling, GiB"
    )
    max_num_batched_tokens: LogCount | None = Field(
        None, description="the chunked-prefill budget: most tokens scheduled in one step, tokens"
    )
    max_model_len: LogCount | None = Field(None, description="the longest prompt + output vLLM accepts, tokens")
    kv_cache_layout: str | None = Field(None, description="the KV cache layout vLLM uses")
    block_size_override: LogCount | None = Field(
        None, description="the KV block size the attention backend set instead of the one asked for, tokens"
    )
    attention_backend: str | None = Field(None, description="the attention backend vLLM uses")
    warmup_s: LogSeconds | None = Field(
        None, description="from 'Warming up model' to 'Warming up done', by the log's timestamps, s (1 s steps)"
    )
    startup_s_from_log: LogSeconds | None = Field(
        None, description="from the log's first timestamp to the server's start line, s (1 s steps)"
    )


class VllmEngineNotes(VllmLogNotes):
    """A launched server's notes: its startup log's, and what the launcher measured."""

    model_config = ConfigDict(json_schema_extra=None)  # no minProperties: a log may give nothing yet

    ready_s: Number | None = Field(None, description="from launch to the first /health 200, s (3 decimals)")


class VllmServeReady(ResultModel):
    """``loadgen vllm serve``'s line once the server answers /health: where it is, what it serves, its notes."""

    base_url: str = Field(description="the server's base URL")
    ready_s: Number = Field(description="from launch to the first /health 200, s (1 decimal)")
    log: str = Field(description="the server's log file")
    version: str | None = Field(description="the version /version answered (null: no answer)")
    models: list[str] = Field(description="the model ids /v1/models lists")
    engine_notes: VllmEngineNotes


def ready_document(
    base_url: str, ready_s: float, log: str, identity: Mapping[str, Any], notes: Mapping[str, Any]
) -> dict[str, Any]:
    """The ready line ``loadgen vllm serve`` prints: ``identity`` is ``VllmServer.identity()`` (version,
    models), ``notes`` its ``engine_notes()``."""
    return VllmServeReady(
        base_url=base_url,
        ready_s=round(ready_s, 1),
        log=log,
        version=identity.get("version"),
        models=list(identity.get("models") or []),
        engine_notes=VllmEngineNotes.model_validate(dict(notes)),
    ).document()
