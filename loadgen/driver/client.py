"""Send one request and record it: slot wait, send, headers, every SSE chunk, outcome.

``execute`` never raises for a failed request; it produces exactly one requests row (plus chunk
columns) and hands both to the recorder, also when the run is cancelled around it (then the row
says ``run_interrupted``). The per-chunk path is a read, a split, one JSON parse and three list
appends; token counts come from the server's per-chunk usage when it sends it (vLLM's
``continuous_usage_stats``), else from the run's tokenizer on the delta text (cached).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable

import anyio
import httpx

from ..records import STATUS_CANCELLED, STATUS_ERROR, STATUS_NOT_SENT, STATUS_OK, STATUS_TIMEOUT
from .error_kinds import (
    Phase,
    StreamTruncated,
    classify_exception,
    classify_http_status,
    parse_retry_after,
    redact,
)
from .jobs import Job
from .transport import RawHTTP11Transport, RawResponse
from .schedule import LagStats, RateGate
from .sse import DONE, SSEDecoder, parse_chunk

__all__ = ["RunContext", "execute", "request_row"]

_now = time.perf_counter_ns


@dataclass
class RunContext:
    """Everything a request task shares with the run (one per run)."""

    transport: RawHTTP11Transport
    origin: tuple[bytes, str, int]  # connection key of the target
    anchor_ns: int  # perf_counter_ns of the run's start instant
    limiter: anyio.CapacityLimiter
    rate_gate: RateGate
    count_tokens: Callable[[str], int]
    sink: Callable[[dict[str, Any], dict[str, list[Any]] | None], None]  # recorder.submit
    ttft_timeout_ns: int | None
    total_timeout_ns: int | None
    secrets: tuple[str, ...] = ()
    retain_completion_text: bool = False
    warm_state: str = "unknown"  # warm | cold | unknown
    timeouts: dict[str, tuple[int | None, int | None]] = field(default_factory=dict)  # class -> (ttft, total) ns
    lag: LagStats = field(default_factory=LagStats)
    # live counters (progress display, manifest)
    sent: int = 0
    in_flight: int = 0
    done: int = 0
    errors: int = 0
    slot_waits: int = 0
    first_ok_done_ns: int | None = None
    cpu_start_s: float = 0.0
    recent_ttft_ns: list[int] = field(default_factory=list)
    _token_cache: dict[str, int] = field(default_factory=dict)

    def tokens_in(self, text: str) -> int:
        cache = self._token_cache
        n = cache.get(text)
        if n is None:
            if len(cache) > 200_000:
                cache.clear()
            n = cache[text] = self.count_tokens(text)
        return n

    def anyio_deadline(self, abs_ns: int) -> float:
        """Convert an absolute perf_counter_ns instant to the event loop's clock."""
        return anyio.current_time() + (abs_ns - _now()) / 1e9


def request_row(job: Job, scheduled_ns: int, status: str = STATUS_NOT_SENT, error_kind: str | None = None) -> dict[str, Any]:
    """A requests row with the job's static columns filled in."""
    return {
        "request_id": job.request_id,
        "request_class": job.request_class,
        "conversation_id": job.conversation_id,
        "turn_index": job.turn_index,
        "prefix_group": job.prefix_group,
        "warm": None,
        "scheduled_ns": scheduled_ns,
        "slot_acquired_ns": None,
        "sent_ns": None,
        "first_byte_ns": None,
        "first_token_ns": None,
        "last_token_ns": None,
        "done_ns": None,
        "target_prompt_tokens": job.target_prompt_tokens,
        "target_output_tokens": job.target_output_tokens,
        "client_prompt_tokens": job.client_prompt_tokens,
        "server_prompt_tokens": None,
        "server_output_tokens": None,
        "client_output_tokens": None,
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


async def _read_error_body(response: RawResponse) -> str:
    try:
        with anyio.move_on_after(2):
            body = await response.read(4096)
            return body[:400].decode("utf-8", "replace")
    except httpx.HTTPError:
        pass
    return ""


async def execute(ctx: RunContext, job: Job, scheduled_abs_ns: int) -> None:
    """Run one request scheduled at ``scheduled_abs_ns`` (absolute perf_counter_ns); always records one row."""
    anchor = ctx.anchor_ns
    row = request_row(job, scheduled_abs_ns - anchor)
    arrivals: list[int] = []
    tokens: list[int] = []
    sizes: list[int] = []
    texts: list[str] | None = [] if ctx.retain_completion_text else None
    status: str | None = None
    error_kind = error_message = None
    first_token = last_token = None
    client_tokens = 0
    server_prompt = server_output = None
    finish_reason = response_model = fingerprint = None
    phase = Phase.BEFORE_RESPONSE
    end_abs: int | None = None
    holding_slot = False
    sent = False
    response: RawResponse | None = None
    ttft_ns, total_ns = ctx.timeouts.get(job.request_class, (ctx.ttft_timeout_ns, ctx.total_timeout_ns))
    total_deadline = scheduled_abs_ns + total_ns if total_ns else None
    ttft_deadline = scheduled_abs_ns + ttft_ns if ttft_ns else None
    if ttft_deadline is not None and total_deadline is not None:
        ttft_deadline = min(ttft_deadline, total_deadline)
    try:
        with anyio.CancelScope() as scope:
            first_deadline = ttft_deadline if ttft_deadline is not None else total_deadline
            if first_deadline is not None:
                scope.deadline = ctx.anyio_deadline(first_deadline)
            try:
                waited = await ctx.rate_gate.wait()
                try:
                    ctx.limiter.acquire_nowait()
                except anyio.WouldBlock:
                    waited = True
                    ctx.slot_waits += 1
                    await ctx.limiter.acquire()
                holding_slot = True
                slot_ns = _now()
                row["slot_acquired_ns"] = slot_ns - anchor
                sent_abs = _now()
                sent = True
                row["sent_ns"] = sent_abs - anchor
                if not waited:
                    ctx.lag.add(sent_abs - scheduled_abs_ns)
                ctx.sent += 1
                ctx.in_flight += 1
                response = await ctx.transport.open(ctx.origin, job.payload)
                row["first_byte_ns"] = _now() - anchor
                row["http_status"] = response.status
                phase = Phase.STREAMING
                if response.status != 200:
                    status, error_kind = classify_http_status(response.status)
                    row["retry_after_s"] = parse_retry_after(response.header(b"retry-after"))
                    body = await _read_error_body(response)
                    error_message = redact(f"HTTP {response.status}: {body}", ctx.secrets)
                else:
                    decoder = SSEDecoder()
                    done_seen = False
                    cancel_after = job.cancel_after_tokens
                    prev_usage = 0
                    body_iter = response.body.__aiter__()
                    async for data in body_iter:
                        t = _now() - anchor
                        events = decoder.feed(data)
                        if not events:
                            continue
                        event_sizes = decoder.sizes
                        for k, payload in enumerate(events):
                            if payload == DONE:
                                done_seen = True
                                end_abs = _now()
                                break
                            chunk = parse_chunk(payload)
                            if chunk.error is not None:
                                code = chunk.error_code
                                status = STATUS_ERROR
                                error_kind = "http_4xx" if code is not None and 400 <= code < 500 else "http_5xx"
                                error_message = redact(f"in-stream error: {chunk.error}", ctx.secrets)
                                break
                            n = 0
                            if chunk.pieces:
                                if chunk.completion_tokens is not None:
                                    n = chunk.completion_tokens - prev_usage
                                    if n < 0:
                                        n = 0
                                else:
                                    n = ctx.tokens_in(chunk.text)
                                if texts is not None:
                                    texts.append(chunk.text)
                            if chunk.completion_tokens is not None:
                                prev_usage = chunk.completion_tokens
                                server_output = chunk.completion_tokens
                            if chunk.prompt_tokens is not None:
                                server_prompt = chunk.prompt_tokens
                            if chunk.finish_reason is not None:
                                finish_reason = chunk.finish_reason
                            if response_model is None:
                                response_model = chunk.model
                            if fingerprint is None and chunk.system_fingerprint is not None:
                                fingerprint = chunk.system_fingerprint
                            arrivals.append(t)
                            tokens.append(n)
                            sizes.append(event_sizes[k])
                            if n:
                                if first_token is None:
                                    first_token = t
                                    if total_deadline is not None:
                                        scope.deadline = ctx.anyio_deadline(total_deadline)
                                    elif ttft_deadline is not None:
                                        scope.deadline = float("inf")
                                last_token = t
                                client_tokens += n
                                if cancel_after is not None and client_tokens >= cancel_after:
                                    status = STATUS_CANCELLED
                                    break
                        if status is not None or done_seen:
                            break
                    if done_seen and not response.body.complete:
                        # the body's end (chunked terminator) may come in a later packet: wait for it
                        # briefly so the keep-alive connection can be reused
                        with anyio.move_on_after(0.5):
                            async for _ in body_iter:
                                pass
                    if status is None:
                        if done_seen or finish_reason is not None:
                            if client_tokens == 0 and not server_output:
                                status, error_kind = STATUS_ERROR, "empty_output"
                                error_message = "stream finished with no content tokens"
                            elif finish_reason == "content_filter":
                                status, error_kind = STATUS_ERROR, "content_filter"
                                error_message = "finish_reason content_filter"
                            else:
                                status = STATUS_OK
                        else:
                            raise StreamTruncated(
                                f"stream ended without [DONE] or finish_reason after {client_tokens} tokens"
                            )
            except Exception as exc:  # a failed request is a row, not an exception
                status, error_kind, error_message = classify_exception(exc, phase, ctx.secrets)
        if scope.cancelled_caught and status is None:
            status = STATUS_TIMEOUT
            if first_token is None:
                error_kind = "ttft_timeout"
                error_message = f"no first token within {ttft_ns / 1e9:g} s of scheduling" if ttft_ns else "timeout"
            else:
                error_kind = "total_timeout"
                error_message = f"not done within {total_ns / 1e9:g} s of scheduling" if total_ns else "timeout"
    except anyio.get_cancelled_exc_class():
        if status is None:
            status = STATUS_CANCELLED if sent else STATUS_NOT_SENT
            error_kind = "run_interrupted"
            error_message = "run stopped while this request was " + ("in flight" if sent else "waiting for a slot")
        raise
    finally:
        done_abs = end_abs if end_abs is not None else _now()
        if response is not None and not response.body.release_nowait():
            with anyio.CancelScope(shield=True):
                await response.body.aclose()
        if holding_slot:
            ctx.limiter.release()
        if sent:
            ctx.in_flight -= 1
            ctx.done += 1
            row["done_ns"] = done_abs - anchor
        if status is None:  # should not happen; keep the accounting exact anyway
            status, error_kind = STATUS_ERROR, "client"
        if status == STATUS_ERROR or status == STATUS_TIMEOUT:
            ctx.errors += 1
        row["status"] = status
        row["error_kind"] = error_kind
        row["error_message"] = error_message
        row["first_token_ns"] = first_token
        row["last_token_ns"] = last_token
        row["server_prompt_tokens"] = server_prompt
        row["server_output_tokens"] = server_output
        row["client_output_tokens"] = client_tokens if sent else None
        row["chunk_count"] = len(arrivals) if sent else None
        row["finish_reason"] = finish_reason
        row["response_model"] = response_model
        row["system_fingerprint"] = fingerprint
        if texts is not None and sent:
            row["completion_text"] = "".join(texts)
        if ctx.warm_state == "cold":
            row["warm"] = ctx.first_ok_done_ns is not None and sent and row["sent_ns"] > ctx.first_ok_done_ns
        elif ctx.warm_state == "warm":
            row["warm"] = True
        if status == STATUS_OK:
            if ctx.first_ok_done_ns is None:
                ctx.first_ok_done_ns = done_abs - anchor
            if first_token is not None:
                recent = ctx.recent_ttft_ns
                recent.append(first_token - row["scheduled_ns"])
                if len(recent) > 4096:
                    del recent[:2048]
        chunk_cols = None
        if arrivals:
            chunk_cols = {
                "request_id": [job.request_id] * len(arrivals),
                "seq": list(range(len(arrivals))),
                "arrival_ns": arrivals,
                "tokens": tokens,
                "bytes": sizes,
            }
        ctx.sink(row, chunk_cols)
