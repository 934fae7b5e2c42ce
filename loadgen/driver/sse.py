"""Server-sent events for OpenAI-style streams: a pure parser, no I/O.

The client stamps each network read with the run clock and hands the bytes here. ``SSEDecoder``
splits bytes into lines and lines into events (``data:`` lines joined until a blank line, per the
SSE spec); ``parse_chunk`` turns one event's JSON into the few fields the recorder needs. Nothing
here allocates per chunk beyond the decoded JSON and one small tuple.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, NamedTuple

_loads: Callable[[bytes], Any]
try:  # orjson is ~3x faster on these small objects; optional.
    from orjson import loads as _loads
except ImportError:  # pragma: no cover - depends on the environment
    _loads = json.loads

__all__ = ["DEFAULT_MAX_LINE_BYTES", "DONE", "Chunk", "SSEDecoder", "SSELineTooLong", "SSEProtocolError", "parse_chunk"]

#: The payload that ends an OpenAI stream.
DONE = b"[DONE]"


class SSEProtocolError(ValueError):
    """An event that is not valid JSON or not an OpenAI completion chunk."""


class Chunk(NamedTuple):
    """What one streamed completion chunk says; None where the chunk is silent."""

    text: str  # content/text/refusal/reasoning/tool-call text of every choice, concatenated
    pieces: int  # how many choices carried non-empty text
    choices: int  # how many choices the chunk has (0 for a usage-only chunk)
    finish_reason: str | None  # last non-null finish_reason among the choices
    prompt_tokens: int | None  # usage.prompt_tokens
    completion_tokens: int | None  # usage.completion_tokens (cumulative with continuous usage stats)
    model: str | None
    system_fingerprint: str | None
    error: str | None  # an in-stream {"error": ...} object, as one line
    error_code: int | None  # its numeric code when it has one


class SSELineTooLong(SSEProtocolError):
    """A line (or an event) longer than the decoder's cap: the stream is hostile or broken."""


#: Default cap on one SSE line and on one event's bytes (OpenAI chunks are a few hundred bytes).
DEFAULT_MAX_LINE_BYTES = 1 << 20


class SSEDecoder:
    """Bytes → events. ``feed(data)`` returns the list of completed event payloads (``bytes``).

    ``sizes`` after each feed says how many raw bytes (lines and newlines) formed each payload.
    Comments (``:``), ``event:``, ``id:`` and ``retry:`` fields are ignored; an unterminated final
    event is returned by ``flush()``.

    Linear time: a partial line waits as a list of the reads that carried it (each new read is scanned
    once for a newline and never copied again), and is joined once, when its newline arrives. A line or
    an event longer than ``max_line_bytes`` raises ``SSELineTooLong`` (the request fails as
    ``malformed_sse``) instead of growing without bound.
    """

    __slots__ = ("_data", "_event_bytes", "_part_bytes", "_parts", "max_line_bytes", "sizes")

    def __init__(self, max_line_bytes: int = DEFAULT_MAX_LINE_BYTES) -> None:
        self._parts: list[bytes] = []  # the current partial line, as received
        self._part_bytes = 0
        self._data: list[bytes] = []
        self._event_bytes = 0
        self.sizes: list[int] = []  # raw byte size of each event returned by the last feed/flush
        self.max_line_bytes = max_line_bytes

    def _too_long(self, size: int, what: str = "line") -> SSELineTooLong:
        return SSELineTooLong(
            f"SSE {what} of {size} bytes exceeds the cap of {self.max_line_bytes} bytes (--max-sse-line-bytes)"
        )

    def _keep_partial(self, piece: bytes) -> None:
        if piece:
            self._parts.append(piece)
            self._part_bytes += len(piece)
            if self._part_bytes > self.max_line_bytes:
                raise self._too_long(self._part_bytes)

    def feed(self, data: bytes) -> list[bytes]:
        if self._parts:
            nl = data.find(b"\n")
            if nl < 0:  # the partial line grows: keep the read, never re-join or re-split
                self._keep_partial(data)
                self.sizes = []
                return []
            self._keep_partial(data[:nl])  # checks the cap before the join
            events = self._complete_partial()
            if nl + 1 < len(data):
                sizes = self.sizes
                events += self.feed(data[nl + 1 :])
                self.sizes = sizes + self.sizes
            return events
        if not self._data and b"\r" not in data:
            n = len(data)
            if (
                data[:6] == b"data: "
                and data.find(b"\n") == n - 2
                and data[n - 1 :] == b"\n"
                and n - 2 <= self.max_line_bytes
            ):
                # exactly one event of one data line: the usual read at token pace (what _feed_fast returns)
                self.sizes = [n]
                return [data[6 : n - 2]]
            return self._feed_fast(data)
        return self._feed_lines(data)

    def _complete_partial(self) -> list[bytes]:
        """The buffered partial line got its newline: one join (a data line's prefix is cut before it)."""
        parts, size = self._parts, self._part_bytes
        self._parts, self._part_bytes = [], 0
        self.sizes = []
        self._event_bytes += size + 1
        if parts[0][:5] != b"data:" or len(parts[0]) < 6:  # a short or non-data line: the general path
            self._event_bytes -= size + 1
            return self._feed_lines(b"".join(parts) + b"\n")
        head = parts[0][5:]
        parts[0] = head[1:] if head[:1] == b" " else head
        value = b"".join(parts)
        if value.endswith(b"\r"):
            value = value[:-1]
        self._data.append(value)
        if self._event_bytes > self.max_line_bytes:
            raise self._too_long(self._event_bytes, "event")
        return []

    def _feed_fast(self, data: bytes) -> list[bytes]:
        """LF-only framing, between events: split on blank lines, one data line each."""
        blocks = data.split(b"\n\n")
        rest = blocks.pop()
        events: list[bytes] = []
        sizes = self.sizes = []
        limit = self.max_line_bytes
        for i, block in enumerate(blocks):
            if block[:6] == b"data: " and b"\n" not in block:
                if len(block) > limit:
                    raise self._too_long(len(block))
                events.append(block[6:])
                sizes.append(len(block) + 2)
            else:  # comments, other fields, multi-line data: the general path from here on
                more = self._feed_lines(b"\n\n".join(blocks[i:]) + b"\n\n" + rest)
                self.sizes = sizes + self.sizes
                return events + more
        if b"\n" in rest:  # complete lines of an event still open: into _data, keep only the partial line
            more = self._feed_lines(rest)
            self.sizes = sizes + self.sizes
            return events + more
        self._keep_partial(rest)
        return events

    def _feed_lines(self, data: bytes) -> list[bytes]:
        lines = data.split(b"\n")
        self._keep_partial(lines.pop())
        limit = self.max_line_bytes
        events: list[bytes] = []
        sizes = self.sizes = []
        for line in lines:
            if len(line) > limit:
                raise self._too_long(len(line))
            self._event_bytes += len(line) + 1
            if line.endswith(b"\r"):
                line = line[:-1]
            if not line:
                if self._data:
                    events.append(self._data[0] if len(self._data) == 1 else b"\n".join(self._data))
                    sizes.append(self._event_bytes)
                    self._data = []
                self._event_bytes = 0
                continue
            if line.startswith(b"data:"):
                value = line[5:]
                if value[:1] == b" ":
                    value = value[1:]
                self._data.append(value)
                if self._event_bytes > limit:
                    raise self._too_long(self._event_bytes, "event")
            # comments, event:, id:, retry: and unknown fields carry nothing we use
        return events

    def flush(self) -> list[bytes]:
        """Events left when the stream ended without a final blank line."""
        events = self.feed(b"\n\n") if (self._parts or self._data) else []
        self._parts, self._part_bytes = [], 0
        return events

    @property
    def pending(self) -> bool:
        """True while a partial line or an undispatched event is buffered."""
        return bool(self._parts or self._data)


def _error_line(err: object) -> tuple[str, int | None]:
    if isinstance(err, dict):
        message = str(err.get("message") or err)
        code = err.get("code")
        code = code if isinstance(code, int) else None
    else:
        message, code = str(err), None
    return " ".join(message.split())[:500], code


def parse_chunk(payload: bytes) -> Chunk:
    """Parse one event payload (not ``[DONE]``) of a chat or text completion stream.

    Raises SSEProtocolError for anything that is not a JSON object with ``choices``, ``usage`` or
    ``error``.
    """
    try:
        obj = _loads(payload)
    except (ValueError, TypeError) as exc:
        raise SSEProtocolError(f"invalid JSON in SSE data: {str(exc)[:120]}") from None
    if type(obj) is not dict:
        raise SSEProtocolError(f"SSE data is a JSON {type(obj).__name__}, expected an object")
    err = obj.get("error")
    if err is not None:
        message, code = _error_line(err)
        return Chunk("", 0, 0, None, None, None, obj.get("model"), None, message, code)
    choices = obj.get("choices")
    usage = obj.get("usage")
    if choices is None and usage is None:
        raise SSEProtocolError("SSE data has neither choices nor usage: not an OpenAI completion chunk")
    text = ""
    pieces = 0
    finish = None
    if choices:
        if type(choices) is not list:
            raise SSEProtocolError("choices is not a list")
        for choice in choices:
            if type(choice) is not dict:
                raise SSEProtocolError("a choice is not an object")
            delta = choice.get("delta")
            if delta is not None:
                piece = delta.get("content") or ""
                if len(delta) == 1 and piece:  # content alone (the usual delta): nothing else to add
                    text = text + piece if text else piece
                    pieces += 1
                    reason = choice.get("finish_reason")
                    if reason is not None:
                        finish = reason
                    continue
                refusal = delta.get("refusal")
                if refusal:
                    piece += refusal
                reasoning = delta.get("reasoning_content") or delta.get("reasoning")
                if reasoning:
                    piece = reasoning + piece
                calls = delta.get("tool_calls")
                if calls:
                    for call in calls:
                        fn = call.get("function") or {}
                        piece += (fn.get("name") or "") + (fn.get("arguments") or "")
            else:
                piece = choice.get("text") or ""
            if piece:
                text = text + piece if text else piece
                pieces += 1
            reason = choice.get("finish_reason")
            if reason is not None:
                finish = reason
    prompt_tokens = completion_tokens = None
    if usage:
        prompt_tokens = usage.get("prompt_tokens")
        completion_tokens = usage.get("completion_tokens")
    return Chunk(
        text,
        pieces,
        len(choices) if choices else 0,
        finish,
        prompt_tokens,
        completion_tokens,
        obj.get("model"),
        obj.get("system_fingerprint"),
        None,
        None,
    )
