"""Driver edge cases the simulated engine does not produce, against a small scripted HTTP server
process on loopback: truncated streams, empty output, in-stream errors, content_filter, HTTP-date
Retry-After, Content-Length and close-delimited SSE bodies, CRLF framing, keep-alive reuse."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest

from loadgen.driver import RunOptions, run_trace_sync
from loadgen.rundir.io import load_run
from loadgen.rundir.schema import TRACE_SCHEMA
from loadgen.trace.io import write_trace

SERVER = r"""
import asyncio, json, sys

def ev(obj, crlf=False):
    nl = b"\r\n" if crlf else b"\n"
    return b"data: " + json.dumps(obj).encode() + nl + nl

def tok(text, finish=None):
    return {"id": "x", "object": "text_completion", "model": "edge-model", "system_fingerprint": "fp_edge",
            "choices": [{"index": 0, "text": text, "finish_reason": finish}]}

USAGE = {"id": "x", "choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 3}}

async def handle(reader, writer):
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            lines = head.decode().split("\r\n")
            method, path, _ = lines[0].split(" ")
            hdr = {l.split(":", 1)[0].lower(): l.split(":", 1)[1].strip() for l in lines[1:] if ":" in l}
            body = await reader.readexactly(int(hdr.get("content-length", "0")))
            if method == "GET":
                data = {"/version": b'{"version": "edge-1", "server": "edge"}', "/v1/models": b'{"data": [{"id": "edge-model", "owned_by": "edge"}]}'}.get(path, b"{}")
                status = b"200 OK" if path in ("/version", "/v1/models") else b"404 Not Found"
                writer.write(b"HTTP/1.1 " + status + b"\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n" % len(data) + data)
                await writer.drain()
                continue
            mode = json.loads(body)["prompt"].split()[0]
            sse = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
            if mode == "truncated":  # chunked body that ends properly but the stream never finishes
                writer.write(sse + b"transfer-encoding: chunked\r\n\r\n")
                for part in (ev(tok(" the")), ev(tok(" of"))):
                    writer.write(b"%x\r\n" % len(part) + part + b"\r\n")
                writer.write(b"0\r\n\r\n")
            elif mode == "empty":
                data = ev(tok("", "stop")) + ev({**USAGE, "usage": {"prompt_tokens": 7, "completion_tokens": 0}}) + b"data: [DONE]\n\n"
                writer.write(sse + b"content-length: %d\r\n\r\n" % len(data) + data)
            elif mode == "instream":
                data = ev(tok(" the")) + ev({"error": {"message": "engine died", "type": "InternalServerError", "code": 500}})
                writer.write(sse + b"content-length: %d\r\n\r\n" % len(data) + data)
            elif mode == "filter":
                data = ev(tok(" the")) + ev(tok("", "content_filter")) + b"data: [DONE]\n\n"
                writer.write(sse + b"content-length: %d\r\n\r\n" % len(data) + data)
            elif mode == "datequota":
                data = b'{"error": {"message": "quota"}}'
                writer.write(b"HTTP/1.1 429 Too Many Requests\r\nretry-after: Wed, 21 Oct 2099 07:28:00 GMT\r\ncontent-length: %d\r\n\r\n" % len(data) + data)
            elif mode == "hugeline":  # one SSE line of 3 MiB: over the driver's 1 MiB cap
                writer.write(sse + b"transfer-encoding: chunked\r\n\r\n")
                first = ev(tok(" the")) + b"data: "
                writer.write(b"%x\r\n" % len(first) + first + b"\r\n")
                piece = b"x" * 65536
                for _ in range(48):
                    writer.write(b"%x\r\n" % len(piece) + piece + b"\r\n")
                    await writer.drain()
                tail = b"\n\ndata: [DONE]\n\n"
                writer.write(b"%x\r\n" % len(tail) + tail + b"\r\n0\r\n\r\n")
            elif mode == "closedelim":  # no length, no chunking: the body ends when the server closes
                writer.write(sse + b"connection: close\r\n\r\n" + ev(tok(" the")) + ev(tok(" of", "length"), crlf=True) + b"data: [DONE]\r\n\r\n")
                await writer.drain()
                writer.close()
                return
            else:  # ok, CRLF framing, chunk split mid-event
                data = ev(tok(" the"), True) + ev(tok(" of and"), True) + ev(tok("", "length"), True) + ev(USAGE, True) + b"data: [DONE]\r\n\r\n"
                half = len(data) // 2
                writer.write(sse + b"transfer-encoding: chunked\r\n\r\n")
                for part in (data[:half], data[half:]):
                    writer.write(b"%x\r\n" % len(part) + part + b"\r\n")
                    await writer.drain()
                    await asyncio.sleep(0.01)
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


@pytest.fixture(scope="module")
def edge_url():
    proc = subprocess.Popen([sys.executable, "-c", SERVER], stdout=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        assert line.startswith("listening"), line
        yield f"http://127.0.0.1:{int(line.split()[1])}"
    finally:
        proc.kill()
        proc.wait(timeout=10)


MODES = ["ok", "truncated", "empty", "instream", "filter", "datequota", "closedelim", "ok"]


def test_edge_outcomes(edge_url, tmp_path: Path, monkeypatch):
    # prompts are synthesized: make each prompt start with the word that names the server's behaviour
    import loadgen.driver.jobs as jobs

    class Steered(jobs.PromptSynth):
        def text(self, key, n_tokens, prefix_key=None, prefix_tokens=0):
            return f"{key.removesuffix('2')} filler words"

    monkeypatch.setattr(jobs, "PromptSynth", Steered)
    ids = [*MODES[:-1], "ok2"]  # ok2 behaves like ok, last: it must reuse the keep-alive connection
    rows = [
        {
            "request_id": rid,
            "request_class": "burst",
            "scheduled_offset_ns": i * 30_000_000,
            "prompt_tokens": 8,
            "output_tokens": 3,
            "prefix_group": None,
            "prefix_tokens": None,
            "conversation_id": None,
            "turn_index": None,
            "cancel_after_tokens": None,
        }
        for i, rid in enumerate(ids)
    ]
    trace = write_trace(
        pa.Table.from_pylist(rows, schema=TRACE_SCHEMA),
        tmp_path / "t.parquet",
        {"mode": "open", "max_in_flight": 1, "trace_name": "edge", "seed": 0},
    )
    out = run_trace_sync(
        RunOptions(
            trace_path=trace, target_url=edge_url, out_dir=tmp_path / "run", progress="off", vllm_extensions="off"
        )
    )
    run = load_run(out)
    got = {r["request_id"]: r for r in run.requests.to_pylist()}
    assert {k: (v["status"], v["error_kind"]) for k, v in got.items()} == {
        "ok": ("ok", None),
        "ok2": ("ok", None),
        "truncated": ("error", "truncated"),
        "empty": ("error", "empty_output"),
        "instream": ("error", "http_5xx"),
        "filter": ("error", "content_filter"),
        "datequota": ("error", "http_429"),
        "closedelim": ("ok", None),
    }
    ok = got["ok"]
    assert ok["client_output_tokens"] == 3 == ok["server_output_tokens"] and ok["server_prompt_tokens"] == 7
    assert (
        ok["response_model"] == "edge-model"
        and ok["system_fingerprint"] == "fp_edge"
        and ok["finish_reason"] == "length"
    )
    assert got["instream"]["error_message"].startswith("in-stream error: engine died")
    assert got["datequota"]["retry_after_s"] > 86400
    assert got["closedelim"]["client_output_tokens"] == 2
    chunks = run.chunks.to_pandas()
    assert chunks[chunks.request_id == "ok"].tokens.tolist() == [1, 2, 0, 0]
    m = run.manifest.to_dict()
    assert m["target"]["kind"] == "openai-compatible" and m["target"]["version"] == {
        "version": "edge-1",
        "server": "edge",
    }
    assert m["modelExecuted"] is True  # a real (non-simulated) server produced tokens over the network
    # keep-alive: far fewer connections than requests (the in-stream error and the close-delimited
    # body end theirs; one spare is kept ready for the next deadline)
    assert m["driver"]["connections_opened"] <= 5


def test_an_overlong_sse_line_fails_only_its_request(edge_url, tmp_path: Path, monkeypatch):
    import loadgen.driver.jobs as jobs

    class Steered(jobs.PromptSynth):
        def text(self, key, n_tokens, prefix_key=None, prefix_tokens=0):
            return f"{key.rstrip('0123456789')} filler words"

    monkeypatch.setattr(jobs, "PromptSynth", Steered)
    ids = ["ok1", "hugeline", "ok2", "ok3"]
    rows = [
        {
            "request_id": rid,
            "request_class": "burst",
            "scheduled_offset_ns": i * 20_000_000,
            "prompt_tokens": 8,
            "output_tokens": 3,
            "prefix_group": None,
            "prefix_tokens": None,
            "conversation_id": None,
            "turn_index": None,
            "cancel_after_tokens": None,
        }
        for i, rid in enumerate(ids)
    ]
    trace = write_trace(
        pa.Table.from_pylist(rows, schema=TRACE_SCHEMA),
        tmp_path / "t.parquet",
        {"mode": "open", "max_in_flight": 4, "trace_name": "edge", "seed": 0},
    )
    out = run_trace_sync(
        RunOptions(
            trace_path=trace,
            target_url=edge_url,
            out_dir=tmp_path / "run",
            progress="off",
            vllm_extensions="off",
            max_sse_line_bytes=1 << 20,
        )
    )
    got = {r["request_id"]: r for r in load_run(out).requests.to_pylist()}
    assert {k: (v["status"], v["error_kind"]) for k, v in got.items()} == {
        "ok1": ("ok", None),
        "ok2": ("ok", None),
        "ok3": ("ok", None),
        "hugeline": ("error", "malformed_sse"),
    }
    assert "exceeds the cap of 1048576 bytes" in got["hugeline"]["error_message"]
    assert got["hugeline"]["client_output_tokens"] == 1  # the chunk before the long line was counted
