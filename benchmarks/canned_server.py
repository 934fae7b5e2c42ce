"""A canned OpenAI-style streaming server for client benchmarks: the least server CPU per streamed token.

Every POST gets the same 200 response: ``--tokens`` completion events in vLLM's shape (per-chunk usage),
a usage-only event and ``[DONE]``, chunked. Each event is its own write, one per stream per turn of the
event loop (as an engine step emits one token to every running stream), so the client reads them at the
pace a fast engine writes them. No engine, no tokenizer, no metrics: a client-side benchmark whose
simulated server needs a whole core (``loadgen sim serve`` at thousands of requests a second) measures
the server instead. Not a simulator: use ``loadgen sim serve`` for anything the answers mean.

    python benchmarks/canned_server.py --port 18600 --tokens 16
    python benchmarks/canned_server.py --port 18600 --reuse-port &   # more processes on one port (SO_REUSEPORT)

``launch()`` starts one or several (one port, the kernel spreading connections between them), each pinned.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator, Sequence


def vllm_event(i: int, last: bool) -> bytes:
    """Token ``i``'s SSE event as vLLM's completions stream sends it (continuous usage stats)."""
    usage = f'{{"prompt_tokens":32,"total_tokens":{33 + i},"completion_tokens":{i + 1}}}'
    finish = '"length"' if last else "null"
    return (
        f'data: {{"id":"cmpl-8d1f0c2b6a4e4f0b9d3c","object":"text_completion","created":1764576000,'
        f'"model":"loadgen-sim","choices":[{{"index":0,"text":" w{i}","logprobs":null,"finish_reason":{finish},'
        f'"stop_reason":null}}],"usage":{usage}}}\n\n'
    ).encode()


def _events(tokens: int) -> list[bytes]:
    """The whole stream, one HTTP chunk per event: the tokens, a usage-only event, [DONE], the last chunk."""
    usage = f'{{"prompt_tokens":32,"total_tokens":{32 + tokens},"completion_tokens":{tokens}}}'
    events = [vllm_event(i, i == tokens - 1) for i in range(tokens)]
    events.append(
        f'data: {{"id":"cmpl-8d1f0c2b6a4e4f0b9d3c","object":"text_completion","created":1764576000,'
        f'"model":"loadgen-sim","choices":[],"usage":{usage}}}\n\n'.encode()
    )
    events.append(b"data: [DONE]\n\n")
    framed = [b"%x\r\n%s\r\n" % (len(event), event) for event in events]
    framed[-1] += b"0\r\n\r\n"
    return framed


HEAD = (
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream; charset=utf-8\r\n"
    b"transfer-encoding: chunked\r\nconnection: keep-alive\r\n\r\n"
)


class _Conn(asyncio.Protocol):
    def __init__(self, events: list[bytes]) -> None:
        self.events = events
        self.buf = b""
        self.transport: asyncio.Transport | None = None
        self.loop = asyncio.get_running_loop()
        self.queue = 0  # requests received and not yet answered (pipelining is not used by clients here)

    def connection_made(self, transport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while True:
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                return
            head = self.buf[:end].lower()
            length = 0
            at = head.find(b"content-length:")
            if at >= 0:
                length = int(head[at + 15 : head.find(b"\r\n", at) if head.find(b"\r\n", at) >= 0 else None])
            if len(self.buf) < end + 4 + length:
                return
            self.buf = self.buf[end + 4 + length :]
            if not head.startswith(b"post"):  # probes (/version, /v1/models): a small JSON answer
                self._answer(head)
                continue
            self.queue += 1
            if self.queue == 1:
                self._start()

    def _answer(self, head: bytes) -> None:
        path = head.split(b" ", 2)[1] if head.count(b" ") >= 2 else b"/"
        if path.startswith(b"/v1/models"):
            body = b'{"object":"list","data":[{"id":"loadgen-sim","object":"model"}]}'
        elif path.startswith(b"/version"):
            body = b'{"version":"canned"}'
        else:
            body = b""
        status = b"200 OK" if body else b"404 Not Found"
        if self.transport is not None:
            self.transport.write(
                b"HTTP/1.1 %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
                % (status, len(body), body)
            )

    def _start(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(HEAD)
            self.loop.call_soon(self._next, 0)

    def _next(self, k: int) -> None:
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        transport.write(self.events[k])
        if k + 1 < len(self.events):
            self.loop.call_soon(self._next, k + 1)  # the next token one loop turn later
            return
        self.queue -= 1
        if self.queue:
            self._start()

    def connection_lost(self, exc) -> None:
        self.transport = None


async def serve(host: str, port: int, tokens: int, reuse_port: bool = False) -> None:
    loop = asyncio.get_running_loop()
    events = _events(tokens)
    server = await loop.create_server(lambda: _Conn(events), host, port, backlog=4096, reuse_port=reuse_port or None)
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    print(f"canned server on http://{host}:{server.sockets[0].getsockname()[1]}", flush=True)
    async with server:
        await stop.wait()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--reuse-port", action="store_true", help="bind with SO_REUSEPORT (several processes, one port)")
    args = ap.parse_args()
    try:
        import uvloop  # optional: less server CPU per write

        runner = asyncio.Runner(loop_factory=uvloop.new_event_loop)
    except ImportError:
        runner = asyncio.Runner()
    with runner:
        runner.run(serve(args.host, args.port, args.tokens, args.reuse_port))


def _start(
    port: int, tokens: int, cpus: set[int] | frozenset[int] | None, reuse_port: bool
) -> tuple[subprocess.Popen, str]:
    cmd = [sys.executable, __file__, "--port", str(port), "--tokens", str(tokens)] + (
        ["--reuse-port"] if reuse_port else []
    )
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, text=True, preexec_fn=(lambda: os.sched_setaffinity(0, cpus)) if cpus else None
    )
    line = proc.stdout.readline() if proc.stdout else ""
    if not line.startswith("canned server on "):
        proc.kill()
        raise RuntimeError(f"canned server did not start: {line!r}")
    return proc, line.split()[-1]


@contextlib.contextmanager
def launch(
    tokens: int = 16, cpus: Sequence[set[int] | frozenset[int] | None] = (None,)
) -> Iterator[tuple[str, list[int]]]:
    """One canned server process per entry of ``cpus`` (each pinned to that set; None: unpinned), all on one
    port (SO_REUSEPORT when more than one): yields (url, pids)."""
    procs: list[subprocess.Popen] = []
    try:
        first, url = _start(0, tokens, cpus[0], len(cpus) > 1)
        procs.append(first)
        port = int(url.rsplit(":", 1)[1])
        procs += [_start(port, tokens, c, True)[0] for c in cpus[1:]]
        yield url, [p.pid for p in procs]
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(10)


if __name__ == "__main__":
    main()
