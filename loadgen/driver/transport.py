"""A lean HTTP/1.1 transport for httpx: one keep-alive connection per in-flight request.

Why not httpx's default transport: httpcore's pool scans every connection (probing each socket)
whenever it assigns a request, O(connections) per request, and h11 turns every HTTP chunk into a
Python event object; together they cost more CPU than the rest of the driver at a few thousand
chunks per second. The driver already bounds concurrency itself, so this transport keeps an idle
list (LIFO) instead of a pool, writes each request in one send, and de-chunks the body per network
read with ``bytes.find``: one yield per read, whatever the number of SSE events in it. Failures are
raised as the httpx exceptions httpx itself would raise, so error mapping stays in one place.
"""

from __future__ import annotations

import asyncio
import ssl
import time
import typing

import anyio
import anyio.abc
import httpx

from .schedule import on_asyncio

__all__ = ["MalformedHead", "RawHTTP11Transport", "RawResponse", "SendTiming"]

_READ = 65536


#: Most bytes of a response head (status line and headers, each interim 1xx head apart) read before it fails.
_MAX_HEAD = 1 << 20
#: Most interim (1xx) responses before the answer. A server that sent ``100 Continue`` as fast as it could held
#: the read in a loop that never waited (every head already buffered): no timeout fired, nor SIGTERM, for minutes.
_MAX_INTERIM = 100


class MalformedHead(httpx.RemoteProtocolError):
    """The response head is not one: over ``_MAX_HEAD`` bytes without its blank line, or a status or header
    line that is not HTTP/1.1 (error kind ``malformed_head``; not ``connect``: the server did answer)."""


_NONE = 0  # no body
_LENGTH = 1
_CHUNKED = 2
_UNTIL_CLOSE = 3


class SendTiming:
    """Instants (``perf_counter_ns``) of one request's way to the socket, filled in by ``open``.

    ``connect_start``/``connect_end``: a new connection was opened for it (None when a kept-alive one
    was reused); ``sent``: the request bytes were handed to the socket (None: never sent).
    """

    __slots__ = ("connect_end", "connect_start", "on_sent", "sent")

    def __init__(self, sent: int | None = None, on_sent: typing.Callable[[], None] | None = None) -> None:
        self.connect_start: int | None = None
        self.connect_end: int | None = None
        self.sent = sent
        self.on_sent = on_sent  # called once the bytes are on the socket (live counters)

    def mark_sent(self, instant: int) -> None:
        first = self.sent is None
        self.sent = instant
        if first and self.on_sent is not None:
            self.on_sent()


class _Conn:
    """A connection over an anyio byte stream (any backend)."""

    __slots__ = ("buf", "idle_since", "reused", "stream")

    def __init__(self, stream: anyio.abc.ByteStream) -> None:
        self.stream: anyio.abc.ByteStream | None = stream  # None on a _ProtoConn (no stream)
        self.buf = b""
        self.idle_since = 0.0
        self.reused = False

    async def send(self, data: bytes) -> None:
        assert self.stream is not None  # set in __init__; only _ProtoConn (which overrides this) has none
        await self.stream.send(data)

    async def receive(self) -> bytes:
        assert self.stream is not None
        return await self.stream.receive(_READ)

    async def aclose(self) -> None:
        assert self.stream is not None
        with anyio.CancelScope(shield=True):
            try:
                await self.stream.aclose()
            except (OSError, anyio.BrokenResourceError, anyio.ClosedResourceError):
                pass


class _Protocol(asyncio.Protocol):
    """asyncio protocol feeding a _ProtoConn: data arrives by callback, no pause/resume per read."""

    __slots__ = ("chunks", "eof", "exc", "idle", "paused", "sink", "sink_eof", "transport", "waiter")

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.idle = False  # kept for reuse, no request on it: any byte that arrives now was never asked for
        self.chunks: list[bytes] = []
        self.waiter: asyncio.Future | None = None
        self.eof = False
        self.exc: BaseException | None = None
        self.sink: typing.Callable[[bytes], None] | None = None  # set while a body streams by callback
        self.sink_eof: typing.Callable[[BaseException | None], None] | None = None
        self.paused = False  # reading paused (``_Body.pause_reading``) until the body is read on

    def pause(self) -> None:
        if not self.paused and self.transport is not None and not self.transport.is_closing():
            self.transport.pause_reading()
            self.paused = True

    def resume(self) -> None:
        if self.paused:
            self.paused = False
            if self.transport is not None and not self.transport.is_closing():
                self.transport.resume_reading()

    def connection_made(self, transport) -> None:
        self.transport = transport

    def _wake(self) -> None:
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def data_received(self, data: bytes) -> None:
        if self.idle:  # an answer nobody asked for (or garbage): never read as the next request's answer
            self.eof = True
            if self.transport is not None:
                self.transport.close()
            return
        sink = self.sink
        if sink is not None:
            sink(data)
            return
        self.chunks.append(data)
        self._wake()

    def eof_received(self) -> bool:
        self.eof = True
        if self.sink_eof is not None:
            self.sink_eof(None)
        self._wake()
        return False

    def connection_lost(self, exc: BaseException | None) -> None:
        self.eof = True
        self.exc = exc
        if self.sink_eof is not None:
            self.sink_eof(exc)
        self._wake()


class _ProtoConn(_Conn):
    """A connection on asyncio's protocol API (the driver's usual case: cheaper per read than streams)."""

    __slots__ = ("proto",)

    def __init__(self, proto: _Protocol) -> None:
        self.proto = proto
        self.stream = None
        self.buf = b""
        self.idle_since = 0.0
        self.reused = False

    async def send(self, data: bytes) -> None:
        proto = self.proto
        if proto.eof or proto.transport is None or proto.transport.is_closing():
            raise anyio.BrokenResourceError("connection closed")
        proto.transport.write(data)

    async def receive(self) -> bytes:
        proto = self.proto
        if proto.paused:
            proto.resume()
        while not proto.chunks:
            if proto.eof:
                if proto.exc is not None:
                    raise ConnectionResetError(str(proto.exc) or type(proto.exc).__name__)
                raise anyio.EndOfStream
            waiter = proto.waiter = asyncio.get_running_loop().create_future()
            try:
                await waiter
            finally:
                proto.waiter = None
        chunks = proto.chunks
        data = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        chunks.clear()
        return data

    async def aclose(self) -> None:
        transport = self.proto.transport
        if transport is not None:
            transport.close()


class _Dechunker:
    """Incremental HTTP/1.1 body de-framing: ``feed(bytes) -> payload bytes``; ``complete`` at the end.

    Handles chunked transfer coding (sizes, extensions, trailers), Content-Length and
    read-until-close bodies; bytes after the end of the message are kept in ``leftover``.
    """

    __slots__ = ("_buf", "_chunk_left", "_need_crlf", "_trailer", "complete", "framing", "leftover", "remaining")

    def __init__(self, framing: int, length: int = 0) -> None:
        self.framing = framing
        self.remaining = length
        self.complete = framing == _NONE
        self.leftover = b""
        self._buf = b""
        self._chunk_left = 0
        self._need_crlf = False
        self._trailer = False

    def feed(self, data: bytes) -> bytes:
        framing = self.framing
        if framing == _CHUNKED and not (
            self.complete or self._buf or self._chunk_left or self._need_crlf or self._trailer
        ):
            # between chunks, a read that is exactly one whole chunk (a token's event at token pace):
            # its data at once; anything else (a size of 0, extensions, several or partial chunks, the
            # end) takes the general path
            eol = data.find(b"\r\n", 0, 64)
            if eol > 0:
                end = len(data) - 2
                try:
                    size = int(data[:eol], 16)
                except ValueError:
                    size = 0
                if size > 0 and end - eol - 2 == size and data[end:] == b"\r\n":
                    return data[eol + 2 : end]
        if self.complete:
            self.leftover += data
            return b""
        if framing == _CHUNKED:
            return self._feed_chunked(data)
        if framing == _LENGTH:
            take = data[: self.remaining]
            self.remaining -= len(take)
            if self.remaining == 0:
                self.complete = True
                self.leftover = data[len(take) :]
            return take
        return data  # until close

    def eof(self) -> None:
        """The peer closed: fine for read-until-close bodies, an error otherwise."""
        if self.complete:
            return
        if self.framing == _UNTIL_CLOSE:
            self.complete = True
            return
        raise httpx.RemoteProtocolError("peer closed connection without sending complete message body")

    def _feed_chunked(self, data: bytes) -> bytes:
        buf = self._buf + data if self._buf else data
        pos = 0
        n = len(buf)
        out: list[bytes] = []
        chunk_left = self._chunk_left
        while pos < n:
            if chunk_left:
                piece = buf[pos : pos + chunk_left]
                out.append(piece)
                chunk_left -= len(piece)
                pos += len(piece)
                if chunk_left == 0:
                    self._need_crlf = True
                continue
            if self._need_crlf:
                if n - pos < 2:
                    break
                if buf[pos : pos + 2] != b"\r\n":
                    raise httpx.RemoteProtocolError("malformed chunked encoding: missing CRLF after chunk data")
                pos += 2
                self._need_crlf = False
                continue
            eol = buf.find(b"\r\n", pos)
            if eol < 0:
                if n - pos > 4096:
                    raise httpx.RemoteProtocolError("malformed chunked encoding: chunk-size line too long")
                break
            line = buf[pos:eol]
            pos = eol + 2
            if self._trailer:
                if not line:  # end of trailers: message complete
                    self.complete = True
                    self.leftover = buf[pos:]
                    pos = n
                    break
                continue
            try:
                size = int(line.split(b";", 1)[0].strip(), 16)
            except ValueError:
                raise httpx.RemoteProtocolError(f"malformed chunked encoding: bad chunk size {line[:20]!r}") from None
            if size < 0:
                raise httpx.RemoteProtocolError(f"malformed chunked encoding: bad chunk size {line[:20]!r}")
            if size == 0:
                self._trailer = True
            else:
                chunk_left = size
        self._chunk_left = chunk_left
        self._buf = buf[pos:] if pos < n else b""
        if not out:
            return b""
        return out[0] if len(out) == 1 else b"".join(out)


class _Body(httpx.AsyncByteStream):
    """The response body, de-framed; hands the connection back when fully read.

    Iterate it (any backend), or on asyncio call ``stream_to(sink)``: the protocol's
    ``data_received`` then stamps, de-frames and hands each read to ``sink`` directly, with no
    task switch per read.
    """

    __slots__ = ("_conn", "_dechunker", "_keep_alive", "_key", "_owner")

    def __init__(
        self, conn: _Conn, framing: int, length: int, owner: RawHTTP11Transport, key: tuple, keep_alive: bool
    ) -> None:
        self._conn: _Conn | None = conn  # None once handed back or closed
        self._dechunker = _Dechunker(framing, length)
        self._owner = owner
        self._key = key
        self._keep_alive = keep_alive and framing != _UNTIL_CLOSE

    @property
    def _complete(self) -> bool:
        return self._dechunker.complete

    def _take_buffered(self) -> bytes:
        conn = self._conn
        assert conn is not None  # callers return early when the connection is gone
        data, conn.buf = conn.buf, b""
        return data

    def _finish_read(self) -> None:
        """Keep bytes that followed this message for the next one on the connection."""
        if self._dechunker.complete and self._conn is not None:
            self._conn.buf = self._dechunker.leftover
            self._dechunker.leftover = b""

    async def __aiter__(self) -> typing.AsyncIterator[bytes]:
        conn = self._conn
        dechunker = self._dechunker
        if conn is None or dechunker.complete:
            return
        try:
            data = self._take_buffered()
            while True:
                if data:
                    part = dechunker.feed(data)
                    if dechunker.complete:
                        self._finish_read()
                    if part:
                        yield part
                    if dechunker.complete:
                        return
                try:
                    data = await conn.receive()
                except anyio.EndOfStream:
                    dechunker.eof()
                    return
        except (anyio.BrokenResourceError, ConnectionError, OSError) as exc:
            raise httpx.ReadError(f"connection reset while reading the body: {exc}") from None

    async def stream_to(self, sink: typing.Callable[[int, bytes], bool]) -> None:
        """Hand each read to ``sink(arrival_ns, payload)`` until the body ends or ``sink`` returns True.

        ``arrival_ns`` is ``perf_counter_ns()`` when the bytes came off the socket. Exceptions from
        ``sink`` or the de-framing end the stream and are raised here.
        """
        conn = self._conn
        dechunker = self._dechunker
        if conn is None or dechunker.complete:
            return
        if not isinstance(conn, _ProtoConn):
            async for part in self:
                if sink(time.perf_counter_ns(), part):
                    return
            return
        proto = conn.proto
        proto.resume()
        loop = asyncio.get_running_loop()
        done = loop.create_future()

        def on_data(data: bytes) -> None:
            if done.done():
                proto.chunks.append(data)
                return
            t = time.perf_counter_ns()
            try:
                part = dechunker.feed(data)
                stop = sink(t, part) if part else False
                if dechunker.complete:
                    self._finish_read()
                    done.set_result(None)
                elif stop:
                    done.set_result(None)
            except BaseException as exc:
                done.set_exception(exc)

        def on_eof(exc: BaseException | None) -> None:
            if done.done():
                return
            if exc is not None:
                done.set_exception(httpx.ReadError(f"connection reset while reading the body: {exc}"))
                return
            try:
                dechunker.eof()
                done.set_result(None)
            except BaseException as err:
                done.set_exception(err)

        # bytes that arrived before we attached, then the callback for the rest
        pending = self._take_buffered() + (b"".join(proto.chunks) if proto.chunks else b"")
        proto.chunks.clear()
        proto.sink, proto.sink_eof = on_data, on_eof
        try:
            if pending:
                on_data(pending)
            if proto.eof and not done.done():
                on_eof(proto.exc)
            await done
        finally:
            proto.sink = proto.sink_eof = None

    def pause_reading(self) -> None:
        """Read no more of the socket until the body is read on (``stream_to``) or handed back: back-pressure
        while the reader is busy elsewhere (the server's sends wait in the socket's buffers, not in memory here).
        Only on asyncio's protocol connections; a stream connection is read only when asked anyway."""
        conn = self._conn
        if isinstance(conn, _ProtoConn) and not self._dechunker.complete:
            conn.proto.pause()

    @property
    def complete(self) -> bool:
        """True once the whole body (chunked terminator included) has been read."""
        return self._complete

    def release_nowait(self) -> bool:
        """Hand a fully read keep-alive connection back without awaiting; False when ``aclose`` is needed."""
        if self._conn is None:
            return True
        if self._complete and self._keep_alive:
            conn, self._conn = self._conn, None
            self._owner._release(conn, self._key)
            return True
        return False

    async def aclose(self) -> None:
        conn, self._conn = self._conn, None
        if conn is None:
            return
        if self._complete and self._keep_alive:
            self._owner._release(conn, self._key)
        else:
            await conn.aclose()


class RawResponse:
    """Status, head and body stream of one response on the fast path."""

    __slots__ = ("body", "headers", "reason", "status")

    def __init__(self, status: int, reason: bytes, headers: list[tuple[bytes, bytes]], body: _Body) -> None:
        self.status = status
        self.reason = reason
        self.headers = headers
        self.body = body

    def header(self, name: bytes) -> str | None:
        """First value of a header (name in lower case), decoded."""
        for key, value in self.headers:
            if key.lower() == name:
                return value.decode("latin-1")
        return None

    async def read(self, limit: int = 1 << 16) -> bytes:
        """The body (up to ``limit`` bytes), then close."""
        parts: list[bytes] = []
        size = 0
        try:
            async for part in self.body:
                parts.append(part)
                size += len(part)
                if size >= limit:
                    break
        finally:
            await self.body.aclose()
        return b"".join(parts)[:limit]


def _not_http(answer: bytes) -> str:
    """Why an answer whose first bytes are not ``HTTP/`` is no HTTP/1.1 response: a TLS server (the target's
    scheme is http://) sends an alert record and closes; an HTTP/2-only one sends its SETTINGS frame and waits."""
    if answer[0] in (0x15, 0x16) and answer[1:2] == b"\x03":
        why = "a TLS record: the target answers TLS, is its URL https://?"
    elif len(answer) >= 9 and answer[3] == 0x04 and answer[5:9] == b"\0\0\0\0":
        why = "an HTTP/2 SETTINGS frame: the target speaks HTTP/2 only"
    else:
        why = "no status line"
    return f"answer is not HTTP/1.1 ({why}): it begins {answer[:16]!r}"


def _parse_head(head: bytes) -> tuple[int, bytes, list[tuple[bytes, bytes]]]:
    lines = head.split(b"\r\n")
    parts = lines[0].split(b" ", 2)
    if len(parts) < 2 or not parts[0].startswith(b"HTTP/1."):
        raise MalformedHead(f"malformed status line {lines[0][:60]!r}")
    try:
        status = int(parts[1])
    except ValueError:
        raise MalformedHead(f"malformed status line {lines[0][:60]!r}") from None
    headers = []
    for line in lines[1:]:
        if not line:
            continue
        name, sep, value = line.partition(b":")
        if not sep:
            raise MalformedHead(f"malformed header line {line[:60]!r}")
        headers.append((name.strip(), value.strip()))
    return status, parts[2] if len(parts) > 2 else b"", headers


class RawHTTP11Transport(httpx.AsyncBaseTransport):
    """HTTP/1.1 with keep-alive; see module docstring. ``opened`` counts new connections."""

    def __init__(
        self,
        *,
        verify: bool | ssl.SSLContext = True,
        keepalive_expiry_s: float = 30.0,
        max_idle: int = 4096,
        connect_timeout_s: float | None = 30.0,
    ) -> None:
        self._verify = verify
        self._ssl: ssl.SSLContext | None = None
        self._expiry = keepalive_expiry_s
        self._max_idle = max_idle
        self._connect_timeout_s = connect_timeout_s
        self._idle: dict[tuple, list[_Conn]] = {}
        self._addresses: dict[tuple[str, int], str] = {}
        self.opened = 0
        self.connect_failures = 0

    def _ssl_context(self) -> ssl.SSLContext:
        if self._ssl is None:
            self._ssl = (
                self._verify
                if isinstance(self._verify, ssl.SSLContext)
                else httpx.create_ssl_context(verify=self._verify)
            )
        return self._ssl

    async def _connect(self, scheme: bytes, host: str, port: int) -> _Conn:
        stream: anyio.abc.ByteStream
        try:
            with anyio.fail_after(self._connect_timeout_s):
                if on_asyncio():
                    loop = asyncio.get_running_loop()
                    https = scheme == b"https"
                    address = self._addresses.get((host, port))
                    # the first connection resolves the name (trying every address); later ones reuse
                    # the address that answered, so a burst of new connections does no DNS
                    transport, proto = await loop.create_connection(
                        _Protocol,
                        address or host,
                        port,
                        ssl=self._ssl_context() if https else None,  # None, None: create_connection's defaults
                        server_hostname=host if https else None,
                    )
                    if address is None:
                        peer = transport.get_extra_info("peername")
                        if peer:
                            self._addresses[(host, port)] = peer[0]
                    self.opened += 1
                    return _ProtoConn(proto)
                if scheme == b"https":
                    stream = await anyio.connect_tcp(
                        host,
                        port,
                        tls=True,
                        ssl_context=self._ssl_context(),
                        tls_hostname=host,
                        tls_standard_compatible=False,
                    )
                else:
                    stream = await anyio.connect_tcp(host, port)
        except TimeoutError:
            raise httpx.ConnectTimeout(f"connect to {host}:{port} timed out") from None
        except (OSError, anyio.BrokenResourceError, ssl.SSLError) as exc:
            self._addresses.pop((host, port), None)  # resolve again next time
            raise httpx.ConnectError(f"connect to {host}:{port} failed: {exc}") from None
        self.opened += 1
        return _Conn(stream)

    async def _pop_idle(self, key: tuple) -> _Conn | None:
        """The most recently used idle connection that has not expired (expired ones are closed)."""
        idle = self._idle.get(key)
        now = time.monotonic()
        while idle:
            conn = idle.pop()
            if isinstance(conn, _ProtoConn):
                conn.proto.idle = False
                if conn.proto.eof:  # closed while idle (by the server, or for bytes it sent unasked)
                    await conn.aclose()
                    continue
            if now - conn.idle_since < self._expiry:
                conn.reused = True
                return conn
            await conn.aclose()
        return None

    def _release(self, conn: _Conn, key: tuple) -> None:
        if isinstance(conn, _ProtoConn):
            conn.proto.resume()  # an idle connection is read: bytes nobody asked for close it
        idle = self._idle.setdefault(key, [])
        if len(idle) < self._max_idle and not conn.buf:
            conn.idle_since = time.monotonic()
            if isinstance(conn, _ProtoConn):
                conn.proto.idle = True
            idle.append(conn)
        elif isinstance(conn, _ProtoConn) and conn.proto.transport is not None:
            conn.proto.transport.close()  # not kept: close now rather than when collected

    def idle_count(self, origin: tuple[bytes, str, int]) -> int:
        return len(self._idle.get(origin, ()))

    async def keep_idle(
        self,
        origin: tuple[bytes, str, int],
        low: int,
        high: int,
        *,
        interval_s: float = 0.005,
        task_status=anyio.TASK_STATUS_IGNORED,
    ) -> None:
        """Keep at least ``low`` idle connections open (refilling to ``high``) until cancelled.

        Connecting is then off the send path: a request due at its deadline finds a connection
        ready instead of paying a TCP (and TLS) handshake inside its send lag. Fills to ``high``
        before reporting started. Connect failures back off and are counted in ``connect_failures``.
        """
        started = False
        backoff = interval_s
        while True:
            try:
                while self.idle_count(origin) < (high if not started or self.idle_count(origin) < low else 0):
                    conn = await self._connect(*origin)
                    self._release(conn, origin)
                backoff = interval_s
            except httpx.HTTPError:
                self.connect_failures += 1
                backoff = min(1.0, backoff * 2)
            if not started:
                started = True
                task_status.started()
            await anyio.sleep(backoff)

    @staticmethod
    def origin(url: httpx.URL) -> tuple[bytes, str, int]:
        """The connection key (scheme, host, port) of a URL."""
        scheme = url.raw_scheme
        return scheme, url.host, url.port or (443 if scheme == b"https" else 80)

    @staticmethod
    def request_head(method: str, url: httpx.URL) -> bytes:
        """The first bytes ``encode_request`` writes for ``url`` when Host is the first header."""
        return method.encode() + b" " + url.raw_path + b" HTTP/1.1\r\nhost: " + url.netloc + b"\r\n"

    @staticmethod
    def encode_request(method: str, url: httpx.URL, headers: list[tuple[bytes, bytes]], body: bytes = b"") -> bytes:
        """The exact bytes of an HTTP/1.1 request (``headers`` must include Host; Content-Length is added)."""
        head = [method.encode(), b" ", url.raw_path, b" HTTP/1.1\r\n"]
        for name, value in headers:
            if name.lower() != b"content-length":
                head += (name, b": ", value, b"\r\n")
        if body or method in ("POST", "PUT", "PATCH"):
            head += (b"content-length: ", str(len(body)).encode(), b"\r\n")
        head.append(b"\r\n")
        return b"".join(head) + body

    def send_nowait(self, origin: tuple[bytes, str, int], payload: bytes) -> _Conn | None:
        """Write ``payload`` at once on an idle keep-alive connection (asyncio only); None when none is ready.

        Lets the scheduler put a request on the wire at its deadline, before any task switch;
        finish with ``open(origin, payload, sent=conn)``.
        """
        idle = self._idle.get(origin)
        now = time.monotonic()
        while idle:
            conn = idle[-1]
            if not isinstance(conn, _ProtoConn):
                return None
            idle.pop()
            proto = conn.proto
            proto.idle = False
            transport = proto.transport
            if now - conn.idle_since >= self._expiry or proto.eof or transport is None or transport.is_closing():
                if transport is not None:
                    transport.close()
                continue
            conn.reused = True
            transport.write(payload)
            return conn
        return None

    async def open(
        self,
        origin: tuple[bytes, str, int],
        payload: bytes,
        *,
        head_request: bool = False,
        sent: _Conn | None = None,
        timing: SendTiming | None = None,
    ) -> RawResponse:
        """Send ``payload`` (a whole encoded request) and read the response head; the body streams.

        This is the driver's hot path: no Request/Response objects, one send, one head parse.
        ``sent`` is a connection ``send_nowait`` already wrote the payload on. A reused keep-alive
        connection the server had closed is retried once on a new one. ``timing`` gets the connect
        and send instants (of the attempt that counted).
        """
        _now = time.perf_counter_ns
        for attempt in (0, 1):
            conn = sent if attempt == 0 else None
            if conn is None:
                if timing is not None and attempt:
                    timing.sent = None  # the first attempt's bytes went to a connection the server had closed
                conn = await self._pop_idle(origin)
            if conn is None:
                if timing is not None:
                    timing.connect_start = _now()
                conn = await self._connect(*origin)
                if timing is not None:
                    timing.connect_end = _now()
            got_bytes = False
            try:
                if conn is not sent:
                    await conn.send(payload)
                    if timing is not None:
                        timing.mark_sent(_now())
                buf = conn.buf
                searched = 0  # bytes of buf already searched for the head's end (a head read in small pieces)
                interim = 0
                while True:
                    end = buf.find(b"\r\n\r\n", searched)
                    if end >= 0:
                        status, reason, headers = _parse_head(buf[:end])
                        buf, searched = buf[end + 4 :], 0
                        if 100 <= status < 200 and status != 101:
                            interim += 1  # interim response (100 Continue): read the real one
                            if interim > _MAX_INTERIM:
                                raise MalformedHead(f"more than {_MAX_INTERIM} interim (1xx) responses, no answer")
                            continue
                        break
                    if len(buf) > _MAX_HEAD:
                        raise MalformedHead(f"response head too large: no end within {_MAX_HEAD} bytes")
                    if buf[:5] != b"HTTP/"[: len(buf)]:  # no status line can come: say what did, at once
                        raise MalformedHead(_not_http(buf))
                    searched = max(0, len(buf) - 3)
                    data = await conn.receive()
                    got_bytes = True
                    buf += data
                conn.buf = buf
            except anyio.EndOfStream:
                await conn.aclose()
                if conn.reused and not got_bytes and attempt == 0:
                    continue  # the server closed an idle keep-alive connection: retry once on a new one
                raise httpx.RemoteProtocolError("Server disconnected without sending a response.") from None
            except (anyio.BrokenResourceError, ConnectionError, OSError) as exc:
                await conn.aclose()
                if conn.reused and not got_bytes and attempt == 0:
                    continue
                raise httpx.ReadError(f"connection failed before the response: {exc}") from None
            except BaseException:
                await conn.aclose()
                raise
            break
        assert conn is not None  # each attempt breaks with a connection, continues (only the first) or raises
        framing, length, keep_alive = _NONE, 0, True
        te = cl = None
        for name, value in headers:
            lname = name.lower()
            if lname == b"transfer-encoding":
                te = value.lower()
            elif lname == b"content-length":
                cl = value
            elif lname == b"connection" and value.lower() == b"close":
                keep_alive = False
        if not head_request and status not in (204, 304):
            if te is not None and b"chunked" in te:
                framing = _CHUNKED
            elif cl is not None:
                try:
                    length = int(cl)
                except ValueError:
                    await conn.aclose()
                    raise httpx.RemoteProtocolError(f"bad Content-Length {cl[:20]!r}") from None
                framing = _LENGTH if length > 0 else _NONE
            else:
                framing = _UNTIL_CLOSE
        body = _Body(conn, framing, length, self, origin, keep_alive)
        if framing == _NONE:
            await body.aclose()
        return RawResponse(status, reason, headers, body)

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        """httpx's transport interface (probes, scrapes, /tokenize) on top of ``open``."""
        body = await request.aread()
        payload = self.encode_request(request.method, request.url, request.headers.raw, body)
        raw = await self.open(self.origin(request.url), payload, head_request=request.method == "HEAD")
        return httpx.Response(
            status_code=raw.status,
            headers=raw.headers,
            stream=raw.body,
            extensions={"http_version": b"HTTP/1.1", "reason_phrase": raw.reason},
        )

    async def aclose(self) -> None:
        for idle in self._idle.values():
            for conn in idle:
                await conn.aclose()
        self._idle.clear()
