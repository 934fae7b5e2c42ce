"""The run manifest's ``engine_notes``: what the engine of a run reported, section by section, typed.

Each engine writes its own keys: the virtual-time worksheet its work counts (``simulate_trace``: steps, busy
time, cache and fault counts, its ``profile_grid`` coverage; a fleet its sums, ``routed`` and ``per_replica``),
a launched vLLM its startup log's notes under ``log`` (``VllmEngineNotes``, built by ``VllmServer.engine_notes``),
the memory its process tree reached (``memory``), the ledger against what it reported (``ledger_reconcile``), and
``died`` when it exited during the run. Manifests written before ``log`` existed hold a vLLM log's notes at the
top level. :class:`EngineNotes` names every key of this repo's writers and stays open to others (another engine's,
a newer loadgen's): a read-then-write keeps them. Every notes model writes back only the keys it was read or built
with (``NotesSection``), so a manifest's bytes do not move when it is read and written again.

The vLLM models live here, below ``rundir`` (``loadgen.vllm.result`` re-exports them): a manifest reads them.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_serializer
from pydantic.functional_serializers import SerializerFunctionWrapHandler

from loadgen.util.limits import MAX_DURATION_S, MAX_MEMORY_GIB, MAX_OFFSET_NS, MAX_PARAM, check_number
from loadgen.util.resultmodel import Number, ResultModel

__all__ = [
    "ClosedNotes",
    "EngineConfigValue",
    "EngineNotes",
    "LedgerReconcileNote",
    "MemoryNote",
    "ModelLoading",
    "NotesSection",
    "ProfileGridNote",
    "ProfiledGrid",
    "ReconcileRowResult",
    "ReplicaNote",
    "VllmEngineNotes",
    "VllmLogNotes",
    "VllmLogSection",
    "WorksheetNotes",
]

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


class ReconcileRowResult(ResultModel):
    """One quantity the ledger and the engine both give, in the unit its name says (tokens, blocks, bytes, GiB,
    or requests for max_concurrency)."""

    quantity: str
    ledger: Number | None = Field(description="the ledger's figure, in the quantity's unit (null: none)")
    engine: Number | None = Field(description="the engine's reported figure, in the quantity's unit (null: none)")
    source: str = Field(description="where the engine's figure came from (log line, metrics, meta.json)")
    exact: bool = Field(description="an exact match is required (else within 1%)")
    match: bool | None = Field(description="null: one side has no figure")


class NotesSection(BaseModel):
    """A section of the engine notes: its keys typed, open to others (kept), written back with only the keys it
    was read or built with (an absent key stays absent, never a null)."""

    model_config = ConfigDict(extra="allow")

    # no return annotation: the published schema is then the model's own (an annotated Any would publish {})
    @model_serializer(mode="wrap")
    def _present_keys_only(self, handler: SerializerFunctionWrapHandler):
        data = handler(self)
        kept = self.model_fields_set | set(self.model_extra or {})
        return {k: v for k, v in data.items() if k in kept} if isinstance(data, dict) else data


class ClosedNotes(NotesSection):
    """A section only loadgen writes, every key named: another key is a damaged manifest, refused."""

    model_config = ConfigDict(extra="forbid")


#: A count the engine reports (steps, tokens, blocks, hits): a whole number >= 0.
Count = Annotated[int, Field(ge=0)]
#: A duration the engine reports, s (at most the manifest's own duration bound: a fleet sums its engines' busy time).
Seconds = Annotated[Number, *_within(0, MAX_OFFSET_NS / 1e9)]
#: A rate or ratio the engine reports (tokens/s, peak / ledger).
Ratio = Annotated[Number, *_within(0, MAX_PARAM)]


class WorksheetScalars(BaseModel):
    """The worksheet's scalar notes (``simulate_trace``): one engine's, or a fleet's sums."""

    simulated: bool | None = Field(None, description="true: the virtual-time worksheet ran this (no engine did)")
    steps: Count | None = Field(None, description="engine steps run")
    busy_s: Seconds | None = Field(None, description="virtual time the engine spent in steps, s (a fleet: summed)")
    virtual_duration_s: Seconds | None = Field(None, description="from the trace's start to the last step, s")
    output_tokens: Count | None = Field(None, description="output tokens generated, tokens")
    output_tokens_per_busy_s: Ratio | None = Field(
        None, description="output tokens per second of busy time, tokens/s (null: no busy time)"
    )
    prompt_tokens_computed: Count | None = Field(None, description="prompt tokens prefilled (not cached), tokens")
    preemptions: Count | None = Field(None, description="requests preempted (KV cache full)")
    prefix_cache_queries: Count | None = Field(None, description="prompt tokens looked up in the prefix cache")
    prefix_cache_hits: Count | None = Field(None, description="prompt tokens the prefix cache held")
    num_kv_blocks: Count | None = Field(None, description="KV cache blocks (a fleet: summed)")
    block_size: Count | None = Field(None, description="tokens per KV block")
    kv_cache_tokens: Count | None = Field(None, description="KV cache capacity, tokens (a fleet: summed)")
    replicas: Count | None = Field(None, description="a fleet: its engines")
    route_policy: str | None = Field(None, description="a fleet: how requests were routed to its engines")


class ProfiledGrid(ClosedNotes):
    """A profile's largest measured point on each axis (``loadgen.sim.profile_grid.ProfileGrid``)."""

    tokens: Count = Field(description="tokens in a step")
    sequences: Count = Field(description="sequences in a step")
    prefill_chunk: Count = Field(description="a prefill chunk, tokens")
    cached_prefix: Count = Field(description="a cached prefix, tokens")
    decodes: Count = Field(description="decodes in a step")
    kv: Count = Field(description="a decode's KV length, tokens")
    expert_tokens: Count | None = Field(None, description="tokens an expert kernel ran over (null: not an MoE)")


class ProfileGridNote(ClosedNotes):
    """How much of a replay's profiled step time the profile's measured points priced (``GridCoverage``)."""

    steps: Count = Field(description="steps priced from the profile")
    steps_beyond: Count = Field(description="of them, steps past the grid on some axis")
    profiled_s: Seconds = Field(description="their priced time, s")
    profiled_s_beyond: Seconds = Field(description="the priced time of the steps past the grid, s")
    by_axis: dict[str, Count] = Field(description="axis -> steps past the grid on it")
    grid: ProfiledGrid


class WorksheetNotes(WorksheetScalars, ResultModel):
    """The replay's engine notes as ``sim validate --measured`` reports them: the scalars, and the profile grid's
    coverage when a profile priced its steps."""

    profile_grid: ProfileGridNote | None = None


class ReplicaNote(NotesSection):
    """One engine of a fleet."""

    steps: Count | None = None
    busy_s: Seconds | None = None
    virtual_duration_s: Seconds | None = None
    preemptions: Count | None = None
    prefix_cache_hits: Count | None = None


class VllmLogSection(VllmEngineNotes, NotesSection):
    """A run manifest's ``engine_notes.log``: a launched vLLM's notes (``VllmEngineNotes``), open to keys an
    older or newer loadgen wrote."""

    model_config = ConfigDict(extra="allow")


#: Bytes of memory.
Bytes = Annotated[int, Field(ge=0)]


class MemoryNote(NotesSection):
    """What the memory sampler saw of a launched engine's process tree (``MemorySampler.summary``), and the
    runtime that implies beside the ledger's model memory (``engine_memory``)."""

    samples: Count | None = Field(None, description="samples taken")
    interval_s: Seconds | None = Field(None, description="between samples, s")
    rss_high_water_bytes: Bytes | None = Field(None, description="the tree's largest RSS, bytes")
    rss_first_bytes: Bytes | None = Field(None, description="the tree's first RSS, bytes")
    gpu_high_water_bytes: Bytes | None = Field(None, description="the largest device memory used, bytes")
    rss_by_process_at_peak: dict[str, Bytes] | None = Field(None, description="process -> RSS at the peak, bytes")
    note: str | None = None
    held_high_water_bytes: Bytes | None = Field(None, description="the largest RssAnon + RssShmem, bytes")
    file_backed_high_water_bytes: Bytes | None = Field(None, description="the largest RssFile, bytes")
    hwm_sum_bytes: Bytes | None = Field(None, description="the sum of every process's VmHWM, bytes")
    held_note: str | None = None
    ledger_total_bytes: Bytes | None = Field(None, description="the ledger's total, bytes")
    rss_high_water_over_ledger: Ratio | None = Field(None, description="RSS high-water / ledger total")
    runtime_measured_bytes: int | None = Field(
        None, description="the peak beyond the ledger's model-memory lines, bytes (negative: below them)"
    )
    peak_bytes: Bytes | None = Field(None, description="the peak the runtime is measured from, bytes")
    peak_basis: str | None = Field(None, description="what the peak is: device memory or the tree's RSS")
    peak_over_ledger: Ratio | None = Field(None, description="peak / ledger total")


class LedgerReconcileNote(NotesSection):
    """The ledger against what the launched vLLM reported (``reconcile_server_run``); ``ok`` null and a
    ``reason`` when it could not be computed."""

    ok: bool | None = Field(None, description="every compared quantity matches (null: not computed)")
    reason: str | None = Field(None, description="why it was not computed")
    rows: list[ReconcileRowResult] | None = None
    ledger_total_bytes: Bytes | None = Field(None, description="the ledger's total, bytes")
    ledger_lines: dict[str, Bytes] | None = Field(None, description="ledger line -> bytes")
    model_memory_bytes: dict[str, Bytes] | None = Field(None, description="model-memory line -> bytes")
    device: str | None = Field(None, description="the ledger's device (cuda, cpu)")


class EngineNotes(WorksheetScalars, NotesSection):
    """The manifest's ``engine_notes`` (see the module docstring): every key a writer of this repo writes,
    typed; other keys kept as they are."""

    model_config = ConfigDict(extra="allow")

    faults_injected: dict[str, Count] | None = Field(None, description="fault kind -> requests it was injected into")
    profile_grid: ProfileGridNote | None = None
    routed: list[Count] | None = Field(None, description="a fleet: requests routed to each engine")
    per_replica: list[ReplicaNote] | None = None
    log: VllmLogSection | None = None
    memory: MemoryNote | None = None
    ledger_reconcile: LedgerReconcileNote | None = None
    died: str | None = Field(None, description="how a launched engine exited during the run")
