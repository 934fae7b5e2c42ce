"""The record schema: the one definition of every Parquet table loadgen writes or reads.

Driver, simulator, importers and analyzer all import these schemas; nothing else spells a column
name. Times are int64 nanoseconds from the run's monotonic anchor (``*_ns``); token counts are
int32; a value that was never observed is null, never 0.

Each table of a run directory (``REQUESTS_FILE`` ...) is a directory of closed Parquet part files
(``loadgen.rundir.io`` writes and reads them); runs written before schema version 2 hold one file per
table and still load, their columns added since (``COLUMNS_SINCE``) read as null.
"""

from __future__ import annotations

import pyarrow as pa

__all__ = [
    "CHUNKS_FILE",
    "CHUNKS_SCHEMA",
    "CHUNK_ANSWER",
    "CHUNK_KINDS",
    "CHUNK_REASONING",
    "COLUMNS_SINCE",
    "CONTRACT_FILE",
    "ERROR_KINDS",
    "MANIFEST_FILE",
    "PLAN_FILE",
    "REQUESTS_FILE",
    "REQUESTS_SCHEMA",
    "SCHEMA_VERSION",
    "SERVER_METRICS_FILE",
    "SERVER_METRICS_SCHEMA",
    "SIM_REASONING_FIELD",
    "SIM_SERVICE_FIELD",
    "SIM_TOOL_CALL_FIELD",
    "STATUSES",
    "STATUS_CANCELLED",
    "STATUS_ERROR",
    "STATUS_NOT_SENT",
    "STATUS_OK",
    "STATUS_TIMEOUT",
    "TRACE_FULL_SCHEMA",
    "TRACE_OPTIONAL_FIELDS",
    "TRACE_SCHEMA",
    "empty_request_row",
    "http_error_kind",
    "record_schema_note",
]

#: 2: tables are directories of part files; requests gained connect_start_ns / connect_end_ns.
#: 3: reasoning apart from the answer: requests gained first_answer_token_ns, client_reasoning_tokens and
#: server_reasoning_tokens; chunks gained ``kind``.
SCHEMA_VERSION = "3"


def record_schema_note(version: str) -> str | None:
    """What a reader of this loadgen should know of a run recorded under record schema ``version``: None for one
    it reads (1 to ``SCHEMA_VERSION``), else a note that columns the writer added are not read."""
    known = version.isdigit() and 1 <= int(version) <= int(SCHEMA_VERSION)
    if known:
        return None
    kind = "a newer" if version.isdigit() and int(version) > int(SCHEMA_VERSION) else "an unknown"
    return (
        f"recorded under {kind} record schema ({version!r}; this loadgen reads 1 to {SCHEMA_VERSION}): "
        "columns it does not know are not read, and figures they would change are as this version defines them"
    )


STATUS_OK = "ok"
STATUS_ERROR = "error"
STATUS_TIMEOUT = "timeout"
STATUS_CANCELLED = "cancelled"
STATUS_NOT_SENT = "not_sent"
#: Every scheduled request ends with exactly one of these.
STATUSES = (STATUS_OK, STATUS_ERROR, STATUS_TIMEOUT, STATUS_CANCELLED, STATUS_NOT_SENT)

#: error_kind values (status error/timeout/not_sent); http_<code> is used for other HTTP statuses.
ERROR_KINDS = (
    "connect",  # could not connect / connection refused (not_sent when no byte was written, else error)
    "client_queue_timeout",  # TTFT timeout reached while waiting in the client queue (status not_sent)
    "not_due",  # the run stopped before this request was due (status not_sent; neither offered nor failed)
    "http_429",  # rate limited (Retry-After recorded in retry_after_s)
    "http_4xx",  # other client error (exact code in http_status)
    "http_5xx",  # server error (exact code in http_status)
    "reset_mid_stream",  # connection dropped after the response started
    "malformed_head",  # the response head is not HTTP/1.1: over 1 MiB without its end, or a bad status/header line
    "malformed_sse",  # a data line that is not valid JSON / not an OpenAI chunk
    "empty_output",  # stream ended normally with no content tokens
    "truncated",  # stream ended without [DONE] / finish_reason
    "ttft_timeout",  # sent, but no first token within the scenario's TTFT timeout (status timeout)
    "total_timeout",  # not done within the total timeout (status timeout)
    "content_filter",  # finish_reason content_filter (managed APIs)
    "run_interrupted",  # due, but the run stopped (signal, deadline, write error) before/while it ran
    "worker_lost",  # its worker died (killed) before recording it: cancelled when due by then, else not_sent
    "client",  # unexpected client-side exception (message kept)
)

# Error kinds that mean the run, not the server, cut the request short: the analysis ends the run's
# covered window at the first of them (its outcome, and the offered load after it, are unknown) and
# never counts them as failures.
CUT_ERROR_KINDS = ("run_interrupted", "worker_lost")


def http_error_kind(code: int | None, *, otherwise: str = "client") -> str:
    """The error_kind of an HTTP status: the one mapping driver, simulator and importers share.

    429 → ``http_429``; other 4xx → ``http_4xx``; 5xx and above → ``http_5xx`` (the exact code goes in
    ``http_status``). No code, or one that is not an error (1xx-3xx), gives ``otherwise``.
    """
    if code is None or code < 400:
        return otherwise
    if code == 429:
        return "http_429"
    if code < 500:
        return "http_4xx"
    return "http_5xx"


REQUESTS_FILE = "requests.parquet"
CHUNKS_FILE = "chunks.parquet"
SERVER_METRICS_FILE = "server_metrics.parquet"
MANIFEST_FILE = "manifest.json"
#: A plan directory's state file (``loadgen plan``; owned by ``loadgen.plan.files``): named here so that a reader
#: of run directories can tell a plan directory from a run directory.
PLAN_FILE = "plan.json"
#: Behaviour-contract result beside the records (``loadgen contract``, plans, practice).
CONTRACT_FILE = "contract.json"

#: One row per request of a trace (input to a run). Offsets are ns from trace start.
TRACE_SCHEMA = pa.schema(
    [
        pa.field("request_id", pa.string(), nullable=False),
        pa.field("request_class", pa.string(), nullable=False),
        pa.field("scheduled_offset_ns", pa.int64(), nullable=False),
        pa.field("prompt_tokens", pa.int32(), nullable=False),  # whole prompt incl. thread context
        pa.field("output_tokens", pa.int32(), nullable=False),
        pa.field("prefix_group", pa.string()),  # shared-prefix group id, null if none
        pa.field("prefix_tokens", pa.int32()),  # tokens of the shared prefix, null if none
        pa.field("conversation_id", pa.string()),  # long-thread conversations
        pa.field("turn_index", pa.int32()),  # 0-based turn within the conversation
        pa.field("cancel_after_tokens", pa.int32()),  # client abandons after N tokens; null = never
    ]
)
#: Optional trace columns (an older trace, or a table built with TRACE_SCHEMA alone, lacks them: read as nulls).
TRACE_OPTIONAL_FIELDS = (
    # null: sent at its offset; set: sent this long after the previous turn of its conversation ended
    # (thread.wait_for_reply; its offset is then the open-loop estimate, for ordering and the worksheet)
    pa.field("think_after_reply_ns", pa.int64()),
    # null: no reasoning asked for; set: the first N of output_tokens are reasoning (the class's
    # reasoning_tokens draw; the simulated engine streams them as reasoning deltas)
    pa.field("reasoning_tokens", pa.int32()),
    # the prompt's prefix structure (null: unknown): hash i stands for the first (i + 1) x B prompt tokens, B the
    # trace metadata's ``block_hash_tokens``; two requests share a prefix cache block exactly where their hashes
    # agree (token-id imports: ``loadgen.trace.block_hashes``, B = 16; Mooncake's hash_ids as given, B = 512)
    pa.field("prompt_block_hashes", pa.list_(pa.int64())),
    # recorded text (null: synthesised to the token counts): the user message this row adds (a thread's later
    # turn: after its previous turns and their replies) and the recorded reply, sent as history by the next turn
    # (ShareGPT imports). Written only when some row holds text. The run records keep only prompt hashes unless
    # the scenario retains prompt text.
    pa.field("prompt_text", pa.string()),
    pa.field("reply_text", pa.string()),
    # null: a reply-waiting row waits for its conversation's previous turn; set: the request ids whose replies
    # it waits for, all of them (an agent step after a fan-out: its previous step and each sub-session's last)
    pa.field("wait_for_ids", pa.list_(pa.string())),
    # null: the server answers at its own pace; set: loadgen's simulated engine holds the reply's end until
    # this long after the request arrived (an imported session's recorded server time; ``SIM_SERVICE_FIELD``)
    pa.field("service_ns", pa.int64()),
    # null: the reply is text; set: its last N output tokens are one tool call (function name, then JSON
    # arguments in pieces) that loadgen's simulated engine streams as ``tool_calls`` deltas, finishing with
    # "tool_calls" (``SIM_TOOL_CALL_FIELD``). Written only when some row holds it
    pa.field("tool_call_tokens", pa.int32()),
)
#: The chat request field that carries a trace row's ``reasoning_tokens`` to loadgen's simulated engine (the
#: driver sends it to that target only): the engine streams that many of the output tokens as
#: ``reasoning_content`` deltas before the answer, as vLLM's reasoning parsers emit them, and reports them in
#: usage ``completion_tokens_details.reasoning_tokens``.
SIM_REASONING_FIELD = "sim_reasoning_tokens"
#: The chat request field that carries a trace row's ``tool_call_tokens`` to loadgen's simulated engine (that
#: target only): the engine streams the last that many output tokens as one OpenAI ``tool_calls`` delta
#: sequence (name, then the arguments piece by piece, a token per event) and finishes with "tool_calls".
SIM_TOOL_CALL_FIELD = "sim_tool_call_tokens"
#: The request field that carries a trace row's ``service_ns`` to loadgen's simulated engine (that target only),
#: in ms: the engine ends the reply no earlier than this long after it received the request.
SIM_SERVICE_FIELD = "sim_service_ms"

#: Every column a trace file holds: the required TRACE_SCHEMA, then the optional fields.
TRACE_FULL_SCHEMA = pa.schema([*TRACE_SCHEMA, *TRACE_OPTIONAL_FIELDS])

#: One row per *scheduled* request of a run, including those never sent.
REQUESTS_SCHEMA = pa.schema(
    [
        pa.field("request_id", pa.string(), nullable=False),
        pa.field("request_class", pa.string(), nullable=False),
        pa.field("conversation_id", pa.string()),
        pa.field("turn_index", pa.int32()),
        pa.field("prefix_group", pa.string()),
        # index of the target URL (replica) it was routed to, in the manifest's ``targets`` order; null: never
        # routed (not dispatched), or a run written before replicas (one target)
        pa.field("target_index", pa.int32()),
        pa.field("warm", pa.bool_()),  # false for the cold-start requests when the run began cold
        # instants, ns from the run's monotonic anchor
        pa.field("scheduled_ns", pa.int64(), nullable=False),
        pa.field("slot_acquired_ns", pa.int64()),  # concurrency slot granted
        pa.field("connect_start_ns", pa.int64()),  # a new connection was opened for it: connect began...
        pa.field("connect_end_ns", pa.int64()),  # ...and ended (null when a kept-alive connection was reused)
        pa.field("sent_ns", pa.int64()),  # request bytes handed to the socket (null: never sent)
        pa.field("first_byte_ns", pa.int64()),  # response headers received
        pa.field("first_token_ns", pa.int64()),  # first chunk carrying tokens of either kind (reasoning or answer)
        # first chunk carrying answer tokens (content, refusal or tool calls; not reasoning): TTFAT's end.
        # Equal to first_token_ns for a model that does not reason; null before schema 3 or with no answer token
        pa.field("first_answer_token_ns", pa.int64()),
        pa.field("last_token_ns", pa.int64()),  # last chunk carrying tokens of either kind
        pa.field("done_ns", pa.int64()),  # request finished, or was given up unsent (null: cut by a stop, or never due)
        # the engine's own instants, when it reports them (an imported vLLM run's RequestStateStats, the
        # worksheet's engine): it queued the request, and first scheduled it (queue time = the difference)
        pa.field("server_queued_ns", pa.int64()),
        pa.field("server_scheduled_ns", pa.int64()),
        # token counts
        pa.field("target_prompt_tokens", pa.int32(), nullable=False),
        pa.field("target_output_tokens", pa.int32(), nullable=False),
        pa.field("client_prompt_tokens", pa.int32()),  # tokenizer count of the prompt sent
        pa.field("server_prompt_tokens", pa.int32()),  # usage.prompt_tokens
        pa.field("server_output_tokens", pa.int32()),  # usage.completion_tokens
        pa.field("client_output_tokens", pa.int32()),  # tokens counted from received chunks, both kinds
        # of client_output_tokens, those that came as reasoning (``reasoning_content``/``reasoning`` deltas);
        # answer tokens = client_output_tokens - client_reasoning_tokens. Null before schema 3
        pa.field("client_reasoning_tokens", pa.int32()),
        pa.field("server_reasoning_tokens", pa.int32()),  # usage.completion_tokens_details.reasoning_tokens
        pa.field("chunk_count", pa.int32()),
        pa.field("cancel_after_tokens", pa.int32()),
        # outcome
        pa.field("status", pa.string(), nullable=False),
        pa.field("error_kind", pa.string()),
        pa.field("error_message", pa.string()),  # one line, secrets redacted
        pa.field("http_status", pa.int32()),
        pa.field("retry_after_s", pa.float64()),
        pa.field("finish_reason", pa.string()),
        pa.field("response_model", pa.string()),  # model id the server answered with
        pa.field("system_fingerprint", pa.string()),
        # content (hash always, text only when the scenario allows retention)
        pa.field("prompt_sha256", pa.string()),
        pa.field("prompt_text", pa.string()),
        pa.field("completion_text", pa.string()),
    ]
)

#: Columns added after schema version 1 (absent from older runs; read back as null), with the version.
COLUMNS_SINCE = {
    "connect_start_ns": "2",
    "connect_end_ns": "2",
    "target_index": "2",
    "server_queued_ns": "2",
    "server_scheduled_ns": "2",
    "first_answer_token_ns": "3",
    "client_reasoning_tokens": "3",
    "server_reasoning_tokens": "3",
    "kind": "3",  # chunks
}

#: A chunk's kind: its tokens are the answer (content, refusal, tool calls), or reasoning only.
CHUNK_ANSWER = "answer"
CHUNK_REASONING = "reasoning"
#: Chunk kinds by code (the driver keeps a code per chunk: 0 answer, 1 reasoning).
CHUNK_KINDS = (CHUNK_ANSWER, CHUNK_REASONING)

#: One row per received chunk that carried content (or a usage-only/empty chunk with tokens=0).
CHUNKS_SCHEMA = pa.schema(
    [
        pa.field("request_id", pa.string(), nullable=False),
        pa.field("seq", pa.int32(), nullable=False),  # 0-based within the request
        pa.field("arrival_ns", pa.int64(), nullable=False),
        pa.field("tokens", pa.int32(), nullable=False),  # tokens carried by this chunk, both kinds
        pa.field("bytes", pa.int32(), nullable=False),  # bytes of the SSE event
        # "reasoning": every token of the chunk is reasoning; "answer": it carries answer tokens (a chunk
        # carrying both kinds, where reasoning ends, is "answer"; the request's counts split it exactly).
        # Null before schema 3 (read as answer)
        pa.field("kind", pa.string()),
    ]
)

#: Scraped (or simulated) Prometheus samples on the run clock.
SERVER_METRICS_SCHEMA = pa.schema(
    [
        pa.field("time_ns", pa.int64(), nullable=False),
        pa.field("name", pa.string(), nullable=False),
        pa.field("labels", pa.string(), nullable=False),  # JSON object, keys sorted; "{}" if none
        pa.field("value", pa.float64(), nullable=False),
    ]
)


def empty_request_row(**values: object) -> dict[str, object]:
    """A requests row with every column present (null), updated with ``values``."""
    row: dict[str, object] = {name: None for name in REQUESTS_SCHEMA.names}
    unknown = set(values) - set(row)
    if unknown:
        raise KeyError(f"unknown request column(s): {sorted(unknown)}")
    row.update(values)
    return row
