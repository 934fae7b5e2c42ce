"""The memory ledger (``loadgen ledger --json``) as a typed result.

``Ledger.result()`` gives ``LedgerResult`` (schema version ``LEDGER_SCHEMA_VERSION``, the document's
``version``); the CLI prints its ``document()``, so the output has exactly the keys the published schema names
(``loadgen schema ledger``); ``Reconciliation.result()`` gives ``ReconciliationResult``
(``loadgen ledger --reconcile SOURCE --json``, ``loadgen schema reconciliation``). Figures are per device (per tensor-parallel rank); memory in bytes (``*_bytes``,
a line's ``bytes``) or GiB (``*_gib``), lengths in tokens.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from loadgen.rundir.engine_notes import ReconcileRowResult
from loadgen.util.resultmodel import Number, ResultModel

__all__ = [
    "LEDGER_SCHEMA_VERSION",
    "RECONCILIATION_SCHEMA_VERSION",
    "LedgerClass",
    "LedgerEngine",
    "LedgerLineResult",
    "LedgerResult",
    "LineKind",
    "ReconciliationResult",
]

#: The ledger document's ``version``.
LEDGER_SCHEMA_VERSION = 1

#: How a line's bytes were found: config arithmetic, a labelled estimate, the given budget, or measured.
LineKind = Literal["exact", "estimate", "budget", "measured"]


class LedgerModel(ResultModel):
    """The model config read; ``num_layers``, ``full_layers`` and ``sliding_layers`` count decoder layers."""

    source: str = Field(description="the config.json read")
    architecture: str | None
    attention: str = Field(description="the KV layout: mha, gqa, mqa or mla")
    num_layers: int
    sliding_window: int | None = Field(description="tokens (null: no sliding-window layers)")
    full_layers: int
    sliding_layers: int


class LedgerLora(ResultModel):
    """LoRA adapters resident at once: ``count`` adapters of at most ``rank``."""

    count: int
    rank: int
    targets: list[str] = Field(description="the target modules")


class LedgerEngine(ResultModel):
    """The engine settings the ledger used (vLLM's flags); lengths in tokens, ``max_num_seqs`` in sequences."""

    dtype: str
    quantization: str
    kv_cache_dtype: str
    block_size: int = Field(description="tokens per KV block")
    tensor_parallel_size: int = Field(description="devices the model is split over")
    max_model_len: int | None = Field(description="tokens (null: the config's max_position_embeddings)")
    max_num_seqs: int = Field(description="sequences scheduled at once")
    max_num_batched_tokens: int = Field(description="tokens per scheduler step")
    concurrent_batches: int = Field(description="batches in flight at once (vLLM's max_concurrent_batches)")
    lora: LedgerLora
    kv_cache_gib: Number | None
    device_memory_gib: Number | None
    gpu_memory_utilization: Number = Field(description="share of device memory vLLM may use, 0..1")
    device: Literal["cuda", "cpu"]
    usage_context: str
    device_name: str
    fragmentation_fraction: Number | None = Field(description="share of activations + workspaces, 0..1")
    graph_buffer_gib: Number | None
    non_torch_gib: Number | None
    allreduce_rms_fusion: bool | None
    safety_margin_fraction: Number = Field(description="share of the accounted total, 0..1")
    runtime_gib: Number | None
    defaulted: list[str] = Field(description="the settings that took vLLM's default")


#: One factor of a ledger line's formula (each formula has factors of its own names; their kinds are these).
LedgerFactor = bool | Number | str | list[str] | dict[str, Number] | None


class LedgerLineResult(ResultModel):
    """One ledger line: its bytes per device and the formula, with its factors, that produced them."""

    name: str
    bytes: int = Field(description="bytes per device")
    gib: Number = Field(description="the same, GiB (2^30 bytes), rounded to 6 decimals")
    formula: str
    factors: dict[str, LedgerFactor] = Field(
        description="the formula's factors by name: numbers (bytes, counts, shares or GiB, as each name says), "
        "names (a dtype, a device, a source), flags, a list of names (LoRA targets), or numbers by name (GiB per "
        "process)"
    )
    kind: LineKind


class LedgerClass(ResultModel):
    """How many sequences of a request class fit in the KV pool at its p50 and p99 lengths (prompt + output
    tokens); ``samples`` counts the sampled requests, ``blocks_*`` KV blocks, ``max_seqs_*`` sequences."""

    name: str
    samples: int
    total_p50: Number = Field(description="tokens (prompt + output) at the class's p50")
    total_p99: Number = Field(description="tokens (prompt + output) at the class's p99")
    blocks_p50: int
    blocks_p99: int
    max_seqs_p50: int = Field(description="sequences that fit in the KV pool at p50 lengths")
    max_seqs_p99: int = Field(description="sequences that fit in the KV pool at p99 lengths")
    max_seqs_p50_prefix_shared: int = Field(description="sequences at p50 lengths, the shared prefix stored once")
    engine_limit: int = Field(description="max_num_seqs, sequences")
    limit_p99: int = Field(description="sequences: min(KV-limited at p99, the engine limit)")


class LedgerKvGroup(ResultModel):
    """A group of layers sharing a KV layout; ``layers`` counts them."""

    kind: Literal["full", "sliding"]
    layers: int


class LedgerResult(ResultModel):
    """Where a device's memory goes for one model and engine configuration, line by line."""

    kind: Literal["loadgen.ledger"]
    version: int = Field(description=f"the schema version ({LEDGER_SCHEMA_VERSION})")
    model: LedgerModel
    engine: LedgerEngine
    max_model_len: int = Field(description="tokens")
    parameters: dict[str, int] = Field(description="parameter counts by part (embed, attention, mlp, ..., total)")
    kv_bytes_per_token: int
    kv_formula: str
    kv_page_bytes_per_layer: int
    kv_bytes_per_block: int
    kv_groups: list[LedgerKvGroup]
    kv_budget_bytes: int | None
    kv_cache_blocks: int | None = Field(description="KV blocks in the pool")
    kv_cache_tokens: int | None = Field(description="token slots: blocks x block_size")
    vllm_kv_cache_size_tokens: int | None = Field(description="what vLLM logs: int(concurrency x max_model_len)")
    max_concurrency_at_max_len: Number | None = Field(description="requests of max_model_len tokens that fit")
    blocks_per_max_len_request: int = Field(description="KV blocks one max_model_len request holds")
    total_bytes: int
    total_gib: Number
    lines: list[LedgerLineResult]
    classes: list[LedgerClass]
    notes: list[str]


#: The reconciliation document's ``version`` (``loadgen ledger --reconcile SOURCE --json``).
RECONCILIATION_SCHEMA_VERSION = 1


class ReconciledLedger(ResultModel):
    """The ledger's KV capacity for the configuration the engine reported."""

    kv_cache_blocks: int | None = Field(description="KV blocks in the pool")
    kv_cache_tokens: int | None = Field(description="token slots: blocks x block_size")
    vllm_kv_cache_size_tokens: int | None = Field(description="what vLLM logs: int(concurrency x max_model_len)")
    kv_bytes_per_token: int
    engine: LedgerEngine


class ReconciliationResult(ResultModel):
    """The ledger's KV capacity against what a running vLLM reported, quantity by quantity."""

    kind: Literal["loadgen.ledger_reconciliation"]
    version: int = Field(description=f"the schema version ({RECONCILIATION_SCHEMA_VERSION})")
    ok: bool = Field(description="every compared quantity matches (false when nothing was compared)")
    rows: list[ReconcileRowResult]
    engine_report: dict[str, Any] = Field(  # open: what this log, /metrics or manifest happened to report
        description="the facts the engine reported (its log, metrics, manifest)"
    )
    ledger: ReconciledLedger
