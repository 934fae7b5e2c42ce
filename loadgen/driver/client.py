"""Send one request and record it: slot wait, send, response head, every SSE chunk, outcome.

``execute`` never raises for a failed request; it produces exactly one requests row (plus chunk
columns) and hands both to the recorder, also when the run is cancelled around it (then the row
says ``run_interrupted``). ``sent_ns`` is the instant the request bytes were handed to the socket
(after a new connection's connect, recorded apart in ``connect_start_ns``/``connect_end_ns``); a
request whose bytes never reached a socket (client queue timeout, refused connection, run stopped)
is ``not_sent`` with an error kind that says why. On asyncio the open-loop scheduler writes the request itself at the
deadline when a slot and an idle connection are free (``send_at_deadline``), and the response body
is handed to ``StreamState.feed`` straight from the protocol's ``data_received``: per network read
one timestamp, one de-framing, one SSE split and one JSON parse per event, no task switch. Token
counts come from the server's per-chunk usage when it sends it (vLLM's ``continuous_usage_stats``),
else from the run's tokenizer on the delta text (cached).
"""

from __future__ import annotations

import time
from array import array
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import anyio
import httpx

from loadgen.rundir.schema import (
    STATUS_CANCELLED,
    STATUS_ERROR,
    STATUS_NOT_SENT,
    STATUS_OK,
    STATUS_TIMEOUT,
    http_error_kind,
)
from loadgen.util.redact import without_secrets
from loadgen.workload.routing import Router

from .error_kinds import (
    Phase,
    StreamTruncated,
    classify_exception,
    classify_http_status,
    parse_retry_after,
    redact,
)
from .jobs import Job
from .recorder import StreamChunks
from .schedule import LagStats, RateGate
from .sse import DEFAULT_MAX_LINE_BYTES, DONE, SSEDecoder, SSEProtocolError, parse_chunk
from .transport import RawHTTP11Transport, RawResponse, SendTiming

__all__ = ["PreSent", "RunContext", "StreamState", "execute", "max_empty_events", "request_row", "send_at_deadline"]

_now = time.perf_counter_ns


@dataclass
class RunContext:
    """Everything a request task shares with the run (one per run)."""

    transport: RawHTTP11Transport
    origin: tuple[bytes, str, int]  # connection key of the target (the first, with several replicas)
    anchor_ns: int  # perf_counter_ns of the run's start instant
    limiter: anyio.CapacityLimiter
    rate_gate: RateGate
    count_tokens: Callable[[str], int]
    sink: Callable[[dict[str, Any], StreamChunks | None], None]  # recorder.submit
    ttft_timeout_ns: int | None
    total_timeout_ns: int | None
    secrets: tuple[str, ...] = ()
    retain_completion_text: bool = False
    warm_state: str = "unknown"  # warm | cold | unknown
    timeouts: Mapping[str, tuple[int | None, int | None]] = field(default_factory=dict)  # class -> (ttft, total) ns
    max_sse_line_bytes: int = DEFAULT_MAX_LINE_BYTES  # a longer SSE line fails its request as malformed_sse
    lag: LagStats = field(default_factory=LagStats)
    origins: list[tuple[bytes, str, int]] = field(default_factory=list)  # per replica (default: [origin])
    router: Router | None = None  # several replicas: routes each job at dispatch
    heads: list[bytes] = field(default_factory=list)  # per replica: request line + Host (payloads start so)
    # live counters (progress display, manifest)
    sent: int = 0  # bytes on the socket (live counter)
    dispatched: int = 0  # jobs handed to execute so far (in trace order)
    in_flight: int = 0  # holding a concurrency slot (connecting, sent or streaming)
    peak_in_flight: int = 0
    done: int = 0
    errors: int = 0
    slot_waits: int = 0
    sent_at_deadline: int = 0  # requests the scheduler wrote itself (no task start in the send lag)
    first_ok_done_ns: int | None = None
    cpu_start_s: float = 0.0
    rss_start_bytes: int = 0
    recent_ttft_ns: list[int] = field(default_factory=list)
    _token_cache: dict[str, int] = field(default_factory=dict)
    _token_cache_chars: int = 0  # characters of the texts in _token_cache
    # texts counted off the loop, one at a time: the run's other work (and a target on the same host) keeps a core
    off_loop_counts: anyio.CapacityLimiter = field(default_factory=lambda: anyio.CapacityLimiter(1))

    def __post_init__(self) -> None:
        if not self.origins:
            self.origins = [self.origin]

    def route(self, job: Job) -> None:
        """Pick the job's replica (at dispatch): the router's choice, else the one target."""
        if self.router is None:
            job.target_index = 0
            return
        index = job.target_index = self.router.assign(job.conversation_id)
        if index:  # every payload was encoded for the first replica: swap its request line and Host
            job.payload = self.heads[index] + job.payload[len(self.heads[0]) :]

    def remember(self, text: str, n: int) -> int:
        """Keep a text's token count for the next alike: at most ``TOKEN_CACHE_MAX_CHARS`` characters of texts are
        kept, past which the cache starts again. Returns ``n``."""
        cache = self._token_cache
        self._token_cache_chars += len(text)
        if len(cache) > 200_000 or self._token_cache_chars > TOKEN_CACHE_MAX_CHARS:
            cache.clear()
            self._token_cache_chars = len(text)
        cache[text] = n
        return n

    def remember_all(self, counts: dict[str, int]) -> None:
        """Keep several texts' counts, all of them (the bound reached by one does not drop another)."""
        for text, n in counts.items():
            self.remember(text, n)
        self._token_cache.update(counts)

    def count_sent(self) -> None:
        self.sent += 1

    def anyio_deadline(self, abs_ns: int) -> float:
        """Convert an absolute perf_counter_ns instant to the event loop's clock."""
        return anyio.current_time() + (abs_ns - _now()) / 1e9


def request_row(
    job: Job, scheduled_ns: int, status: str = STATUS_NOT_SENT, error_kind: str | None = None
) -> dict[str, Any]:
    """A requests row with the job's static columns filled in."""
    return {
        "request_id": job.request_id,
        "request_class": job.request_class,
        "conversation_id": job.conversation_id,
        "turn_index": job.turn_index,
        "prefix_group": job.prefix_group,
        "target_index": job.target_index,
        "warm": None,
        "scheduled_ns": scheduled_ns,
        "slot_acquired_ns": None,
        "connect_start_ns": None,
        "connect_end_ns": None,
        "sent_ns": None,
        "first_byte_ns": None,
        "first_token_ns": None,
        "first_answer_token_ns": None,
        "last_token_ns": None,
        "done_ns": None,
        "server_queued_ns": None,  # the engine's own instants: not seen over HTTP
        "server_scheduled_ns": None,
        "target_prompt_tokens": job.target_prompt_tokens,
        "target_output_tokens": job.target_output_tokens,
        "client_prompt_tokens": job.client_prompt_tokens,
        "server_prompt_tokens": None,
        "server_output_tokens": None,
        "client_output_tokens": None,
        "client_reasoning_tokens": None,
        "server_reasoning_tokens": None,
        "chunk_count": None,
        "cancel_after_tokens": job.cancel_after_tokens,
        "status": status,
        "error_kind": error_kind,
        "error_message": None,
        "http_status": None,
        "retry_after_s": None,
        "finish_reason": None,
        "response_model": None,
        "system_fingerprint": None,
        "prompt_sha256": job.prompt_sha256,
        "prompt_text": job.prompt_text,
        "completion_text": None,
    }


#: finish_reason values that end a stream as failed, not done (vLLM's FinishReason ABORT and ERROR): the request
#: is an error, never a latency sample.
FAILED_FINISH_REASONS = ("abort", "error")


#: Most characters of chunk texts one network read may have counted on the event loop; a text that would go past
#: them is counted in a worker thread (``StreamState.count_later``), the stream's reading paused meanwhile. Before,
#: every text was counted on the loop: a server that streamed 256 KiB texts, no two alike (``huge-text``, 45 ms of
#: cl100k_base each), held the loop for seconds: send lag p99 2.7 s, requests never timed out nor sent in time.
#: Ordinary chunks (a few characters) never come near it.
INLINE_COUNT_MAX_CHARS = 8192


class CountOffLoop(Exception):
    """``text`` is not counted yet and too long to count on the event loop (``StreamState.tokens_of``)."""

    def __init__(self, text: str) -> None:
        super().__init__(len(text))
        self.text = text


#: Most characters of chunk texts whose token counts are kept (for the next chunk that carries the same text).
#: Before, only the number of texts was bounded (200,000): a server that streamed 256 KiB texts grew the run's
#: memory by each new one (``tests/hostile_server.py --behaviour huge-text``: 422 MB RSS against 209 MB).
TOKEN_CACHE_MAX_CHARS = 32 << 20


def max_empty_events(max_tokens: int) -> int:
    """Most SSE events carrying no token one request's stream may have before it fails as ``malformed_sse``.

    A server sends a few (role, finish, usage; an empty text where a token ends inside a character); this
    allows 8 per token asked for, plus 4096. Events with tokens are not capped: a server may stream more
    tokens than asked for (a replayed recording, reasoning not counted in ``max_tokens``). Without the cap a
    server that floods events carrying nothing (``{"choices": []}`` at network speed) grew the request's
    chunk columns until its timeout: 8.5 million rows and 1.1 GB RSS for 12 requests in 10 s.
    """
    return 8 * max(max_tokens, 0) + 4096


#: Most bytes of an error answer's body read; ``redact`` cuts the message (after redacting it) to 500 characters.
ERROR_BODY_MAX_BYTES = 4096


async def _read_error_body(response: RawResponse) -> str:
    """The error body's head, uncut: redaction comes first, then the cut (``redact``). When the body goes on
    past what is read, its last 256 bytes are dropped too: a secret across the read limit is never kept in part."""
    try:
        with anyio.move_on_after(2):
            body = await response.read(ERROR_BODY_MAX_BYTES)
            if len(body) >= ERROR_BODY_MAX_BYTES:
                body = body[:-256] + b" [cut]"
            return body.decode("utf-8", "replace")
    except httpx.HTTPError:
        pass
    return ""


class StreamState:
    """Everything one streamed response has said so far; ``feed`` is the per-read hot path (no I/O).

    ``feed(arrival_abs_ns, body_bytes)`` splits SSE events, parses each chunk, counts its tokens
    (server per-chunk usage when present, else the tokenizer on the delta text) and appends one
    chunk row. It returns True when reading should stop: ``[DONE]``, an in-stream error, or the
    trace's cancel-after-tokens reached. Malformed events raise SSEProtocolError.

    Reasoning deltas count as tokens (the first token of either kind is TTFT's end) and are counted
    apart (``reasoning_tokens``); ``first_answer_token`` is the first chunk carrying answer tokens (TTFAT's end).
    A chunk carrying both kinds with per-chunk usage gives its reasoning text's tokenizer count (at most
    the usage delta) to reasoning, the rest to the answer.
    """

    __slots__ = (
        "anchor",
        "arrivals",
        "cache",
        "cancel_after",
        "cancelled",
        "client_tokens",
        "ctx",
        "decoder",
        "done_abs",
        "error",
        "error_code",
        "fingerprint",
        "finish_reason",
        "first_answer",
        "first_token",
        "kinds",
        "inline",
        "known",
        "last_token",
        "later",
        "empty_events",
        "max_empty_events",
        "on_first_token",
        "prev_usage",
        "reasoning_tokens",
        "response_model",
        "server_output",
        "server_prompt",
        "server_reasoning",
        "sizes",
        "texts",
        "tokens",
    )

    def __init__(
        self,
        ctx: RunContext,
        cancel_after: int | None,
        on_first_token: Callable[[], None] | None,
        max_empty_events: int | None = None,
    ) -> None:
        self.ctx = ctx
        self.max_empty_events = max_empty_events
        self.empty_events = 0
        self.anchor = ctx.anchor_ns
        self.decoder = SSEDecoder(ctx.max_sse_line_bytes)
        # per chunk, as machine integers (no int object kept per chunk; the recorder takes the buffers)
        self.arrivals = array("q")
        self.tokens = array("q")
        self.sizes = array("q")
        self.kinds: array | None = None  # 0 answer, 1 reasoning (CHUNK_KINDS); None until a chunk reasons
        self.texts: list[str] | None = [] if ctx.retain_completion_text else None
        self.cancel_after = cancel_after
        self.prev_usage = 0
        self.first_token: int | None = None
        self.first_answer: int | None = None
        self.last_token: int | None = None
        self.client_tokens = 0
        self.reasoning_tokens = 0
        self.server_reasoning: int | None = None
        self.server_prompt: int | None = None
        self.server_output: int | None = None
        self.finish_reason: str | None = None
        self.response_model: str | None = None
        self.fingerprint: str | None = None
        self.done_abs: int | None = None  # when [DONE] arrived
        self.cancelled = False
        self.error: str | None = None
        self.error_code: int | None = None
        self.on_first_token = on_first_token
        # a text too long to count on the event loop: (text, arrival, the events from its own on, their sizes)
        self.later: tuple[str, int, list[bytes], list[int]] | None = None
        self.known: dict[str, int] | None = None  # counts made off the loop for the event held in ``later``
        self.cache = ctx._token_cache  # the run's counts of texts seen (one dict for the run's life: cleared, kept)
        self.inline = 0  # characters counted on the event loop since the current read began

    def feed(self, arrival_abs_ns: int, data: bytes) -> bool:
        self.inline = 0
        decoder = self.decoder
        payload = decoder.single(data)
        if payload is not None:
            try:
                return self._event(arrival_abs_ns, payload, len(data))
            except CountOffLoop as exc:
                return self._hold(exc.text, arrival_abs_ns, [payload], [len(data)])
        events = decoder.feed(data)
        return self._events(arrival_abs_ns, events, decoder.sizes)

    def _events(self, arrival_abs_ns: int, events: list[bytes], sizes: list[int]) -> bool:
        k = 0
        try:
            for k, payload in enumerate(events):
                if self._event(arrival_abs_ns, payload, sizes[k]):
                    return True
        except CountOffLoop as exc:
            return self._hold(exc.text, arrival_abs_ns, events[k:], sizes[k:])
        return False

    def _hold(self, text: str, arrival_abs_ns: int, events: list[bytes], sizes: list[int]) -> bool:
        """Stop reading: ``events[0]`` needs ``text`` counted off the loop (``count_later``) before it is taken.

        A text this long carries tokens (cl100k_base gives any text one at least): when it is the first, the TTFT
        deadline is met at once, not when the count is done (its worker thread may wait for the CPU behind other
        streams' counts); the first token's instant is still the chunk's arrival."""
        self.later = (text, arrival_abs_ns, events, sizes)
        if self.first_token is None and self.on_first_token is not None:
            self.on_first_token()
        return True

    async def count_later(self) -> bool:
        """Count the text held in ``later`` in a worker thread, then take the events held with it, in order. True
        when reading should stop (as ``feed``), also when another text is held (``later`` says which)."""
        assert self.later is not None
        text, arrival_abs_ns, events, sizes = self.later
        self.later = None
        # the tokenizers release the GIL (cl100k_base; hf: counts long texts so): the loop goes on meanwhile
        ctx = self.ctx
        n = await anyio.to_thread.run_sync(ctx.count_tokens, text, abandon_on_cancel=True, limiter=ctx.off_loop_counts)
        known = self.known = self.known or {}
        known[text] = n
        ctx.remember_all(known)
        self.inline = 0
        try:
            stop = self._event(arrival_abs_ns, events[0], sizes[0])
        except CountOffLoop as exc:  # the event's other text (reasoning beside the answer): counted next
            return self._hold(exc.text, arrival_abs_ns, events, sizes)
        self.known = None
        return stop or self._events(arrival_abs_ns, events[1:], sizes[1:])

    def _event(self, arrival_abs_ns: int, payload: bytes, size: int) -> bool:
        """One event's payload (``size``: its raw bytes); True when reading should stop."""
        if payload == DONE:
            self.done_abs = arrival_abs_ns
            return True
        t = arrival_abs_ns - self.anchor
        text, reasoning, pieces, choices, finish, prompt, usage, thought, model, fingerprint, error, code = parse_chunk(
            payload
        )
        if error is not None:
            self.error, self.error_code = error, code
            return True
        n = r = 0
        if usage is not None:
            if choices and (self.prev_usage or not self.client_tokens):
                # per-chunk usage (vLLM continuous_usage_stats): exact, also for tokens whose text
                # is empty (partial UTF-8, special tokens). A first usage after tokens counted without it is
                # the total on the last chunk (DeepSeek, Alibaba), not a per-chunk count
                n = usage - self.prev_usage
                if n < 0:
                    n = 0
                if reasoning:
                    r = min(n, self.tokens_of(reasoning)) if text else n
            elif pieces:
                n, r = self._count(text, reasoning)
            self.prev_usage = self.server_output = usage
            if thought is not None:
                self.server_reasoning = thought
        elif pieces:
            n, r = self._count(text, reasoning) if reasoning else (self.tokens_of(text), 0)
        if text and self.texts is not None:
            self.texts.append(text)
        if prompt is not None:
            self.server_prompt = prompt
        if finish is not None:
            self.finish_reason = finish
        if self.response_model is None:
            self.response_model = model
        if fingerprint is not None and self.fingerprint is None:
            self.fingerprint = fingerprint
        if not n:
            self._empty_event()
        self.arrivals.append(t)
        self.tokens.append(n)
        self.sizes.append(size)
        if r or self.kinds is not None:  # a reasoning stream (an answer-only one never comes here)
            self._reasoning_chunk(t, n, r)
        if n:
            if self.first_token is None:
                self.first_token = t
                if self.on_first_token is not None:
                    self.on_first_token()
            self.last_token = t
            self.client_tokens += n
            if self.cancel_after is not None and self.client_tokens >= self.cancel_after:
                self.cancelled = True
                return True
        return False

    def _empty_event(self) -> None:
        """Count an event that carried no token; past the cap the stream fails (not an answer, a flood)."""
        self.empty_events += 1
        if self.max_empty_events is not None and self.empty_events > self.max_empty_events:
            raise SSEProtocolError(
                f"more than {self.max_empty_events} SSE events carried no token "
                f"({self.client_tokens} tokens in all): the stream is not an answer"
            )

    def _reasoning_chunk(self, t: int, n: int, r: int) -> None:
        """Kind and counts of a chunk once the stream has reasoned (kinds start then: every chunk before was
        answer, so the first answer token, if any, was the first token)."""
        kinds = self.kinds
        if kinds is None:
            kinds = self.kinds = array("q", bytes(8 * (len(self.arrivals) - 1)))
            self.first_answer = self.first_token
        kinds.append(1 if r == n and r else 0)
        self.reasoning_tokens += r
        if self.first_answer is None and n > r:
            self.first_answer = t

    @property
    def first_answer_token(self) -> int | None:
        """When the first answer token arrived (the first token, for a stream that never reasoned)."""
        return self.first_answer if self.kinds is not None else self.first_token

    def tokens_of(self, text: str) -> int:
        """The tokens of a chunk text: the run's count of it, else the tokenizer's on the event loop. Raises
        ``CountOffLoop`` when that would take the read past ``INLINE_COUNT_MAX_CHARS`` characters counted."""
        n = self.cache.get(text)
        return self._count_new(text) if n is None else n

    def _count_new(self, text: str) -> int:
        inline = self.inline + len(text)
        if inline > INLINE_COUNT_MAX_CHARS:
            raise CountOffLoop(text)
        self.inline = inline
        return self.ctx.remember(text, self.ctx.count_tokens(text))

    def _count(self, text: str, reasoning: str) -> tuple[int, int]:
        """(all tokens, reasoning tokens) of a chunk's texts by the run's tokenizer (no per-chunk usage)."""
        if not reasoning:
            return self.tokens_of(text), 0
        r = self.tokens_of(reasoning)
        return (self.tokens_of(text) if text else 0) + r, r


class PreSent:
    """A request the scheduler already put on the wire at its deadline (slot taken on behalf of ``token``)."""

    __slots__ = ("conn", "sent_abs", "slot_abs", "token")

    def __init__(self, token: object, conn, slot_abs: int, sent_abs: int) -> None:
        self.token = token
        self.conn = conn
        self.slot_abs = slot_abs
        self.sent_abs = sent_abs


def send_at_deadline(ctx: RunContext, job: Job) -> PreSent | None:
    """Synchronously take a slot and write the request on an idle connection; None when either is not free.

    Called by the open-loop scheduler the moment a deadline is reached, so the send lag is the
    scheduler's wake-up precision alone, not the request task's start-up.
    """
    if ctx.rate_gate.interval_ns:
        return None
    token = object()
    try:
        ctx.limiter.acquire_on_behalf_of_nowait(token)
    except anyio.WouldBlock:
        return None
    slot_abs = _now()
    conn = ctx.transport.send_nowait(ctx.origins[job.target_index or 0], job.payload)
    if conn is None:
        ctx.limiter.release_on_behalf_of(token)
        return None
    ctx.sent_at_deadline += 1
    ctx.sent += 1
    return PreSent(token, conn, slot_abs, _now())


async def execute(ctx: RunContext, job: Job, scheduled_abs_ns: int, pre: PreSent | None = None) -> None:
    """Run one request scheduled at ``scheduled_abs_ns`` (absolute perf_counter_ns); always records one row.

    ``pre``: the scheduler already took the slot and wrote the request (``send_at_deadline``).
    """
    anchor = ctx.anchor_ns
    row = request_row(job, scheduled_abs_ns - anchor)
    status: str | None = None
    error_kind = error_message = None
    phase = Phase.BEFORE_RESPONSE
    timing = SendTiming(pre.sent_abs if pre is not None else None, ctx.count_sent)
    response: RawResponse | None = None
    ttft_ns, total_ns = ctx.timeouts.get(job.request_class, (ctx.ttft_timeout_ns, ctx.total_timeout_ns))
    total_deadline = scheduled_abs_ns + total_ns if total_ns else None
    ttft_deadline = scheduled_abs_ns + ttft_ns if ttft_ns else None
    if ttft_deadline is not None and total_deadline is not None:
        ttft_deadline = min(ttft_deadline, total_deadline)
    scope = anyio.CancelScope()
    first_deadline = ttft_deadline if ttft_deadline is not None else total_deadline
    if first_deadline is not None:
        scope.deadline = ctx.anyio_deadline(first_deadline)

    def on_first_token() -> None:  # the TTFT deadline is met: only the total one remains
        if ttft_deadline is not None:
            scope.deadline = ctx.anyio_deadline(total_deadline) if total_deadline is not None else float("inf")

    state = StreamState(ctx, job.cancel_after_tokens, on_first_token, max_empty_events(job.target_output_tokens))
    token = pre.token if pre is not None else object()
    holding_slot = pre is not None
    try:
        with scope:
            try:
                if pre is None:
                    await _take_slot(ctx, token, scheduled_abs_ns, row)
                else:
                    row["slot_acquired_ns"] = pre.slot_abs - anchor
                    ctx.lag.add(pre.slot_abs - scheduled_abs_ns)
                holding_slot = True
                ctx.in_flight += 1
                ctx.peak_in_flight = max(ctx.peak_in_flight, ctx.in_flight)
                response = await ctx.transport.open(
                    ctx.origins[job.target_index or 0],
                    job.payload,
                    sent=pre.conn if pre is not None else None,
                    timing=timing,
                )
                row["first_byte_ns"] = _now() - anchor
                row["http_status"] = response.status
                if response.status != 200:
                    row["retry_after_s"] = parse_retry_after(response.header(b"retry-after"))
                phase = Phase.STREAMING
                status, error_kind, error_message = await _read_response(response, state, ctx.secrets)
            except Exception as exc:
                status, error_kind, error_message = classify_exception(exc, phase, ctx.secrets)
        if scope.cancelled_caught and status is None:
            status, error_kind, error_message = _timeout_outcome(state, ttft_ns, total_ns)
    except anyio.get_cancelled_exc_class():
        if status is None:
            sent = timing.sent is not None
            status = STATUS_CANCELLED if sent else STATUS_NOT_SENT
            error_kind = "run_interrupted"
            where = "in flight" if sent else ("connecting" if holding_slot else "waiting for a slot")
            error_message = "run stopped while this request was " + where
        raise
    finally:
        done_abs = state.done_abs if state.done_abs is not None else _now()
        if response is not None and not response.body.release_nowait():
            with anyio.CancelScope(shield=True):
                await response.body.aclose()
        if holding_slot:
            ctx.limiter.release_on_behalf_of(token)
        if timing.sent is None:
            status, error_kind, error_message = _never_sent(status, error_kind, error_message, holding_slot, ttft_ns)
        _record(ctx, job, row, state, (status, error_kind, error_message), timing, holding_slot, done_abs)


async def _take_slot(ctx: RunContext, token: object, scheduled_abs_ns: int, row: dict[str, Any]) -> None:
    """The client queue: the rate cap, then a concurrency slot; the send lag counts only when neither waited."""
    waited = await ctx.rate_gate.wait()
    try:
        ctx.limiter.acquire_on_behalf_of_nowait(token)
    except anyio.WouldBlock:
        waited = True
        ctx.slot_waits += 1
        await ctx.limiter.acquire_on_behalf_of(token)
    slot_abs = _now()
    row["slot_acquired_ns"] = slot_abs - ctx.anchor_ns
    if not waited:
        ctx.lag.add(slot_abs - scheduled_abs_ns)


async def _read_response(
    response: RawResponse, state: StreamState, secrets: tuple[str, ...]
) -> tuple[str, str | None, str | None]:
    """(status, error_kind, message) of a response whose head arrived: an HTTP error, or the stream."""
    if response.status != 200:
        status, error_kind = classify_http_status(response.status)
        body = await _read_error_body(response)
        return status, error_kind, redact(f"HTTP {response.status}: {body}", secrets)
    encoding = response.header(b"content-encoding")
    if encoding is not None and encoding.strip().lower() not in ("", "identity"):
        # asked for identity (``accept-encoding``); the stream is not decoded: say so, not "0 tokens, truncated"
        return (
            STATUS_ERROR,
            "malformed_sse",
            f"stream sent with content-encoding {encoding.strip()[:40]!r} though identity was asked for: not decoded",
        )
    await _stream(response, state)
    if not state.arrivals and state.done_abs is None and state.error is None:
        kind = (response.header(b"content-type") or "").strip()
        if "event-stream" not in kind.lower():  # a whole JSON answer (stream flag ignored), an HTML page
            shown = repr(kind[:60]) if kind else "none"
            return STATUS_ERROR, "malformed_sse", f"answer is not an event stream (content-type {shown}): no SSE event"
    if state.done_abs is not None and not response.body.complete:
        # the chunked terminator may come in a later packet: wait briefly for it so the keep-alive
        # connection can be reused. A server that closes (FIN or RST) instead has still delivered the whole
        # answer: [DONE] ends the stream, the terminator only the HTTP message (the connection is not reused)
        try:
            with anyio.move_on_after(0.5):
                await response.body.stream_to(_ignore)
        except httpx.TransportError:
            pass
    return _outcome(state)


async def _stream(response: RawResponse, state: StreamState) -> None:
    """Hand the body to ``state.feed`` until it ends or says stop; a text held to be counted off the loop pauses
    the reading (the server waits, nothing piles up) until it is counted."""
    body = response.body
    await body.stream_to(state.feed)
    while state.later is not None:
        body.pause_reading()
        if not await state.count_later():
            await body.stream_to(state.feed)


def _timeout_outcome(state: StreamState, ttft_ns: int | None, total_ns: int | None) -> tuple[str, str, str]:
    if state.first_token is None and state.later is None:  # (a text held for its count carries the first token)
        return (
            STATUS_TIMEOUT,
            "ttft_timeout",
            (f"no first token within {ttft_ns / 1e9:g} s of scheduling" if ttft_ns else "timeout"),
        )
    return (
        STATUS_TIMEOUT,
        "total_timeout",
        (f"not done within {total_ns / 1e9:g} s of scheduling" if total_ns else "timeout"),
    )


def _never_sent(
    status: str | None, kind: str | None, message: str | None, had_slot: bool, ttft_ns: int | None
) -> tuple[str, str | None, str | None]:
    """A request whose bytes never reached a socket is ``not_sent``, with the reason as its kind."""
    if status == STATUS_TIMEOUT:
        if not had_slot:
            limit = f"{ttft_ns / 1e9:g} s " if ttft_ns else ""
            return (
                STATUS_NOT_SENT,
                "client_queue_timeout",
                f"TTFT timeout {limit}reached in the client queue: never sent",
            )
        return STATUS_NOT_SENT, "connect", "timeout reached while connecting: never sent"
    if status in (STATUS_ERROR, STATUS_CANCELLED):
        return STATUS_NOT_SENT, kind, message
    return status or STATUS_NOT_SENT, kind, message


def _ignore(arrival_abs_ns: int, data: bytes) -> bool:
    return False


def _outcome(state: StreamState) -> tuple[str, str | None, str | None]:
    """(status, error_kind, message) of a stream that ended without a transport error."""
    if state.error is not None:
        # an in-stream error without an HTTP error code is the server failing mid-answer
        kind = http_error_kind(state.error_code, otherwise="http_5xx")
        return STATUS_ERROR, kind, f"in-stream error: {state.error}"
    if state.cancelled:
        return STATUS_CANCELLED, None, None
    if state.done_abs is not None or state.finish_reason is not None:
        if state.finish_reason in FAILED_FINISH_REASONS:  # as an in-stream error without a code
            return (
                STATUS_ERROR,
                "http_5xx",
                f"finish_reason {state.finish_reason!r}: the server ended the answer as failed",
            )
        if state.client_tokens == 0 and not state.server_output:
            return STATUS_ERROR, "empty_output", "stream finished with no content tokens"
        if state.finish_reason == "content_filter":
            return STATUS_ERROR, "content_filter", "finish_reason content_filter"
        return STATUS_OK, None, None
    raise StreamTruncated(f"stream ended without [DONE] or finish_reason after {state.client_tokens} tokens")


def _server_text(value: str | None, secrets: tuple[str, ...]) -> str | None:
    """A text the server sent (model, fingerprint, finish reason, completion) with the run's secrets replaced:
    a server that echoes the request's key in them does not get it stored."""
    return without_secrets(value, secrets) if value and secrets else value


def _record(
    ctx: RunContext,
    job: Job,
    row: dict[str, Any],
    state: StreamState,
    outcome: tuple[str | None, str | None, str | None],
    timing: SendTiming,
    had_slot: bool,
    done_abs: int,
) -> None:
    """Fill the row's outcome columns and hand row + chunk columns to the recorder (exactly once)."""
    status, error_kind, error_message = outcome
    anchor = ctx.anchor_ns
    sent = timing.sent is not None
    if had_slot:
        ctx.in_flight -= 1
    if timing.connect_start is not None:
        row["connect_start_ns"] = timing.connect_start - anchor
    if timing.connect_end is not None:
        row["connect_end_ns"] = timing.connect_end - anchor
    if timing.sent is not None:  # sent
        ctx.done += 1
        row["sent_ns"] = timing.sent - anchor
    if sent or error_kind != "run_interrupted":  # finished, or given up (queue timeout, refused): it left
        row["done_ns"] = done_abs - anchor
        job.done_abs_ns = done_abs  # a request waiting for this reply is due from this instant
    if status is None:  # should not happen; keep the accounting exact anyway
        status, error_kind = STATUS_ERROR, "client"
    if status in (STATUS_ERROR, STATUS_TIMEOUT) or (status == STATUS_NOT_SENT and error_kind != "run_interrupted"):
        ctx.errors += 1
    if ctx.router is not None and job.target_index is not None:
        ctx.router.finished(job.target_index, error_kind)
    arrivals = state.arrivals
    row["status"] = status
    row["error_kind"] = error_kind
    row["error_message"] = redact(error_message, ctx.secrets) if error_message else None
    row["first_token_ns"] = state.first_token
    row["first_answer_token_ns"] = state.first_answer_token
    row["last_token_ns"] = state.last_token
    row["server_prompt_tokens"] = state.server_prompt
    row["server_output_tokens"] = state.server_output
    row["client_output_tokens"] = state.client_tokens if sent else None
    row["client_reasoning_tokens"] = state.reasoning_tokens if sent else None
    row["server_reasoning_tokens"] = state.server_reasoning
    row["chunk_count"] = len(arrivals) if sent else None
    row["finish_reason"] = _server_text(state.finish_reason, ctx.secrets)
    row["response_model"] = _server_text(state.response_model, ctx.secrets)
    row["system_fingerprint"] = _server_text(state.fingerprint, ctx.secrets)
    if state.texts is not None and sent:
        row["completion_text"] = _server_text("".join(state.texts), ctx.secrets)
    if ctx.warm_state == "cold":
        row["warm"] = ctx.first_ok_done_ns is not None and sent and row["sent_ns"] > ctx.first_ok_done_ns
    elif ctx.warm_state == "warm":
        row["warm"] = True
    if status == STATUS_OK:
        if ctx.first_ok_done_ns is None:
            ctx.first_ok_done_ns = done_abs - anchor
        if state.first_token is not None:
            recent = ctx.recent_ttft_ns
            recent.append(state.first_token - row["scheduled_ns"])
            if len(recent) > 4096:
                del recent[:2048]
    chunks = StreamChunks(arrivals, state.tokens, state.sizes, state.kinds) if arrivals else None
    ctx.sink(row, chunks)
