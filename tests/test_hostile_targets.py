"""A hostile or odd server never costs a row, a secret or a hang (issue 34: data loss and hangs, secrets).

Every case runs the real command (``python -m loadgen run ...``) against ``tests/hostile_server.py``, a real
server process over loopback playing one misbehaviour. The subprocess timeouts only keep a regression from
hanging the suite; no assertion is about time.
"""

from __future__ import annotations

import base64
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import duckdb
import pyarrow.parquet as pq
import pytest
from hostile_server import BAD_FIELDS, LONG_STREAM_EVENTS, MAX_TOKENS, MODEL, hostile_server, read_record

from loadgen.driver.client import max_empty_events
from loadgen.rundir.io import load_run, run_table_files
from loadgen.rundir.manifest import MetricsScrapes, read_manifest
from loadgen.rundir.rowtables import requests_table
from loadgen.rundir.schema import CHUNKS_FILE, REQUESTS_FILE
from loadgen.targets import launch_sim_server

# The hostile-server tier: each test starts a misbehaving server process and runs the real CLI against it
# (5-12 s each, about 150 s in all); .ci/run runs it after the README's command.
pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
KEY = "hk-Qz8vTq3WmX7pLr2NcY5dKfh"  # no API-key shape (sk-...) the generic redaction would catch
QUERY = "code=S1queryvalue1&subscription-key=S2queryvalue2"


def cli(*args: object, timeout: float = 120, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "loadgen", *map(str, args)],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
        timeout=timeout,
        env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})},
    )


def one_line_error(out: subprocess.CompletedProcess, *expected: str) -> str:
    assert out.returncode == 2, out.stderr
    lines = [line for line in out.stderr.splitlines() if not line.startswith("loadgen: warning:")]
    assert len(lines) == 1 and lines[0].startswith("loadgen: error: ") and "Traceback" not in out.stderr, out.stderr
    for text in expected:
        assert text in lines[0], lines[0]
    return lines[0]


def all_bytes(root: Path) -> bytes:
    return b"\n".join(p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file())


@pytest.fixture(scope="module")
def trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 3 s steady trace of the canonical scenario (12 requests of three classes)."""
    root = tmp_path_factory.mktemp("hostile")
    scenario = root / "s.toml"
    scenario.write_text(
        (REPO / "scenarios" / "canonical.toml")
        .read_text()
        .replace('cases = ["contract/canonical.toml"]', "cases = []")
        .replace("rate_rps = 4.0\nduration_s = 60", "rate_rps = 4.0\nduration_s = 3", 1)
    )
    out = cli("trace", "generate", scenario, "--trace", "steady", "--out", root / "t.parquet")
    assert out.returncode == 0, out.stderr
    return root / "t.parquet"


def run(trace: Path, url: str, out: Path, *extra: object, env: dict[str, str] | None = None):
    return cli(
        "run",
        trace,
        "--target",
        url,
        "--out",
        out,
        "--ttft-timeout-s",
        "2",
        "--total-timeout-s",
        "4",
        "--deadline-s",
        "10",
        *extra,
        timeout=90,
        env=env,
    )


def good_row_is_exact(row: dict, chunks: int) -> None:
    """A request the server answered well: recorded whole (tokens, finish, model, chunks)."""
    tokens = max(1, min(row["target_output_tokens"], MAX_TOKENS))
    assert row["status"] == "ok" and row["error_kind"] is None, row
    assert row["finish_reason"] == "length" and row["response_model"] == MODEL, row
    assert row["system_fingerprint"] == "fp-hostile", row
    assert row["server_output_tokens"] == tokens and row["server_prompt_tokens"] == 5, row
    assert row["client_output_tokens"] == tokens and row["chunk_count"] == tokens + 1 == chunks, row


# ---- data loss ---------------------------------------------------------------------------------------------


def test_chunk_fields_of_unexpected_types_cost_only_their_request(tmp_path: Path, trace: Path) -> None:
    record = tmp_path / "record.jsonl"
    with hostile_server("bad-field-types", record) as server:
        out = run(trace, server.base_url, tmp_path / "run")
    assert out.returncode == 0, out.stderr
    variants = {
        e["prompt_sha256"]: e["variant"] for e in read_record(record) if str(e["target"]).endswith("completions")
    }
    data = load_run(tmp_path / "run")
    rows = data.requests.to_pylist()
    chunks = data.chunks.to_pandas().groupby("request_id").size().to_dict() if data.chunks is not None else {}
    assert len(rows) == 12 and len(variants) == 12
    bad = [r for r in rows if variants[r["prompt_sha256"]] != "ok"]
    assert len(bad) == 4  # every third of 12 POSTs
    for row in rows:
        variant = variants[row["prompt_sha256"]]
        if variant == "ok":
            good_row_is_exact(row, chunks[row["request_id"]])
            continue
        field = next(iter(json.loads(variant.removeprefix("bad:"))))
        assert row["status"] == "error" and row["error_kind"] == "malformed_sse", row
        assert row["error_message"].startswith(f"{field} = "), row
        assert row["finish_reason"] in (None, "length") and row["response_model"] in (None, MODEL), row
    assert {json.dumps(b) for b in BAD_FIELDS} == {variants[r["prompt_sha256"]].removeprefix("bad:") for r in bad}
    analyzed = cli("analyze", tmp_path / "run", "--quiet")
    assert analyzed.returncode == 0 and "truncated or replaced" not in analyzed.stderr, analyzed.stderr


def test_a_value_no_check_caught_costs_its_row_not_the_flush(tmp_path: Path, trace: Path) -> None:
    """The writer's own guarantee under the driver's checks: one row whose value does not fit its column
    is fitted (text kept as text, the row marked malformed); the other rows of the flush are kept, exact."""
    with hostile_server("ok") as server:
        assert run(trace, server.base_url, tmp_path / "run").returncode == 0
    (part,) = run_table_files(tmp_path / "run", REQUESTS_FILE)
    rows = pq.read_table(part).to_pylist()
    odd = dict(rows[3], finish_reason=["stop"], response_model=123, server_output_tokens="7")
    table = requests_table([*rows[:3], odd, *rows[4:]])
    pq.write_table(table, tmp_path / "fitted.parquet")
    back = pq.read_table(tmp_path / "fitted.parquet").to_pylist()
    assert back[:3] == rows[:3] and back[4:] == rows[4:]
    assert back[3]["finish_reason"] == '["stop"]' and back[3]["response_model"] == "123"
    assert back[3]["server_output_tokens"] is None and back[3]["status"] == "error"
    assert back[3]["error_kind"] == "malformed_sse" and "finish_reason" in back[3]["error_message"]


@pytest.mark.parametrize("behaviour", ["done-fin", "done-rst"])
def test_done_then_close_without_the_terminator_is_complete(tmp_path: Path, trace: Path, behaviour: str) -> None:
    with hostile_server(behaviour) as server:
        out = run(trace, server.base_url, tmp_path / "run")
    assert out.returncode == 0, out.stderr
    data = load_run(tmp_path / "run")
    chunks = data.chunks.to_pandas().groupby("request_id").size().to_dict()
    rows = data.requests.to_pylist()
    assert len(rows) == 12
    for row in rows:
        good_row_is_exact(row, chunks[row["request_id"]])


# ---- hangs -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("behaviour", "extra", "expected"),
    [
        ("hang", [], "not reachable (GET /version and /v1/models failed: GET /version: no complete answer within 2 s"),
        ("hang-tokenize", ["--tokenizer", "server"], "tokenizer server: POST /tokenize: no complete answer within 2 s"),
        # a head that never ends, a byte every 0.5 s: each read had 2 s, the whole none (hours, held at the start)
        ("tokenize-trickle", ["--tokenizer", "server"], "POST /tokenize: no complete answer within 2 s"),
    ],
)
def test_a_target_that_never_answers_is_one_line(tmp_path, trace, behaviour, extra, expected) -> None:
    with hostile_server(behaviour) as server:
        out = run(trace, server.base_url, tmp_path / "run", *extra)
    one_line_error(out, expected)
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("path", ["version", "models", "metrics"])
def test_a_probe_that_never_answers_is_a_note(tmp_path: Path, trace: Path, path: str) -> None:
    with hostile_server(f"hang-{path}") as server:
        out = run(trace, server.base_url, tmp_path / "run", "--model", MODEL)
    assert out.returncode == 0, out.stderr
    data = load_run(tmp_path / "run")
    assert data.requests.column("status").to_pylist() == ["ok"] * 12
    notes = data.manifest.to_dict()["driver"]["target_notes"]
    shown = "/v1/models" if path == "models" else f"/{path}"
    assert f"GET {shown}: no complete answer within 2 s" in notes, notes


def test_the_default_tokenizer_trial_is_bounded(tmp_path: Path, trace: Path) -> None:
    """``--tokenizer auto`` (the default) asks the target's /tokenize: one that never answers costs the run's
    probe bound and a warning (prompts sized with cl100k_base), not a hang."""
    with hostile_server("hang-tokenize") as server:
        out = run(trace, server.base_url, tmp_path / "run")
    assert out.returncode == 0, out.stderr
    assert "/tokenize is not usable (tokenizer server: POST /tokenize: no complete answer within 2 s" in out.stderr
    data = load_run(tmp_path / "run")
    assert data.requests.column("status").to_pylist() == ["ok"] * 12
    manifest = data.manifest.to_dict()
    assert manifest["driver"]["tokenizer"] == "auto: cl100k_base", manifest["driver"]
    assert any("/tokenize is not usable" in w for w in manifest["warnings"]), manifest["warnings"]


def test_a_tokenizer_the_target_names_is_not_trusted_to_load(tmp_path: Path, trace: Path) -> None:
    """A server claiming to be the simulated engine names a local file as its tokenizer (``hf:PATH``) that
    is no tokenizer.json: the run falls back (the target's /tokenize, else cl100k_base), no traceback."""
    with hostile_server("sim-tokenizer") as server:
        out = run(trace, server.base_url, tmp_path / "run")
    assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr
    data = load_run(tmp_path / "run")
    assert data.manifest.to_dict()["target"]["kind"] == "sim"
    assert data.manifest.to_dict()["driver"]["tokenizer"] == "auto: cl100k_base"
    assert data.requests.column("status").to_pylist() == ["ok"] * 12


PLAN = """name = "cold-url"
scenario = "SCENARIO"
trace = "steady"
classes = ["short"]
states = ["cold"]
concurrency = [16]
rates_rps = [5]
repeats = 1
[start]
mode = "lowest"
[warmup]
requests = 0
[confidence]
extend = false
"""
PLAN_SCENARIO = """name = "cold-url"
seed = 3
[classes.short]
share = 1.0
input_tokens = { dist = "fixed", value = 32 }
output_tokens = { dist = "fixed", value = 6 }
[classes.short.budgets]
ttft_ms = { p50 = 5000, hard = true }
[errors]
ttft_timeout_s = 5
total_timeout_s = 10
[traces.steady]
process = "poisson"
rate_rps = 10
duration_s = 2
"""


def test_the_cold_reset_of_a_url_target_is_bounded(tmp_path: Path) -> None:
    """``loadgen plan --target URL`` empties the prefix cache for a cold cell (``POST /reset_prefix_cache``);
    a target that answers 200 and then trickles a body that never ends held the plan for good (the body was
    read whole, each byte within the read timeout). The status decides; the body is not read."""
    (tmp_path / "scenario.toml").write_text(PLAN_SCENARIO)
    (tmp_path / "plan.toml").write_text(PLAN.replace("SCENARIO", str(tmp_path / "scenario.toml")))
    record = tmp_path / "record.jsonl"
    with hostile_server("trickle-reset", record) as server:
        out = cli(
            "plan",
            tmp_path / "plan.toml",
            "--target",
            server.base_url + "/v1",
            "--model",
            MODEL,
            "--out",
            tmp_path / "plan",
            "--json",
            timeout=120,
        )
    assert out.returncode == 0, out.stderr
    assert any(e["target"] == "/reset_prefix_cache" for e in read_record(record))
    (manifest_path,) = (tmp_path / "plan" / "cells").rglob("manifest.json")
    warm_state = json.loads(manifest_path.read_text())["warm_state"]
    assert warm_state["state"] == "cold" and warm_state["achieved"] is True, warm_state
    assert "POST /reset_prefix_cache answered HTTP 200" in warm_state["actions"][0], warm_state


def test_framing_headers_are_refused(tmp_path: Path, trace: Path) -> None:
    """``--header 'Transfer-Encoding: chunked'`` made the server wait for a chunked body that never came."""
    for header in ("Transfer-Encoding: chunked", "content-length: 5", "Connection: close"):
        out = run(trace, "http://127.0.0.1:9", tmp_path / "run", "--header", header)
        one_line_error(out, "--header", "set by loadgen for each request")


@pytest.mark.parametrize(("behaviour", "shown"), [("models-null", "data = null"), ("models-int", "data = 5")])
def test_models_data_that_is_not_a_list(tmp_path: Path, trace: Path, behaviour: str, shown: str) -> None:
    with hostile_server(behaviour) as server:
        out = run(trace, server.base_url, tmp_path / "run")
    one_line_error(out, "GET /v1/models", shown, "expected a list of models")


def test_version_is_read_with_a_size_bound(tmp_path: Path, trace: Path) -> None:
    record = tmp_path / "record.jsonl"
    with hostile_server("version-huge", record) as server:
        out = run(trace, server.base_url, tmp_path / "run")
    assert out.returncode == 0, out.stderr
    (huge,) = [e for e in read_record(record) if e.get("sent_bytes") is not None]
    # what the server could write before the client stopped reading: the 1 MiB read plus socket buffers
    assert huge["sent_bytes"] < 64 << 20, huge
    manifest = load_run(tmp_path / "run").manifest.to_dict()
    assert manifest["target"]["version"] is None
    assert any("GET /version: answer longer than" in n for n in manifest["driver"]["target_notes"])


def test_a_contract_case_reads_its_answer_with_a_size_bound(tmp_path: Path) -> None:
    """``loadgen contract replay`` read each case's whole answer: a 300 MB body was all read into memory."""
    record = tmp_path / "record.jsonl"
    cases = REPO / "scenarios" / "contract" / "canonical.toml"
    with hostile_server("answer-huge", record) as server:
        out = cli(
            "contract",
            "replay",
            f"{cases}#target-capital",
            "--target",
            server.base_url,
            "--model",
            MODEL,
            "--out",
            tmp_path / "contract.json",
        )
    assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr  # the case failed, in its result
    (huge,) = [e for e in read_record(record) if e.get("sent_bytes") is not None]
    # what the server could write before the client stopped reading: 16 MiB read plus socket buffers
    assert huge["sent_bytes"] < 64 << 20, huge
    (case,) = json.loads((tmp_path / "contract.json").read_text())["cases"]
    assert (
        case["passed"] is False
        and case["observed"]["error"] == f"answer longer than {16 << 20} bytes: not read further"
    )


# ---- overwriting ---------------------------------------------------------------------------------------


def test_run_and_analyze_never_write_over_a_run_or_bundle(tmp_path: Path, trace: Path) -> None:
    sim = cli("sim", "run", trace, "--engine", "instant", "--out", tmp_path / "run")
    assert sim.returncode == 0, sim.stderr
    assert cli("handoff", tmp_path / "run", "--out", tmp_path / "bundle").returncode == 0
    before = {root: all_bytes(tmp_path / root) for root in ("run", "bundle")}
    for out_dir in ("bundle", "run"):
        one_line_error(run(trace, "http://127.0.0.1:9", tmp_path / out_dir), "already holds a run or handoff bundle")
        one_line_error(cli("sim", "run", trace, "--engine", "instant", "--out", tmp_path / out_dir), "already holds")
    (part,) = run_table_files(tmp_path / "run", CHUNKS_FILE)
    for flag, target in (
        ("--json", tmp_path / "run" / "manifest.json"),
        ("--html", part),
        ("--json", tmp_path / "bundle" / "identity.json"),
        ("--html", tmp_path / "bundle" / "SHA256SUMS"),
    ):
        one_line_error(cli("analyze", tmp_path / "run", "--quiet", flag, target), flag, "belongs to the")
    # the rest of the kind: every command's output file
    manifest = tmp_path / "run" / "manifest.json"
    scenario = trace.parent / "s.toml"
    for args in (
        ["trace", "generate", scenario, "--trace", "steady", "--out", manifest],
        ["compare", tmp_path / "run", tmp_path / "run", "--out", manifest],
        ["sim", "calibrate", tmp_path / "run", "--out", tmp_path / "bundle" / "engine.toml"],
        ["sim", "engine", "--profile", "p", "--model-config", "c.json", "--out", manifest],
        ["schema", "analysis", "--out", manifest],
    ):
        one_line_error(cli(*args), "--out", "belongs to the")
    for args in (
        ["runs", "pareto", tmp_path / "run", "--html", manifest],
        ["sim", "validate", "instant", "--measured", tmp_path / "run", "--html", manifest],
        ["sim", "validate", "instant", "--measured", tmp_path / "run", "--json", manifest],
    ):
        one_line_error(cli(*args), "belongs to the")
    assert {root: all_bytes(tmp_path / root) for root in ("run", "bundle")} == before
    ok = cli("analyze", tmp_path / "run", "--quiet", "--json", tmp_path / "run" / "analysis.json")
    assert ok.returncode == 0, ok.stderr  # a file of its own beside the records is fine


# ---- secrets -----------------------------------------------------------------------------------------------


def test_the_query_string_is_sent_and_every_value_redacted(tmp_path: Path, trace: Path) -> None:
    record = tmp_path / "record.jsonl"
    with hostile_server("ok", record) as server:
        out = run(trace, f"{server.base_url}/v1?{QUERY}", tmp_path / "run", "--scrape-metrics", "on")
    assert out.returncode == 0, out.stderr
    entries = read_record(record)
    assert {e["target"].split("?")[0] for e in entries} >= {"/version", "/v1/models", "/metrics", "/v1/completions"}
    assert all(e["target"].endswith("?" + QUERY) for e in entries), entries
    assert cli("handoff", tmp_path / "run", "--out", tmp_path / "bundle").returncode == 0
    analyzed = cli("analyze", tmp_path / "run", "--quiet", "--json", tmp_path / "a.json")
    assert analyzed.returncode == 0, analyzed.stderr
    stored = all_bytes(tmp_path / "run") + all_bytes(tmp_path / "bundle") + (tmp_path / "a.json").read_bytes()
    for value in (b"S1queryvalue1", b"S2queryvalue2"):
        assert value not in stored and value not in (out.stdout + out.stderr).encode()
    manifest = load_run(tmp_path / "run").manifest.to_dict()
    assert manifest["options"]["target_url"].endswith("/v1?code=REDACTED&subscription-key=REDACTED")


def test_echoed_credentials_are_redacted_before_the_cut(tmp_path: Path, trace: Path) -> None:
    """The echo server puts the X-Api-Key value across the 400th character of its 401 body, and every
    request header into /version and into /metrics' labels: no 8 characters of it (nor of the Bearer key)
    are stored."""
    bearer = "bk-Jw4RtY9uHs6GkP1eVb8MnZq"
    with hostile_server("echo") as server:
        out = run(
            trace,
            server.base_url,
            tmp_path / "run",
            "--header",
            f"X-Api-Key: {KEY}",
            "--api-key-env",
            "HOSTILE_KEY",
            env={"HOSTILE_KEY": bearer},
        )
    assert out.returncode == 0, out.stderr
    data = load_run(tmp_path / "run")
    rows = data.requests.to_pylist()
    assert {r["error_kind"] for r in rows} == {"http_4xx"} and all("REDACTED" in r["error_message"] for r in rows)
    assert data.server_metrics is not None
    labels = data.server_metrics.column("labels").to_pylist()  # /metrics echoed the scrape's headers in labels
    assert labels and all('"authorization": "Bearer REDACTED"' in text for text in labels), labels[:1]
    stored = all_bytes(tmp_path / "run") + (out.stdout + out.stderr).encode()
    for secret in (KEY, bearer):
        for i in range(len(secret) - 7):
            assert secret[i : i + 8].encode() not in stored, secret[i : i + 8]


def test_credentials_echoed_in_stream_fields_are_redacted(tmp_path: Path, trace: Path) -> None:
    """A stream whose model, system_fingerprint and text carry the request's credentials: none is stored."""
    bearer = "bk-Jw4RtY9uHs6GkP1eVb8MnZq"
    with hostile_server("echo-fields") as server:
        out = run(
            trace,
            server.base_url,
            tmp_path / "run",
            "--header",
            f"X-Api-Key: {KEY}",
            "--api-key-env",
            "HOSTILE_KEY",
            env={"HOSTILE_KEY": bearer},
        )
    assert out.returncode == 0, out.stderr
    rows = load_run(tmp_path / "run").requests.to_pylist()
    assert {r["status"] for r in rows} == {"ok"}, rows[0]
    assert {(r["response_model"], r["system_fingerprint"]) for r in rows} == {("echo Bearer REDACTED", "REDACTED")}
    stored = all_bytes(tmp_path / "run") + (out.stdout + out.stderr).encode()
    for secret in (KEY, bearer):
        for i in range(len(secret) - 7):
            assert secret[i : i + 8].encode() not in stored, secret[i : i + 8]


def test_credentials_echoed_in_a_contract_answer_are_redacted(tmp_path: Path) -> None:
    bearer = "bk-Jw4RtY9uHs6GkP1eVb8MnZq"
    cases = REPO / "scenarios" / "contract" / "canonical.toml"
    with hostile_server("echo-fields") as server:
        out = cli(
            "contract",
            "replay",
            f"{cases}#target-capital",
            "--target",
            server.base_url,
            "--model",
            MODEL,
            "--endpoint",
            "completions",
            "--stream",
            "--api-key-env",
            "HOSTILE_KEY",
            "--out",
            tmp_path / "c.json",
            env={"HOSTILE_KEY": bearer},
        )
    assert out.returncode in (0, 1) and "Traceback" not in out.stderr, out.stderr
    stored = (tmp_path / "c.json").read_bytes() + (out.stdout + out.stderr).encode()
    assert b"echo Bearer REDACTED" in stored
    for i in range(len(bearer) - 7):
        assert bearer[i : i + 8].encode() not in stored, bearer[i : i + 8]


def test_one_credential_per_run_on_every_request(tmp_path: Path, trace: Path) -> None:
    record = tmp_path / "record.jsonl"
    with hostile_server("ok", record) as server:
        userinfo = server.base_url.replace("http://", "http://user:pw-secret-1@")
        refused = run(trace, userinfo, tmp_path / "two", "--header", "Authorization: Bearer X-token-1234")
        one_line_error(refused, "credentials given twice", "--header Authorization", "user:password")
        assert "pw-secret-1" not in refused.stderr and "X-token-1234" not in refused.stderr
        assert not record.exists()  # refused before anything was sent
        for url, header, expected in (
            (userinfo, [], "Basic dXNlcjpwdy1zZWNyZXQtMQ=="),
            (server.base_url, ["--header", "AUTHORIZATION: Bearer X-token-1234"], "Bearer X-token-1234"),
        ):
            record.unlink(missing_ok=True)
            out = run(trace, url, tmp_path / expected[:5], "--scrape-metrics", "on", *header)
            assert out.returncode == 0, out.stderr
            entries = read_record(record)
            assert {e["method"] for e in entries} == {"GET", "POST"} and len(entries) > 12
            for entry in entries:  # one Authorization header, the same on probes, scrapes and requests
                assert [v for k, v in entry["headers"].items() if k == "authorization"] == [expected], entry


# ---- minor -------------------------------------------------------------------------------------------------


def test_retry_after_nan_is_null_and_a_gzip_stream_is_named(tmp_path: Path, trace: Path) -> None:
    with hostile_server("retry-after-nan") as server:
        assert run(trace, server.base_url, tmp_path / "nan").returncode == 0
    rows = load_run(tmp_path / "nan").requests.to_pylist()
    assert {r["error_kind"] for r in rows} == {"http_429"} and {r["retry_after_s"] for r in rows} == {None}
    with hostile_server("gzip") as server:
        assert run(trace, server.base_url, tmp_path / "gzip").returncode == 0
    rows = load_run(tmp_path / "gzip").requests.to_pylist()
    assert {r["error_kind"] for r in rows} == {"malformed_sse"}
    assert all("content-encoding 'gzip'" in r["error_message"] for r in rows)


def test_sim_server_refuses_content_length_with_transfer_encoding_and_closes() -> None:
    body = b'{"prompt": "hi", "max_tokens": 2, "stream": false}'
    with launch_sim_server("instant") as sim:
        host, port = sim.base_url.removeprefix("http://").rsplit(":", 1)
        for framing in (
            b"content-length: %d\r\ntransfer-encoding: chunked\r\n" % len(body),
            b"content-length: %d\r\ncontent-length: 5\r\n" % len(body),
        ):
            with socket.create_connection((host, int(port)), timeout=10) as sock:
                sock.sendall(b"POST /v1/completions HTTP/1.1\r\nhost: x\r\n" + framing + b"\r\n" + body)
                reply = b""
                while data := sock.recv(65536):  # ends only when the server closes the connection
                    reply += data
            assert reply.startswith(b"HTTP/1.1 400"), reply[:200]
            assert b"connection: close" in reply.lower()


# ---- the canary sweep: a server that echoes the credential and the URL everywhere ----------------------------

CANARY_KEY = "sk-LEAKCANARY-7f3e9d2a1b5c"
CANARY_PASSWORD = "PWLEAKCANARYpw"
CANARY_QUERY = "api_key=QLEAKCANARYq1&x=QLEAKCANARYq2"


def canaries() -> dict[str, bytes]:
    """Every form of the run's secrets a leak could take: the key (raw, base64, as its Bearer header in
    base64), the URL password, the Basic token made of it, and the query values."""
    b64 = base64.b64encode
    return {
        "key": CANARY_KEY.encode(),
        "key-base64": b64(CANARY_KEY.encode()),
        "bearer-base64": b64(f"Bearer {CANARY_KEY}".encode()),
        "password": CANARY_PASSWORD.encode(),
        "basic-token": b64(f"alice:{CANARY_PASSWORD}".encode()),
        "query": b"QLEAKCANARYq",
    }


def decoded_bytes(root: Path) -> bytes:
    """Every file under ``root`` as stored, plus each Parquet table's values and metadata decoded (its pages
    are compressed: a raw search misses them) and each DuckDB table's rows."""
    parts = [all_bytes(root)]
    for path in sorted(p for p in root.rglob("*.parquet") if p.is_file()):  # a table may be a folder of parts
        file = pq.ParquetFile(path)
        parts.append(str(file.schema_arrow.metadata).encode())
        parts.append(str(file.read().to_pylist()).encode())
    for path in sorted(root.rglob("*.duckdb")):
        con = duckdb.connect(str(path), read_only=True)
        for (name,) in con.execute("select table_name from information_schema.tables").fetchall():
            parts.append(str(con.execute(f'select * from "{name}"').fetchall()).encode())
        con.close()
    return b"\n".join(parts)


def test_a_server_echoing_the_credential_everywhere_leaves_no_canary(tmp_path: Path, trace: Path) -> None:
    """``echo-all`` says the request's Authorization (Basic decoded too) and its URL back in response headers,
    /version, /v1/models, /metrics (label and HELP), error bodies (500 JSON, 400 text, 404), a 307 Location
    and the stream's SSE comments and fields. Every command that talks to it or derives from what it said
    (run with a key and a query, run with user:password, contract replay, practice, sim calibrate and
    validate, handoff, analyze, the runs catalog) is run for real; no form of the secrets is in any byte written or printed."""
    env = {"LEAK_KEY": CANARY_KEY, "LOADGEN_CATALOG": str(tmp_path / "out" / "catalog.duckdb")}
    out, printed = tmp_path / "out", []
    scenario = trace.parent / "s.toml"  # retain_prompt_text = false: prompts are stored as hashes

    def call(*args: object, timeout: float = 120) -> subprocess.CompletedProcess:
        done = cli(*args, timeout=timeout, env=env)
        printed.append((done.stdout + done.stderr).encode())
        assert "Traceback" not in done.stderr, done.stderr
        return done

    record = tmp_path / "record.jsonl"
    with hostile_server("echo-all", record) as server:
        keyed = f"{server.base_url}/v1?{CANARY_QUERY}"
        userinfo = f"http://alice:{CANARY_PASSWORD}@{server.base_url.removeprefix('http://')}"
        for url, name, extra in ((keyed, "keyed", ["--api-key-env", "LEAK_KEY"]), (userinfo, "basic", [])):
            done = call(
                "run",
                trace,
                "--target",
                url,
                "--out",
                out / name,
                "--scrape-metrics",
                "on",
                "--scenario",
                scenario,
                "--ttft-timeout-s",
                "2",
                "--total-timeout-s",
                "4",
                *extra,
            )
            assert done.returncode == 0, done.stderr
            cases = REPO / "scenarios" / "contract" / "canonical.toml"
            done = call(
                "contract", "replay", cases, "--target", url, "--model", MODEL, "--out", out / f"{name}.json", *extra
            )
            assert done.returncode == 1 and (out / f"{name}.json").exists(), done.stderr  # every case refused
        done = call(
            "practice",
            "--target",
            userinfo,
            "--target",
            userinfo,
            "--model",
            MODEL,
            "--scenario",
            scenario,
            "--trace",
            trace,
            "--window-s",
            "2",
            "--out",
            out / "practice",
            timeout=300,
        )
        assert "practice: candidate-a: warm-up then the burst trace against http://127.0.0.1" in done.stderr
        done = call("sim", "calibrate", "--target", userinfo, "--out", out / "cal" / "e.toml", "--no-warmup")
        assert done.returncode == 0 and (out / "cal" / "e.toml").exists(), done.stderr  # limits' sources: URLs
        validate = ("sim", "validate", "interactive-small-batch", "--target", userinfo, "--out", out / "val")
        done = call(*validate, "--duration-s", "2", "--repeats", "1", "--no-warmup")
        assert done.returncode == 0 and (out / "val" / "fidelity.json").exists(), done.stderr
    entries = read_record(record)
    said = {e["prompt_tail"] for e in entries if e.get("prompt_tail")}
    paths = {e["target"] for e in entries if e["method"] == "POST"}  # the contract's cases too: on the API path
    known = ("/v1/completions", "/v1/chat/completions", "/tokenize", "/detokenize")
    assert not [t for t in paths if t.split("?")[0] not in known], paths  # not /v1?api_key=.../v1/chat/...
    rows = load_run(out / "keyed").requests.to_pylist()
    assert {r["error_kind"] for r in rows} == {None, "http_5xx", "http_4xx", "client"}, rows  # every variant
    assert any("HTTP 307" in (r["error_message"] or "") for r in rows)
    assert call("handoff", out / "basic", "--out", out / "bundle").returncode == 0
    assert call("analyze", out / "keyed", "--quiet", "--json", out / "a.json", "--html", out / "a.html").returncode == 0
    assert call("runs", "index", out / "keyed", out / "basic").returncode == 0
    assert call("runs", "list").returncode == 0 and call("runs", "show", "keyed").returncode == 0
    stored = decoded_bytes(out) + b"\n".join(printed)
    for name, secret in canaries().items():
        assert secret not in stored, f"{name} stored"
    phrases = {" ".join(tail.split()[1:-1]) for tail in said}  # whole words of each prompt sent, in order
    assert phrases and not [p for p in phrases if len(p) >= 20 and p.encode() in stored], "prompt text stored"


def test_a_short_query_secret_echoed_everywhere_is_not_stored(tmp_path: Path, trace: Path) -> None:
    """``?key=Zq7&sig=Wv9``: values under 8 characters were no secrets of the run, so ``echo-all``'s echo of the
    target in the stream's ``model`` and fingerprint, in /metrics labels and in /v1/models was stored as said.
    A credential-named parameter's value is a secret whatever its length; an ordinary one (``n=5``) is not."""
    out = tmp_path / "run"
    with hostile_server("echo-all") as server:
        url = f"{server.base_url}/v1?key=Zq7&sig=Wv9&n=5"
        done = run(trace, url, out, "--scrape-metrics", "on", "--api-key-env", "LEAK_KEY", env={"LEAK_KEY": KEY})
    assert done.returncode == 0, done.stderr
    rows = load_run(out).requests.to_pylist()
    assert len(rows) == 12 and any(r["response_model"] for r in rows), rows  # the echoing stream was recorded
    stored = decoded_bytes(out) + (done.stdout + done.stderr).encode()
    for secret in (b"Zq7", b"Wv9", KEY.encode()):
        assert secret not in stored, secret
    assert b"n=5" in stored  # an ordinary parameter's value is kept where the server said it


def test_a_hostile_metrics_endpoint_costs_no_row_and_stores_no_bloat(tmp_path: Path, trace: Path) -> None:
    """``/metrics`` gzipped as prometheus_client does when asked (the scrape asked for gzip, read raw bytes and
    stored no sample), about a million samples a scrape (parsed on the run's event loop: 3 of 22 requests timed
    out, 568 MB RSS, 925,216 rows stored) and garbage with an 8 MiB line (stored as a sample name)."""
    stored: dict[str, list[str]] = {}
    scrapes: dict[str, MetricsScrapes | None] = {}
    for behaviour in ("metrics-gzip", "metrics-huge", "metrics-garbage"):
        with hostile_server(behaviour) as server:
            done = run(trace, server.base_url, tmp_path / behaviour, "--scrape-metrics", "on")
        assert done.returncode == 0, done.stderr
        assert ("warning: server metrics:" in done.stderr) == (behaviour == "metrics-huge"), done.stderr
        data = load_run(tmp_path / behaviour)
        assert data.requests.num_rows == 12, behaviour
        stored[behaviour] = [] if data.server_metrics is None else data.server_metrics.column("name").to_pylist()
        scrapes[behaviour] = read_manifest(tmp_path / behaviour).metrics_scrapes
    assert stored["metrics-gzip"] and set(stored["metrics-gzip"]) == {"vllm:num_requests_running"}
    assert stored["metrics-huge"] == []  # over 50,000 lines: the scrape is skipped, as one over 16 MiB is
    assert stored["metrics-garbage"] and set(stored["metrics-garbage"]) == {"vllm:num_requests_running"}
    # the manifest counts what was stored and what was skipped, by why, and the skipped ones are a warning
    huge, gzip = scrapes["metrics-huge"], scrapes["metrics-gzip"]
    assert huge is not None and huge.stored == 0 and set(huge.skipped) == {"over 50,000 lines"}
    assert huge.skipped["over 50,000 lines"] >= 2  # the baseline scrape and the last one, at least
    warned = [w for w in read_manifest(tmp_path / "metrics-huge").warnings if w.startswith("server metrics:")]
    assert warned and f"{huge.skipped['over 50,000 lines']} of {huge.skipped['over 50,000 lines']}" in warned[0]
    assert gzip is not None and gzip.stored >= 2 and gzip.skipped == {}
    assert not [w for w in read_manifest(tmp_path / "metrics-gzip").warnings if w.startswith("server metrics:")]


def test_the_key_said_back_encoded_or_as_the_served_model_is_not_stored(tmp_path: Path, trace: Path) -> None:
    """``echo-encoded`` says the credential back base64-encoded (``Bearer KEY`` whole, KEY after one byte, URL-safe
    after two) in 401 bodies, a stream's ``model`` and SSE error events: only the raw key was a secret, so every
    form was stored in ``error_message`` and ``response_model``. ``models-echo`` lists one model, its id the
    credential: without ``--model`` it became the run's model, sent with every request and in the manifest."""
    env = {"LEAK_KEY": CANARY_KEY}
    with hostile_server("echo-encoded") as server:
        done = run(trace, server.base_url, tmp_path / "enc", "--api-key-env", "LEAK_KEY", env=env)
    assert done.returncode == 0, done.stderr
    rows = load_run(tmp_path / "enc").requests.to_pylist()
    assert len(rows) == 12 and {r["error_kind"] for r in rows} >= {"http_4xx"}, rows
    key = CANARY_KEY.encode()
    forms = {**canaries(), **{f"base64+{n}": base64.b64encode(b"x" * n + key)[4:24] for n in (1, 2)}}
    forms["base64url+2"] = base64.urlsafe_b64encode(b"k:" + key)[4:24]
    stored = decoded_bytes(tmp_path / "enc") + (done.stdout + done.stderr).encode()
    assert not [name for name, form in forms.items() if form in stored]
    with hostile_server("models-echo") as server:  # no --model: the first model listed would be the run's
        done = run(trace, server.base_url, tmp_path / "models", "--api-key-env", "LEAK_KEY", env=env)
    one_line_error(done, "first model GET /v1/models lists", "holds a secret of the run", "--model NAME")
    assert CANARY_KEY not in done.stderr and not (tmp_path / "models").exists()


# ---- odd streams: every request accounted for, every wait bounded (issue: hostile-server audit) -------------

TIMEOUT = ("timeout", "ttft_timeout")
#: behaviour -> the (status, error_kind) every one of the 12 requests ends with
ODD_STREAMS = {
    "hang-completions": TIMEOUT,  # accepts, reads, never sends a head
    "head-only": TIMEOUT,  # a 200 head, then nothing
    "slowloris": TIMEOUT,  # one byte of the first event a second
    "comments-forever": TIMEOUT,  # ": keep-alive" comments, never a token: no TTFT from them
    "interim-forever": TIMEOUT,  # "100 Continue" forever
    # "100 Continue" as fast as read: the head loop never waited, no timeout nor SIGTERM ended the run for minutes
    "continue-flood": ("error", "malformed_head"),
    "close-after-head": ("error", "reset_mid_stream"),  # a 200 SSE head, then the connection closed
    "length-short": ("error", "truncated"),  # Content-Length cuts the stream in half, then close
    "length-long": ("ok", None),  # Content-Length 1 MiB over the body: [DONE] ends the answer, then close
    "no-done-open": ("timeout", "total_timeout"),  # every token and the finish, no [DONE], the connection open
    "close-mid-chunk": ("error", "reset_mid_stream"),
    "json-body": ("error", "malformed_sse"),  # a 200 JSON completion: the stream flag ignored
    "huge-line": ("error", "malformed_sse"),  # 100 MiB of one line, no newline
    "bad-utf8": ("error", "malformed_sse"),
    "deflate": ("error", "malformed_sse"),
    "flood": ("error", "malformed_sse"),  # events carrying nothing, at network speed, forever
    "finish-abort": ("error", "http_5xx"),  # two tokens, then finish_reason "abort"
    "redirect-loop": ("error", "client"),  # 307 to itself: not followed
    "retry-after-huge": ("error", "http_429"),
    "retry-after-negative": ("error", "http_429"),
    "retry-after-garbage": ("error", "http_429"),
    "interim-1xx": ("ok", None),  # 100 Continue and 103 Early Hints before the answer
    "odd-chunks": ("ok", None),  # choices [], null texts, a usage-only chunk before the tokens
    "done-then-more": ("ok", None),  # a token after [DONE] is not counted
    "reset-every-3rd": ("ok", None),  # a reset kept-alive connection is retried once on a new one
    "version-garbage": ("ok", None),  # /version answers HTML
}


def analyzed_overall(run_dir: Path, tmp_path: Path) -> dict:
    out = cli("analyze", run_dir, "--quiet", "--json", tmp_path / "a.json")
    assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr
    return json.loads((tmp_path / "a.json").read_text())["overall"]


def assert_accounted(run_dir: Path, tmp_path: Path, expected: tuple[str, str | None]) -> list[dict]:
    """Every one of the 12 scheduled requests has one row with the expected outcome; the analysis counts the
    failures as failures (no TTFT sample, no output tokens from them)."""
    rows = load_run(run_dir).requests.to_pylist()
    assert len(rows) == 12 and {(r["status"], r["error_kind"]) for r in rows} == {expected}, rows[0]
    overall = analyzed_overall(run_dir, tmp_path)
    assert overall["n_scheduled"] == 12 and overall["status_counts"][expected[0]] == 12, overall["status_counts"]
    if expected[0] != "ok":
        assert not overall["metrics"]["ttft_ms"] or overall["metrics"]["ttft_ms"]["n"] == 0, overall["metrics"]
        assert overall["output_tok_s"] == 0, overall
    return rows


@pytest.mark.parametrize("behaviour", sorted(ODD_STREAMS))
def test_an_odd_stream_costs_no_row_and_no_hang(tmp_path: Path, trace: Path, behaviour: str) -> None:
    record = tmp_path / "record.jsonl"
    with hostile_server(behaviour, record) as server:
        out = run(trace, server.base_url, tmp_path / "run")
    assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr
    rows = assert_accounted(tmp_path / "run", tmp_path, ODD_STREAMS[behaviour])
    if ODD_STREAMS[behaviour] == ("ok", None):
        tokens = {max(1, min(r["target_output_tokens"], MAX_TOKENS)) for r in rows}
        assert {r["client_output_tokens"] for r in rows} <= tokens and all(r["first_token_ns"] for r in rows)
    elif ODD_STREAMS[behaviour] == TIMEOUT:  # no token came: no first token (a comment or a byte is none)
        assert {(r["first_token_ns"], r["client_output_tokens"] or 0) for r in rows} == {(None, 0)}, rows[0]
    if behaviour == "huge-line":  # read up to the line cap, then dropped: never the whole 100 MiB
        sent = [e["sent_bytes"] for e in read_record(record) if "sent_bytes" in e]
        assert len(sent) == 12 and max(sent) < 64 << 20, sent
    if behaviour == "finish-abort":
        assert {r["client_output_tokens"] for r in rows} == {2} and {r["finish_reason"] for r in rows} == {"abort"}
    if behaviour == "flood":  # the chunk columns stop at the cap, not at the timeout
        assert all(r["chunk_count"] <= max_empty_events(r["target_output_tokens"]) for r in rows), rows[0]
        assert all("SSE events carried no token (0 tokens in all)" in r["error_message"] for r in rows), rows[0]
    if behaviour == "json-body":
        assert all("content-type 'application/json'" in r["error_message"] for r in rows), rows[0]
    if behaviour.startswith("retry-after"):
        shown = {"huge": 1e300, "negative": 0.0, "garbage": None}[behaviour.rsplit("-", 1)[-1]]
        assert {r["retry_after_s"] for r in rows} == {shown}


def test_huge_chunk_texts_are_counted_off_the_event_loop(tmp_path: Path, trace: Path) -> None:
    """``huge-text``: 256 KiB chunk texts, no two alike, as fast as read, never a [DONE]. Each was counted by the
    tokenizer on the event loop (45 ms of cl100k_base): the loop was held for seconds, so requests whose first
    chunk had come waited past their TTFT timeout, and the timeouts fired late or not at all (30 requests with a
    2 s TTFT and a 4 s total timeout: send lag p99 2.7 s, 28 ended by the run's 20 s deadline, 2 total_timeout).
    Long texts are now counted in a worker thread, the stream's reading paused meanwhile: every request meets its
    TTFT and ends at its total timeout, with its tokens counted."""
    with hostile_server("huge-text") as server:
        out = run(trace, server.base_url, tmp_path / "run")
    assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr
    rows = assert_accounted(tmp_path / "run", tmp_path, ("timeout", "total_timeout"))
    assert all(r["first_token_ns"] is not None and r["chunk_count"] >= 1 for r in rows), rows[0]
    chunks = load_run(tmp_path / "run").chunks.to_pandas()
    assert chunks["tokens"].min() >= 65535  # " the" * 65535 and a tag: counted whole, never cut
    per_request = chunks.groupby("request_id")["tokens"].sum().to_dict()
    assert {r["request_id"]: r["client_output_tokens"] for r in rows} == per_request


def test_a_contract_case_answer_of_14_mib_is_read_whole_off_the_event_loop() -> None:
    """Each case's answer (up to 16 MiB) was parsed, redacted and checked on the event loop, which under load is
    the measured run's: ``long-stream`` answers (90,000 events, about 14 MiB) held it 3.3 s
    (``benchmarks/bench_contract_loop.py``; 0.3 s now, in a worker thread). Read there, each is still whole."""
    from loadgen.contract import load_cases, replay_cases_sync

    cases = load_cases(REPO / "scenarios" / "contract" / "canonical.toml")
    with hostile_server("long-stream") as server:
        result = replay_cases_sync(cases, server.base_url, MODEL, stream=True, concurrency=2)
    assert len(result.cases) == len(cases)
    for case in result.cases:
        assert case.observed.error is None and case.observed.text == " the" * LONG_STREAM_EVENTS, case.observed.error


@pytest.mark.parametrize("behaviour", ["head-only", "huge-line"])
def test_an_odd_stream_over_two_workers(tmp_path: Path, trace: Path, behaviour: str) -> None:
    with hostile_server(behaviour) as server:
        out = run(trace, server.base_url, tmp_path / "run", "--workers", "2")
    assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr
    assert_accounted(tmp_path / "run", tmp_path, ODD_STREAMS[behaviour])


def test_the_run_deadline_ends_requests_that_would_wait_longer(tmp_path: Path, trace: Path) -> None:
    """Per-request timeouts far past the run's deadline: the deadline ends every request (cut, not failed)."""
    with hostile_server("head-only") as server:
        out = cli(
            "run", trace, "--target", server.base_url, "--out", tmp_path / "run",
            "--ttft-timeout-s", "300", "--total-timeout-s", "600", "--deadline-s", "4", timeout=90,
        )  # fmt: skip
    assert out.returncode == 0, out.stderr
    rows = load_run(tmp_path / "run").requests.to_pylist()
    assert len(rows) == 12 and {(r["status"], r["error_kind"]) for r in rows} == {("cancelled", "run_interrupted")}
    assert analyzed_overall(tmp_path / "run", tmp_path)["status_counts"]["cancelled"] == 12


@pytest.mark.parametrize("workers", ["1", "2"])
def test_sigterm_against_a_slowloris_ends_with_records(tmp_path: Path, trace: Path, workers: str) -> None:
    with hostile_server("slowloris") as server:
        proc = subprocess.Popen(
            [sys.executable, "-m", "loadgen", "run", trace, "--target", server.base_url, "--out", tmp_path / "run",
             "--ttft-timeout-s", "300", "--total-timeout-s", "600", "--deadline-s", "300", "--workers", workers],
            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env={**os.environ, "PYTHONPATH": str(REPO)},
        )  # fmt: skip
        try:
            record = tmp_path / "run" / "manifest.json"
            for _ in range(600):  # until the run has begun (its manifest is written at the start)
                if record.exists() or proc.poll() is not None:
                    break
                time.sleep(0.1)
            time.sleep(4)  # every request of the 3 s trace due
            proc.send_signal(signal.SIGTERM)
            _, err = proc.communicate(timeout=60)
        finally:
            proc.kill()
    assert proc.returncode == 143 and "Traceback" not in err, err
    rows = load_run(tmp_path / "run").requests.to_pylist()
    assert len(rows) == 12 and {r["error_kind"] for r in rows} <= {"run_interrupted", "not_due"}, rows[0]
    overall = analyzed_overall(tmp_path / "run", tmp_path)  # cut requests: neither failures nor samples
    assert overall["status_counts"]["ok"] == 0 and not overall["error_kinds"], overall


def test_a_server_that_dies_mid_run(tmp_path: Path, trace: Path) -> None:
    """The server exits after its 5th answer: those 5 are exact, the other 7 are connect failures."""
    with hostile_server("die-after-5") as server:
        out = run(trace, server.base_url, tmp_path / "run")
    assert out.returncode == 0, out.stderr
    rows = load_run(tmp_path / "run").requests.to_pylist()
    assert len(rows) == 12 and sum(r["status"] == "ok" for r in rows) == 5
    failed = [r for r in rows if r["status"] != "ok"]
    assert {r["error_kind"] for r in failed} == {"connect"} and {r["status"] for r in failed} <= {"not_sent", "error"}
    assert analyzed_overall(tmp_path / "run", tmp_path)["metrics"]["ttft_ms"]["n"] == 5


def test_odd_heads_and_probes_are_one_line_or_one_row(tmp_path: Path, trace: Path) -> None:
    with hostile_server("models-garbage") as server:
        one_line_error(run(trace, server.base_url, tmp_path / "m"), "GET /v1/models answered HTTP 200 that is not JSON")
    with hostile_server("huge-head") as server:  # 4 MiB of headers: the head is read up to 1 MiB
        assert run(trace, server.base_url, tmp_path / "h").returncode == 0
    rows = load_run(tmp_path / "h").requests.to_pylist()
    assert len(rows) == 12 and all(r["status"] == "error" and "head too large" in r["error_message"] for r in rows)
    # the server answered, with no HTTP head: its own kind, not ``connect`` (it was labelled so)
    assert {r["error_kind"] for r in rows} == {"malformed_head"}, rows[0]


def test_an_answer_nobody_asked_for_is_never_the_next_requests(tmp_path: Path) -> None:
    """After each whole answer the server sends, 50 ms later, a second one (model ``stale-answer``, one token) on
    the kept-alive connection. It was read as the next request's answer: ok, one token, a TTFT of microseconds.
    A connection that receives bytes while idle is closed, not reused. Requests come every 250 ms (constant), so
    the stale answer always arrives while the connection is idle."""
    scenario = tmp_path / "s.toml"
    text = (
        (REPO / "scenarios" / "canonical.toml").read_text().replace('cases = ["contract/canonical.toml"]', "cases = []")
    )
    scenario.write_text(
        text.replace(
            'process = "poisson"\nrate_rps = 4.0\nduration_s = 60',
            'process = "constant"\nrate_rps = 4.0\nduration_s = 3',
        )
    )
    assert cli("trace", "generate", scenario, "--trace", "steady", "--out", tmp_path / "t.parquet").returncode == 0
    with hostile_server("unsolicited") as server:
        out = run(tmp_path / "t.parquet", server.base_url, tmp_path / "run")
    assert out.returncode == 0, out.stderr
    rows = load_run(tmp_path / "run").requests.to_pylist()
    assert len(rows) == pq.read_table(tmp_path / "t.parquet").num_rows
    assert {(r["status"], r["response_model"]) for r in rows} == {("ok", MODEL)}, rows
    assert {r["client_output_tokens"] for r in rows} == {MAX_TOKENS}
