"""Secrets and containment (issue 12): what a hostile target says is never stored verbatim; the simulated
server bounds what one client can make it hold; URLs and headers from the command line are checked."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from loadgen.driver import RunOptions
from loadgen.driver.probe import VERSION_MAX_BYTES, safe_version
from loadgen.targets import launch_sim_server as start_sim_server

REPO = Path(__file__).resolve().parents[1]
KEY = "sk-test-4f9a8b7c6d5e4f3a2b1c"


class _EchoHandler(BaseHTTPRequestHandler):
    """An OpenAI-compatible server that echoes the Authorization header into /version (and pads it)."""

    protocol_version = "HTTP/1.1"

    def log_message(self, *args: object) -> None:  # quiet
        pass

    def _send(self, status: int, body: bytes, ctype: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("content-type", ctype)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        if self.path == "/version":
            auth = self.headers.get("authorization", "")
            body = {
                "version": "9.9",
                "you_sent": auth,
                "authorization": auth,
                "padding": ["x" * 1000] * 200,
                "nested": {"echo": f"header was {auth}"},
            }
            self._send(200, json.dumps(body).encode())
        elif self.path == "/v1/models":
            self._send(200, json.dumps({"data": [{"id": "echo-model", "owned_by": "me"}]}).encode())
        else:
            self._send(404, b"{}")

    def do_POST(self) -> None:
        length = int(self.headers.get("content-length", "0"))
        self.rfile.read(length)
        chunk = {
            "id": "c",
            "object": "text_completion",
            "choices": [{"index": 0, "text": " hi", "finish_reason": None}],
        }
        last = {
            "id": "c",
            "object": "text_completion",
            "choices": [{"index": 0, "text": "", "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 5, "completion_tokens": 1},
        }
        body = (f"data: {json.dumps(chunk)}\n\ndata: {json.dumps(last)}\n\ndata: [DONE]\n\n").encode()
        self._send(200, body, "text/event-stream")


@contextmanager
def echo_server() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _EchoHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def _cli(*args: str, env: dict[str, str] | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "loadgen", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
        timeout=timeout,
        env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})},
    )


def _all_text(root: Path) -> str:
    return "\n".join(p.read_bytes().decode("utf-8", "replace") for p in root.rglob("*") if p.is_file())


def test_safe_version_redacts_credentials_and_caps_the_size() -> None:
    body = {
        "Authorization": f"Bearer {KEY}",
        "x-api-key": "abc",
        "tokenizer": "cl100k_base",
        "max_num_batched_tokens": 8,
        "note": f"key {KEY} and Basic dXNlcjpwYXNzd29yZA==",
        "mine": "s3cr3t-value!",
    }
    clean = safe_version(body, ("s3cr3t-value!",))
    text = json.dumps(clean)
    assert KEY not in text and "dXNlcjpwYXNzd29yZA==" not in text and "s3cr3t-value!" not in text
    assert clean["Authorization"] == clean["x-api-key"] == "REDACTED"
    assert clean["tokenizer"] == "cl100k_base" and clean["max_num_batched_tokens"] == 8  # not credential keys
    big = safe_version({"a": ["y" * 400] * 1000})
    assert big["truncated"] is True and len(json.dumps(big)) <= VERSION_MAX_BYTES


def test_a_target_echoing_the_api_key_never_gets_it_stored(tmp_path: Path) -> None:
    trace = tmp_path / "t.parquet"
    scenario = tmp_path / "s.toml"
    scenario.write_text(
        (REPO / "scenarios" / "canonical.toml")
        .read_text()
        .replace('cases = ["contract/canonical.toml"]', "cases = []")
        .replace("duration_s = 60", "duration_s = 2", 1)
    )
    assert _cli("trace", "generate", str(scenario), "--trace", "steady", "--out", str(trace)).returncode == 0
    with echo_server() as url:
        out = _cli(
            "run",
            str(trace),
            "--target",
            url,
            "--out",
            str(tmp_path / "run"),
            "--scenario",
            str(scenario),
            "--api-key-env",
            "ECHO_KEY",
            "--scrape-metrics",
            "off",
            env={"ECHO_KEY": KEY},
        )
        assert out.returncode == 0, out.stderr
    assert out.stderr.count(KEY) == 0 and out.stdout.count(KEY) == 0
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    version = manifest["target"]["version"]
    assert version["truncated"] is True or version["authorization"] == "REDACTED"
    assert len(json.dumps(version)) <= VERSION_MAX_BYTES
    analyzed = _cli("analyze", str(tmp_path / "run"), "--quiet", "--json", str(tmp_path / "a.json"))
    assert analyzed.returncode in (0, 3), analyzed.stderr
    bundle = _cli("handoff", str(tmp_path / "run"), "--out", str(tmp_path / "bundle"))
    for root in (tmp_path / "run", tmp_path / "a.json", tmp_path / "bundle"):
        if root.exists():
            text = root.read_text() if root.is_file() else _all_text(root)
            assert KEY not in text, f"API key stored under {root}"
            assert KEY[3:] not in text
    assert bundle.returncode == 0, bundle.stderr


def test_target_urls_and_headers_from_the_command_line() -> None:
    out = _cli("run", "t.parquet", "--target", "ftp://user:SECRET@host", "--out", "o")
    assert out.returncode == 2 and "SECRET" not in out.stderr and out.stderr.startswith("loadgen: error: ")
    out = _cli("run", "t.parquet", "--target", "http://user:SECRET@[::1", "--out", "o")
    assert out.returncode == 2 and "SECRET" not in out.stderr and "Traceback" not in out.stderr
    for url in ("ftp://host/v1?api_key=QSECRETvalue", "http://user:SECRET@host:99999/v1?api_key=QSECRETvalue"):
        out = _cli("run", "t.parquet", "--target", url, "--out", "o")  # the refusal shows no query value either
        assert out.returncode == 2 and "SECRET" not in out.stderr and "api_key=REDACTED" in out.stderr, out.stderr
    out = _cli("run", "t.parquet", "--target", "http://x", "--out", "o", "--header", "X-A: b\r\nX-Injected: 1")
    assert out.returncode == 2 and "CR, LF" in out.stderr and out.stderr.count("\n") == 1
    with pytest.raises(ValueError, match="control characters"):
        RunOptions(trace_path="t", target_url="http://x", out_dir="o", headers={"X-A": "b\r\nX-Injected: 1"})
    with pytest.raises(ValueError) as exc:
        RunOptions(trace_path="t", target_url="ftp://user:SECRET@host", out_dir="o")
    assert "SECRET" not in str(exc.value)


@pytest.mark.parametrize(
    "command",
    [["run", "t.parquet", "--target", "http://x", "--out", "o"], ["bench"], ["plan", "p.toml", "--out", "o"]]
    + [["practice"], ["contract", "replay", "--target", "http://x", "--model", "m"], ["handoff", "rerun", "b"]],
)
def test_a_key_given_as_api_key_env_is_refused_and_never_echoed(command: list[str]) -> None:
    """Every command with --api-key-env refuses a value that is not a variable name, in one line, exit 2, without
    echoing it (bench ran the whole canonical trace with a key there: the value was checked by run alone)."""
    out = _cli(*command, "--api-key-env", "sk-SECRET0123456789abcdef")
    assert out.returncode == 2 and out.stderr.count("\n") == 1, out.stderr
    assert "not a key" in out.stderr and "SECRET" not in out.stderr + out.stdout


def test_an_unset_key_variable_reads_the_same_from_run_and_contract(monkeypatch: pytest.MonkeyPatch) -> None:
    """contract replay said 'environment variable is unset or empty', run and bench 'variable unset or empty':
    one message now, from one constant, before any request."""
    from loadgen.contract.replay import _api_key
    from loadgen.driver.run import _auth_headers
    from loadgen.util.errors import TargetError

    monkeypatch.setenv("LOADGEN_TEST_UNSET_KEY", "")
    options = RunOptions(trace_path="t", target_url="http://x", out_dir="o", api_key_env="LOADGEN_TEST_UNSET_KEY")
    with pytest.raises(TargetError) as run:
        _auth_headers(options)
    with pytest.raises(TargetError) as contract:
        _api_key("LOADGEN_TEST_UNSET_KEY")
    line = "--api-key-env LOADGEN_TEST_UNSET_KEY: variable unset or empty: expected the API key in it"
    assert str(run.value) == str(contract.value) == line


# ---- the simulated server's containment -----------------------------------------------------------------


def _raw(base_url: str, payload: bytes, *, read_timeout: float = 10.0, shutdown: bool = False) -> bytes:
    host, port = base_url.removeprefix("http://").rsplit(":", 1)
    with socket.create_connection((host.strip("[]"), int(port)), timeout=read_timeout) as sock:
        sock.sendall(payload)
        if shutdown:
            sock.shutdown(socket.SHUT_WR)
        chunks = []
        try:
            while True:
                data = sock.recv(65536)
                if not data:
                    break
                chunks.append(data)
        except (ConnectionResetError, TimeoutError):
            pass
        return b"".join(chunks)


def _post(path: str, body: bytes, extra: str = "") -> bytes:
    return (
        f"POST {path} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n{extra}"
        f"content-length: {len(body)}\r\n\r\n"
    ).encode() + body


def test_sim_server_bounds_what_a_client_can_make_it_hold(tmp_path: Path) -> None:
    with start_sim_server("instant", "--header-timeout-s", "1", "--idle-timeout-s", "1") as sim:
        # deeply nested JSON: a 400, not a RecursionError (and the server lives on)
        deep = b'{"prompt": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
        reply = _raw(sim.base_url, _post("/v1/completions", deep, "connection: close\r\n"))
        assert reply.startswith(b"HTTP/1.1 400") and b"nested too deeply" in reply
        # a body above the cap: 413 before it is read
        reply = _raw(sim.base_url, b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-length: 33554432\r\n\r\n")
        assert reply.startswith(b"HTTP/1.1 413")
        # an unknown transfer-encoding: 501; chunked works
        reply = _raw(sim.base_url, b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ntransfer-encoding: gzip\r\n\r\n")
        assert reply.startswith(b"HTTP/1.1 501")
        body = json.dumps({"prompt": "hi", "max_tokens": 2, "stream": False}).encode()
        chunked = (
            b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n"
            + b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)
        )
        assert _raw(sim.base_url, chunked).startswith(b"HTTP/1.1 200")
        # a request that never completes: 408 after the header timeout
        start = time.monotonic()
        reply = _raw(sim.base_url, b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-le")
        assert reply.startswith(b"HTTP/1.1 408") and time.monotonic() - start < 8
        # an idle keep-alive connection is closed
        start = time.monotonic()
        assert _raw(sim.base_url, b"") == b"" and time.monotonic() - start < 8
        # pipelined bytes beyond the buffer cap while a request is in flight: the connection is dropped
        flood = _post("/v1/completions", body) + b"x" * (9 * 1024 * 1024)
        try:
            _raw(sim.base_url, flood, read_timeout=5)
        except (BrokenPipeError, ConnectionResetError):
            pass
        health = _raw(sim.base_url, b"GET /health HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
        assert health.startswith(b"HTTP/1.1 200")  # and the server is still up


def test_sim_serve_prints_ipv6_urls_in_brackets() -> None:
    try:
        with socket.socket(socket.AF_INET6) as probe:
            probe.bind(("::1", 0))
    except OSError:
        pytest.skip("no IPv6 loopback here")
    proc = subprocess.Popen(
        [sys.executable, "-m", "loadgen", "sim", "serve", "--engine", "instant", "--host", "::1", "--port", "0"],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("loadgen-sim listening on http://[::1]:"), line
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_sim_serve_start_errors_are_one_line(tmp_path: Path) -> None:
    with start_sim_server("instant") as sim:
        port = sim.base_url.rsplit(":", 1)[1]
        busy = _cli("sim", "serve", "--engine", "instant", "--port", port)
    assert busy.returncode == 2 and "cannot listen" in busy.stderr and busy.stderr.count("\n") == 1
    unbindable = _cli("sim", "serve", "--engine", "instant", "--host", "192.0.2.1", "--port", "0")
    assert unbindable.returncode == 2 and "cannot listen" in unbindable.stderr
    log = _cli("sim", "serve", "--engine", "instant", "--port", "0", "--fault-log", str(tmp_path / "no" / "dir" / "f"))
    assert log.returncode == 2 and "fault log" in log.stderr and "Traceback" not in log.stderr
