"""Face 2: the live OpenAI-compatible server, the same engine advancing in real time.

Endpoints: ``POST /v1/completions``, ``POST /v1/chat/completions`` (stream or not, usage chunk),
``POST /tokenize``, ``POST /detokenize``, ``POST /reset_prefix_cache``, ``GET /v1/models``, ``/version``, ``/health``, ``/metrics``
(vLLM names).
One asyncio task runs the engine's step loop: it schedules a step, sleeps the step's modelled
duration, then hands each request its new tokens. Faults come from ``[faults]`` (seeded) or the
``X-Loadgen-Fault`` header; ``[managed]`` adds a request quota, model/fingerprint drift and an
API-key check. A client that goes away is aborted in the engine at once (its KV blocks freed).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import secrets
import signal
import sys
import time
from collections import deque
from pathlib import Path
from typing import Any, NamedTuple

from loadgen.rundir.schema import SIM_REASONING_FIELD, SIM_SERVICE_FIELD, SIM_TOOL_CALL_FIELD
from loadgen.util.errors import TargetError
from loadgen.workload.prompts import get_tokenizer

from .. import __version__
from ..contract.responder import CASE_HEADER, respond_full, token_pieces
from .config import EngineConfig, load_engine_config
from .engine import Engine, Seq
from .faults import FAULT_HEADER, FaultDecider, FaultLog, FaultPlan, parse_fault_header
from .http import HEADER_TIMEOUT_S, IDLE_TIMEOUT_S, Connection, Request, start_http_server
from .metrics import E2E_BUCKETS, ITERATION_TOKENS_BUCKETS, ITL_BUCKETS, TTFT_BUCKETS, Histogram, format_value
from .protocol import DONE, StreamFormat, filler_text, request_id_for, tool_call_piece
from .ready import ready_line

__all__ = ["SimServer", "serve"]

log = logging.getLogger("loadgen.sim.server")

_JSON = "application/json"
_SSE_HEADERS = [("content-type", "text/event-stream; charset=utf-8"), ("cache-control", "no-cache")]
_ERROR_TYPES = {
    400: "BadRequestError",
    401: "AuthenticationError",
    404: "NotFoundError",
    405: "MethodNotAllowedError",
    413: "BadRequestError",
    422: "UnprocessableEntityError",
    429: "RateLimitError",
    431: "BadRequestError",
}


def error_body(
    status: int, message: str, param: str | None = None, err_type: str | None = None, code: Any = None
) -> bytes:
    """OpenAI/vLLM-style error JSON: {"error": {"message", "type", "param", "code"}}."""
    etype = err_type or _ERROR_TYPES.get(status, "InternalServerError" if status >= 500 else "BadRequestError")
    return json.dumps(
        {"error": {"message": message, "type": etype, "param": param, "code": status if code is None else code}}
    ).encode()


class _Invalid(Exception):
    def __init__(self, status: int, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.param = param


class LiveRequest:
    """Server-side state of one request between the engine loop and its HTTP handler."""

    __slots__ = ("seq", "visible", "done", "waiter", "arrival_ns", "last_ns", "gone", "hold_until_ns")

    def __init__(self, arrival_ns: int) -> None:
        self.seq: Seq | None = None
        self.visible = 0  # tokens the engine has handed over (delivered after the step's duration)
        self.done = False
        self.waiter: asyncio.Future[None] | None = None
        self.arrival_ns = arrival_ns
        self.last_ns = arrival_ns
        self.hold_until_ns = arrival_ns  # the reply does not end before this (SIM_SERVICE_FIELD)
        self.gone = False

    def wake(self) -> None:
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def wait(self) -> None:
        self.waiter = asyncio.get_running_loop().create_future()
        try:
            await self.waiter
        finally:
            self.waiter = None


class LiveEngine:
    """Runs the engine's step loop on the event loop's clock and records vLLM's histograms."""

    def __init__(self, config: EngineConfig, seed: int = 0) -> None:
        self.engine = Engine(config, seed=seed)
        self.t0 = time.perf_counter_ns()
        self._wake = asyncio.Event()
        self.ttft = Histogram(TTFT_BUCKETS)
        self.itl = Histogram(ITL_BUCKETS)
        self.e2e = Histogram(E2E_BUCKETS)
        self.queue_time = Histogram(E2E_BUCKETS)
        self.iteration_tokens = Histogram(ITERATION_TOKENS_BUCKETS)
        self.success: dict[str, int] = {}

    def now_ns(self) -> int:
        return time.perf_counter_ns() - self.t0

    def submit(self, seq: Seq) -> None:
        self.engine.add(seq)
        self._wake.set()

    def abort(self, seq: Seq) -> None:
        if self.engine.abort(seq):
            self.success["abort"] = self.success.get("abort", 0) + 1

    async def run(self) -> None:
        """The step loop. While busy, each step starts when the previous one was due to end (not
        when the loop woke up), so timer overshoot does not accumulate; >50 ms behind re-anchors."""
        engine = self.engine
        prev_end: int | None = None
        while True:
            if not engine.has_work:
                self._wake.clear()
                prev_end = None
                await self._wake.wait()
                continue
            now = self.now_ns()
            if prev_end is not None and now - prev_end < 50_000_000:
                now = prev_end
            hold = engine.hold_until_ns(now)
            if hold is not None:
                self._wake.clear()
                prev_end = None
                try:
                    await asyncio.wait_for(self._wake.wait(), max(0.0, (hold - self.now_ns()) / 1e9))
                except TimeoutError:
                    pass
                continue
            res = engine.step(now)
            prev_end = now + res.duration_ns
            if not res.emitted and not res.finished and res.duration_ns == 0:
                prev_end = None
                self._wake.clear()
                try:
                    await asyncio.wait_for(self._wake.wait(), 0.01)
                except TimeoutError:
                    pass
                continue
            delay = (now + res.duration_ns - self.now_ns()) / 1e9
            await asyncio.sleep(delay if delay > 0 else 0)
            t = self.now_ns()
            self.iteration_tokens.observe(res.prefill_tokens + res.decode_seqs)
            for seq in res.emitted:
                ctx: LiveRequest = seq.ctx
                if ctx.gone:
                    continue
                k = seq.emitted
                if ctx.visible == 0:
                    self.ttft.observe((t - ctx.arrival_ns) / 1e9)
                else:
                    self.itl.observe((t - ctx.last_ns) / 1e9 / k, k)
                ctx.last_ns = t
                ctx.visible = seq.output
                ctx.wake()
            for seq in res.finished:
                ctx = seq.ctx
                ctx.done = True
                self.e2e.observe((t - ctx.arrival_ns) / 1e9)
                self.success["length"] = self.success.get("length", 0) + 1
                ctx.wake()


class SimServer:
    """Routes requests to the live engine; owns faults, managed-API state and metrics."""

    def __init__(
        self, config: EngineConfig, *, tokenizer: str | None = None, fault_log: Path | None = None, seed: int = 0
    ) -> None:
        self.config = config
        self.tokenizer = get_tokenizer(tokenizer or config.tokenizer)
        # a chars:N engine streams N characters a token, so the client's count of the text is the engine's
        self.filler_width = int(getattr(self.tokenizer, "chars_per_token", 0))
        self.live = LiveEngine(config, seed=seed)
        self.faults = FaultDecider(config.faults, seed=seed)
        self.fault_log = FaultLog(fault_log)
        self.salt = secrets.randbits(40) << 40
        self.counter = 0
        self.managed = config.managed if config.managed is not None and config.managed.enabled else None
        self.quota_times: deque[float] = deque()
        self.served = 0
        self.api_key: str | None = None
        if self.managed is not None and self.managed.api_key_env:
            self.api_key = os.environ.get(self.managed.api_key_env)
            if not self.api_key:
                raise TargetError(
                    f"sim serve: env var {self.managed.api_key_env} (managed.api_key_env) is empty: "
                    f"expected the API key clients must send"
                )
        self.connections: set[Connection] = set()

    # -- routing -----------------------------------------------------------------------------------
    async def handle(self, req: Request, conn: Connection) -> None:
        path = req.path.rstrip("/") or "/"
        prefix = self.managed.path_prefix if self.managed is not None else ""
        if prefix and path != "/health":  # /health also at the root: a readiness probe needs no prefix
            if path != prefix and not path.startswith(prefix + "/"):
                return self._error(conn, 404, f"no route {req.method} {req.path} (this API is served under {prefix})")
            path = path[len(prefix) :] or "/"
        if path in ("/v1/completions", "/v1/chat/completions"):
            if req.method != "POST":
                return self._error(conn, 405, f"method {req.method} not allowed on {path}; use POST")
            return await self.generate(req, conn, "chat" if path.endswith("chat/completions") else "completions")
        if path == "/tokenize":
            if req.method != "POST":
                return self._error(conn, 405, "method not allowed on /tokenize; use POST")
            return self.tokenize(req, conn)
        if path == "/detokenize":
            if req.method != "POST":
                return self._error(conn, 405, "method not allowed on /detokenize; use POST")
            return self.detokenize(req, conn)
        if path == "/reset_prefix_cache":  # vLLM's (dev-mode) endpoint: cold prefix cache without a restart
            if req.method != "POST":
                return self._error(conn, 405, "method not allowed on /reset_prefix_cache; use POST")
            freed = self.live.engine.reset_prefix_cache()
            return conn.send(200, json.dumps({"reset": True, "blocks_freed": freed}).encode())
        routes = {
            "/health": self._health,
            "/version": self._version,
            "/v1/models": self._models,
            "/metrics": self._metrics,
        }
        fn = routes.get(path)
        if fn is None:
            return self._error(conn, 404, f"no route {req.method} {req.path}")
        if req.method not in ("GET", "HEAD"):
            return self._error(conn, 405, f"method {req.method} not allowed on {path}; use GET")
        if path == "/v1/models" and self._key_refused(req, conn):  # a provider lists its models to a key holder only
            return None
        fn(conn)

    def _error(
        self,
        conn: Connection,
        status: int,
        message: str,
        param: str | None = None,
        headers: list[tuple[str, str]] | None = None,
        err_type: str | None = None,
        code: Any = None,
    ) -> None:
        conn.send(status, error_body(status, message, param, err_type, code), headers=headers)

    def _health(self, conn: Connection) -> None:
        conn.send(200, b"", content_type="text/plain")

    def _version(self, conn: Connection) -> None:
        body = {
            "version": __version__,
            "engine": "loadgen-sim",
            "engine_config": self.config.name,
            "tokenizer": self.tokenizer.name,  # the one it counts with (a client can size prompts with it locally)
            "config": self.config.manifest(),
        }
        conn.send(200, json.dumps(body).encode())

    def _models(self, conn: Connection) -> None:
        card = {
            "id": self.config.model,
            "object": "model",
            "created": int(time.time()),
            "owned_by": "loadgen-sim",
            "root": self.config.model,
            "parent": None,
            "max_model_len": self.config.scheduler.max_model_len,
            "permission": [],
        }
        conn.send(200, json.dumps({"object": "list", "data": [card]}).encode())

    def _metrics(self, conn: Connection) -> None:
        conn.send(200, self.render_metrics().encode(), content_type="text/plain; version=0.0.4; charset=utf-8")

    # -- request parsing ---------------------------------------------------------------------------
    def _body(self, req: Request) -> dict[str, Any]:
        if not req.body:
            raise _Invalid(400, "request body is empty: expected a JSON object")
        try:
            body = json.loads(req.body)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise _Invalid(400, f"request body is not valid JSON: {exc}") from None
        except RecursionError:
            raise _Invalid(400, "request body is nested too deeply: expected an OpenAI request object") from None
        if not isinstance(body, dict):
            raise _Invalid(422, f"request body is a JSON {type(body).__name__}: expected an object")
        return body

    def _check_model(self, body: dict[str, Any]) -> None:
        model = body.get("model")
        if model is not None and not isinstance(model, str):
            raise _Invalid(422, "model: expected a string", "model")
        if model and model != self.config.model:
            raise _Invalid(404, f"The model `{model}` does not exist.", "model")

    def _prompt_ids(self, body: dict[str, Any], kind: str) -> list[int]:
        tok = self.tokenizer
        if kind == "chat":
            messages = body.get("messages")
            if not isinstance(messages, list) or not messages:
                raise _Invalid(422, "messages: expected a non-empty list of {role, content}", "messages")
            ids: list[int] = []
            for i, msg in enumerate(messages):
                if not isinstance(msg, dict) or not isinstance(msg.get("role"), str):
                    raise _Invalid(422, f"messages[{i}]: expected an object with a string role", "messages")
                content = msg.get("content")
                if content is None:
                    text = ""
                elif isinstance(content, str):
                    text = content
                elif isinstance(content, list):
                    parts = []
                    for part in content:
                        if (
                            not isinstance(part, dict)
                            or part.get("type") != "text"
                            or not isinstance(part.get("text"), str)
                        ):
                            raise _Invalid(422, f"messages[{i}].content: expected text parts", "messages")
                        parts.append(part["text"])
                    text = "".join(parts)
                else:
                    raise _Invalid(422, f"messages[{i}].content: expected a string or a list of parts", "messages")
                ids.extend(tok.encode(text))
                ids.extend([0] * self.config.stream.chat_tokens_per_message)
            return ids
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
            prompt = prompt[0]
        if isinstance(prompt, str):
            return tok.encode(prompt)
        if isinstance(prompt, list) and all(isinstance(x, int) and not isinstance(x, bool) for x in prompt):
            return list(prompt)
        if isinstance(prompt, list) and len(prompt) > 1:
            raise _Invalid(
                400, "prompt: batches of prompts are not supported by the simulated engine; send one", "prompt"
            )
        raise _Invalid(422, "prompt: expected a string or a list of token ids", "prompt")

    def _int(self, body: dict[str, Any], name: str, default: int | None, low: int) -> int | None:
        value = body.get(name, default)
        if value is None:
            return default
        if not isinstance(value, int) or isinstance(value, bool):
            raise _Invalid(422, f"{name}: {value!r}: expected an integer", name)
        if value < low:
            raise _Invalid(400, f"{name} = {value}: expected >= {low}", name)
        return value

    def _parse_generate(self, body: dict[str, Any], kind: str) -> tuple[list[int], int, bool, bool, int]:
        self._check_model(body)
        stream = body.get("stream", False)
        if not isinstance(stream, bool):
            raise _Invalid(422, "stream: expected true or false", "stream")
        options = body.get("stream_options") or {}
        if not isinstance(options, dict):
            raise _Invalid(422, "stream_options: expected an object", "stream_options")
        include_usage = bool(options.get("include_usage", False))
        if "ignore_eos" in body and not isinstance(body["ignore_eos"], bool):
            raise _Invalid(422, "ignore_eos: expected true or false", "ignore_eos")
        n = self._int(body, "n", 1, 1)
        if n != 1:
            raise _Invalid(400, f"n = {n}: the simulated engine generates one choice (n = 1)", "n")
        ids = self._prompt_ids(body, kind)
        max_len = self.config.scheduler.max_model_len
        name = "max_completion_tokens" if kind == "chat" and "max_completion_tokens" in body else "max_tokens"
        default = 16 if kind == "completions" else max(1, max_len - len(ids))
        asked = self._int(body, name, default, 1)
        assert asked is not None
        max_tokens = self.config.scheduler.output_tokens(len(ids), asked)
        if max_tokens is None:
            raise _Invalid(
                400,
                f"This model's maximum context length is {max_len} tokens. However, you requested "
                f"{len(ids) + asked} tokens ({len(ids)} in the messages, {asked} in the completion). "
                "Please reduce the length of the messages or completion.",
                "max_tokens" if kind == "completions" else "messages",
            )
        bs = self.config.kv.block_size
        if not self.live.engine.fits(len(ids), max_tokens):
            raise _Invalid(
                400,
                f"request needs {len(ids) + max_tokens} tokens of KV cache; the engine has "
                f"{self.live.engine.total_blocks * bs}",
                "max_tokens",
            )
        priority = self._int(body, "priority", 0, -(2**31)) or 0
        return ids, max_tokens, stream, include_usage, priority

    def _reasoning(self, body: dict[str, Any], kind: str, max_tokens: int) -> int:
        """How many of the output tokens stream as reasoning (``SIM_REASONING_FIELD``, chat only; at most all)."""
        if kind != "chat" or SIM_REASONING_FIELD not in body:
            return 0
        asked = self._int(body, SIM_REASONING_FIELD, 0, 0)
        return min(asked or 0, max_tokens)

    def _tool_call(self, body: dict[str, Any], kind: str, max_tokens: int, reasoning: int) -> int:
        """How many of the last output tokens stream as a tool call (``SIM_TOOL_CALL_FIELD``, chat only; at most
        the tokens after the reasoning)."""
        if kind != "chat" or SIM_TOOL_CALL_FIELD not in body:
            return 0
        asked = self._int(body, SIM_TOOL_CALL_FIELD, 0, 0)
        return min(asked or 0, max_tokens - reasoning)

    def _service_ns(self, body: dict[str, Any]) -> int:
        """The reply's least duration (``SIM_SERVICE_FIELD``, ms; 0: the engine's own pace)."""
        value = body.get(SIM_SERVICE_FIELD, 0)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1e7:
            raise _Invalid(422, f"{SIM_SERVICE_FIELD}: {value!r}: expected milliseconds in 0..1e7", SIM_SERVICE_FIELD)
        return round(value * 1e6)

    async def _hold(self, ctx: LiveRequest) -> None:
        """Wait until the reply may end (its ``SIM_SERVICE_FIELD`` time after arrival): never sooner, so the sleep
        is repeated for what is left, since uvloop's millisecond timers (``_loop_factory``) can wake it early."""
        while (wait_ns := ctx.hold_until_ns - self.live.now_ns()) > 0:
            await asyncio.sleep(wait_ns / 1e9)

    def _chain(self, ids: list[int]) -> list[int]:
        """Block hashes of the prompt's full blocks (chained, as vLLM's prefix cache keys them)."""
        bs = self.config.kv.block_size
        chain = []
        h = 0
        for i in range(0, len(ids) - bs + 1, bs):
            h = hash((h, tuple(ids[i : i + bs])))
            chain.append(h)
        return chain

    # -- managed API -------------------------------------------------------------------------------
    def _key_refused(self, req: Request, conn: Connection) -> bool:
        """A managed API's key check (HTTP 401 without the key, as a provider answers); True when refused."""
        if self.api_key is None or req.headers.get("authorization", "") == f"Bearer {self.api_key}":
            return False
        self._error(conn, 401, "Incorrect API key provided.", err_type="invalid_request_error", code="invalid_api_key")
        return True

    def _managed_gate(self, req: Request, conn: Connection, rid: str) -> bool:
        """API key and quota; True when the request was answered (rejected) here."""
        m = self.managed
        if m is None:
            return False
        if self._key_refused(req, conn):
            return True
        if m.requests_per_minute:
            now = time.monotonic()
            q = self.quota_times
            while q and q[0] <= now - 60.0:
                q.popleft()
            if len(q) >= m.requests_per_minute:
                retry = max(0.001, q[0] + 60.0 - now)
                self.fault_log.log(
                    rid,
                    "quota",
                    {"retry_after_s": round(retry, 3), "requests_per_minute": m.requests_per_minute},
                    req.headers.get("x-request-id"),
                )
                self._error(
                    conn,
                    429,
                    f"Rate limit reached for requests: limit {m.requests_per_minute} per minute.",
                    headers=[
                        ("retry-after", format(retry, ".3f")),
                        ("retry-after-ms", str(int(retry * 1000))),
                        ("x-ratelimit-limit-requests", str(m.requests_per_minute)),
                        ("x-ratelimit-remaining-requests", "0"),
                    ],
                    err_type="requests",
                    code="rate_limit_exceeded",
                )
                return True
            q.append(now)
        return False

    def _identity(self) -> tuple[str, str | None]:
        """(response model id, system_fingerprint) for the next served request."""
        m = self.managed
        if m is None:
            return self.config.model, None
        turn = self.served // m.change_after_requests if m.change_after_requests else 0
        self.served += 1
        model = m.response_models[min(turn, len(m.response_models) - 1)] if m.response_models else self.config.model
        fp = m.system_fingerprints[min(turn, len(m.system_fingerprints) - 1)] if m.system_fingerprints else None
        return model, fp

    # -- generation --------------------------------------------------------------------------------
    async def generate(self, req: Request, conn: Connection, kind: str) -> None:
        received_ns = self.live.now_ns()  # a SIM_SERVICE_FIELD time counts from here (parsing included)
        self.counter += 1
        rid = request_id_for(kind, self.salt + self.counter)
        client_rid = req.headers.get("x-request-id")
        if self._managed_gate(req, conn, rid):
            return
        try:
            body = self._body(req)
            ids, max_tokens, stream, include_usage, priority = self._parse_generate(body, kind)
            header = req.headers.get(FAULT_HEADER)
            plan = parse_fault_header(header) if header else self.faults.decide()
        except _Invalid as exc:
            return self._error(conn, exc.status, str(exc), exc.param)
        except ValueError as exc:  # bad fault header
            return self._error(conn, 400, f"{FAULT_HEADER}: {exc}", FAULT_HEADER)
        headers = [("x-request-id", rid)]
        if plan:
            for fkind, params in plan.items():
                self.fault_log.log(rid, fkind, params, client_rid)
            if plan.error_status is not None:
                return self._error(
                    conn, plan.error_status, f"injected fault: HTTP {plan.error_status}", headers=headers
                )
            if plan.retry_after_s is not None:
                ra = plan.retry_after_s
                return self._error(
                    conn,
                    429,
                    "injected fault: rate limited",
                    headers=headers + [("retry-after", format(ra, "g")), ("retry-after-ms", str(int(ra * 1000)))],
                )
        pieces, finish = self._contract_answer(body, req)
        if pieces is not None:
            max_tokens = len(pieces)
        try:
            reasoning = self._reasoning(body, kind, max_tokens) if pieces is None else 0
            tool = self._tool_call(body, kind, max_tokens, reasoning) if pieces is None else 0
            service_ns = self._service_ns(body)
        except _Invalid as exc:
            return self._error(conn, exc.status, str(exc), exc.param)
        model, fingerprint = self._identity()
        fmt = StreamFormat(kind, rid, int(time.time()), model, fingerprint)
        ctx = LiveRequest(0)
        conn.on_lost = lambda: self._client_gone(ctx)
        if plan and plan.slow_start_s > 0:
            await asyncio.sleep(plan.slow_start_s)
            if ctx.gone:
                return
        bs = self.config.kv.block_size
        chain = self._chain(ids) if self.config.kv.enable_prefix_caching and len(ids) >= bs else None
        seq = Seq(
            self.counter,
            len(ids),
            max_tokens,
            self.live.now_ns(),
            priority=priority,
            cache_key=chain[0] if chain else None,
            chain=chain,
            ctx=ctx,
        )
        ctx.seq = seq
        ctx.arrival_ns = ctx.last_ns = seq.arrival_ns
        ctx.hold_until_ns = received_ns + service_ns
        if max_tokens > 0:
            self.live.submit(seq)
        else:  # an empty contract answer: nothing to generate
            ctx.done = True
        try:
            if stream:
                phases = _Phases(reasoning, max_tokens - tool, max_tokens)
                await self._stream(conn, ctx, fmt, headers, include_usage, plan, len(ids), pieces, finish, phases)
            else:
                await self._whole(conn, ctx, fmt, headers, plan, len(ids), pieces, finish, tool)
        finally:
            if not ctx.done and not ctx.gone:
                ctx.gone = True
                self.live.abort(seq)

    def _contract_answer(self, body: dict[str, Any], req: Request) -> tuple[list[str] | None, str]:
        """Token pieces of the contract case's answer (loadgen.contract responder), or (None, "length")."""
        if CASE_HEADER not in req.headers and b"loadgen-case:" not in req.body:
            return None, "length"

        tok = self.tokenizer if not self.tokenizer.name.startswith("chars:") else get_tokenizer("cl100k_base")
        base = Path(self.config.source_path).parent if self.config.source_path else None
        answer = respond_full(body, self.config.behavior, headers=req.headers, base_dir=base, tokenizer=tok)
        if answer is None:
            return None, "length"
        return token_pieces(answer.text, tok), answer.finish_reason

    def _client_gone(self, ctx: LiveRequest) -> None:
        ctx.gone = True
        if ctx.seq is not None:
            self.live.abort(ctx.seq)
        ctx.wake()

    async def _stream(
        self,
        conn: Connection,
        ctx: LiveRequest,
        fmt: StreamFormat,
        headers: list[tuple[str, str]],
        include_usage: bool,
        plan: FaultPlan | None,
        prompt_tokens: int,
        pieces: list[str] | None = None,
        finish: str = "length",
        phases: _Phases | None = None,
    ) -> None:
        """Stream the tokens as they become visible, in ``phases``: reasoning deltas, content, then a tool call
        (a coalesced run that crosses phases goes out as an event per phase; a tool call's, one per token)."""
        phases = phases or _Phases(0, 1 << 62, 1 << 62)
        reasoning = phases.reasoning
        conn.start_stream(200, _SSE_HEADERS + headers)
        if fmt.kind == "chat":
            conn.write_chunk(fmt.role())
        coalesce = self.config.stream.coalesce
        width = self.filler_width
        stops: dict[int, list[str]] = {}
        if plan:
            if plan.stall_s > 0:
                stops.setdefault(plan.stall_after, []).append("stall")
            if plan.malformed_after is not None:
                stops.setdefault(plan.malformed_after, []).append("malformed")
            if plan.disconnect_after is not None:
                stops.setdefault(plan.disconnect_after, []).append("disconnect")
        sent = 0
        if 0 in stops and await self._fault_point(conn, ctx, fmt, plan, stops.pop(0)):
            return
        while True:
            if ctx.gone:
                return
            if sent < ctx.visible:
                target = ctx.visible
                if stops:
                    nxt = min(k for k in stops)
                    if nxt < target:
                        target = nxt
                if pieces is not None:
                    if coalesce:
                        conn.write_chunk(fmt.content_any("".join(pieces[sent:target])))
                    else:
                        conn.write_chunk(b"".join(fmt.content_any(pieces[j]) for j in range(sent, target)))
                elif sent < reasoning or target > phases.tool_from:
                    conn.write_chunk(_phase_events(fmt, sent, target, phases, coalesce, width))
                elif coalesce:
                    conn.write_chunk(fmt.content(filler_text(sent, target - sent, width)))
                else:
                    conn.write_chunk(b"".join(fmt.content(filler_text(j, 1, width)) for j in range(sent, target)))
                sent = target
                if sent in stops and await self._fault_point(conn, ctx, fmt, plan, stops.pop(sent)):
                    return
                await conn.drain()
                continue
            if ctx.done:
                break
            await ctx.wait()
        await self._hold(ctx)
        if ctx.gone:
            return
        conn.write_chunk(fmt.finish("tool_calls" if phases.tool_from < sent == phases.total else finish))
        if include_usage:
            cached = ctx.seq.cached_tokens if ctx.seq else None
            conn.write_chunk(fmt.usage(prompt_tokens, sent, cached, min(reasoning, sent)))
        conn.write_chunk(DONE)
        conn.end_stream()

    async def _fault_point(
        self, conn: Connection, ctx: LiveRequest, fmt: StreamFormat, plan: FaultPlan | None, kinds: list[str]
    ) -> bool:
        """Apply faults due at this token count; True when the connection was dropped."""
        assert plan is not None
        if "malformed" in kinds:
            conn.write_chunk(fmt.malformed())
        if "stall" in kinds:
            await asyncio.sleep(plan.stall_s)
        if "disconnect" in kinds:
            ctx.gone = True
            if ctx.seq is not None:
                self.live.abort(ctx.seq)
            conn.on_lost = None
            conn.abort()
            return True
        return ctx.gone

    async def _whole(
        self,
        conn: Connection,
        ctx: LiveRequest,
        fmt: StreamFormat,
        headers: list[tuple[str, str]],
        plan: FaultPlan | None,
        prompt_tokens: int,
        pieces: list[str] | None = None,
        finish: str = "length",
        tool: int = 0,
    ) -> None:
        while not ctx.done:
            if ctx.gone:
                return
            await ctx.wait()
        await self._hold(ctx)
        if plan and plan.stall_s > 0:
            await asyncio.sleep(plan.stall_s)
        if plan and plan.disconnect_after is not None:
            conn.on_lost = None
            conn.abort()
            return
        if plan and plan.malformed_after is not None:
            conn.send(200, b'{"id": "' + fmt.rid.encode() + b'", "choices": [', headers=headers)
            return
        seq = ctx.seq
        assert seq is not None
        text = "".join(pieces) if pieces is not None else filler_text(0, seq.output - tool, self.filler_width)
        arguments = "".join(tool_call_piece(j, tool) for j in range(1, tool)) if tool else None
        finish = "tool_calls" if tool else finish
        body = fmt.full_response(text, finish, prompt_tokens, seq.output, seq.cached_tokens, arguments)
        conn.send(200, json.dumps(body).encode(), headers=headers)

    # -- tokenize ----------------------------------------------------------------------------------
    def tokenize(self, req: Request, conn: Connection) -> None:
        try:
            body = self._body(req)
            self._check_model(body)
            if "messages" in body:
                ids = self._prompt_ids(body, "chat")
            elif isinstance(body.get("prompt"), str):
                ids = self.tokenizer.encode(body["prompt"])
            else:
                raise _Invalid(422, "prompt: expected a string (or messages)", "prompt")
        except _Invalid as exc:
            return self._error(conn, exc.status, str(exc), exc.param)
        out = {"count": len(ids), "max_model_len": self.config.scheduler.max_model_len, "tokens": ids}
        conn.send(200, json.dumps(out).encode())

    def detokenize(self, req: Request, conn: Connection) -> None:
        """vLLM's ``POST /detokenize``: ``{"tokens": [ids]}`` → ``{"prompt": text}`` (422 where the tokenizer
        cannot decode: a ``chars:N`` one counts only)."""
        try:
            body = self._body(req)
            self._check_model(body)
            ids = body.get("tokens")
            if not isinstance(ids, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
                raise _Invalid(422, "tokens: expected a list of token ids", "tokens")
            try:
                text = self.tokenizer.decode(ids)
            except NotImplementedError:
                raise _Invalid(422, f"tokenizer {self.tokenizer.name}: cannot decode", "tokens") from None
            except (ValueError, KeyError, OverflowError, TypeError):
                raise _Invalid(422, "tokens: not ids of this tokenizer", "tokens") from None
        except _Invalid as exc:
            return self._error(conn, exc.status, str(exc), exc.param)
        conn.send(200, json.dumps({"prompt": text}).encode())

    # -- metrics -----------------------------------------------------------------------------------
    def render_metrics(self) -> str:
        e = self.live.engine
        lab = f'engine="0",model_name="{self.config.model}"'
        lines: list[str] = []

        def family(name: str, kind: str, help_text: str, samples: list[tuple[str, str, float]]) -> None:
            lines.append(f"# HELP {name} {help_text}")
            lines.append(f"# TYPE {name} {kind}")
            for sample, labels, value in samples:
                lines.append(f"{sample}{{{labels}}} {format_value(value)}")

        family(
            "vllm:num_requests_running",
            "gauge",
            "Number of requests in model execution batches.",
            [("vllm:num_requests_running", lab, len(e.running))],
        )
        family(
            "vllm:num_requests_waiting",
            "gauge",
            "Number of requests waiting to be processed.",
            [("vllm:num_requests_waiting", lab, len(e.waiting))],
        )
        family(
            "vllm:kv_cache_usage_perc",
            "gauge",
            "KV-cache usage. 1 means 100 percent usage.",
            [("vllm:kv_cache_usage_perc", lab, e.kv_usage)],
        )
        for name, help_text, value in (
            (
                "vllm:prefix_cache_queries",
                "Prefix cache queries, in terms of number of queried tokens.",
                e.prefix_queries,
            ),
            ("vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.", e.prefix_hits),
            ("vllm:num_preemptions", "Cumulative number of preemption from the engine.", e.num_preemptions),
            ("vllm:prompt_tokens", "Number of prefill tokens processed.", e.prompt_tokens_total),
            ("vllm:generation_tokens", "Number of generation tokens processed.", e.generation_tokens_total),
        ):
            family(name, "counter", help_text, [(name + "_total", lab, value)])
        family(
            "vllm:request_success",
            "counter",
            "Count of successfully processed requests.",
            [
                ("vllm:request_success_total", f'{lab},finished_reason="{r}"', v)
                for r, v in sorted(self.live.success.items())
            ],
        )
        for name, help_text, hist in (
            ("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", self.live.ttft),
            ("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", self.live.itl),
            ("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", self.live.e2e),
            (
                "vllm:iteration_tokens_total",
                "Histogram of number of tokens per engine_step.",
                self.live.iteration_tokens,
            ),
        ):
            lines.append(f"# HELP {name} {help_text}")
            lines.append(f"# TYPE {name} histogram")
            lines.extend(hist.lines(name, lab))
        family(
            "loadgen_sim_faults",
            "counter",
            "Faults injected by the simulated engine, by kind.",
            [("loadgen_sim_faults_total", f'kind="{k}"', v) for k, v in sorted(self.fault_log.counts.items())],
        )
        family(
            "loadgen_sim_kv_blocks_total",
            "gauge",
            "KV blocks of the simulated engine.",
            [("loadgen_sim_kv_blocks_total", lab, e.total_blocks)],
        )
        family(
            "loadgen_sim_busy_seconds",
            "counter",
            "Sum of modelled step durations.",
            [("loadgen_sim_busy_seconds_total", lab, e.busy_ns / 1e9)],
        )
        return "\n".join(lines) + "\n"


class _Phases(NamedTuple):
    """A reply's output phases by token index: reasoning ``[0, reasoning)``, content up to ``tool_from``, then a
    tool call up to ``total``."""

    reasoning: int
    tool_from: int
    total: int


def _phase_events(fmt: StreamFormat, start: int, end: int, phases: _Phases, coalesce: bool, width: int = 0) -> bytes:
    """Events for output tokens ``start .. end-1``: reasoning, content, tool call (an event per tool token)."""
    out = []
    reasoning, tool_from = phases.reasoning, phases.tool_from
    for lo, hi, emit in (
        (start, min(end, reasoning), fmt.reasoning),
        (max(start, reasoning), min(end, tool_from), fmt.content),
    ):
        if hi > lo:
            text = filler_text
            out += [emit(text(lo, hi - lo, width))] if coalesce else [emit(text(j, 1, width)) for j in range(lo, hi)]
    count = phases.total - tool_from
    out += [fmt.tool_call(j - tool_from, count) for j in range(max(start, tool_from), end)]
    return b"".join(out)


def _parse_error(conn: Connection, status: int, message: str) -> bytes:
    return error_body(status, message)


async def _listen(server: SimServer, host: str, port: int, timeouts: dict[str, float]) -> asyncio.Server:
    """Bind, or one TargetError line saying why not (port in use, address not local, unknown host)."""
    try:
        return await start_http_server(server.handle, host, port, _parse_error, **timeouts)
    except OSError as exc:
        reason = (exc.strerror or str(exc)).split(": ")[-1]
        raise TargetError(
            f"sim serve --host {host} --port {port}: cannot listen ({reason}): expected a free port on a local address"
        ) from None


async def _main(
    config: EngineConfig,
    host: str,
    port: int,
    tokenizer: str | None,
    fault_log: Path | None,
    seed: int,
    timeouts: dict[str, float],
) -> None:
    server = SimServer(config, tokenizer=tokenizer, fault_log=fault_log, seed=seed)
    try:
        http = await _listen(server, host, port, timeouts)
    except BaseException:
        server.fault_log.close()
        raise
    engine_task = asyncio.create_task(server.live.run())
    actual_port = http.sockets[0].getsockname()[1]
    sys.stdout.write(ready_line(host, actual_port, server.managed.path_prefix if server.managed else ""))
    sys.stdout.flush()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    failed: list[BaseException] = []

    def engine_ended(task: asyncio.Task) -> None:  # a dead step loop must not leave a hanging server
        if not task.cancelled() and task.exception() is not None:
            failed.append(task.exception())  # type: ignore[arg-type]
            log.error("engine step loop failed: %r", task.exception())
            stop.set()

    engine_task.add_done_callback(engine_ended)
    try:
        await stop.wait()
        if failed:
            raise failed[0]
    finally:
        http.close()
        engine_task.cancel()
        try:
            await engine_task
        except asyncio.CancelledError:
            pass
        server.fault_log.close()


def serve(
    engine: str | Path | EngineConfig,
    host: str = "127.0.0.1",
    port: int = 8000,
    *,
    tokenizer: str | None = None,
    fault_log: str | Path | None = None,
    seed: int = 0,
    header_timeout_s: float = HEADER_TIMEOUT_S,
    idle_timeout_s: float = IDLE_TIMEOUT_S,
) -> int:
    """Run the live server until SIGTERM/SIGINT; prints the ready line when listening. Returns 0."""
    config = engine if isinstance(engine, EngineConfig) else load_engine_config(engine)
    if not 0 <= port <= 65535:
        raise TargetError(f"sim serve --port {port}: expected 0..65535 (0 = any free port)")
    if tokenizer:
        get_tokenizer(tokenizer)  # fail fast on a bad spec, before listening
    logging.basicConfig(level=logging.WARNING, format="loadgen-sim: %(levelname)s %(message)s")
    timeouts = {"header_timeout_s": header_timeout_s, "idle_timeout_s": idle_timeout_s}
    with asyncio.Runner(loop_factory=_loop_factory(config)) as runner:
        runner.run(_main(config, host, port, tokenizer, Path(fault_log) if fault_log else None, seed, timeouts))
    return 0


def _loop_factory(config: EngineConfig):
    """uvloop (when installed) for an engine that models no time (every cost term 0, no batching window):
    it serves the same stream with less CPU per event, so the server is not what a client benchmark
    measures. Otherwise asyncio's loop: uvloop's millisecond timers can fire a step up to half a
    millisecond early, asyncio's never do, and the step loop's timing relies on that."""
    cost = config.cost
    timed = (
        cost.fixed_ms
        or cost.per_prefill_token_ms
        or cost.per_decode_seq_ms
        or cost.per_kv_token_ms
        or cost.request_overhead_ms
        or cost.step_jitter_ms
        or config.batching.window_ms
    )
    if timed:
        return None
    try:
        import uvloop  # optional: loaded only for an engine that models no time
    except ImportError:
        return None
    return uvloop.new_event_loop
