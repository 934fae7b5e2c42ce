"""The step-size warm-up that calibration and validation run first: which lengths it sends, that it sends
them (real HTTP to a live simulated server, counted by the server's own metrics), and when it does not."""

from __future__ import annotations

import socket
from pathlib import Path

import httpx
import pytest
from hostile_server import hostile_server

from loadgen.calibration.calibrate import engine_limits, warm_engine
from loadgen.driver import parse_prometheus_text
from loadgen.util.errors import LoadgenError
from loadgen.vllm.warmup import DENSE_UP_TO, STRIDE, warm_step_shapes, warmup_lengths, warmup_line


def test_lengths_dense_then_strided_up_to_what_one_step_holds():
    lengths = warmup_lengths(512, 1000)
    assert lengths[:DENSE_UP_TO] == list(range(1, DENSE_UP_TO + 1))
    above = lengths[DENSE_UP_TO:]
    assert all(b - a == STRIDE for a, b in zip(above, above[1:-1]))
    assert lengths[-1] == 512  # the budget itself is a step size
    assert warmup_lengths(2048, 1000)[-1] == 999  # one request: the context must leave room for its token
    assert warmup_lengths(16, 4096) == list(range(1, 17))
    assert warmup_lengths(8192, 2) == [1]
    assert len(set(lengths)) == len(lengths) and lengths == sorted(lengths)
    assert warmup_lengths(512, 1000, stride=37)[DENSE_UP_TO : DENSE_UP_TO + 2] == [101, 138]


def _counter(url: str, name: str) -> float:
    text = httpx.get(url + "/metrics").text
    return sum(v for n, _, v in parse_prometheus_text(text) if n == name)


def _requests_done(url: str) -> float:
    return _counter(url, "vllm:request_success_total")


def test_sweep_sends_every_length_once(sim_server):
    sim = sim_server("instant")
    before = _requests_done(sim.base_url), _counter(sim.base_url, "vllm:prompt_tokens_total")
    warmed = warm_step_shapes(sim.base_url, 200, 4096, skip_simulated=False)
    lengths = warmup_lengths(200, 4096)
    assert (warmed.lengths, warmed.largest, warmed.skipped) == (len(lengths), 200, None)
    assert _requests_done(sim.base_url) - before[0] == len(lengths)
    # every prompt computed (the sim counts a 1-token prompt's step as a decode, not as prefill tokens)
    assert _counter(sim.base_url, "vllm:prompt_tokens_total") - before[1] == sum(lengths) - 1
    assert warmed.to_dict()["stride_tokens"] == STRIDE
    assert "stopped" not in warmed.line()  # no request came near the stop (0.05 ms a prompt token)


def test_sweep_stops_after_two_slow_requests_in_a_row(sim_server, tmp_path: Path):
    # 1 ms a prompt token: a request of n tokens takes at least n ms, so a 0.1 s stop ends the sweep after two
    # lengths of 100 tokens or more (104, 112) at the latest; a loaded host can only end it sooner
    engine = tmp_path / "slow-prefill.toml"
    engine.write_text('name = "slow-prefill"\n[cost]\nfixed_ms = 0.1\nper_prefill_token_ms = 1.0\n')
    sim = sim_server(str(engine))
    before = _requests_done(sim.base_url)
    warmed = warm_step_shapes(sim.base_url, 512, 4096, skip_simulated=False, stop_request_s=0.1)
    lengths = warmup_lengths(512, 4096)
    assert warmed.largest <= 112 and warmed.lengths == lengths.index(warmed.largest) + 1
    assert _requests_done(sim.base_url) - before == warmed.lengths  # nothing sent past the stop
    recorded = warmed.to_dict()
    assert (recorded["budget_tokens"], recorded["stop_request_s"]) == (512, 0.1)
    assert "stopped below the 512-token budget" in warmup_line(recorded)


def test_engine_refusing_token_ids_is_skipped_with_the_reason(sim_server, tmp_path: Path):
    engine = tmp_path / "refuses.toml"
    engine.write_text('name = "refuses"\n[cost]\nfixed_ms = 0.1\n[faults]\nerror_rate = 1.0\nerror_statuses = [422]\n')
    sim = sim_server(str(engine))
    warmed = warm_step_shapes(sim.base_url, 64, 4096, skip_simulated=False)
    assert warmed.lengths == 0
    assert warmed.skipped is not None and "HTTP 422" in warmed.skipped


def test_simulated_engine_and_no_warmup_are_not_swept(sim_server):
    sim = sim_server("instant")
    limits = engine_limits(sim.base_url)
    before = _requests_done(sim.base_url)
    assert "no per-shape cost" in (warm_engine(sim.base_url, limits, True).skipped or "")
    assert "--no-warmup" in (warm_engine(sim.base_url, limits, False).skipped or "")
    assert _requests_done(sim.base_url) == before


def test_unreachable_engine_is_one_line():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, never listening: connections are refused
        with pytest.raises(LoadgenError, match=r"^http://127\.0\.0\.1:\d+: warm-up: ConnectError") as err:
            warm_step_shapes(f"http://127.0.0.1:{port}", 64, 4096, skip_simulated=False)
    assert "\n" not in str(err.value)


def test_an_answer_that_trickles_ends_at_the_request_deadline():
    """Each sweep request read its answer with a 300 s timeout per read and none on the whole: a server that sent
    one byte every few seconds (``trickle``: every 0.5 s) held the calibration for hours. Each request now ends
    within its deadline (connect to last byte; set low here), in one line naming the URL without its secrets."""
    with hostile_server("trickle") as server:
        port = server.base_url.rsplit(":", 1)[1]
        url = f"http://user:pw-Qz8vTq3W@127.0.0.1:{port}?code=S1queryvalue1"
        with pytest.raises(LoadgenError) as err:
            warm_step_shapes(url, 64, 4096, skip_simulated=False, request_timeout_s=1.5)
    said = str(err.value)
    assert said.startswith(f"http://127.0.0.1:{port}: warm-up: no complete answer within 1.5 s"), said
    assert "POST /v1/completions" in said and "\n" not in said
    assert "pw-Qz8vTq3W" not in said and "S1queryvalue1" not in said
