"""Server-sent events for OpenAI-style streams: a pure parser, no I/O.

The client stamps each network read with the run clock and hands the bytes here. ``SSEDecoder``
splits bytes into lines and lines into events (``data:`` lines joined until a blank line, per the
SSE spec); ``parse_chunk`` turns one event's JSON into the few fields the recorder needs. Nothing
here allocates per chunk beyond the decoded JSON and one small tuple.
"""

from __future__ import annotations

import json
from typing import NamedTuple

try:  # orjson is ~3x faster on these small objects; optional.
    from orjson import loads as _loads
except ImportError:  # pragma: no cover - depends on the environment
    _loads = json.loads

__all__ = ["SSEDecoder", "SSEProtocolError", "Chunk", "parse_chunk", "DONE"]

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


class SSEDecoder:
    """Bytes → events. ``feed(data)`` returns the list of completed event payloads (``bytes``).

    ``bytes_in_event`` after each payload says how many raw bytes (lines and newlines) formed it.
    Comments (``:``), ``event:``, ``id:`` and ``retry:`` fields are ignored; an unterminated final
    event is returned by ``flush()``.
    """

    __slots__ = ("_tail", "_data", "_event_bytes", "sizes")

    def __init__(self) -> None:
        self._tail = b""
        self._data: list[bytes] = []
        self._event_bytes = 0
        self.sizes: list[int] = []  # raw byte size of each event returned by the last feed/flush

    def feed(self, data: bytes) -> list[bytes]:
        if self._tail:
            data = self._tail + data
        if not self._data and b"\r" not in data:
            # fast path: LF-only framing, between events: split on blank lines, one data line each
            blocks = data.split(b"\n\n")
            rest = blocks.pop()
            events: list[bytes] = []
            sizes = self.sizes = []
            for i, block in enumerate(blocks):
                if block[:6] == b"data: " and b"\n" not in block:
                    events.append(block[6:])
                    sizes.append(len(block) + 2)
                else:  # comments, other fields, multi-line data: the general path from here on
                    self._tail = b""
                    more = self._feed_lines(b"\n\n".join(blocks[i:]) + b"\n\n" + rest)
                    events += more
                    sizes += self.sizes
                    self.sizes = sizes
                    return events
            self._tail = rest
            return events
        return self._feed_lines(data)

    def _feed_lines(self, data: bytes) -> list[bytes]:
        lines = data.split(b"\n")
        self._tail = lines.pop()
        events: list[bytes] = []
        sizes = self.sizes = []
        for line in lines:
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
            # comments, event:, id:, retry: and unknown fields carry nothing we use
        return events

    def flush(self) -> list[bytes]:
        """Events left when the stream ended without a final blank line."""
        events = self.feed(b"\n\n") if (self._tail or self._data) else []
        self._tail = b""
        return events

    @property
    def pending(self) -> bool:
        """True while a partial line or an undispatched event is buffered."""
        return bool(self._tail or self._data)


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
        text, pieces, len(choices) if choices else 0, finish, prompt_tokens, completion_tokens,
        obj.get("model"), obj.get("system_fingerprint"), None, None,
    )
