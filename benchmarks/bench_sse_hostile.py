"""One hostile stream must not move the other requests' send lag (issue 12, SSE decoding).

A scripted server on loopback (its own process) streams ordinary completions (16 chunks, 10 ms apart) to
every request but one; that one gets a single 10 MB SSE line, written as fast as the socket takes it.
The driver replays a Poisson trace against it (in this process, as ``loadgen run`` would) and the script
prints, for the requests scheduled while the hostile stream was being read, the send lag (sent −
scheduled) p50/p99/max next to a run without the hostile request:

- ``baseline``: no hostile request;
- ``capped``: the default line cap (1 MiB): the hostile request fails at once as ``malformed_sse``;
- ``uncapped``: the cap raised to 64 MiB, so the whole 10 MB line is decoded (linear time; what remains is
  one 10 MB join and a failed JSON parse when the line ends, about 10 ms of event-loop time);
- ``quadratic``: (``--with-old``) the pre-fix decoder, which joined and re-split its buffer on every read.

    python benchmarks/bench_sse_hostile.py               # ~30 s
    python benchmarks/bench_sse_hostile.py --with-old    # also the old decoder (slow by design)

Figures only: no pass/fail (timing belongs here, not in tests).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pyarrow as pa

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import loadgen.driver.client as client_module
from loadgen.driver import RunOptions, run_trace_sync
from loadgen.rundir.io import load_run
from loadgen.rundir.schema import TRACE_SCHEMA
from loadgen.trace.io import write_trace

LINE_BYTES = 10 * 1024 * 1024
HOSTILE_ID = "r0000100"

SERVER = r"""
import asyncio, json, sys
LINE = int(sys.argv[1])

def ev(text, finish=None):
    obj = {"id": "x", "object": "text_completion", "model": "m", "choices": [{"index": 0, "text": text, "finish_reason": finish}]}
    return b"data: " + json.dumps(obj).encode() + b"\n\n"

def chunk(data):
    return b"%x\r\n" % len(data) + data + b"\r\n"

async def handle(reader, writer):
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            lines = head.decode().split("\r\n")
            method, path, _ = lines[0].split(" ")
            hdr = {l.split(":", 1)[0].lower(): l.split(":", 1)[1].strip() for l in lines[1:] if ":" in l}
            await reader.readexactly(int(hdr.get("content-length", "0")))
            if method == "GET":
                data = {"/version": b'{"version": "hostile-1"}', "/v1/models": b'{"data": [{"id": "m", "owned_by": "x"}]}'}.get(path, b"{}")
                status = b"200 OK" if path in ("/version", "/v1/models") else b"404 Not Found"
                writer.write(b"HTTP/1.1 " + status + b"\r\ncontent-length: %d\r\n\r\n" % len(data) + data)
                await writer.drain()
                continue
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
            if "x-hostile" in hdr:
                writer.write(chunk(b"data: "))
                piece = b"x" * 65536
                for _ in range(LINE // len(piece)):
                    writer.write(chunk(piece))
                    await writer.drain()
                writer.write(chunk(b"\n\n" + b"data: [DONE]\n\n"))
            else:
                for i in range(16):
                    writer.write(chunk(ev(" the", "length" if i == 15 else None)))
                    await writer.drain()
                    await asyncio.sleep(0.01)
                writer.write(chunk(b"data: [DONE]\n\n"))
            writer.write(b"0\r\n\r\n")
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    finally:
        writer.close()

async def main():
    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    print("listening", server.sockets[0].getsockname()[1], flush=True)
    async with server:
        await server.serve_forever()

asyncio.run(main())
"""


class QuadraticDecoder:
    """The decoder before the fix (for comparison only): the whole buffer joined and split on every read."""

    def __init__(self, max_line_bytes: int = 0) -> None:
        self._tail = b""
        self._data: list[bytes] = []
        self._event_bytes = 0
        self.sizes: list[int] = []

    def feed(self, data: bytes) -> list[bytes]:
        lines = (self._tail + data).split(b"\n")
        self._tail = lines.pop()
        events, sizes = [], []
        for line in lines:
            self._event_bytes += len(line) + 1
            line = line.rstrip(b"\r")
            if not line:
                if self._data:
                    events.append(b"\n".join(self._data))
                    sizes.append(self._event_bytes)
                    self._data = []
                self._event_bytes = 0
            elif line.startswith(b"data:"):
                self._data.append(line[5:].lstrip(b" "))
        self.sizes = sizes
        return events

    def flush(self) -> list[bytes]:
        events = self.feed(b"\n\n") if (self._tail or self._data) else []
        self._tail = b""
        return events

    @property
    def pending(self) -> bool:
        return bool(self._tail or self._data)


def make_trace(path: Path, rate: float, duration_s: float, seed: int = 3) -> None:
    rng = np.random.default_rng(seed)
    n = int(rate * duration_s)
    offsets = (np.cumsum(rng.exponential(1.0 / rate, n)) * 1e9).astype(np.int64)
    rows = {
        "request_id": [f"r{i:07d}" for i in range(n)],
        "request_class": ["short-message"] * n,
        "scheduled_offset_ns": offsets,
        "prompt_tokens": [16] * n,
        "output_tokens": [16] * n,
        "prefix_group": [None] * n,
        "prefix_tokens": [None] * n,
        "conversation_id": [None] * n,
        "turn_index": [None] * n,
        "cancel_after_tokens": [None] * n,
    }
    write_trace(
        pa.table(rows, schema=TRACE_SCHEMA),
        path,
        {"mode": "open", "max_in_flight": 4096, "trace_name": "p", "seed": seed},
    )


def one_run(label: str, url: str, trace: Path, out: Path, *, hostile: bool, cap: int) -> None:
    headers = {HOSTILE_ID: {"x-hostile": "1"}} if hostile else {}
    run_dir = run_trace_sync(
        RunOptions(
            trace_path=trace,
            target_url=url,
            out_dir=out,
            progress="off",
            scrape_metrics="off",
            vllm_extensions="off",
            tokenizer="chars:4",
            request_headers=headers,
            max_sse_line_bytes=cap,
        )
    )
    rows = {r["request_id"]: r for r in load_run(run_dir, chunks=False).requests.to_pylist()}
    h = rows[HOSTILE_ID]
    start = h["scheduled_ns"]
    end = h["done_ns"] or start
    end = max(end, start + 500_000_000)  # at least the half second after it
    lag = np.array(
        [
            (r["sent_ns"] - r["scheduled_ns"]) / 1e6
            for rid, r in rows.items()
            if rid != HOSTILE_ID and r["sent_ns"] is not None and start <= r["scheduled_ns"] <= end
        ]
    )
    others_ok = sum(1 for rid, r in rows.items() if rid != HOSTILE_ID and r["status"] == "ok")
    hostile_what = f"{h['status']}/{h['error_kind']}" if hostile else "(not hostile)"
    hostile_ms = (h["done_ns"] - h["sent_ns"]) / 1e6 if hostile and h["done_ns"] and h["sent_ns"] else float("nan")
    print(
        f"{label:10s} n={len(lag):4d} send lag p50 {np.percentile(lag, 50):7.3f} ms  p99 {np.percentile(lag, 99):7.3f} ms  "
        f"max {lag.max():7.3f} ms | others ok {others_ok}/{len(rows) - 1} | r100 {hostile_what} in {hostile_ms:.0f} ms"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rate", type=float, default=100.0)
    ap.add_argument("--duration-s", type=float, default=4.0)
    ap.add_argument("--with-old", action="store_true", help="also run the pre-fix quadratic decoder")
    args = ap.parse_args()
    proc = subprocess.Popen([sys.executable, "-c", SERVER, str(LINE_BYTES)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        url = f"http://127.0.0.1:{int(proc.stdout.readline().split()[1])}"
        with tempfile.TemporaryDirectory() as tmp:
            work = Path(tmp)
            trace = work / "t.parquet"
            make_trace(trace, args.rate, args.duration_s)
            print(
                f"{args.rate:g} req/s for {args.duration_s:g} s; request {HOSTILE_ID} may get one {LINE_BYTES >> 20} MB "
                "line; lag of the others scheduled while it streamed:"
            )
            one_run("baseline", url, trace, work / "base", hostile=False, cap=1 << 20)
            one_run("capped", url, trace, work / "capped", hostile=True, cap=1 << 20)
            one_run("uncapped", url, trace, work / "uncapped", hostile=True, cap=64 << 20)
            if args.with_old:
                client_module.SSEDecoder = QuadraticDecoder  # type: ignore[misc]
                one_run("quadratic", url, trace, work / "old", hostile=True, cap=64 << 20)
    finally:
        proc.kill()
        proc.wait(timeout=10)


if __name__ == "__main__":
    from docs_page import recorded  # why: run as a script, benchmarks/ is on sys.path

    with recorded(__file__):  # its figures into docs/benchmarks.md
        main()
