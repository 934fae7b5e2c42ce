"""The live simulated server over real HTTP: protocol, errors, queueing physics, faults, managed API.

Every test starts ``python -m loadgen sim serve`` as a subprocess on loopback (loadgen.targets.launch_sim_server).
"""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import anyio
import httpx

from loadgen.workload.prompts import get_tokenizer

SHARED_SSE = Path(__file__).resolve().parents[2] / "shared" / "traces" / "sse" / "openai-python"


def engine_file(tmp_path: Path, name: str = "test", **sections: dict) -> str:
    """Write an engine TOML (name + sections of scalars/lists) and return its path."""
    lines = [f'name = "{name}"']
    for section, values in sections.items():
        lines.append(f"[{section}]")
        for key, value in values.items():
            lines.append(f"{key} = {json.dumps(value)}")
    path = tmp_path / f"{name}.toml"
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def slow_engine(tmp_path: Path, name: str = "slow", fixed_ms: float = 20.0, **sections: dict) -> str:
    base = {"cost": {"fixed_ms": fixed_ms, "per_prefill_token_ms": 0.0, "per_decode_seq_ms": 0.0}}
    for k, v in sections.items():
        base.setdefault(k, {}).update(v)
    return engine_file(tmp_path, name, **base)


def metrics(base_url: str) -> dict[str, float]:
    """Unlabelled view of /metrics: sample name (+ kind label for faults) → value."""
    text = httpx.get(base_url + "/metrics").text
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name_labels, value = line.rsplit(" ", 1)
        name = name_labels.split("{", 1)[0]
        if name == "loadgen_sim_faults_total":
            name += ":" + name_labels.split('kind="', 1)[1].split('"', 1)[0]
        if "_bucket" in name:
            continue
        out[name] = float(value)
    return out


async def stream_request(client: httpx.AsyncClient, url: str, body: dict, headers: dict | None = None) -> dict:
    """POST a streaming request; return status, headers, per-event arrival times and parsed events."""
    t0 = time.perf_counter()
    out: dict = {"events": [], "times": [], "raw": [], "error": None}
    try:
        async with client.stream("POST", url, json={**body, "stream": True}, headers=headers or {}) as resp:
            out["status"] = resp.status_code
            out["headers"] = resp.headers
            out["head_s"] = time.perf_counter() - t0
            if resp.status_code != 200:
                out["body"] = json.loads(await resp.aread())
                return out
            async for line in resp.aiter_lines():
                if not line.startswith("data: "):
                    continue
                payload = line[6:]
                out["raw"].append(payload)
                out["times"].append(time.perf_counter() - t0)
                if payload == "[DONE]":
                    out["events"].append("[DONE]")
                    continue
                try:
                    out["events"].append(json.loads(payload))
                except json.JSONDecodeError:
                    out["events"].append(None)
    except (httpx.RemoteProtocolError, httpx.ReadError) as exc:
        out["error"] = type(exc).__name__
    return out


def content_tokens(event) -> int:
    """Tokens in one chunk, counted with the tokenizer the driver uses."""
    if not isinstance(event, dict) or not event.get("choices"):
        return 0
    choice = event["choices"][0]
    text = choice.get("text") if "text" in choice else (choice.get("delta") or {}).get("content")
    return get_tokenizer("cl100k_base").count(text) if text else 0


def first_token_s(result: dict) -> float:
    for event, t in zip(result["events"], result["times"]):
        if content_tokens(event):
            return t
    raise AssertionError("no content token")


# --- protocol ------------------------------------------------------------------------------------


def test_endpoints_and_openai_stream_format(sim_server):
    sim = sim_server("instant")
    base = sim.base_url
    assert httpx.get(base + "/health").status_code == 200
    assert httpx.get(base + "/version").json()["engine"] == "loadgen-sim"
    models = httpx.get(base + "/v1/models").json()
    assert models["object"] == "list" and models["data"][0]["id"] == "loadgen-sim"
    prompt = "The quick brown fox jumps over the lazy dog, again and again."
    n_prompt = get_tokenizer("cl100k_base").count(prompt)
    tok = httpx.post(base + "/tokenize", json={"prompt": prompt}).json()
    assert tok["count"] == n_prompt == len(tok["tokens"])

    async def both():
        async with httpx.AsyncClient(timeout=30) as client:
            comp = await stream_request(
                client,
                base + "/v1/completions",
                {"prompt": prompt, "max_tokens": 7, "stream_options": {"include_usage": True}},
            )
            chat = await stream_request(
                client,
                base + "/v1/chat/completions",
                {
                    "messages": [{"role": "user", "content": prompt}],
                    "max_tokens": 5,
                    "stream_options": {"include_usage": True},
                    "ignore_eos": True,
                },
            )
            return comp, chat

    comp, chat = anyio.run(both)
    assert comp["status"] == 200 and comp["headers"]["content-type"].startswith("text/event-stream")
    assert comp["events"][-1] == "[DONE]"
    assert all(isinstance(e, dict) for e in comp["events"][:-1]), "every data line but [DONE] is JSON"
    assert sum(content_tokens(e) for e in comp["events"]) == 7
    assert {e["object"] for e in comp["events"][:-1]} == {"text_completion"}
    usage = comp["events"][-2]
    assert (
        usage["choices"] == []
        and usage["usage"]["completion_tokens"] == 7
        and usage["usage"]["prompt_tokens"] == n_prompt
    )
    assert comp["events"][-3]["choices"][0]["finish_reason"] == "length"

    events = chat["events"]
    assert events[0]["choices"][0]["delta"]["role"] == "assistant"
    assert sum(content_tokens(e) for e in events) == 5 and events[-1] == "[DONE]"
    assert events[-2]["usage"]["total_tokens"] == n_prompt + 5
    if SHARED_SSE.is_dir():  # same shape as OpenAI's recorded chat.completion.chunk events
        recorded = [
            json.loads(line[6:])
            for f in sorted(SHARED_SSE.glob("*.bin"))
            for line in f.read_text().splitlines()
            if line.startswith("data: {")
        ]
        top = set().union(*(r.keys() for r in recorded))
        choice_keys = set().union(*(c.keys() for r in recorded for c in r["choices"]))
        for e in events[:-1]:
            assert set(e) <= top, set(e) - top
            for c in e["choices"]:
                assert set(c) <= choice_keys

    whole = httpx.post(
        base + "/v1/chat/completions", json={"messages": [{"role": "user", "content": prompt}], "max_tokens": 4}
    ).json()
    assert whole["object"] == "chat.completion" and whole["usage"]["completion_tokens"] == 4
    assert get_tokenizer("cl100k_base").count(whole["choices"][0]["message"]["content"]) == 4


def test_bad_requests_get_openai_errors_never_a_crash(sim_server):
    sim = sim_server("instant")
    base = sim.base_url
    cases = [
        ("POST", "/v1/completions", b"{not json", 400),
        ("POST", "/v1/completions", b"", 400),
        ("POST", "/v1/completions", b"[1, 2]", 422),
        ("POST", "/v1/completions", json.dumps({"prompt": 5}).encode(), 422),
        ("POST", "/v1/completions", json.dumps({"prompt": "x", "max_tokens": "many"}).encode(), 422),
        ("POST", "/v1/completions", json.dumps({"prompt": "x", "max_tokens": 0}).encode(), 400),
        ("POST", "/v1/completions", json.dumps({"prompt": "x", "n": 3}).encode(), 400),
        ("POST", "/v1/completions", json.dumps({"prompt": "x", "max_tokens": 10**7}).encode(), 400),
        ("POST", "/v1/completions", json.dumps({"prompt": "x", "model": "gpt-nope"}).encode(), 404),
        ("POST", "/v1/chat/completions", json.dumps({"messages": "hi"}).encode(), 422),
        ("POST", "/v1/chat/completions", json.dumps({"messages": [{"content": "no role"}]}).encode(), 422),
        ("POST", "/v1/completions", json.dumps({"prompt": "x", "stream": "yes"}).encode(), 422),
        ("POST", "/tokenize", json.dumps({"prompt": 3}).encode(), 422),
        ("GET", "/v1/nothing", None, 404),
        ("GET", "/v1/completions", None, 405),
        ("POST", "/v1/completions", json.dumps({"prompt": "x"}).encode(), 400, {"X-Loadgen-Fault": "explode"}),
    ]
    with httpx.Client(base_url=base, timeout=10) as client:
        for method, path, body, status, *hdr in cases:
            resp = client.request(
                method, path, content=body, headers=(hdr[0] if hdr else {}) | {"content-type": "application/json"}
            )
            assert resp.status_code == status, (path, body, resp.text)
            err = resp.json()["error"]
            assert isinstance(err["message"], str) and err["message"] and "type" in err and "code" in err
        assert client.get("/health").status_code == 200
    sim.process.send_signal(signal.SIGTERM)
    assert sim.process.wait(timeout=10) == 0, "clean shutdown on SIGTERM"


# --- engine physics over HTTP ---------------------------------------------------------------------


def test_ttft_grows_with_queue_depth_when_running_cap_is_small(sim_server, tmp_path):
    sim = sim_server(slow_engine(tmp_path, scheduler={"max_num_seqs": 1}))
    url = sim.base_url + "/v1/completions"

    async def burst():
        async with httpx.AsyncClient(timeout=30) as client:
            results = [None] * 5
            waiting_seen = []

            async def one(i):
                results[i] = await stream_request(client, url, {"prompt": f"request {i}", "max_tokens": 8})

            async def scrape():
                await anyio.sleep(0.15)
                waiting_seen.append((await client.get(sim.base_url + "/metrics")).text)

            async with anyio.create_task_group() as tg:
                for i in range(5):
                    tg.start_soon(one, i)
                tg.start_soon(scrape)
            return results, waiting_seen

    results, scraped = anyio.run(burst)
    ttfts = sorted(first_token_s(r) for r in results)
    # one request at a time, 8 tokens x 20 ms each: the k-th in line waits ~k x 160 ms
    gaps = [b - a for a, b in zip(ttfts, ttfts[1:])]
    assert all(g > 0.1 for g in gaps), ttfts
    assert ttfts[-1] - ttfts[0] > 0.5
    waiting = [line for line in scraped[0].splitlines() if line.startswith("vllm:num_requests_waiting{")]
    assert float(waiting[0].rsplit(" ", 1)[1]) >= 2


def test_kv_exhaustion_causes_preemption_visible_in_metrics(sim_server, tmp_path):
    engine = slow_engine(
        tmp_path, fixed_ms=2.0, kv={"num_kv_blocks": 24, "block_size": 16, "enable_prefix_caching": False}
    )
    sim = sim_server(engine)
    url = sim.base_url + "/v1/completions"
    prompt = " ".join(["word"] * 50)

    async def go():
        async with httpx.AsyncClient(timeout=60) as client:
            results = [None] * 4

            async def one(i):
                results[i] = await stream_request(client, url, {"prompt": prompt + f" {i}", "max_tokens": 120})

            async with anyio.create_task_group() as tg:
                for i in range(4):
                    tg.start_soon(one, i)
            return results

    results = anyio.run(go)
    for r in results:
        assert sum(content_tokens(e) for e in r["events"]) == 120, "preempted requests still finish (recompute)"
    m = metrics(sim.base_url)
    assert m["vllm:num_preemptions_total"] >= 1
    assert m["vllm:num_requests_running"] == 0 and m["vllm:kv_cache_usage_perc"] == 0


def test_batching_window_raises_ttft(sim_server, tmp_path):
    plain = sim_server(slow_engine(tmp_path, "plain", fixed_ms=5.0))
    windowed = sim_server(
        slow_engine(tmp_path, "windowed", fixed_ms=5.0, batching={"window_ms": 400, "min_waiting": 16})
    )

    async def ttft(base):
        async with httpx.AsyncClient(timeout=30) as client:
            return first_token_s(
                await stream_request(client, base + "/v1/completions", {"prompt": "hello", "max_tokens": 3})
            )

    t_plain = anyio.run(ttft, plain.base_url)
    t_window = anyio.run(ttft, windowed.base_url)
    assert t_plain < 0.2
    assert t_window >= 0.4 and t_window - t_plain > 0.3


def test_client_disconnect_frees_its_kv_blocks(sim_server, tmp_path):
    sim = sim_server(slow_engine(tmp_path, fixed_ms=10.0))
    with httpx.Client(timeout=30) as client:
        with client.stream(
            "POST",
            sim.base_url + "/v1/completions",
            json={"prompt": " ".join(["token"] * 300), "max_tokens": 2000, "stream": True},
        ) as resp:
            lines = resp.iter_lines()
            got = 0
            for line in lines:
                if line.startswith("data: "):
                    got += 1
                    if got == 3:
                        break
            during = metrics(sim.base_url)
        # the response is closed here: the client went away mid-stream
    assert during["vllm:num_requests_running"] == 1 and during["vllm:kv_cache_usage_perc"] > 0
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        after = metrics(sim.base_url)
        if after["vllm:num_requests_running"] == 0:
            break
        time.sleep(0.05)
    assert after["vllm:num_requests_running"] == 0 and after["vllm:kv_cache_usage_perc"] == 0
    assert after["vllm:generation_tokens_total"] < 1000, "generation stopped when the client left"


# --- faults --------------------------------------------------------------------------------------


def test_each_header_fault_is_produced_and_logged(sim_server):
    sim = sim_server("instant")
    url = sim.base_url + "/v1/completions"
    body = {"prompt": "fault me", "max_tokens": 12}

    async def go():
        async with httpx.AsyncClient(timeout=30) as client:
            out = {}
            for spec in ("error=503", "429=2.5", "stall=0.8@3", "disconnect@5", "malformed@2", "slow_start=0.6"):
                out[spec] = await stream_request(client, url, body, {"X-Loadgen-Fault": spec})
            return out

    out = anyio.run(go)
    assert out["error=503"]["status"] == 503 and out["error=503"]["body"]["error"]["code"] == 503
    r429 = out["429=2.5"]
    assert r429["status"] == 429 and float(r429["headers"]["retry-after"]) == 2.5

    stall = out["stall=0.8@3"]
    content_times = [t for e, t in zip(stall["events"], stall["times"]) if content_tokens(e)]
    gaps = [b - a for a, b in zip(content_times, content_times[1:])]
    assert max(gaps) >= 0.75 and gaps.index(max(gaps)) == 2, "the stall comes after the 3rd token"
    assert sum(content_tokens(e) for e in stall["events"]) == 12

    disc = out["disconnect@5"]
    assert disc["error"] is not None and "[DONE]" not in disc["events"]
    assert sum(content_tokens(e) for e in disc["events"]) == 5

    mal = out["malformed@2"]
    bad = [i for i, e in enumerate(mal["events"]) if e is None]
    assert len(bad) == 1 and sum(content_tokens(e) for e in mal["events"][: bad[0]]) == 2
    assert mal["events"][-1] == "[DONE]"

    assert out["slow_start=0.6"]["head_s"] >= 0.55

    kinds = sorted(line["kind"] for line in sim.fault_lines())
    assert kinds == sorted(["error", "rate_limit", "stall", "disconnect", "malformed", "slow_start"])
    for line in sim.fault_lines():
        assert line["request_id"].startswith("cmpl-") and line["time"] > 0
    m = metrics(sim.base_url)
    for kind in ("error", "rate_limit", "stall", "disconnect", "malformed", "slow_start"):
        assert m[f"loadgen_sim_faults_total:{kind}"] == 1


def test_config_faults_follow_their_rates_and_every_one_is_logged(sim_server, tmp_path):
    engine = engine_file(
        tmp_path,
        "faulty",
        cost={"fixed_ms": 0.0},
        faults={
            "seed": 5,
            "error_rate": 0.12,
            "error_statuses": [502],
            "rate_limit_rate": 0.12,
            "retry_after_s": 1.5,
            "stall_rate": 0.12,
            "stall_s": 0.2,
            "stall_after_tokens": 2,
            "disconnect_rate": 0.12,
            "disconnect_after_tokens": 3,
            "malformed_rate": 0.12,
            "malformed_after_tokens": 1,
            "slow_start_rate": 0.12,
            "slow_start_s": 0.1,
        },
    )
    sim = sim_server(engine, "--seed", "1")

    async def go():
        async with httpx.AsyncClient(timeout=30) as client:
            return [
                await stream_request(
                    client,
                    sim.base_url + "/v1/completions",
                    {"prompt": "x", "max_tokens": 6},
                    {"X-Request-Id": f"client-{i}"},
                )
                for i in range(80)
            ]

    results = anyio.run(go)
    by_client: dict[str, list[str]] = {}
    for line in sim.fault_lines():
        by_client.setdefault(line["client_request_id"], []).append(line["kind"])
    assert {"error", "rate_limit", "stall", "disconnect", "malformed", "slow_start"} <= {
        k for v in by_client.values() for k in v
    }
    for i, r in enumerate(results):
        kinds = by_client.get(f"client-{i}", [])
        if "error" in kinds:
            assert r["status"] == 502
        elif "rate_limit" in kinds:
            assert r["status"] == 429 and float(r["headers"]["retry-after"]) == 1.5
        else:
            assert r["status"] == 200
            assert (r["error"] is not None) == ("disconnect" in kinds)
            assert (None in r["events"]) == ("malformed" in kinds)
            if not kinds:
                assert sum(content_tokens(e) for e in r["events"]) == 6 and r["events"][-1] == "[DONE]"
    m = metrics(sim.base_url)
    assert m["loadgen_sim_faults_total:error"] == sum("error" in v for v in by_client.values())


# --- managed API ---------------------------------------------------------------------------------


def test_managed_mode_quota_identity_drift_and_api_key(sim_server, tmp_path):
    engine = engine_file(
        tmp_path,
        "managed",
        cost={"fixed_ms": 0.0},
        managed={
            "requests_per_minute": 4,
            "response_models": ["sim-2026-01", "sim-2026-02"],
            "system_fingerprints": ["fp_aaa", "fp_bbb"],
            "change_after_requests": 2,
            "api_key_env": "SIM_TEST_KEY",
        },
    )
    sim = sim_server(engine, env={"SIM_TEST_KEY": "sk-test-123"})
    url = sim.base_url + "/v1/chat/completions"
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    with httpx.Client(timeout=10) as client:
        denied = client.post(url, json=body, headers={"Authorization": "Bearer wrong"})
        assert denied.status_code == 401 and denied.json()["error"]["code"] == "invalid_api_key"
        auth = {"Authorization": "Bearer sk-test-123"}
        answers = [client.post(url, json=body, headers=auth) for _ in range(5)]
    assert [a.status_code for a in answers] == [200, 200, 200, 200, 429]
    ids = [(a.json()["model"], a.json()["system_fingerprint"]) for a in answers[:4]]
    assert ids == [("sim-2026-01", "fp_aaa")] * 2 + [("sim-2026-02", "fp_bbb")] * 2
    limited = answers[4]
    assert 0 < float(limited.headers["retry-after"]) <= 60 and limited.json()["error"]["code"] == "rate_limit_exceeded"
    assert [line["kind"] for line in sim.fault_lines()] == ["quota"]


def test_a_request_past_max_model_len_is_cut_or_refused_as_vllm_does(sim_server, tmp_path):
    """vLLM 0.32: a prompt that leaves room is served with max_tokens cut to what is left; a prompt that fills
    the context, or max_tokens past it, is refused with 400. The worksheet applies the same rule (one definition)."""
    sim = sim_server(slow_engine(tmp_path, fixed_ms=0.0, scheduler={"max_model_len": 100}))
    with httpx.Client(base_url=sim.base_url, timeout=30) as client:

        def ask(prompt_tokens: int, max_tokens: int) -> httpx.Response:
            body = {"prompt": list(range(1, prompt_tokens + 1)), "max_tokens": max_tokens, "ignore_eos": True}
            return client.post("/v1/completions", json=body)

        cut = ask(90, 40)
        assert cut.status_code == 200 and cut.json()["usage"]["completion_tokens"] == 10, cut.text
        assert ask(60, 40).json()["usage"]["completion_tokens"] == 40  # fits: not cut
        for prompt_tokens, max_tokens in [(100, 1), (101, 1), (5, 101)]:
            assert ask(prompt_tokens, max_tokens).status_code == 400, (prompt_tokens, max_tokens)


def test_a_chars_engine_streams_text_its_tokenizer_counts_as_the_reported_tokens(sim_server, tmp_path):
    """The ``instant-long-context`` preset counts ``chars:4`` and coalesces: its text must be 4 characters a token,
    or a client counting the stream with the engine's tokenizer counts more tokens than the usage reports (an
    outside recompute of an agent replay found 36,894 client against 31,113 server tokens, +18.6%, and the ITL
    and TPOT that divide by them off as much). Streamed and whole replies."""
    import pyarrow as pa

    from loadgen.driver import RunOptions, run_trace_sync
    from loadgen.rundir.io import load_run
    from loadgen.rundir.schema import TRACE_SCHEMA
    from loadgen.trace.io import write_trace

    sim = sim_server("instant-long-context")
    tok = get_tokenizer("chars:4")
    with httpx.Client(base_url=sim.base_url, timeout=30) as client:
        body = {"model": "loadgen-sim", "prompt": "x" * 40, "max_tokens": 37, "stream": False}
        whole = client.post("/v1/completions", json=body).json()
    assert tok.count(whole["choices"][0]["text"]) == whole["usage"]["completion_tokens"] == 37
    rows = [
        {"request_id": f"r{i}", "request_class": "agent", "scheduled_offset_ns": i * 5_000_000, "prompt_tokens": 64}
        | {"output_tokens": n, "prefix_group": None, "prefix_tokens": None, "conversation_id": None}
        | {"turn_index": None, "cancel_after_tokens": None}
        for i, n in enumerate([1, 2, 7, 64, 333, 1000])
    ]
    trace = write_trace(pa.Table.from_pylist(rows, schema=TRACE_SCHEMA), tmp_path / "t.parquet", {"seed": 1})
    out = run_trace_sync(
        RunOptions(trace_path=trace, target_url=sim.base_url, out_dir=tmp_path / "run", progress="off")
    )
    got = sorted(load_run(out).requests.to_pylist(), key=lambda r: r["request_id"])
    assert [r["status"] for r in got] == ["ok"] * len(rows)
    assert [(r["client_output_tokens"], r["server_output_tokens"]) for r in got] == [
        (n, n) for n in [1, 2, 7, 64, 333, 1000]
    ]
