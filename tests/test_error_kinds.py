"""HTTP status → error_kind: one table (``records.http_error_kind``), and every producer uses it."""

from __future__ import annotations

from types import SimpleNamespace

import pyarrow as pa
import pytest

from loadgen.driver.client import _outcome
from loadgen.driver.error_kinds import classify_http_status
from loadgen.rundir.foreign import _vllm_error_columns, llmperf_error_kind
from loadgen.rundir.schema import ERROR_KINDS, TRACE_SCHEMA, http_error_kind
from loadgen.sim import parse_engine_config, simulate_trace

TABLE = [
    (None, "client"),
    (100, "client"),
    (200, "client"),
    (302, "client"),
    (399, "client"),
    (400, "http_4xx"),
    (404, "http_4xx"),
    (428, "http_4xx"),
    (429, "http_429"),
    (430, "http_4xx"),
    (499, "http_4xx"),
    (500, "http_5xx"),
    (503, "http_5xx"),
    (599, "http_5xx"),
    (600, "http_5xx"),  # not a valid status, but the server sent it: a server failure
]


@pytest.mark.parametrize("code,kind", TABLE)
def test_the_mapping_table(code, kind):
    assert http_error_kind(code) == kind
    assert kind in ERROR_KINDS


@pytest.mark.parametrize("code,kind", TABLE)
def test_producers_agree_with_the_table(code, kind):
    if code is not None:
        assert classify_http_status(code) == ("error", kind)  # driver: a non-200 response
        assert llmperf_error_kind(code) == (kind, None if kind == "client" else code)  # LLMPerf error_code
    if code is not None and 400 <= code <= 599:  # vLLM bench: the code is read from the error text
        cols = _vllm_error_columns(f"Bad Request: HTTP status {code} (x)")
        assert (cols["error_kind"], cols["http_status"]) == (kind, code)


def test_without_a_status():
    assert http_error_kind(None, otherwise="http_5xx") == "http_5xx"
    assert llmperf_error_kind(-1) == ("client", None) and llmperf_error_kind("x") == ("client", None)
    assert _vllm_error_columns("connection refused")["error_kind"] == "client"
    # an in-stream error object: its code when it is an HTTP error status, else a server failure
    for code, kind in [(None, "http_5xx"), (200, "http_5xx"), (400, "http_4xx"), (429, "http_429"), (500, "http_5xx")]:
        state = SimpleNamespace(error="engine died", error_code=code)
        assert _outcome(state)[:2] == ("error", kind)


def test_simulator_injected_statuses_use_the_table():
    n = 300
    table = pa.Table.from_pydict(
        {
            "request_id": [f"r{i:04d}" for i in range(n)],
            "request_class": ["c"] * n,
            "scheduled_offset_ns": [i * 10_000_000 for i in range(n)],
            "prompt_tokens": [50] * n,
            "output_tokens": [4] * n,
            "prefix_group": [None] * n,
            "prefix_tokens": [None] * n,
            "conversation_id": [None] * n,
            "turn_index": [None] * n,
            "cancel_after_tokens": [None] * n,
        },
        schema=TRACE_SCHEMA,
    )
    faults = {"error_rate": 0.3, "error_statuses": [404, 429, 503], "rate_limit_rate": 0.1}
    config = parse_engine_config({"name": "t", "faults": faults, "scheduler": {"max_model_len": 60}}, "t")
    rows = simulate_trace(table, {}, config).requests
    failed = [r for r in rows if r["status"] == "error"]
    assert {r["http_status"] for r in failed} == {404, 429, 503}
    assert all(r["error_kind"] == http_error_kind(r["http_status"]) for r in failed)
    long = simulate_trace(table.set_column(3, "prompt_tokens", pa.array([70] * n, pa.int32())), {}, config).requests
    assert {(r["http_status"], r["error_kind"]) for r in long if r["http_status"] == 400} == {(400, "http_4xx")}
