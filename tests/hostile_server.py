"""A misbehaving OpenAI-compatible server, as a real process over loopback (issue 34): one behaviour per run.

Each behaviour is one way a server (or something in front of it) has been seen to misbehave. ``ok`` is the
well-behaved baseline every other behaviour departs from in one respect:

- ``ok``: ``/version``, ``/v1/models`` (model ``hostile-model``), 404 on ``/metrics`` and ``/tokenize``; a POST
  streams ``min(max_tokens, 8)`` one-token chunks (chunked, ``finish_reason`` "length" on the last, usage),
  a usage-only event, ``[DONE]`` and the chunked terminator;
- ``bad-field-types``: every third POST's last chunk carries a field of an unexpected type, in turn
  ``"model": 123``, ``"finish_reason": 7``, ``"finish_reason": ["stop"]``, ``"system_fingerprint": {}``;
- ``hang``: accepts every connection, reads, never answers; ``hang-version``, ``hang-models``,
  ``hang-metrics``, ``hang-tokenize``: only that path never answers (``/metrics`` and ``/tokenize`` then exist);
- ``done-fin`` / ``done-rst``: the stream delivers ``[DONE]``, then the connection is closed (FIN / RST)
  without the chunked terminator;
- ``models-null`` / ``models-int``: ``/v1/models`` answers ``{"data": null}`` / ``{"data": 5}``;
- ``version-huge``: ``/version`` is a 300 MB JSON body;
- ``echo``: ``/version``, ``/metrics`` (as the labels of one sample) and error bodies echo every request
  header back; a POST answers 401 with the
  credential (``x-api-key``, else ``authorization``) placed across the 400th character of the body;
- ``echo-fields``: a POST streams as ``ok`` does, with the request's headers in every chunk: its
  Authorization in ``model`` (the usage event's too), its X-Api-Key in ``system_fingerprint`` and in the text;
- ``retry-after-nan``: a POST answers 429 with ``Retry-After: nan``;
- ``gzip``: the stream is sent ``content-encoding: gzip``;
- ``answer-huge``: every POST answers a 300 MB JSON body (as ``version-huge`` does for ``/version``);
- ``trickle-reset``: ``POST /reset_prefix_cache`` answers 200 and then a body of one byte every 0.2 s that
  never ends (every other behaviour answers it 404);
- ``echo-all``: every answer echoes the request's Authorization (and, for Basic, the decoded ``user:password``)
  and its target (path and query) in every place a server can: response headers, ``/version``, ``/v1/models``
  (``owned_by``, ``root``), ``/metrics`` (a label and a ``# HELP`` line), 404 bodies, and POSTs in turn: a
  stream with the echo in SSE comments and in ``model``, ``system_fingerprint`` and the text; a 500 JSON error;
  a 307 whose ``Location`` carries the key as ``?api_key=``; a 400 plain-text error;
- the stream behaviours (``STREAM_BEHAVIOURS``; probes answer as ``ok``): ``hang-completions`` (a POST is read,
  never answered), ``head-only`` (a 200 head, then nothing), ``slowloris`` (the first event one byte a second),
  ``comments-forever`` (``: keep-alive`` every 0.1 s), ``flood`` (``{"choices": []}`` events as fast as read),
  ``no-done-open`` (every token and the finish, then silence on an open connection), ``done-then-more`` (a
  token and a second ``[DONE]`` after the first), ``close-mid-chunk``, ``json-body`` (a 200 JSON completion),
  ``huge-line`` (100 MiB of one line; the bytes sent are recorded), ``huge-head`` (4 MiB of headers),
  ``bad-utf8``, ``odd-chunks`` (``choices: []``, null texts, usage-only, before the tokens), ``finish-abort`` (two
  tokens, then ``finish_reason: "abort"``), ``retry-after-huge``/``-negative``/``-garbage`` (429), ``redirect-loop``
  (307 to itself), ``interim-1xx`` (100 and 103 before the answer), ``interim-forever``, ``deflate``,
  ``unsolicited`` (50 ms after each answer, a second one nobody asked for), ``reset-every-3rd`` (every third POST
  read, then RST), ``die-after-5`` (the process exits at the 6th POST), ``models-garbage``/``version-garbage``
  (that probe answers HTML), ``echo-encoded`` (the credential said back base64-, base64url- and
  percent-encoded, in turn in a 401 body, a stream's ``model`` and an SSE error event), ``continue-flood``
  (``100 Continue`` heads as fast as read), ``close-after-head``, ``length-short`` (Content-Length half the
  body, then close), ``length-long`` (Content-Length 1 MiB over the body, then close), ``odd-values`` (the n-th
  POST's last chunk, or its JSON answer when it asks for no stream, carries ``ODD_VALUES[n]``: values of the
  wrong type, out of range, huge or nested 1000 deep), ``echo-escaped`` (a 401 that says the key
  ``\\u``-escaped, ``/`` as ``\\/`` and upper-cased in its body, as sent in ``www-authenticate`` and
  ``set-cookie``), ``echo-cut`` (the key across the 500th character of an in-stream error and across the 60th
  of an object ``model`` and a list ``system_fingerprint``), ``tls-answer`` (a TLS alert, then the close), ``h2-answer`` (an HTTP/2 SETTINGS frame, then
  silence), ``never-read`` (a POST's head is read, its body never, nor is it answered),
  ``huge-text`` (events of 256 KiB of text, no two alike, as fast as read), ``trickle`` (a 200 whose
  Content-Length body, a JSON completion, is sent one byte every 0.5 s), ``long-stream`` (``LONG_STREAM_EVENTS``
  one-token events, about 14 MiB, then ``[DONE]``: under the contract replay's 16 MiB read cap);
- the ``/metrics`` behaviours (``METRICS_BEHAVIOURS``; everything else as ``ok``): ``metrics-gzip`` (gzip
  whenever the scrape accepts it, as prometheus_client does), ``metrics-huge`` (15 MiB: about a million
  samples), ``metrics-endless`` (a sample a second, never the end), ``metrics-garbage`` (NULs, invalid UTF-8,
  an 8 MiB line, then one good sample), ``metrics-trickle`` (a Content-Length answer sent one byte a second);
- ``models-echo``: ``/v1/models`` lists one model whose id and owner are the request's credential and target
  (as ``echo-all`` says them); ``models-many``: it lists 5,000 models of 150-character ids; ``models-odd-len``:
  its ``max_model_len`` is, in turn, ``"4096 tokens"``, ``[4096]``, -4096, 1e30 and ``true``;
- ``detokenize-odd``: ``/tokenize`` counts words, ``/detokenize`` answers a prompt that is a list;
  ``tokenize-trickle``: ``/tokenize`` answers a head that never ends, one byte every 0.5 s;
- ``sim-tokenizer``: ``/version`` claims to be loadgen's simulated engine counting with
  ``hf:<this file>`` (a local path that is no tokenizer.json).

``--record FILE`` appends one JSON line per request (method, target with its query string, headers, the
sha256 of the prompt and its last 60 characters, the variant answered) and, for ``version-huge``, the bytes written before the client
left. A behaviour that needs a request to be told apart uses the prompt's sha256 (the run's
``prompt_sha256`` column).

    python tests/hostile_server.py --behaviour done-fin --port 0      # prints "hostile listening on URL"

Tests use ``hostile_server(behaviour)``: a context manager that starts the process and yields its URL.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import gzip
import hashlib
import itertools
import json
import os
import signal
import socket
import struct
import subprocess
import sys
import urllib.parse
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

__all__ = ["BEHAVIOURS", "BAD_FIELDS", "METRICS_BEHAVIOURS", "HostileServer", "MODEL", "hostile_server", "read_record"]

MODEL = "hostile-model"
#: Behaviours of the POST answer alone (probes answer as ``ok``): ``_odd_post`` plays each.
STREAM_BEHAVIOURS = (
    "hang-completions",
    "head-only",
    "slowloris",
    "comments-forever",
    "no-done-open",
    "done-then-more",
    "close-mid-chunk",
    "json-body",
    "huge-line",
    "huge-head",
    "bad-utf8",
    "odd-chunks",
    "finish-abort",
    "retry-after-huge",
    "retry-after-negative",
    "retry-after-garbage",
    "redirect-loop",
    "interim-1xx",
    "interim-forever",
    "deflate",
    "reset-every-3rd",
    "die-after-5",
    "models-garbage",
    "version-garbage",
    "flood",
    "unsolicited",
    "echo-encoded",
    "continue-flood",
    "close-after-head",
    "length-short",
    "length-long",
    "odd-values",
    "echo-escaped",
    "echo-cut",
    "tls-answer",
    "h2-answer",
    "never-read",
    "huge-text",
    "trickle",
    "long-stream",
)
#: Stream behaviours whose POST answers are ``ok`` ones (what they change is elsewhere).
_OK_POST = ("reset-every-3rd", "die-after-5", "models-garbage", "version-garbage")
#: Behaviours of ``GET /metrics`` alone (everything else answers as ``ok``): ``_metrics`` plays each.
METRICS_BEHAVIOURS = ("metrics-gzip", "metrics-huge", "metrics-endless", "metrics-garbage", "metrics-trickle")
#: ``metrics-huge``: bytes of one /metrics answer (under the scrape's 16 MiB read cap), ~1 million samples.
HUGE_METRICS_BYTES = 15 << 20
BEHAVIOURS = (
    "ok",
    "bad-field-types",
    "hang",
    "hang-version",
    "hang-models",
    "hang-metrics",
    "hang-tokenize",
    "done-fin",
    "done-rst",
    "models-null",
    "models-int",
    "version-huge",
    "echo",
    "retry-after-nan",
    "gzip",
    "sim-tokenizer",
    "trickle-reset",
    "answer-huge",
    "echo-fields",
    "echo-all",
    "models-echo",
    "models-many",
    "models-odd-len",
    "detokenize-odd",
    "tokenize-trickle",
    *METRICS_BEHAVIOURS,
    *STREAM_BEHAVIOURS,
)
#: ``bad-field-types``: the fields put on the last chunk of every third POST, in turn.
BAD_FIELDS: tuple[dict[str, object], ...] = (
    {"model": 123},
    {"finish_reason": 7},
    {"finish_reason": ["stop"]},
    {"system_fingerprint": {}},
)
#: ``odd-values``: what the last chunk (or the whole JSON answer, when the request asks for no stream) of the
#: n-th POST carries, in turn: well-formed JSON whose values are of the wrong type, out of range, huge or deep.
_ODD_TURN = itertools.count()
DEEP = 1000  # nesting levels of a deep value (orjson parses up to 1024; Python's recursion limit is 1000)
ODD_VALUES: tuple[tuple[str, dict[str, object]], ...] = (
    ("model-deep", {"model": {"DEEP": None}}),
    ("finish-deep", {"choices": [{"index": 0, "text": " the", "finish_reason": {"DEEP": None}}]}),
    ("error-deep", {"error": {"message": {"DEEP": None}, "code": 500}}),
    ("delta-list", {"choices": [{"index": 0, "delta": ["the"], "finish_reason": "length"}]}),
    ("tool-calls-string", {"choices": [{"index": 0, "delta": {"tool_calls": "x"}, "finish_reason": "length"}]}),
    ("reasoning-int", {"choices": [{"index": 0, "delta": {"reasoning_content": 5}, "finish_reason": "length"}]}),
    ("choice-int", {"choices": [5]}),
    ("text-int", {"choices": [{"index": 0, "text": 7, "finish_reason": "length"}]}),
    ("usage-list", {"usage": [5, 8]}),
    ("usage-negative", {"usage": {"prompt_tokens": -1, "completion_tokens": 8}}),
    ("usage-2^63", {"usage": {"prompt_tokens": 2**63, "completion_tokens": 8}}),
    ("created-string", {"created": "yesterday"}),
    ("usage-float", {"usage": {"prompt_tokens": 5, "completion_tokens": 1.5}}),
    ("usage-string", {"usage": {"prompt_tokens": "5", "completion_tokens": 8}}),
    ("usage-bool", {"usage": {"prompt_tokens": 5, "completion_tokens": True}}),
    ("usage-1e30", {"usage": {"prompt_tokens": 5, "completion_tokens": 1e30}}),
    ("id-2MiB", {"id": "i" * (2 << 20)}),
    ("logprobs-monster", {"logprobs": {"content": [{"token": "t", "logprob": -1.0, "top_logprobs": [{}] * 99}] * 900}}),
)
#: Behaviours whose every POST answer is that behaviour (the record's ``variant``).
_POST_VARIANTS = ("echo", "echo-all", "retry-after-nan", "gzip", "done-fin", "done-rst", "answer-huge")
HUGE_VERSION_BYTES = 300 * 1024 * 1024
#: ``long-stream``: one-token events in one answer (~165 bytes each: about 14 MiB).
LONG_STREAM_EVENTS = 90_000
MAX_TOKENS = 8


def _event(obj: object) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


def _stream_events(
    tokens: int, bad: dict[str, object] | None = None, echo: dict[str, str] | None = None
) -> list[bytes]:
    """One chunk per token (the last with finish_reason "length"), a usage-only event, [DONE]. ``echo``: the
    request's headers, put in every chunk's model (Authorization), fingerprint and text (X-Api-Key)."""
    events = []
    for i in range(tokens):
        last = i == tokens - 1
        chunk: dict[str, object] = {
            "id": "cmpl-hostile",
            "object": "text_completion",
            "model": MODEL if echo is None else f"echo {echo.get('authorization', '')}",
            "system_fingerprint": "fp-hostile" if echo is None else echo.get("x-api-key", ""),
            "choices": [{"index": 0, "text": " the", "finish_reason": "length" if last else None}],
        }
        if echo is not None:
            chunk["choices"][0]["text"] = f" said {echo.get('x-api-key', '')}"  # type: ignore[index]
        if last and bad:
            if "finish_reason" in bad:
                chunk["choices"][0]["finish_reason"] = bad["finish_reason"]  # type: ignore[index]
            else:
                chunk.update(bad)
        events.append(_event(chunk))
    usage = {"prompt_tokens": 5, "completion_tokens": tokens, "total_tokens": 5 + tokens}
    model = MODEL if echo is None else f"echo {echo.get('authorization', '')}"
    events.append(
        _event({"id": "cmpl-hostile", "object": "text_completion", "model": model, "choices": [], "usage": usage})
    )
    events.append(b"data: [DONE]\n\n")
    return events


def _echo_text(request: _Request) -> str:
    """What ``echo-all`` says back: the request's Authorization (Basic decoded too) and its target."""
    auth = request.headers.get("authorization", "")
    said = f"auth={auth} target={request.target}"
    if auth.lower().startswith("basic "):
        with contextlib.suppress(ValueError):
            said += " basic=" + base64.b64decode(auth[6:]).decode("utf-8", "replace")
    return said


def _echo_headers(request: _Request) -> bytes:
    auth = request.headers.get("authorization", "")
    return f"x-echo-authorization: {auth}\r\nx-echo-target: {request.target}\r\n".encode("latin-1", "replace")


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


@dataclass
class _Request:
    method: str
    target: str
    headers: dict[str, str]
    body: bytes


class _Server:
    def __init__(self, behaviour: str, record: Path | None) -> None:
        self.behaviour = behaviour
        self.record = record
        self.posts = 0
        self.posts_read = 0

    def log(self, entry: dict[str, object]) -> None:
        if self.record is not None:
            with self.record.open("a") as f:
                f.write(json.dumps(entry) + "\n")

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                request = await _read_request(reader, unread_posts=self.behaviour == "never-read")
                if request is None:
                    return
                if self.behaviour == "reset-every-3rd" and request.method == "POST":
                    self.posts_read += 1  # (every POST read, the reset ones too)
                if self.behaviour == "reset-every-3rd" and request.method == "POST" and self.posts_read % 3 == 0:
                    # the request read, then RST: no answer at all
                    sock = writer.get_extra_info("socket")
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    return
                if not await self.answer(request, writer):
                    return
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            pass
        finally:
            with contextlib.suppress(Exception):
                writer.close()

    async def answer(self, request: _Request, writer: asyncio.StreamWriter) -> bool:
        """Answer one request; False when the connection is to be closed (or was)."""
        path = request.target.split("?", 1)[0]
        prompt = _prompt(request.body)
        behaviour = self.behaviour
        if behaviour == "hang" or behaviour == "hang-" + path.rsplit("/", 1)[-1]:
            self.log({"method": request.method, "target": request.target, "variant": "hang"})
            await asyncio.Event().wait()  # never answers (the client's close ends the task)
        if path == "/reset_prefix_cache":
            self.log({"method": request.method, "target": request.target, "variant": behaviour})
            await self.reset(writer)
            return False
        bad = None
        if request.method == "GET" or path.endswith("tokenize"):  # /tokenize and /detokenize: no POST counted
            variant = "version-huge" if behaviour == "version-huge" and path == "/version" else "ok"
        else:
            self.posts += 1
            if behaviour == "bad-field-types" and self.posts % 3 == 0:
                bad = BAD_FIELDS[(self.posts // 3 - 1) % len(BAD_FIELDS)]
            variant = "bad:" + json.dumps(bad) if bad else behaviour if behaviour in _POST_VARIANTS else "ok"
        # recorded before any byte of the answer: a client that has its answer finds its request recorded
        self.log(
            {
                "method": request.method,
                "target": request.target,
                "headers": request.headers,
                "prompt_sha256": hashlib.sha256(prompt.encode()).hexdigest() if prompt is not None else None,
                "prompt_tail": prompt[-60:] if prompt is not None else None,
                "variant": variant,
            }
        )
        if behaviour == "echo-all":
            await self.echo_all(path, request, writer)
        elif request.method == "GET" or path.endswith("tokenize"):
            await self.get(path, request, writer)
        elif behaviour == "die-after-5" and self.posts > 5:
            os._exit(0)  # the server dies: every open connection goes with it
        elif behaviour in STREAM_BEHAVIOURS and behaviour not in _OK_POST:
            keep = await _odd_post(behaviour, request, writer, self.log)
            await writer.drain()
            return keep
        else:
            await self.post(request, writer, bad)
        await writer.drain()
        return variant not in ("done-fin", "done-rst", "version-huge", "answer-huge")

    async def get(self, path: str, request: _Request, writer: asyncio.StreamWriter) -> str:
        behaviour = self.behaviour
        if path == "/version" and behaviour != "version-garbage":
            if behaviour == "version-huge":
                await self.huge(writer, "GET", "/version")
                return "version-huge"
            body: object = {"version": "hostile-1"}
            if behaviour == "echo":
                body = {"version": "hostile-1", "headers": request.headers}
            elif behaviour == "sim-tokenizer":
                body = {"engine": "loadgen-sim", "version": "hostile-1", "tokenizer": f"hf:{Path(__file__).resolve()}"}
            _respond(writer, 200, json.dumps(body).encode())
        elif path in ("/version", "/v1/models") and behaviour == path.rsplit("/", 1)[-1] + "-garbage":
            _respond(writer, 200, b"\xff\xfe<html>not json", "text/html")
        elif path == "/v1/models":
            data: object = [{"id": MODEL, "object": "model", "owned_by": "hostile"}]
            if behaviour in ("models-null", "models-int"):
                data = None if behaviour == "models-null" else 5
            elif behaviour == "models-echo":  # the served model's id is the request's credential and target
                data = [{"id": _echo_text(request), "object": "model", "owned_by": _echo_text(request)}]
            elif behaviour == "models-odd-len":  # a max_model_len that is no count, in turn
                odd: list[object] = ["4096 tokens", [4096], -4096, 1e30, True]
                data = [{"id": MODEL, "object": "model", "max_model_len": odd[next(_ODD_TURN) % len(odd)]}]
            elif behaviour == "models-many":  # 5,000 models, each id 150 characters, under the 1 MiB read cap
                data = [{"id": f"m{i:05d}-" + "x" * 143, "object": "model"} for i in range(5000)]
            _respond(writer, 200, json.dumps({"object": "list", "data": data}).encode())
        elif path == "/metrics" and behaviour == "echo":
            shown = ",".join(f"{k.replace('-', '_')}={json.dumps(v)}" for k, v in request.headers.items())
            _respond(writer, 200, f"hostile_echo{{{shown}}} 1\n".encode(), "text/plain")
        elif path == "/metrics" and behaviour in METRICS_BEHAVIOURS:
            await _metrics(behaviour, request, writer)
        elif path == "/metrics" and behaviour == "hang-metrics":
            _respond(writer, 200, b"vllm:num_requests_running 0\n", "text/plain")
        elif path.endswith("tokenize") and behaviour == "detokenize-odd":  # /detokenize: a prompt that is a list
            prompt = _body(request.body).get("prompt")
            words = prompt.split() if isinstance(prompt, str) else []
            said = {"count": len(words), "tokens": list(range(len(words)))}
            answer = said if path.endswith("/tokenize") else {"prompt": ["odd", "text"]}
            _respond(writer, 200, json.dumps(answer).encode())
        elif path.endswith("/tokenize") and behaviour == "tokenize-trickle":  # a head that never ends, a byte at a time
            with contextlib.suppress(ConnectionError):
                for byte in itertools.chain(b"HTTP/1.1 200 OK\r\n", itertools.cycle(b"x-pad: trickle\r\n")):
                    writer.write(bytes([byte]))
                    await writer.drain()
                    await asyncio.sleep(0.5)
        elif path.endswith("/tokenize") and behaviour == "hang-tokenize":
            _respond(writer, 200, json.dumps({"count": 1, "tokens": [1]}).encode())
        else:
            _respond(writer, 404, b'{"error": "not found"}')
        return "ok"

    async def echo_all(self, path: str, request: _Request, writer: asyncio.StreamWriter) -> None:
        """``echo-all``: the request's credential and target said back in every place an answer has."""
        said, extra = _echo_text(request), _echo_headers(request)
        if path == "/version":
            body: object = {"version": "hostile-1", "said": said, "headers": request.headers}
            _respond(writer, 200, json.dumps(body).encode(), extra=extra)
        elif path == "/v1/models":
            data = [{"id": MODEL, "object": "model", "owned_by": said, "root": request.target, "max_model_len": 4096}]
            _respond(writer, 200, json.dumps({"object": "list", "data": data}).encode(), extra=extra)
        elif path == "/metrics":
            text = f"# HELP hostile_echo {said}\n# TYPE hostile_echo gauge\nhostile_echo{{said={json.dumps(said)}}} 1\n"
            _respond(writer, 200, text.encode(), "text/plain", extra=extra)
        elif request.method == "GET" or path != "/v1/completions" and path != "/v1/chat/completions":
            _respond(writer, 404, json.dumps({"error": {"message": f"not found: {said}"}}).encode(), extra=extra)
        elif self.posts % 4 == 1:
            _respond(
                writer, 500, json.dumps({"error": {"message": said}, "headers": request.headers}).encode(), extra=extra
            )
        elif self.posts % 4 == 2:
            key = request.headers.get("authorization", "").split(" ", 1)[-1]
            location = f"http://127.0.0.1:9/v1/completions?api_key={key}".encode()
            _respond(writer, 307, said.encode(), "text/plain", extra=extra + b"location: " + location + b"\r\n")
        elif self.posts % 4 == 3:
            _respond(writer, 400, f"bad request: {said}".encode(), "text/plain", extra=extra)
        else:
            await self.echo_stream(request, said, extra, writer)

    async def echo_stream(self, request: _Request, said: str, extra: bytes, writer: asyncio.StreamWriter) -> None:
        tokens = max(1, min(_max_tokens(request.body), MAX_TOKENS))
        fields = {"authorization": said, "x-api-key": said}
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n" + extra + b"\r\n"
        )
        writer.write(_chunk(f": {said}\n\n".encode()))
        for event in _stream_events(tokens, None, fields):
            writer.write(_chunk(f": {said}\n".encode() + event))
        writer.write(b"0\r\n\r\n")

    async def reset(self, writer: asyncio.StreamWriter) -> None:
        if self.behaviour != "trickle-reset":
            _respond(writer, 404, b'{"error": "not found"}')
            return
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n")
        while True:  # until the client leaves (the write then fails)
            writer.write(_chunk(b" "))
            await writer.drain()
            await asyncio.sleep(0.2)

    async def huge(self, writer: asyncio.StreamWriter, method: str, target: str) -> None:
        piece = b" " * (1 << 20)
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n{" % HUGE_VERSION_BYTES
        )
        sent = 1
        try:
            while sent < HUGE_VERSION_BYTES - 1:
                writer.write(piece[: HUGE_VERSION_BYTES - 1 - sent])
                sent += min(len(piece), HUGE_VERSION_BYTES - 1 - sent)
                await writer.drain()
            writer.write(b"}")
            await writer.drain()
        except ConnectionError:
            pass
        self.log({"method": method, "target": target, "variant": self.behaviour, "sent_bytes": sent})

    async def post(self, request: _Request, writer: asyncio.StreamWriter, bad: dict[str, object] | None) -> str:
        behaviour = self.behaviour
        if behaviour == "answer-huge":
            await self.huge(writer, request.method, request.target)
            return "answer-huge"
        if behaviour == "echo":
            # the credential (an X-Api-Key header's value, else Authorization's) begins 5 characters before
            # the 400th character of the body: a client that cuts before redacting keeps a part of it
            secret = request.headers.get("x-api-key") or request.headers.get("authorization", "")
            prefix = '{"error": {"message": "'
            message = "x" * (395 - len(prefix)) + secret + " was refused"
            error = {"error": {"message": message}, "headers": request.headers}
            _respond(writer, 401, json.dumps(error).encode())
            return "echo"
        if behaviour == "retry-after-nan":
            _respond(writer, 429, b'{"error": "slow down"}', extra=b"retry-after: nan\r\n")
            return "retry-after-nan"
        tokens = max(1, min(_max_tokens(request.body), MAX_TOKENS))
        events = _stream_events(tokens, bad, request.headers if behaviour == "echo-fields" else None)
        if behaviour == "gzip":
            packed = gzip.compress(b"".join(events))
            writer.write(
                b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-encoding: gzip\r\n"
                b"transfer-encoding: chunked\r\n\r\n" + _chunk(packed) + b"0\r\n\r\n"
            )
            return "gzip"
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
        for event in events:
            writer.write(_chunk(event))
            await writer.drain()
        if behaviour in ("done-fin", "done-rst"):
            await writer.drain()
            if behaviour == "done-rst":
                sock = writer.get_extra_info("socket")
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            writer.close()
            return behaviour
        writer.write(b"0\r\n\r\n")
        return "bad:" + json.dumps(bad) if bad else "ok"


def _respond(
    writer: asyncio.StreamWriter, status: int, body: bytes, ctype: str = "application/json", extra: bytes = b""
) -> None:
    reason = {200: b"OK", 307: b"Temporary Redirect", 400: b"Bad Request", 401: b"Unauthorized", 404: b"Not Found"}
    reason |= {429: b"Too Many Requests", 500: b"Internal Server Error"}
    phrase = reason[status]
    writer.write(
        b"HTTP/1.1 %d %s\r\ncontent-type: %s\r\ncontent-length: %d\r\n%s\r\n"
        % (status, phrase, ctype.encode(), len(body), extra)
        + body
    )


async def _metrics(behaviour: str, request: _Request, writer: asyncio.StreamWriter) -> None:
    """``GET /metrics`` of the ``METRICS_BEHAVIOURS``."""
    text = b"# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running 3\n"
    if behaviour == "metrics-gzip":  # as prometheus_client's ASGI app does: gzip whenever the client accepts it
        gz = "gzip" in request.headers.get("accept-encoding", "")
        extra = b"content-encoding: gzip\r\n" if gz else b""
        _respond(writer, 200, gzip.compress(text) if gz else text, "text/plain", extra=extra)
    elif behaviour == "metrics-huge":  # about a million samples, each its own label value
        line = b'vllm:hostile_bloat{i="%07d"} 1\n'
        body = text + b"".join(line % i for i in range(HUGE_METRICS_BYTES // len(line % 0)))
        _respond(writer, 200, body, "text/plain")
    elif behaviour == "metrics-endless":  # a sample a second, never the end of the body
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ntransfer-encoding: chunked\r\n\r\n")
        with contextlib.suppress(ConnectionError):
            await _forever(writer, text, 1.0)
    elif behaviour == "metrics-trickle":  # a whole answer announced, its bytes sent one a second
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: %d\r\n\r\n" % len(text))
        with contextlib.suppress(ConnectionError):
            for byte in text:
                writer.write(bytes([byte]))
                await writer.drain()
                await asyncio.sleep(1.0)
    else:  # metrics-garbage: bytes that are no exposition format (NULs, invalid UTF-8, a line of 8 MiB)
        _respond(writer, 200, b'\x00\xff\xfe{{{ 1\nvllm:x{a="\n' + b"z" * (8 << 20) + b" 1\n" + text, "text/plain")


_SSE_HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
_RETRY_AFTER = {"retry-after-huge": b"1e300", "retry-after-negative": b"-5", "retry-after-garbage": b"soon\x01;x"}


def _text_chunk(text: object, finish: object = None, **extra: object) -> bytes:
    choice = {"index": 0, "text": text, "finish_reason": finish}
    return _event({"id": "cmpl-hostile", "object": "text_completion", "model": MODEL, "choices": [choice], **extra})


async def _forever(writer: asyncio.StreamWriter, piece: bytes, every_s: float) -> None:
    """Send ``piece`` (as one chunk) every ``every_s`` until the client leaves (the write then fails)."""
    while True:
        writer.write(_chunk(piece))
        await writer.drain()
        await asyncio.sleep(every_s)


async def _odd_post(
    behaviour: str, request: _Request, writer: asyncio.StreamWriter, log: Callable[[dict[str, object]], None]
) -> bool:
    """The POST answer of one of ``STREAM_BEHAVIOURS``; False when the connection is to be closed."""
    ok_events = _stream_events(max(1, min(_max_tokens(request.body), MAX_TOKENS)))
    if behaviour in _RETRY_AFTER:
        _respond(writer, 429, b'{"error": "slow down"}', extra=b"retry-after: " + _RETRY_AFTER[behaviour] + b"\r\n")
    elif behaviour == "echo-encoded":  # the credential said back base64- and percent-encoded, never as sent
        auth = request.headers.get("authorization", "")
        key = auth.split(" ", 1)[-1]
        said = f"b64={base64.b64encode(auth.encode()).decode()} b64key=x{base64.b64encode(key.encode()).decode()}"
        said += (
            f" url={urllib.parse.quote(auth, safe='')} b64url={base64.urlsafe_b64encode(b'k:' + key.encode()).decode()}"
        )
        turn = int(hashlib.sha256(request.body).hexdigest(), 16) % 3
        if turn == 0:
            _respond(writer, 401, json.dumps({"error": {"message": said}}).encode())
        else:
            chunk = _event({"id": "c", "model": said, "choices": [{"index": 0, "text": " the"}]})
            error = _event({"error": {"message": said, "code": 500}})
            events = [chunk, error] if turn == 1 else [chunk, *ok_events[1:]]
            writer.write(_SSE_HEAD + b"".join(_chunk(e) for e in events) + b"0\r\n\r\n")
    elif behaviour == "continue-flood":  # 100 Continue heads as fast as the client reads, never the answer
        with contextlib.suppress(ConnectionError):
            while True:
                writer.write(b"HTTP/1.1 100 Continue\r\n\r\n" * 4096)
                await writer.drain()
    elif behaviour == "long-stream":  # a whole answer of ~14 MiB of one-token events
        event = ok_events[0].replace(b', "finish_reason": null', b"")
        writer.write(_SSE_HEAD + _chunk(event * LONG_STREAM_EVENTS) + _chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n")
    elif behaviour == "trickle":  # a whole JSON completion announced, its bytes sent one every 0.5 s
        body = json.dumps({"id": "c", "object": "text_completion", "model": MODEL, "choices": [{"text": " the"}]})
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n" % len(body))
        with contextlib.suppress(ConnectionError):
            for byte in body.encode():
                writer.write(bytes([byte]))
                await writer.drain()
                await asyncio.sleep(0.5)
    elif behaviour == "close-after-head":  # a 200 SSE head (chunked), then the connection closed
        writer.write(_SSE_HEAD)
        await writer.drain()
        return False
    elif behaviour in ("length-short", "length-long"):  # Content-Length cuts an event / promises 1 MiB more
        body = b"".join(ok_events)
        length = len(body) // 2 if behaviour == "length-short" else len(body) + (1 << 20)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-length: %d\r\n\r\n" % length)
        writer.write(body)
        await writer.drain()
        return False
    elif behaviour == "redirect-loop":
        _respond(writer, 307, b"", extra=b"location: " + request.target.encode() + b"\r\n")
    elif behaviour == "json-body":  # the stream flag ignored: one JSON completion
        body = {"id": "c", "object": "text_completion", "model": MODEL, "choices": [{"text": " the the"}]}
        _respond(writer, 200, json.dumps(body).encode())
    elif behaviour == "huge-head":  # 4 MiB of headers, never a blank line
        writer.write(b"HTTP/1.1 200 OK\r\n")
        for i in range(4096):
            writer.write(b"x-pad-%d: %s\r\n" % (i, b"p" * 1000))
            await writer.drain()
        return False
    elif behaviour in ("interim-1xx", "interim-forever"):
        writer.write(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nlink: </x>\r\n\r\n")
        while behaviour == "interim-forever":
            writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            await writer.drain()
            await asyncio.sleep(0.05)
        writer.write(_SSE_HEAD + b"".join(_chunk(e) for e in ok_events) + b"0\r\n\r\n")
    elif behaviour == "odd-values":
        _odd_values(request, writer, log)
    elif behaviour == "echo-escaped":
        _echo_escaped(request, writer)
    elif behaviour == "echo-cut":
        _echo_cut(request, writer)
    elif behaviour == "tls-answer":  # what a TLS server says to a plaintext request: an alert, then the close
        writer.write(b"\x15\x03\x01\x00\x02\x02\x46")
        return False
    elif behaviour == "h2-answer":  # an HTTP/2-only server: its SETTINGS frame, then it waits for a preface
        writer.write(b"\x00\x00\x00\x04\x00\x00\x00\x00\x00")
        await writer.drain()
        await asyncio.Event().wait()
    elif behaviour == "deflate":
        packed = zlib.compress(b"".join(ok_events))
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-encoding: deflate\r\n"
            b"content-length: %d\r\n\r\n%s" % (len(packed), packed)
        )
    else:
        writer.write(_SSE_HEAD)
        return await _odd_stream(behaviour, ok_events, writer, log)
    return True


def _echo_escaped(request: _Request, writer: asyncio.StreamWriter) -> None:
    """``echo-escaped``: a 401 whose JSON body says the bearer key back as JSON may write it and no byte as sent:
    every character ``\\u``-escaped, ``/`` as ``\\/`` (PHP's json_encode), and upper-cased; a
    ``www-authenticate`` and a ``set-cookie`` header carry it as sent."""
    key = request.headers.get("authorization", "").split(" ", 1)[-1]
    escaped = "".join(f"\\u{ord(c):04x}" for c in key)
    slashed = key.replace("/", "\\/")
    body = f'{{"error": {{"message": "bad key {escaped} / {slashed} / {key.upper()}", "code": 401}}}}'.encode()
    extra = f'www-authenticate: Bearer error="invalid_token", token="{key}"\r\nset-cookie: k={key}\r\n'
    _respond(writer, 401, body, extra=extra.encode())


def _echo_cut(request: _Request, writer: asyncio.StreamWriter) -> None:
    """``echo-cut``: the key (the bearer's) placed across where a client may cut what it shows of a value, in turn:
    an in-stream error's message across its 500th character (its first 9 characters before it), an object
    ``model`` and a list ``system_fingerprint`` across the 60th character of their JSON (12 before it)."""
    key = request.headers.get("authorization", "").split(" ", 1)[-1]
    turn = next(_ODD_TURN) % 3
    if turn == 0:
        event = {"error": {"message": "x" * 474 + key, "code": 500}}
    elif turn == 1:
        event = {"id": "c", "model": {"said": "x" * 38 + key}, "choices": [{"index": 0, "text": " the"}]}
    else:
        event = {"id": "c", "system_fingerprint": ["x" * 46 + key], "choices": [{"index": 0, "text": " a"}]}
    writer.write(_SSE_HEAD + _chunk(_event(event)) + _chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n")


def _odd_json(fields: dict[str, object]) -> bytes:
    """``fields`` as JSON, each ``{"DEEP": null}`` in it replaced by ``DEEP`` nested empty lists."""
    return json.dumps(fields).replace('{"DEEP": null}', "[" * DEEP + "]" * DEEP).encode()


def _odd_values(request: _Request, writer: asyncio.StreamWriter, log: Callable[[dict[str, object]], None]) -> None:
    """``odd-values``: the n-th POST's answer with ``ODD_VALUES[n % len]`` in its last chunk (or in its JSON
    answer when the request asks for no stream); the record says which (``odd:NAME``)."""
    body = _body(request.body)
    name, fields = ODD_VALUES[next(_ODD_TURN) % len(ODD_VALUES)]
    prompt = _prompt(request.body)
    sha = hashlib.sha256(prompt.encode()).hexdigest() if prompt is not None else None
    log({"method": "POST", "variant": "odd:" + name, "prompt_sha256": sha})
    tokens = max(1, min(_max_tokens(request.body), MAX_TOKENS))
    base: dict[str, object] = {"id": "cmpl-hostile", "object": "text_completion", "model": MODEL}
    if body.get("stream") is False:
        choice = {"index": 0, "text": " the" * tokens, "finish_reason": "length"}
        usage = {"prompt_tokens": 5, "completion_tokens": tokens}
        _respond(writer, 200, _odd_json({**base, "choices": [choice], "usage": usage, **fields}))
        return
    events = _stream_events(tokens)
    choice = {"index": 0, "text": " the", "finish_reason": "length"}
    events[tokens - 1] = b"data: " + _odd_json({**base, "choices": [choice], **fields}) + b"\n\n"
    writer.write(_SSE_HEAD + b"".join(_chunk(e) for e in events) + b"0\r\n\r\n")


async def _odd_stream(
    behaviour: str, ok_events: list[bytes], writer: asyncio.StreamWriter, log: Callable[[dict[str, object]], None]
) -> bool:
    """The body of an SSE answer (the head is sent) for the stream behaviours."""
    if behaviour == "head-only":
        await asyncio.Event().wait()
    elif behaviour == "slowloris":  # one byte of a first event a second
        for byte in ok_events[0]:
            writer.write(_chunk(bytes([byte])))
            await writer.drain()
            await asyncio.sleep(1)
        await asyncio.Event().wait()
    elif behaviour == "flood":  # empty-choice events as fast as the client reads, never a token
        event = _event({"id": "c", "choices": []})
        await _forever(writer, event * 4096, 0)
    elif behaviour == "huge-text":  # events of 256 KiB of text, each its own, as fast as the client reads
        with contextlib.suppress(ConnectionError):
            for n in _ODD_TURN:  # (one count for the whole server: no two texts alike)
                writer.write(_chunk(_text_chunk(f" n{n}" + " the" * 65535)))
                await writer.drain()
    elif behaviour == "comments-forever":
        await _forever(writer, b": keep-alive\n\n", 0.1)
    elif behaviour == "no-done-open":  # every token and the finish, then silence on an open connection
        writer.write(b"".join(_chunk(e) for e in ok_events[:-1]))
        await writer.drain()
        await asyncio.Event().wait()
    elif behaviour == "unsolicited":  # a whole answer, then (a moment later) a second one nobody asked for
        writer.write(b"".join(_chunk(e) for e in ok_events) + b"0\r\n\r\n")
        await writer.drain()
        await asyncio.sleep(0.05)
        stale = [_text_chunk(" stale", "stop", model="stale-answer"), b"data: [DONE]\n\n"]
        writer.write(_SSE_HEAD + b"".join(_chunk(e) for e in stale) + b"0\r\n\r\n")
    elif behaviour == "done-then-more":
        more = [_text_chunk(" after"), b"data: [DONE]\n\n"]
        writer.write(b"".join(_chunk(e) for e in [*ok_events, *more]) + b"0\r\n\r\n")
    elif behaviour == "close-mid-chunk":  # two tokens, then a chunk that announces more than it carries
        writer.write(b"".join(_chunk(e) for e in ok_events[:2]) + b'400\r\ndata: {"choi')
        await writer.drain()
        return False
    elif behaviour == "huge-line":  # 100 MiB of one line, no newline, as fast as the client reads
        piece, sent = b"data: " + b"x" * (1 << 20), 0
        with contextlib.suppress(ConnectionError):
            for _ in range(100):
                writer.write(_chunk(piece))
                await writer.drain()
                sent += len(piece)
        log({"method": "POST", "variant": behaviour, "sent_bytes": sent})
        return False
    elif behaviour == "bad-utf8":
        bad = b'data: {"id": "c", "model": "hostile-model", "choices": [{"text": "\xff\xfe", "index": 0}]}\n\n'
        writer.write(b"".join(_chunk(e) for e in [bad, *ok_events]) + b"0\r\n\r\n")
    elif behaviour == "odd-chunks":  # empty choices, null texts, a usage-only chunk, then the tokens
        odd = [
            _event({"id": "c", "object": "text_completion", "model": MODEL, "choices": []}),
            _text_chunk(None),
            _event({"id": "c", "choices": [{"index": 0, "delta": {"content": None, "role": "assistant"}}]}),
            _event({"id": "c", "choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 0}}),
        ]
        writer.write(b"".join(_chunk(e) for e in [*odd, *ok_events]) + b"0\r\n\r\n")
    elif behaviour == "finish-abort":  # two tokens, then the engine gives up on the request mid-answer
        events = [*ok_events[:2], _text_chunk("", "abort"), b"data: [DONE]\n\n"]
        writer.write(b"".join(_chunk(e) for e in events) + b"0\r\n\r\n")
    return True


async def _read_request(reader: asyncio.StreamReader, unread_posts: bool = False) -> _Request | None:
    """One request off the connection (None at a clean close); a chunked body is read as chunked.
    ``unread_posts``: a POST's body is never read, nor the request answered (``never-read``)."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError:
        return None
    lines = head.decode("latin-1").split("\r\n")
    method, target, _ = lines[0].split(" ", 2)
    if unread_posts and method == "POST" and not target.split("?")[0].endswith("/tokenize"):
        reader._transport.pause_reading()  # type: ignore[attr-defined]  # the socket's buffers fill up
        await asyncio.Event().wait()
    headers = {}
    for line in lines[1:]:
        if ":" in line:
            name, value = line.split(":", 1)
            headers[name.strip().lower()] = value.strip()
    if "chunked" in headers.get("transfer-encoding", "").lower():  # as a real server would: the chunked body
        parts = []
        while True:
            size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
            parts.append(await reader.readexactly(size + 2))
            if size == 0:
                break
        body = b"".join(p[:-2] for p in parts)
    else:
        body = await reader.readexactly(int(headers.get("content-length", "0") or 0))
    return _Request(method, target, headers, body)


def _body(raw: bytes) -> dict[str, object]:
    try:
        obj = json.loads(raw)
    except ValueError:
        return {}
    return obj if isinstance(obj, dict) else {}


def _prompt(raw: bytes) -> str | None:
    body = _body(raw)
    if isinstance(body.get("prompt"), str):
        return str(body["prompt"])
    messages = body.get("messages")
    if isinstance(messages, list) and messages and isinstance(messages[-1], dict):
        return str(messages[-1].get("content"))
    return None


def _max_tokens(raw: bytes) -> int:
    body = _body(raw)
    value = body.get("max_tokens", body.get("max_completion_tokens", MAX_TOKENS))
    return value if isinstance(value, int) else MAX_TOKENS


async def _serve(behaviour: str, host: str, port: int, record: Path | None) -> None:
    server = _Server(behaviour, record)
    listener = await asyncio.start_server(server.handle, host, port)
    bound = listener.sockets[0].getsockname()[1]
    print(f"hostile listening on http://{host}:{bound}", flush=True)
    async with listener:
        await listener.serve_forever()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--behaviour", choices=BEHAVIOURS, default="ok")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--record", type=Path, default=None, help="append one JSON line per request here")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))  # stopped: no clean-up of hanging answers to report
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_serve(args.behaviour, args.host, args.port, args.record))


@dataclass
class HostileServer:
    base_url: str  # http://127.0.0.1:PORT
    record: Path | None


@contextlib.contextmanager
def hostile_server(behaviour: str, record: Path | None = None) -> Iterator[HostileServer]:
    """Start ``tests/hostile_server.py --behaviour behaviour`` on a free port; stop it on exit."""
    proc = subprocess.Popen(
        [sys.executable, __file__, "--behaviour", behaviour, "--port", "0"]
        + (["--record", str(record)] if record is not None else []),
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if not line.startswith("hostile listening on "):
            raise RuntimeError(f"hostile server did not start: {line!r}")
        yield HostileServer(line.split()[-1], record)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def read_record(path: Path) -> list[dict[str, object]]:
    """The ``--record`` lines, parsed."""
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


if __name__ == "__main__":
    main()
