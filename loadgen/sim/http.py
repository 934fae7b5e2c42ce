"""A lean HTTP/1.1 server on asyncio protocols: keep-alive, Content-Length or chunked bodies, SSE.

Why not a framework: the simulated server shares two cores with the driver it is benchmarked
against, and it needs precise control of the connection (drop it mid-stream, notice the client
going away at once). One request at a time per connection (no pipelining overlap); a handler gets
a ``Request`` and the ``Connection`` it answers on.

Containment, so one client cannot hold the server: a connection buffers at most
``MAX_HEADER_BYTES + MAX_BODY_BYTES`` (8 MiB + 64 KiB; more is 413/431 or a dropped connection), a
request must arrive whole within ``header_timeout_s`` of its first byte (else 408), an idle keep-alive
connection is closed after ``idle_timeout_s``, and a chunked body has at most ``MAX_BODY_CHUNKS`` chunks.
A request framed two ways (Content-Length and Transfer-Encoding, or either twice with different values)
is refused with 400 and its connection closed: which framing holds is what request smuggling plays on.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from urllib.parse import urlsplit

__all__ = ["Request", "Connection", "Handler", "start_http_server", "REASONS"]

log = logging.getLogger("loadgen.sim.http")

MAX_HEADER_BYTES = 64 * 1024
MAX_BODY_BYTES = 8 * 1024 * 1024  # a 1M-token prompt is ~5 MB of JSON
MAX_BODY_CHUNKS = 65536
#: Seconds from a request's first byte until it must be complete (slow-loris defence).
HEADER_TIMEOUT_S = 30.0
#: The headers that frame a request body: each may appear once, and never both.
_FRAMING = ("content-length", "transfer-encoding")
#: Seconds a keep-alive connection may sit with no request before it is closed.
IDLE_TIMEOUT_S = 120.0

REASONS = {
    200: "OK",
    400: "Bad Request",
    401: "Unauthorized",
    403: "Forbidden",
    404: "Not Found",
    405: "Method Not Allowed",
    408: "Request Timeout",
    411: "Length Required",
    413: "Payload Too Large",
    422: "Unprocessable Entity",
    429: "Too Many Requests",
    431: "Request Header Fields Too Large",
    500: "Internal Server Error",
    501: "Not Implemented",
    502: "Bad Gateway",
    503: "Service Unavailable",
    504: "Gateway Timeout",
}


@dataclass
class Request:
    method: str
    path: str
    query: str
    headers: dict[str, str]  # lower-cased names; a repeated header keeps its last value
    body: bytes
    keep_alive: bool


Handler = Callable[[Request, "Connection"], Awaitable[None]]


class _BadRequest(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class Connection(asyncio.Protocol):
    """One client connection: parses requests, runs the handler, writes responses."""

    server_name = "loadgen-sim"

    def __init__(
        self,
        handler: Handler,
        on_error: Callable[[Connection, int, str], bytes],
        header_timeout_s: float = HEADER_TIMEOUT_S,
        idle_timeout_s: float = IDLE_TIMEOUT_S,
    ) -> None:
        self.handler = handler
        self.header_timeout_s = header_timeout_s
        self.idle_timeout_s = idle_timeout_s
        self._timer: asyncio.TimerHandle | None = None
        self._timer_kind: str | None = None
        self._chunks: tuple[int, int, list[bytes], int] | None = None  # a chunked body read so far
        self.on_error = on_error  # builds an error response body for parse failures
        self.transport: asyncio.Transport | None = None
        self.buffer = bytearray()
        self.closed = False
        self.busy = False
        self.keep_alive = True
        self.streaming = False
        self.response_started = False
        self.on_lost: Callable[[], None] | None = None  # set by a handler while it waits
        self._drain: asyncio.Future[None] | None = None
        self._paused = False
        self._task: asyncio.Task[None] | None = None
        self._continued = False

    # -- asyncio.Protocol --------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self._arm("idle")

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        if len(self.buffer) > MAX_BODY_BYTES + MAX_HEADER_BYTES + 64:
            self.abort()  # more than one whole request's worth of bytes queued: refuse to buffer it
            return
        if self.busy:
            return
        if self._timer_kind != "request":
            self._arm("request")  # the first byte of a request starts its clock
        self._next_request()

    # -- timeouts ----------------------------------------------------------------------------------
    def _arm(self, kind: str | None) -> None:
        """(Re)start the idle or request timer; None stops it (while a handler runs)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._timer_kind = kind
        if kind is None or self.closed:
            return
        delay = self.idle_timeout_s if kind == "idle" else self.header_timeout_s
        if delay > 0:
            self._timer = asyncio.get_running_loop().call_later(delay, self._timed_out, kind)

    def _timed_out(self, kind: str) -> None:
        self._timer = None
        if self.closed or self.busy:
            return
        if kind == "request" and self.buffer:
            self.keep_alive = False
            self.busy = True
            self.send(408, self.on_error(self, 408, f"request not complete within {self.header_timeout_s:g} s"))
        else:
            self.transport.close()  # type: ignore[union-attr]
            self._lost()

    def eof_received(self) -> bool:
        # The client closed its side: treat it as gone (a streaming client never half-closes).
        self._lost()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self._lost()

    def pause_writing(self) -> None:
        self._paused = True

    def resume_writing(self) -> None:
        self._paused = False
        if self._drain is not None and not self._drain.done():
            self._drain.set_result(None)

    def _lost(self) -> None:
        if self.closed:
            return
        self.closed = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._drain is not None and not self._drain.done():
            self._drain.set_result(None)
        callback, self.on_lost = self.on_lost, None
        if callback is not None:
            callback()

    # -- parsing -----------------------------------------------------------------------------------
    def _next_request(self) -> None:
        try:
            request = self._parse()
        except _BadRequest as exc:
            self._arm(None)
            self.keep_alive = False
            self.busy = True
            self.send(exc.status, self.on_error(self, exc.status, str(exc)), content_type="application/json")
            return
        if request is None:
            return
        self._arm(None)
        self.busy = True
        self.keep_alive = request.keep_alive
        self.response_started = False
        self.streaming = False
        self._task = asyncio.get_running_loop().create_task(self._run(request))

    def _parse(self) -> Request | None:
        buf = self.buffer
        end = buf.find(b"\r\n\r\n")
        if end < 0:
            if len(buf) > MAX_HEADER_BYTES:
                raise _BadRequest(431, "request headers too large")
            return None
        head = bytes(buf[:end]).decode("latin-1")
        lines = head.split("\r\n")
        parts = lines[0].split(" ")
        if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
            raise _BadRequest(400, f"malformed request line {lines[0][:80]!r}")
        method, target, version = parts
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if not sep:
                raise _BadRequest(400, f"malformed header line {line[:80]!r}")
            key, value = name.strip().lower(), value.strip()
            if key in _FRAMING and headers.get(key, value) != value:
                raise _BadRequest(400, f"{key} given twice with different values: expected one")
            headers[key] = value
        if "transfer-encoding" in headers and "content-length" in headers:
            # which one frames the body is the question request smuggling exploits: refuse, and close
            raise _BadRequest(400, "both content-length and transfer-encoding: expected one (RFC 9112 6.3)")
        pos = end + 4
        body = b""
        encoding = headers.get("transfer-encoding", "").lower()
        if encoding and encoding != "chunked":
            raise _BadRequest(501, f"transfer-encoding {encoding[:40]!r} not implemented: expected chunked or none")
        if encoding == "chunked":
            chunked = self._read_chunks(buf, pos)
            if chunked is None:
                return None
            body, pos = chunked
        else:
            length_text = headers.get("content-length", "0") or "0"
            try:
                length = int(length_text)
            except ValueError:
                raise _BadRequest(400, f"content-length {length_text!r} is not an integer") from None
            if length < 0:
                raise _BadRequest(400, "negative content-length")
            if length > MAX_BODY_BYTES:
                raise _BadRequest(413, "request body too large")
            if len(buf) < pos + length:
                if headers.get("expect", "").lower() == "100-continue" and not self._continued:
                    self._continued = True  # curl waits for this before sending a large body
                    self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")  # type: ignore[union-attr]
                return None
            body = bytes(buf[pos : pos + length])
            pos += length
        del buf[:pos]
        self._continued = False
        conn_header = headers.get("connection", "").lower()
        keep_alive = (version == "HTTP/1.1" and conn_header != "close") or conn_header == "keep-alive"
        split = urlsplit(target)
        return Request(method.upper(), split.path or "/", split.query, headers, body, keep_alive)

    def _read_chunks(self, buf: bytearray, start: int) -> tuple[bytes, int] | None:
        """A chunked body from ``start``: (body, end) or None while incomplete.

        Resumable: the chunks already read are kept between reads, so a body trickling in byte by byte
        costs linear time, not a re-walk of every chunk per read.
        """
        state = self._chunks if self._chunks is not None and self._chunks[0] == start else (start, start, [], 0)
        _, pos, parts, total = state
        while True:
            line_end = buf.find(b"\r\n", pos)
            if line_end < 0:
                if len(buf) - pos > 1024:
                    raise _BadRequest(400, "malformed chunked body: chunk-size line too long")
                self._chunks = (start, pos, parts, total)
                return None
            try:
                size = int(bytes(buf[pos:line_end]).split(b";")[0], 16)
            except ValueError:
                raise _BadRequest(400, "malformed chunked body") from None
            if size < 0:
                raise _BadRequest(400, "malformed chunked body: negative chunk size")
            if size == 0:  # last chunk; trailers are not supported
                if len(buf) < line_end + 4:
                    self._chunks = (start, pos, parts, total)
                    return None
                self._chunks = None
                return b"".join(parts), line_end + 4
            if total + size > MAX_BODY_BYTES:
                raise _BadRequest(413, "request body too large")
            if len(parts) >= MAX_BODY_CHUNKS:
                raise _BadRequest(413, f"request body in more than {MAX_BODY_CHUNKS} chunks")
            if line_end + 2 + size + 2 > len(buf):
                self._chunks = (start, pos, parts, total)
                return None
            parts.append(bytes(buf[line_end + 2 : line_end + 2 + size]))
            total += size
            pos = line_end + 2 + size + 2

    async def _run(self, request: Request) -> None:
        try:
            await self.handler(request, self)
        except Exception:  # a handler bug must never take the server down
            log.exception("handler failed for %s %s", request.method, request.path)
            if not self.response_started and not self.closed:
                self.keep_alive = False
                self.send(
                    500,
                    self.on_error(self, 500, "internal error in the simulated server"),
                    content_type="application/json",
                )
            else:
                self.abort()
        finally:
            self.on_lost = None
            self.busy = False
            if not self.closed:  # (no return in finally: it would swallow a cancellation)
                self._after_response()

    def _after_response(self) -> None:
        """Close, or wait for (or start) the next request on this keep-alive connection."""
        if not self.keep_alive:
            self.transport.close()  # type: ignore[union-attr]
        else:
            self._arm("request" if self.buffer else "idle")
            if self.buffer:
                self._next_request()

    # -- responses ---------------------------------------------------------------------------------
    def _head(self, status: int, headers: list[tuple[str, str]]) -> bytes:
        lines = [f"HTTP/1.1 {status} {REASONS.get(status, 'Status')}", f"server: {self.server_name}"]
        lines += [f"{k}: {v}" for k, v in headers]
        if not self.keep_alive:
            lines.append("connection: close")
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")

    def send(
        self,
        status: int,
        body: bytes,
        content_type: str = "application/json",
        headers: list[tuple[str, str]] | None = None,
    ) -> None:
        """A whole response with Content-Length."""
        if self.closed:
            return
        self.response_started = True
        hdrs = [("content-type", content_type), ("content-length", str(len(body)))] + (headers or [])
        self.transport.write(self._head(status, hdrs) + body)  # type: ignore[union-attr]
        if not self.keep_alive:
            self.transport.close()  # type: ignore[union-attr]
            self.closed = True

    def start_stream(self, status: int, headers: list[tuple[str, str]]) -> None:
        """Response head for a chunked (streaming) body."""
        if self.closed:
            return
        self.response_started = True
        self.streaming = True
        self.transport.write(self._head(status, headers + [("transfer-encoding", "chunked")]))  # type: ignore[union-attr]

    def write_chunk(self, data: bytes) -> None:
        if self.closed or not data:
            return
        self.transport.write(b"%x\r\n%b\r\n" % (len(data), data))  # type: ignore[union-attr]

    def end_stream(self) -> None:
        if self.closed:
            return
        self.transport.write(b"0\r\n\r\n")  # type: ignore[union-attr]
        self.streaming = False

    async def drain(self) -> None:
        """Wait while the transport's write buffer is above its high-water mark."""
        if self._paused and not self.closed:
            self._drain = asyncio.get_running_loop().create_future()
            await self._drain
            self._drain = None

    def abort(self) -> None:
        """Drop the connection at once (RST), as a crashing proxy would."""
        if self.transport is not None:
            self.transport.abort()
        self._lost()


async def start_http_server(
    handler: Handler,
    host: str,
    port: int,
    on_error: Callable[[Connection, int, str], bytes],
    *,
    header_timeout_s: float = HEADER_TIMEOUT_S,
    idle_timeout_s: float = IDLE_TIMEOUT_S,
) -> asyncio.Server:
    """Listen on host:port (0 = any free port); each connection runs ``handler`` per request."""
    loop = asyncio.get_running_loop()
    return await loop.create_server(
        lambda: Connection(handler, on_error, header_timeout_s, idle_timeout_s),
        host,
        port,
        reuse_address=True,
        backlog=1024,
    )
