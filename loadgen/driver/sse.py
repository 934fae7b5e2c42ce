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
    """What one streamed completion chunk says; None where the chunk is silent.

    Reasoning (``reasoning_content`` or ``reasoning`` in a chat delta, as vLLM's reasoning parsers and hosted
    reasoning models emit it) is kept apart from the answer (content, refusal, tool calls, completion text).
    """

    text: str  # the answer text (content/text/refusal/tool-call name and arguments) of every choice, concatenated
    reasoning: str  # the reasoning text of every choice, concatenated
    pieces: int  # how many choices carried non-empty text of either kind
    choices: int  # how many choices the chunk has (0 for a usage-only chunk)
    finish_reason: str | None  # last non-null finish_reason among the choices
    prompt_tokens: int | None  # usage.prompt_tokens
    completion_tokens: int | None  # usage.completion_tokens (cumulative with continuous usage stats)
    reasoning_tokens: int | None  # usage.completion_tokens_details.reasoning_tokens
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
        payload = self.single(data)
        if payload is not None:
            self.sizes = [len(data)]
            return [payload]
        if not self._data and b"\r" not in data:
            return self._feed_fast(data)
        return self._feed_lines(data)

    def single(self, data: bytes) -> bytes | None:
        """The payload when ``data`` is exactly one event of one ``data: `` line (LF-framed) and nothing is
        buffered: the usual read at token pace, what ``feed`` would return alone; else None (call ``feed``).

        A CR inside the line stays in the payload on every path (only LF ends a line here); a CR before
        the final LFs is left to the general path, which strips it."""
        if data.startswith(b"data: ") and data.endswith(b"\n\n") and not (self._parts or self._data):
            n = len(data) - 2
            if data.find(b"\n", 6, n) < 0 and data[n - 1] != 13 and n <= self.max_line_bytes:
                return data[6:n]
        return None

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


_chunk = tuple.__new__  # Chunk(...) without the generated __new__ (the hot path's one allocation)


def _text_field(name: str, value: object) -> str | None:
    """A chunk field recorded in a string column (finish_reason, model, system_fingerprint): a string or absent.

    Anything else (``"model": 123``, ``"finish_reason": ["stop"]``) fails this request as malformed, naming the
    field and value; it never reaches a typed column.
    """
    if value is None or type(value) is str:
        return value
    shown = json.dumps(value, default=str)[:60]
    raise SSEProtocolError(f"{name} = {shown} ({type(value).__name__}): expected a string or null")


def _count(value: object) -> bool:
    """A usage count the stream may carry: absent (None) or a whole number (not a bool) in 0 .. 2^31-1."""
    return value is None or (type(value) is int and 0 <= value < 1 << 31)


def _choice_text(choice: dict) -> tuple[str, str]:
    """(answer, reasoning) text one choice carries: a delta's content, refusal and tool calls, or ``text``;
    and a delta's ``reasoning_content`` or ``reasoning``."""
    delta = choice.get("delta")
    if delta is None:
        return choice.get("text") or "", ""
    piece = delta.get("content") or ""
    if piece and len(delta) == 1:  # content alone: the usual delta
        return piece, ""
    refusal = delta.get("refusal")
    if refusal:
        piece += refusal
    reasoning = delta.get("reasoning_content") or delta.get("reasoning") or ""
    calls = delta.get("tool_calls")
    if calls:
        for call in calls:
            fn = call.get("function") or {}
            piece += (fn.get("name") or "") + (fn.get("arguments") or "")
    return piece, reasoning


def _reasoning_count(usage: dict) -> int | None:
    """usage.completion_tokens_details.reasoning_tokens, when the server reports it."""
    details = usage.get("completion_tokens_details")
    if type(details) is not dict:
        return None
    value = details.get("reasoning_tokens")
    if not _count(value):
        raise SSEProtocolError("usage reasoning token count is not a whole number in 0 .. 2^31-1")
    return value


def parse_chunk(payload: bytes) -> Chunk:
    """Parse one event payload (not ``[DONE]``) of a chat or text completion stream.

    Raises SSEProtocolError for anything that is not a JSON object with ``choices``, ``usage`` or
    ``error``, or whose fields have the wrong types.
    """
    try:
        obj = _loads(payload)
    except (ValueError, TypeError, RecursionError) as exc:
        raise SSEProtocolError(f"invalid JSON in SSE data: {str(exc)[:120]}") from None
    if type(obj) is not dict:
        raise SSEProtocolError(f"SSE data is a JSON {type(obj).__name__}, expected an object")
    get = obj.get
    choices = get("choices")
    if type(choices) is list and len(choices) == 1 and "error" not in obj:
        # one choice whose text is plain: most chunks of most streams, read without the general walk
        # below (``chunk_from_object``, which gives the same Chunk for them)
        choice = choices[0]
        if type(choice) is dict:
            delta = choice.get("delta")
            text = (
                choice.get("text")
                if delta is None
                else delta.get("content")
                if type(delta) is dict and len(delta) == 1
                else None
            )
            if type(text) is str and text:
                usage = get("usage")
                if usage is None or (type(usage) is dict and not usage):
                    prompt = completion = None
                elif type(usage) is dict and usage.get("completion_tokens_details") is None:
                    prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens")
                    if not (_count(prompt) and _count(completion)):
                        return chunk_from_object(obj)
                else:
                    return chunk_from_object(obj)
                reason = choice.get("finish_reason")
                model, fingerprint = get("model"), get("system_fingerprint")
                if (
                    (reason is None or type(reason) is str)
                    and (model is None or type(model) is str)
                    and (fingerprint is None or type(fingerprint) is str)
                ):
                    return _chunk(
                        Chunk, (text, "", 1, 1, reason, prompt, completion, None, model, fingerprint, None, None)
                    )
    return chunk_from_object(obj)


def chunk_from_object(obj: dict) -> Chunk:
    """The Chunk of one decoded event object (the general walk: every choice, delta kind and error)."""
    try:
        return _walk(obj)
    except (AttributeError, TypeError):  # a field of the wrong type (a delta that is a list, ...)
        raise SSEProtocolError("SSE data has a field of an unexpected type: not an OpenAI completion chunk") from None
    except RecursionError:  # a value nested ~1000 deep (orjson parses to 1024) shown or joined by the walk
        raise SSEProtocolError("SSE data has a value nested too deep: not an OpenAI completion chunk") from None


def _walk(obj: dict) -> Chunk:
    get = obj.get
    err = get("error")
    if err is not None:
        message, code = _error_line(err)
        return _chunk(
            Chunk, ("", "", 0, 0, None, None, None, None, _text_field("model", get("model")), None, message, code)
        )
    choices = get("choices")
    usage = get("usage")
    if choices is None and usage is None:
        raise SSEProtocolError("SSE data has neither choices nor usage: not an OpenAI completion chunk")
    text = reasoning = ""
    pieces = 0
    finish = None
    if choices:
        if type(choices) is not list:
            raise SSEProtocolError("choices is not a list")
        for choice in choices:
            if type(choice) is not dict:
                raise SSEProtocolError("a choice is not an object")
            piece, thought = _choice_text(choice)
            if type(piece) is not str or type(thought) is not str:
                raise SSEProtocolError("a choice's text is not a string")
            if piece or thought:
                text += piece
                reasoning += thought
                pieces += 1
            reason = choice.get("finish_reason")
            if reason is not None:
                finish = _text_field("finish_reason", reason)
    prompt_tokens = completion_tokens = reasoning_tokens = None
    if usage:
        prompt_tokens = usage.get("prompt_tokens")
        completion_tokens = usage.get("completion_tokens")
        if not (_count(prompt_tokens) and _count(completion_tokens)):
            raise SSEProtocolError("usage token counts are not whole numbers in 0 .. 2^31-1")
        reasoning_tokens = _reasoning_count(usage)
    return _chunk(
        Chunk,
        (
            text,
            reasoning,
            pieces,
            len(choices) if choices else 0,
            finish,
            prompt_tokens,
            completion_tokens,
            reasoning_tokens,
            _text_field("model", get("model")),
            _text_field("system_fingerprint", get("system_fingerprint")),
            None,
            None,
        ),
    )
