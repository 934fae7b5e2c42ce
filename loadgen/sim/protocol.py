"""OpenAI wire format of the simulated engine: filler text and SSE events, shared by both faces.

Output text is filler words that encode to exactly one cl100k_base token each, so a chunk of k
tokens is k words; the worksheet uses the same byte arithmetic as the live server to fill
``chunks.bytes`` without formatting millions of events.
"""

from __future__ import annotations

import functools
import json
from typing import Any

import numpy as np

__all__ = [
    "FILLER_WORDS",
    "filler_text",
    "filler_bytes",
    "StreamFormat",
    "request_id_for",
    "ID_HEX_CHARS",
    "TOOL_NAME",
    "tool_call_piece",
]

#: One cl100k_base token each, also when concatenated (checked by tests).
FILLER_WORDS = (
    " the",
    " of",
    " and",
    " to",
    " in",
    " is",
    " was",
    " for",
    " on",
    " that",
    " with",
    " as",
    " by",
    " at",
    " from",
    " it",
)
_LENS = np.array([len(w) for w in FILLER_WORDS], dtype=np.int64)
_CUM = np.concatenate([[0], np.cumsum(_LENS)])
_CYCLE = int(_CUM[-1])
_L = len(FILLER_WORDS)
#: Hex digits after the id prefix (``cmpl-`` / ``chatcmpl-``); fixed so event sizes are fixed.
ID_HEX_CHARS = 24


def filler_text(start: int, count: int, width: int = 0) -> str:
    """Text of output tokens ``start .. start+count-1``: filler words (one cl100k_base token each), or with
    ``width`` (an engine counting ``chars:N``) each word cut or padded to exactly ``width`` characters, so a
    client counting the stream with the engine's tokenizer counts the tokens the engine reports."""
    words = _widths(width) if width else FILLER_WORDS
    return "".join(words[(start + j) % _L] for j in range(count))


@functools.cache  # per chunk on the server's hot path: built once per width
def _widths(width: int) -> tuple[str, ...]:
    return tuple((w + "_" * width)[:width] for w in FILLER_WORDS)


def filler_bytes(start: np.ndarray, count: np.ndarray) -> np.ndarray:
    """Byte length of filler_text(start, count), vectorised (ASCII: no JSON escaping)."""

    def cum(n: np.ndarray) -> np.ndarray:
        return (n // _L) * _CYCLE + _CUM[n % _L]

    return cum(start + count) - cum(start)


def token_bytes(start: np.ndarray) -> np.ndarray:
    """``filler_bytes(start, 1)``: the byte length of output token ``start`` (one lookup)."""
    return _LENS[start % _L]


#: The simulated engine's tool call: this function name (one token), then JSON arguments ``{"q":"..."}`` whose
#: pieces are one cl100k_base token each (checked by tests), so a tool call of N tokens is N deltas.
TOOL_NAME = "lookup"
_TINY_ARGUMENTS = ((), ("{}",), ("{", "}"), ("{", " ", "}"))  # valid JSON in 0..3 tokens
_ARGS_OPEN = ('{"', "q", '":"')
_ARGS_CLOSE = '"}'


def tool_call_piece(j: int, count: int) -> str:
    """Token ``j`` (0-based) of a ``count``-token tool call: the name, then the arguments' pieces (joined, they
    are a JSON object: ``{}`` up to ``{"q":"<filler>"}``)."""
    if j == 0:
        return TOOL_NAME
    k, a = count - 1, j - 1  # argument tokens, and this one's place among them
    if k < len(_TINY_ARGUMENTS):
        return _TINY_ARGUMENTS[k][a]
    if a < len(_ARGS_OPEN):
        return _ARGS_OPEN[a]
    return _ARGS_CLOSE if a == k - 1 else FILLER_WORDS[(a - len(_ARGS_OPEN)) % _L]


def request_id_for(kind: str, number: int) -> str:
    """Deterministic response id (``cmpl-`` or ``chatcmpl-`` + 24 hex digits)."""
    prefix = "chatcmpl-" if kind == "chat" else "cmpl-"
    return f"{prefix}{number:0{ID_HEX_CHARS}x}"


class StreamFormat:
    """Pre-rendered SSE event pieces for one response (completions or chat)."""

    __slots__ = (
        "kind",
        "head",
        "reasoning_head",
        "tool_head",
        "content_tail",
        "obj",
        "rid",
        "created",
        "model",
        "fingerprint",
        "_base",
    )

    def __init__(self, kind: str, rid: str, created: int, model: str, fingerprint: str | None = None) -> None:
        self.kind = kind
        self.rid = rid
        self.created = created
        self.model = model
        self.fingerprint = fingerprint
        self.obj = "chat.completion.chunk" if kind == "chat" else "text_completion"
        fp = f',"system_fingerprint":{json.dumps(fingerprint)}' if fingerprint else ""
        base = f'{{"id":"{rid}","object":"{self.obj}","created":{created},"model":{json.dumps(model)}{fp},'
        self._base = base
        self.reasoning_head = ("data: " + base + '"choices":[{"index":0,"delta":{"reasoning_content":').encode()
        self.tool_head = ("data: " + base + '"choices":[{"index":0,"delta":{"tool_calls":[').encode()
        if kind == "chat":
            self.head = ("data: " + base + '"choices":[{"index":0,"delta":{"content":').encode()
        else:
            self.head = ("data: " + base + '"choices":[{"index":0,"text":').encode()
        tail = (
            '},"logprobs":null,"finish_reason":null}]}\n\n'
            if kind == "chat"
            else ',"logprobs":null,"finish_reason":null}]}\n\n'
        )
        self.content_tail = tail.encode()

    def content(self, text: str) -> bytes:
        """A content event; ``text`` must be plain ASCII filler (no escaping needed)."""
        return self.head + b'"' + text.encode() + b'"' + self.content_tail

    def reasoning(self, text: str) -> bytes:
        """A chat reasoning event (``delta.reasoning_content``); ``text`` plain ASCII filler."""
        return self.reasoning_head + b'"' + text.encode() + b'"' + self.content_tail

    def tool_call(self, j: int, count: int) -> bytes:
        """Chat event for token ``j`` of a ``count``-token tool call (``tool_call_piece``): the first names the
        function (with the call's id and empty arguments, as OpenAI and vLLM stream it), the rest carry
        arguments."""
        piece = json.dumps(tool_call_piece(j, count))
        if j == 0:
            call = (
                f'{{"index":0,"id":"call_{self.rid[-ID_HEX_CHARS:]}","type":"function",'
                f'"function":{{"name":{piece},"arguments":""}}}}'
            )
        else:
            call = f'{{"index":0,"function":{{"arguments":{piece}}}}}'
        return self.tool_head + call.encode() + b"]" + self.content_tail

    def content_any(self, text: str) -> bytes:
        """A content event for arbitrary text (JSON-escaped; contract answers)."""
        return self.head + json.dumps(text).encode() + self.content_tail

    def content_overhead(self) -> int:
        """Bytes of a content event besides the text itself."""
        return len(self.head) + 2 + len(self.content_tail)

    def role(self) -> bytes:
        """Chat's first event: the assistant role with empty content (as OpenAI sends)."""
        return (
            "data: " + self._base + '"choices":[{"index":0,"delta":{"role":"assistant","content":""},'
            '"logprobs":null,"finish_reason":null}]}\n\n'
        ).encode()

    def finish(self, reason: str) -> bytes:
        if self.kind == "chat":
            body = f'"choices":[{{"index":0,"delta":{{}},"logprobs":null,"finish_reason":"{reason}"}}]}}'
        else:
            body = f'"choices":[{{"index":0,"text":"","logprobs":null,"finish_reason":"{reason}"}}]}}'
        return ("data: " + self._base + body + "\n\n").encode()

    def usage(
        self,
        prompt_tokens: int,
        completion_tokens: int,
        cached_tokens: int | None = None,
        reasoning_tokens: int | None = None,
    ) -> bytes:
        usage = usage_dict(prompt_tokens, completion_tokens, cached_tokens)
        if reasoning_tokens:
            usage["completion_tokens_details"] = {"reasoning_tokens": reasoning_tokens}
        return (
            "data: " + self._base + '"choices":[],"usage":' + json.dumps(usage, separators=(",", ":")) + "}\n\n"
        ).encode()

    def malformed(self) -> bytes:
        """A broken event: truncated JSON, as a buggy proxy might cut it."""
        return ("data: " + self._base + '"choices":[{"index":0,').encode() + b"\n\n"

    def full_response(
        self,
        text: str,
        reason: str,
        prompt_tokens: int,
        completion_tokens: int,
        cached_tokens: int | None = None,
        tool_arguments: str | None = None,
    ) -> dict[str, Any]:
        """The non-streaming response body; ``tool_arguments`` (chat): the message ends in a ``TOOL_NAME`` call
        with these arguments."""
        body: dict[str, Any] = {
            "id": self.rid,
            "object": "chat.completion" if self.kind == "chat" else "text_completion",
            "created": self.created,
            "model": self.model,
        }
        if self.fingerprint:
            body["system_fingerprint"] = self.fingerprint
        if self.kind == "chat":
            message: dict[str, Any] = {"role": "assistant", "content": text}
            if tool_arguments is not None:
                function = {"name": TOOL_NAME, "arguments": tool_arguments}
                message["tool_calls"] = [
                    {"id": f"call_{self.rid[-ID_HEX_CHARS:]}", "type": "function", "function": function}
                ]
            choice = {"index": 0, "message": message, "logprobs": None, "finish_reason": reason}
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": reason}
        body["choices"] = [choice]
        body["usage"] = usage_dict(prompt_tokens, completion_tokens, cached_tokens)
        return body


def usage_dict(prompt_tokens: int, completion_tokens: int, cached_tokens: int | None = None) -> dict[str, Any]:
    usage: dict[str, Any] = {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }
    if cached_tokens is not None:
        usage["prompt_tokens_details"] = {"cached_tokens": cached_tokens}
    return usage


DONE = b"data: [DONE]\n\n"
