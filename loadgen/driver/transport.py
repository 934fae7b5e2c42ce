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

import ssl
import time
import typing

import anyio
import anyio.abc
import httpx

__all__ = ["RawHTTP11Transport", "RawResponse"]

_READ = 65536
_MAX_HEAD = 1 << 20

_NONE = 0  # no body
_LENGTH = 1
_CHUNKED = 2
_UNTIL_CLOSE = 3


class _Conn:
    __slots__ = ("stream", "buf", "idle_since", "reused")

    def __init__(self, stream: anyio.abc.ByteStream) -> None:
        self.stream = stream
        self.buf = b""
        self.idle_since = 0.0
        self.reused = False

    async def receive(self) -> bytes:
        return await self.stream.receive(_READ)

    async def aclose(self) -> None:
        with anyio.CancelScope(shield=True):
            try:
                await self.stream.aclose()
            except (OSError, anyio.BrokenResourceError, anyio.ClosedResourceError):
                pass


class _Body(httpx.AsyncByteStream):
    """The response body, de-framed; hands the connection back when fully read."""

    __slots__ = ("_conn", "_framing", "_length", "_owner", "_key", "_complete", "_keep_alive")

    def __init__(self, conn: _Conn, framing: int, length: int, owner: "RawHTTP11Transport", key: tuple, keep_alive: bool) -> None:
        self._conn = conn
        self._framing = framing
        self._length = length
        self._owner = owner
        self._key = key
        self._complete = framing == _NONE
        self._keep_alive = keep_alive

    async def __aiter__(self) -> typing.AsyncIterator[bytes]:
        conn = self._conn
        if conn is None or self._complete:
            return
        try:
            if self._framing == _LENGTH:
                async for part in self._iter_length(conn):
                    yield part
            elif self._framing == _CHUNKED:
                async for part in self._iter_chunked(conn):
                    yield part
            else:
                async for part in self._iter_until_close(conn):
                    yield part
        except anyio.EndOfStream:
            raise httpx.RemoteProtocolError("peer closed connection without sending complete message body") from None
        except (anyio.BrokenResourceError, ConnectionError, OSError) as exc:
            raise httpx.ReadError(f"connection reset while reading the body: {exc}") from None

    async def _iter_length(self, conn: _Conn) -> typing.AsyncIterator[bytes]:
        remaining = self._length
        buf, conn.buf = conn.buf, b""
        while True:
            if buf:
                take = buf[:remaining]
                conn.buf = buf[remaining:]
                remaining -= len(take)
                if remaining == 0:
                    self._complete = True
                yield take
                if self._complete:
                    return
            buf = await conn.receive()

    async def _iter_until_close(self, conn: _Conn) -> typing.AsyncIterator[bytes]:
        self._keep_alive = False
        if conn.buf:
            data, conn.buf = conn.buf, b""
            yield data
        while True:
            try:
                data = await conn.receive()
            except anyio.EndOfStream:
                self._complete = True
                return
            yield data

    async def _iter_chunked(self, conn: _Conn) -> typing.AsyncIterator[bytes]:
        buf, conn.buf = conn.buf, b""
        pos = 0
        chunk_left = 0  # bytes of the current chunk's data still to come
        need_crlf = False  # the CRLF after a chunk's data
        in_trailer = False
        while True:
            out: list[bytes] = []
            n = len(buf)
            while pos < n:
                if chunk_left:
                    end = pos + chunk_left
                    piece = buf[pos:end]
                    out.append(piece)
                    chunk_left -= len(piece)
                    pos += len(piece)
                    if chunk_left == 0:
                        need_crlf = True
                    continue
                if need_crlf:
                    if n - pos < 2:
                        break
                    if buf[pos : pos + 2] != b"\r\n":
                        raise httpx.RemoteProtocolError("malformed chunked encoding: missing CRLF after chunk data")
                    pos += 2
                    need_crlf = False
                    continue
                eol = buf.find(b"\r\n", pos)
                if eol < 0:
                    if n - pos > 4096:
                        raise httpx.RemoteProtocolError("malformed chunked encoding: chunk-size line too long")
                    break
                line = buf[pos:eol]
                pos = eol + 2
                if in_trailer:
                    if not line:  # end of trailers: message complete
                        conn.buf = buf[pos:]
                        self._complete = True
                        if out:
                            yield b"".join(out)
                        return
                    continue
                try:
                    size = int(line.split(b";", 1)[0].strip(), 16)
                except ValueError:
                    raise httpx.RemoteProtocolError(f"malformed chunked encoding: bad chunk size {line[:20]!r}") from None
                if size == 0:
                    in_trailer = True
                else:
                    chunk_left = size
            if out:
                yield out[0] if len(out) == 1 else b"".join(out)
            buf = buf[pos:] + await conn.receive() if pos < len(buf) else await conn.receive()
            pos = 0

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

    __slots__ = ("status", "reason", "headers", "body")

    def __init__(self, status: int, reason: bytes, headers: list[tuple[bytes, bytes]], body: "_Body") -> None:
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


def _parse_head(head: bytes) -> tuple[int, bytes, list[tuple[bytes, bytes]]]:
    lines = head.split(b"\r\n")
    parts = lines[0].split(b" ", 2)
    if len(parts) < 2 or not parts[0].startswith(b"HTTP/1."):
        raise httpx.RemoteProtocolError(f"malformed status line {lines[0][:60]!r}")
    try:
        status = int(parts[1])
    except ValueError:
        raise httpx.RemoteProtocolError(f"malformed status line {lines[0][:60]!r}") from None
    headers = []
    for line in lines[1:]:
        if not line:
            continue
        name, sep, value = line.partition(b":")
        if not sep:
            raise httpx.RemoteProtocolError(f"malformed header line {line[:60]!r}")
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
        self.opened = 0

    def _ssl_context(self) -> ssl.SSLContext:
        if self._ssl is None:
            self._ssl = self._verify if isinstance(self._verify, ssl.SSLContext) else httpx.create_ssl_context(verify=self._verify)
        return self._ssl

    async def _connect(self, scheme: bytes, host: str, port: int) -> _Conn:
        try:
            with anyio.fail_after(self._connect_timeout_s):
                if scheme == b"https":
                    stream = await anyio.connect_tcp(host, port, tls=True, ssl_context=self._ssl_context(),
                                                     tls_hostname=host, tls_standard_compatible=False)
                else:
                    stream = await anyio.connect_tcp(host, port)
        except TimeoutError:
            raise httpx.ConnectTimeout(f"connect to {host}:{port} timed out") from None
        except (OSError, anyio.BrokenResourceError, ssl.SSLError) as exc:
            raise httpx.ConnectError(f"connect to {host}:{port} failed: {exc}") from None
        self.opened += 1
        return _Conn(stream)

    async def _pop_idle(self, key: tuple) -> _Conn | None:
        """The most recently used idle connection that has not expired (expired ones are closed)."""
        idle = self._idle.get(key)
        now = time.monotonic()
        while idle:
            conn = idle.pop()
            if now - conn.idle_since < self._expiry:
                conn.reused = True
                return conn
            await conn.aclose()
        return None

    def _release(self, conn: _Conn, key: tuple) -> None:
        idle = self._idle.setdefault(key, [])
        if len(idle) < self._max_idle and not conn.buf:
            conn.idle_since = time.monotonic()
            idle.append(conn)

    @staticmethod
    def origin(url: httpx.URL) -> tuple[bytes, str, int]:
        """The connection key (scheme, host, port) of a URL."""
        scheme = url.raw_scheme
        return scheme, url.host, url.port or (443 if scheme == b"https" else 80)

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

    async def open(self, origin: tuple[bytes, str, int], payload: bytes, *, head_request: bool = False) -> RawResponse:
        """Send ``payload`` (a whole encoded request) and read the response head; the body streams.

        This is the driver's hot path: no Request/Response objects, one send, one head parse.
        A reused keep-alive connection the server had closed is retried once on a new one.
        """
        for attempt in (0, 1):
            conn = await self._pop_idle(origin)
            if conn is None:
                conn = await self._connect(*origin)
            got_bytes = False
            try:
                await conn.stream.send(payload)
                buf = conn.buf
                while True:
                    end = buf.find(b"\r\n\r\n")
                    if end >= 0:
                        status, reason, headers = _parse_head(buf[:end])
                        buf = buf[end + 4 :]
                        if 100 <= status < 200 and status != 101:
                            continue  # interim response (100 Continue): read the real one
                        break
                    if len(buf) > _MAX_HEAD:
                        raise httpx.RemoteProtocolError("response head too large")
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
