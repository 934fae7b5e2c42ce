"""Contract replay over real HTTP (loopback): pass/fail per case, reference diff, 429 handling, secrets.

The server here is a small stdlib ``http.server`` that answers with the contract responder (the same
function the simulated engine calls), so the replay client, the checks and the diff are exercised
over a real socket independently of the simulated engine (``test_contract_sim.py`` covers that).
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from result_schemas import assert_valid

from loadgen.contract import diff, load_cases, read_contract, replay_cases_sync, respond_full
from loadgen.util.errors import TargetError
from loadgen.workload.prompts import get_tokenizer

ROOT = Path(__file__).resolve().parents[1]
CANONICAL = ROOT / "scenarios" / "contract" / "canonical.toml"
TOK = get_tokenizer()


@contextmanager
def responder_server(
    behavior: dict[str, Any] | None = None,
    *,
    rate_limit_first: int = 0,
    api_key: str | None = None,
    model_id: str = "sim-model",
) -> Iterator[tuple[str, dict[str, Any]]]:
    """An OpenAI-compatible non-streaming server answering through the contract responder."""
    state: dict[str, Any] = {"requests": 0, "limited": 0, "headers": [], "bodies": []}

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:  # keep pytest output clean
            pass

        def _send(self, status: int, payload: dict[str, Any], headers: dict[str, str] | None = None) -> None:
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            for k, v in (headers or {}).items():
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(data)

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["content-length"])))
            state["headers"].append(dict(self.headers))
            state["bodies"].append(body)
            if api_key is not None and self.headers.get("authorization") != f"Bearer {api_key}":
                return self._send(401, {"error": {"message": "bad key"}})
            if state["limited"] < rate_limit_first:
                state["limited"] += 1
                return self._send(429, {"error": {"message": "slow down"}}, {"retry-after": "0.05"})
            state["requests"] += 1
            answer = respond_full(body, behavior, headers=dict(self.headers))
            text = answer.text if answer else "filler"
            finish = answer.finish_reason if answer else "length"
            choice: dict[str, Any] = {"index": 0, "finish_reason": finish}
            if self.path.endswith("/chat/completions"):
                choice["message"] = {"role": "assistant", "content": text}
            else:
                choice["text"] = text
            self._send(
                200,
                {
                    "id": "x",
                    "object": "chat.completion",
                    "model": model_id,
                    "system_fingerprint": "fp_1",
                    "choices": [choice],
                    "usage": {"prompt_tokens": 10, "completion_tokens": TOK.count(text), "total_tokens": 10},
                },
            )

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", state
    finally:
        server.shutdown()
        server.server_close()


def test_reference_passes_every_case_with_settings_recorded() -> None:
    cases = load_cases(CANONICAL)
    with responder_server() as (url, state):
        result = replay_cases_sync(cases, url, "sim-model")
    assert result.passed, result.failures
    assert len(result.cases) == len(cases) == state["requests"]
    for body in state["bodies"]:
        assert body["temperature"] == 0 and body["seed"] == 1234 and body["stream"] is False
    assert {h.get("X-Loadgen-Case") or h.get("x-loadgen-case") for h in state["headers"]} == {c.id for c in cases}
    d = result.to_dict()
    assert d["cases"][0]["settings"]["seed"] == 1234 and d["system_fingerprints"] == ["fp_1"]
    assert d["sources"][0]["sha256"] == cases.sources[0]["sha256"]


def test_drifted_candidate_fails_and_is_rejected_against_reference() -> None:
    cases = load_cases(CANONICAL)
    with responder_server() as (url, _):
        reference = replay_cases_sync(cases, url, "sim-model")
    with responder_server({"drift_kinds": ["abstention", "schema"]}) as (url, _):
        candidate = replay_cases_sync(cases, url, "sim-model", reference=reference)
    assert not candidate.passed
    failed = {(f["case_id"], f["kind"]) for f in candidate.failures}
    assert failed == {("abstention-missing-fact", "abstention"), ("schema-person", "schema")}
    assert candidate.reference_diff is not None and candidate.reference_diff.rejects
    assert sorted(candidate.reference_diff.regressions) == ["abstention-missing-fact", "schema-person"]
    assert "REJECT" in candidate.summary()
    assert not diff(reference, reference).rejects


def test_completions_endpoint_renders_chat_cases_as_prompt() -> None:
    cases = load_cases(f"{CANONICAL}#target-capital")
    with responder_server() as (url, state):
        result = replay_cases_sync(cases, url + "/v1", "sim-model", endpoint="completions")
    assert result.passed
    assert state["bodies"][0]["prompt"].endswith("Assistant:")
    assert result.cases[0].settings["prompt_template"] == "role-blocks"


def test_429_is_retried_after_retry_after_and_recorded() -> None:
    cases = load_cases(f"{CANONICAL}#target-arithmetic")
    with responder_server(rate_limit_first=2) as (url, _):
        result = replay_cases_sync(cases, url, "sim-model")
    assert result.passed
    assert result.cases[0].attempts == 3 and result.cases[0].retry_after_s == [0.05, 0.05]
    with responder_server(rate_limit_first=10) as (url, _):
        result = replay_cases_sync(cases, url, "sim-model", max_retries=1)
    assert not result.passed and result.cases[0].observed.http_status == 429


def test_api_key_comes_from_env_and_is_never_recorded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    secret = "sk-test-SECRET-0123456789"
    monkeypatch.setenv("LOADGEN_TEST_KEY", secret)
    cases = load_cases(CANONICAL)
    with responder_server(api_key=secret) as (url, _):
        result = replay_cases_sync(cases, url, "sim-model", api_key_env="LOADGEN_TEST_KEY")
        bad = replay_cases_sync(cases, url, "sim-model")  # no key: 401, every case fails
    assert result.passed and not bad.passed and bad.cases[0].observed.http_status == 401
    out = tmp_path / "contract.json"
    from loadgen.contract import write_contract

    write_contract(result, out)
    assert secret not in out.read_text() and "LOADGEN_TEST_KEY" in out.read_text()
    monkeypatch.delenv("LOADGEN_TEST_KEY")
    with pytest.raises(TargetError, match="LOADGEN_TEST_KEY"):
        replay_cases_sync(cases, url, "sim-model", api_key_env="LOADGEN_TEST_KEY")


def test_connection_refused_fails_cases_without_raising() -> None:
    cases = load_cases(f"{CANONICAL}#target-capital")
    result = replay_cases_sync(cases, "http://127.0.0.1:9", "m", timeout_s=2)
    assert not result.passed and result.cases[0].observed.error
    assert result.notes


def test_cli_replay_writes_result_and_exit_codes(tmp_path: Path) -> None:
    with responder_server() as (url, _):
        ref = tmp_path / "ref.json"
        ok = subprocess.run(
            [
                sys.executable,
                "-m",
                "loadgen",
                "contract",
                "replay",
                str(CANONICAL),
                "--target",
                url,
                "--model",
                "sim-model",
                "--out",
                str(ref),
            ],
            capture_output=True,
            text=True,
            cwd=ROOT,
        )
    assert ok.returncode == 0, ok.stderr
    assert "contract PASSED: 8/8" in ok.stdout and read_contract(ref).passed
    assert_valid("contract", json.loads(ref.read_text()))  # `loadgen schema contract`
    with responder_server({"drift": {"target-capital": "Lyon is the capital."}}) as (url, _):
        out = tmp_path / "cand.json"
        bad = subprocess.run(
            [
                sys.executable,
                "-m",
                "loadgen",
                "contract",
                "replay",
                str(CANONICAL),
                "--target",
                url,
                "--model",
                "sim-model",
                "--reference",
                str(ref),
                "--out",
                str(out),
            ],
            capture_output=True,
            text=True,
            cwd=ROOT,
        )
    assert bad.returncode == 1
    assert "FAIL  target-capital" in bad.stdout and "DIFF  target-capital: regressed" in bad.stdout
    candidate = json.loads(out.read_text())
    assert_valid("contract", candidate)  # with its failures and the reference diff
    assert candidate["failures"] and candidate["reference_diff"]["rejects"] is True
    res = subprocess.run(
        [sys.executable, "-m", "loadgen", "contract", "diff", str(out), str(ref)],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    printed = json.loads(res.stdout)
    assert res.returncode == 1 and printed["regressions"] == ["target-capital"]
    assert_valid("contract-diff", printed)  # `loadgen schema contract-diff`
    assert printed == candidate["reference_diff"]  # one shape: the contract's own reference_diff


def test_cli_replay_takes_cases_from_the_scenario() -> None:
    with responder_server() as (url, state):
        res = subprocess.run(
            [
                sys.executable,
                "-m",
                "loadgen",
                "contract",
                "replay",
                "--scenario",
                str(ROOT / "scenarios" / "canonical.toml"),
                "--target",
                url,
                "--model",
                "sim-model",
                "--endpoint",
                "completions",
            ],
            capture_output=True,
            text=True,
            cwd=ROOT,
        )
    assert res.returncode == 0, res.stderr
    assert "contract PASSED: 8/8" in res.stdout and len(state["bodies"]) == 8
    assert all("prompt" in b for b in state["bodies"])
