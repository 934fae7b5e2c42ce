"""Driver parts that need no server: error mapping, redaction, schedule precision, /metrics parsing, prompt jobs."""

from __future__ import annotations

import base64
import inspect
import json
import time
from array import array

import anyio
import httpx
import pyarrow as pa
import pytest

from loadgen.driver.error_kinds import (
    Phase,
    StreamTruncated,
    TotalTimeout,
    TTFTTimeout,
    classify_exception,
    classify_http_status,
    parse_retry_after,
)
from loadgen.driver.jobs import build_jobs
from loadgen.driver.metrics_scrape import parse_prometheus_text, samples_to_columns
from loadgen.driver.schedule import LagStats, RateGate, sleep_until
from loadgen.driver.sse import SSEProtocolError
from loadgen.rundir.schema import ERROR_KINDS, STATUSES, TRACE_SCHEMA
from loadgen.util.redact import basic_token, redact, redact_url, url_secrets, with_encodings, without_secrets
from loadgen.workload.prompts import get_tokenizer

# ---------------------------------------------------------------- error mapping


def _httpx_exception_classes():
    return [obj for _, obj in inspect.getmembers(httpx) if inspect.isclass(obj) and issubclass(obj, httpx.HTTPError)]


def _instance(cls):
    request = httpx.Request("POST", "http://127.0.0.1:1/v1/completions")
    if issubclass(cls, httpx.HTTPStatusError):
        return cls("boom", request=request, response=httpx.Response(500, request=request))
    try:
        return cls("boom", request=request)
    except TypeError:
        return cls("boom")


@pytest.mark.parametrize("phase", [Phase.BEFORE_RESPONSE, Phase.STREAMING])
def test_every_httpx_exception_maps_to_a_known_kind(phase):
    for cls in _httpx_exception_classes():
        status, kind, message = classify_exception(_instance(cls), phase)
        assert status in STATUSES and kind in ERROR_KINDS, cls
        assert "\n" not in message
        if issubclass(cls, httpx.TransportError) and cls is not httpx.LocalProtocolError:
            assert kind != "client", f"{cls.__name__} should not fall through to 'client'"


def test_specific_mappings():
    req = httpx.Request("GET", "http://x")
    assert classify_exception(httpx.ConnectError("refused", request=req), Phase.BEFORE_RESPONSE)[:2] == (
        "error",
        "connect",
    )
    assert classify_exception(httpx.RemoteProtocolError("peer closed", request=req), Phase.STREAMING)[:2] == (
        "error",
        "reset_mid_stream",
    )
    assert classify_exception(httpx.ReadError("reset", request=req), Phase.STREAMING)[:2] == (
        "error",
        "reset_mid_stream",
    )
    assert classify_exception(SSEProtocolError("bad"), Phase.STREAMING)[:2] == ("error", "malformed_sse")
    assert classify_exception(StreamTruncated("cut"), Phase.STREAMING)[:2] == ("error", "truncated")
    assert classify_exception(TTFTTimeout("slow"), Phase.STREAMING)[:2] == ("timeout", "ttft_timeout")
    assert classify_exception(TotalTimeout("slow"), Phase.STREAMING)[:2] == ("timeout", "total_timeout")
    assert classify_exception(RuntimeError("bug"), Phase.STREAMING)[:2] == ("error", "client")
    assert classify_http_status(429) == ("error", "http_429")
    assert classify_http_status(404) == ("error", "http_4xx")
    assert classify_http_status(503) == ("error", "http_5xx")


def test_secrets_never_survive_in_messages_or_urls():
    key = "sk-test-1234567890abcdef"
    exc = httpx.ConnectError(f"failed for https://user:{key}@api.example.com/v1?api_key={key} Bearer {key}")
    _, _, message = classify_exception(exc, Phase.BEFORE_RESPONSE, secrets=(key,))
    assert key not in message and "REDACTED" in message
    assert redact(f"Authorization: Bearer {key}") == "Authorization: Bearer REDACTED"
    url = redact_url(f"https://me:{key}@api.example.com:8443/v1?api-key={key}&x=1")
    # every query value is redacted, whatever its name (a gateway may take its key as ?code= or ?sig=): issue 34
    assert key not in url and "me" not in url and url == "https://api.example.com:8443/v1?api-key=REDACTED&x=REDACTED"


def test_a_target_urls_secrets_are_its_password_basic_token_and_query_values():
    """One definition for the run and the contract replay: what a server may echo of the URL's credentials."""
    url = "http://alice:p%40ss-word@host:8000/v1?api_key=QUERYVALUE1&short=abc"
    token = base64.b64encode(b"alice:p@ss-word").decode()
    assert basic_token(url) == token and basic_token("http://host/v1") is None
    assert url_secrets(url) == ("p%40ss-word", "p@ss-word", token, "QUERYVALUE1")  # short values hit plain text
    echoed = f"Basic {token} for alice:p@ss-word at ?api_key=QUERYVALUE1"
    assert without_secrets(echoed, url_secrets(url)) == "Basic REDACTED for alice:REDACTED at ?api_key=REDACTED"
    assert url_secrets("http://host:8000/v1") == ()


def test_a_short_query_value_of_a_credential_name_is_a_secret_whatever_its_length():
    """``?key=abc`` was kept wherever a server echoed it (only values of 8+ characters were secrets); a short value
    of a credential-named parameter is one now, replaced as a word, sent form and decoded form alike. A plain number
    is not (it would hit the figures of a /metrics answer), nor is a short value of an ordinary name."""
    url = "http://host/v1?key=abc&sig=x%2F1&api-version=2024&n=5&token=42"
    assert url_secrets(url) == ("abc", "x%2F1", "x/1")
    secrets = url_secrets(url)
    assert without_secrets('model "abc" said key=abc, sig x/1 (x%2F1)', secrets) == (
        'model "REDACTED" said key=REDACTED, sig REDACTED (REDACTED)'
    )
    assert without_secrets("abcdef 42 5 2024 vllm:num_requests_running 1", secrets) == (
        "abcdef 42 5 2024 vllm:num_requests_running 1"
    )


def test_a_long_secret_is_also_found_base64_and_percent_encoded_wherever_it_is_aligned():
    """A server that says ``Authorization`` back base64-encoded stored the key: its encoded forms are secrets too
    (the three alignments base64 can give it inside a longer text, standard and URL-safe, and percent-encoded)."""
    key = "sk-LEAK/CANARY+7f3e9d2a?1b5c"
    secrets = with_encodings((key, "short"))
    assert secrets[:2] == (key, "short") and "sk-LEAK%2FCANARY%2B7f3e9d2a%3F1b5c" in secrets
    for before in (b"", b"B", b"Be", b"Bearer ", b"user:"):
        for after in (b"", b"z", b"zz"):
            for encode in (base64.b64encode, base64.urlsafe_b64encode):
                said = encode(before + key.encode() + after).decode()
                assert "REDACTED" in without_secrets(said, secrets), (before, after, said)
    assert without_secrets("a plain answer of 42 tokens", secrets) == "a plain answer of 42 tokens"


def test_retry_after_seconds_and_http_date():
    assert parse_retry_after("2.5") == 2.5
    assert parse_retry_after(None) is None and parse_retry_after("soon") is None
    assert parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT", now_s=1445412470.0) == pytest.approx(10.0)


# ---------------------------------------------------------------- schedule


def test_sleep_until_never_returns_before_its_deadline():
    """Behaviour only: how close to the deadline it wakes is a benchmark (benchmarks/bench_sleep_until.py)."""

    async def main():
        start = time.perf_counter_ns() + 5_000_000
        lags = []
        for k in range(50):
            deadline = start + k * 2_000_000  # every 2 ms, fixed grid
            await sleep_until(deadline)
            lags.append(time.perf_counter_ns() - deadline)
        return lags

    assert min(anyio.run(main)) >= 0


def test_the_early_wake_follows_how_late_the_loop_wakes():
    """On the timerfd path the wake comes as early as the loop's recent wake-ups were late: at the cap while
    nothing is known, down to the floor after quiet wake-ups, back at the cap at once after a late one; and
    real waits report their lateness (a wait never reported would leave it at the cap)."""
    from loadgen.driver import schedule  # the module's constants and its per-loop timer

    async def main():
        timer = schedule._timerfd()
        if timer is None:
            pytest.skip("no timerfd on this platform: the thread path keeps its fixed early wake")
        cap = schedule.WAKE_EARLY_NS
        seen = []
        assert timer.early_ns(cap) == cap
        for _ in range(400):
            timer.woke(5_000)
        seen.append(timer.early_ns(cap))
        timer.woke(1_000_000)
        seen.append(timer.early_ns(cap))
        seen.append(timer.early_ns(schedule.WAKE_EARLY_IDLE_NS))
        reported = []
        timer.woke = reported.append  # the real waits below report here
        for _ in range(5):
            await sleep_until(time.perf_counter_ns() + 2_000_000)
        return seen, reported

    seen, reported = anyio.run(main)
    assert seen == [schedule.WAKE_EARLY_MIN_NS, schedule.WAKE_EARLY_NS, schedule.WAKE_EARLY_IDLE_NS]
    assert len(reported) == 5 and all(late >= 0 for late in reported)


def test_late_deadline_returns_immediately():
    async def main():
        t0 = time.perf_counter_ns()
        await sleep_until(t0 - 1_000_000_000)
        return time.perf_counter_ns() - t0

    assert anyio.run(main) < 5_000_000


def test_rate_gate_spaces_permits():
    async def main():
        gate = RateGate(200.0)  # 5 ms apart
        stamps = []
        for _ in range(5):
            await gate.wait()
            stamps.append(time.perf_counter_ns())
        return stamps, gate.waited

    stamps, waited = anyio.run(main)
    # permits lie on a fixed 5 ms grid from the first one: never earlier than their slot
    assert 1 <= waited <= 4  # the first never waits; a late wake-up can leave a later slot already due
    for k, stamp in enumerate(stamps):
        assert stamp - stamps[0] >= k * 5_000_000 - 100_000


def test_lag_stats_nearest_rank():
    stats = LagStats()
    for v in range(1, 101):
        stats.add(v * 1000)
    assert stats.summary() == {"p50": 50_000, "p99": 99_000, "max": 100_000, "n": 100}
    assert LagStats().summary()["p99"] is None


# ---------------------------------------------------------------- /metrics

VLLM_SAMPLE = """\
# HELP vllm:num_requests_running Number of requests currently running on GPU.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="m"} 3.0
vllm:gpu_cache_usage_perc{model_name="m"} 0.25
vllm:time_to_first_token_seconds_bucket{le="+Inf",model_name="m"} 17.0
vllm:e2e_request_latency_seconds_sum{model_name="m"} 1.5e+01
weird_escape{path="a\\"b\\\\c",empty=""} NaN 1700000000000
process_cpu_seconds_total 12.5
broken line here
"""


def test_prometheus_text_that_is_no_exposition_format_gives_no_sample():
    """A hostile /metrics line of 8 MiB was stored as one sample named 8 MiB of ``z``, and binary bytes as a name:
    a sample's name must be a metric name, and a line over 16 KiB is skipped (its labels are parsed per character)."""
    text = "\x00\ufffd{{{ 1\n" + "z" * (8 << 20) + " 1\n" + 'vllm:x{a="' + "b" * 20_000 + '"} 1\nvllm:ok{a="b"} 2\n'
    assert list(parse_prometheus_text(text)) == [("vllm:ok", {"a": "b"}, 2.0)]


def test_prometheus_text_parsing():
    samples = list(parse_prometheus_text(VLLM_SAMPLE))
    names = [s[0] for s in samples]
    assert names == [
        "vllm:num_requests_running",
        "vllm:gpu_cache_usage_perc",
        "vllm:time_to_first_token_seconds_bucket",
        "vllm:e2e_request_latency_seconds_sum",
        "weird_escape",
        "process_cpu_seconds_total",
    ]
    assert samples[0][1:] == ({"model_name": "m"}, 3.0)
    assert samples[2][1] == {"le": "+Inf", "model_name": "m"}
    assert samples[3][2] == 15.0
    assert samples[4][1] == {"path": 'a"b\\c', "empty": ""} and samples[4][2] != samples[4][2]  # NaN
    cols = samples_to_columns(samples, 123, prefixes=("vllm:",))
    assert cols["time_ns"] == [123] * 4 and json.loads(cols["labels"][0]) == {"model_name": "m"}


# ---------------------------------------------------------------- prompt jobs


def _counting_ctx():
    """A run context that counts a text's tokens as its characters (no tokenizer time), toward no server."""
    from loadgen.driver.client import RunContext
    from loadgen.driver.transport import RawHTTP11Transport

    transport = RawHTTP11Transport()
    return RunContext(
        transport=transport,
        origin=transport.origin(httpx.URL("http://127.0.0.1:9")),
        anchor_ns=0,
        limiter=anyio.CapacityLimiter(1),
        rate_gate=RateGate(None),
        count_tokens=len,
        sink=lambda row, chunks: None,
        ttft_timeout_ns=None,
        total_timeout_ns=None,
    )


def _trace(rows):
    full = []
    for r in rows:
        base = {
            "prefix_group": None,
            "prefix_tokens": None,
            "conversation_id": None,
            "turn_index": None,
            "cancel_after_tokens": None,
        }
        base.update(r)
        full.append(base)
    return pa.Table.from_pylist(full, schema=TRACE_SCHEMA)


ROWS = [
    {
        "request_id": "r0",
        "request_class": "short-message",
        "scheduled_offset_ns": 0,
        "prompt_tokens": 40,
        "output_tokens": 8,
        "prefix_group": "system-prompt",
        "prefix_tokens": 16,
    },
    {
        "request_id": "r1",
        "request_class": "short-message",
        "scheduled_offset_ns": 10,
        "prompt_tokens": 60,
        "output_tokens": 8,
        "prefix_group": "system-prompt",
        "prefix_tokens": 16,
        "cancel_after_tokens": 3,
    },
    {
        "request_id": "t0",
        "request_class": "long-thread",
        "scheduled_offset_ns": 20,
        "prompt_tokens": 30,
        "output_tokens": 12,
        "conversation_id": "c1",
        "turn_index": 0,
    },
    {
        "request_id": "t1",
        "request_class": "long-thread",
        "scheduled_offset_ns": 30,
        "prompt_tokens": 30 + 12 + 25,
        "output_tokens": 9,
        "conversation_id": "c1",
        "turn_index": 1,
    },
    {
        "request_id": "t2",
        "request_class": "long-thread",
        "scheduled_offset_ns": 40,
        "prompt_tokens": 67 + 9 + 5,
        "output_tokens": 4,
        "conversation_id": "c1",
        "turn_index": 2,
    },
]


def test_completions_prompts_are_exact_shared_and_growing():
    tok = get_tokenizer("cl100k_base")
    jobs = build_jobs(_trace(ROWS), model="m", endpoint="completions", tokenizer=tok, retain_prompt_text=True)
    prompts = {j.request_id: json.loads(j.body)["prompt"] for j in jobs}
    for job in jobs:
        assert tok.count(prompts[job.request_id]) == job.target_prompt_tokens == job.client_prompt_tokens
        body = json.loads(job.body)
        assert body["max_tokens"] == job.target_output_tokens and body["stream"] is True
        assert body["ignore_eos"] is True and body["stream_options"]["include_usage"] is True
    prefix = tok.decode(tok.encode(prompts["r0"])[:16])
    assert prompts["r1"].startswith(prefix)
    assert prompts["t1"].startswith(prompts["t0"]) and prompts["t2"].startswith(prompts["t1"])
    assert jobs[1].cancel_after_tokens == 3


def test_chat_prompts_alternate_roles_and_keep_history():
    tok = get_tokenizer("cl100k_base")
    jobs = build_jobs(_trace(ROWS), model="m", endpoint="chat", tokenizer=tok, vllm_extensions=False)
    msgs = {j.request_id: json.loads(j.body)["messages"] for j in jobs}
    assert [m["role"] for m in msgs["t2"]] == ["user", "assistant", "user", "assistant", "user"]
    assert msgs["t2"][:3] == msgs["t1"]
    assert sum(tok.count(m["content"]) for m in msgs["t1"]) == 67
    body = json.loads(jobs[0].body)
    assert "ignore_eos" not in body and "continuous_usage_stats" not in body["stream_options"]


def test_prompt_text_only_when_retained_but_hash_always():
    tok = get_tokenizer("cl100k_base")
    jobs = build_jobs(_trace(ROWS[:1]), model="m", endpoint="completions", tokenizer=tok)
    assert jobs[0].prompt_text is None and len(jobs[0].prompt_sha256) == 64


# ---------------------------------------------------------------- recorder


def test_recorder_never_loses_rows_when_cancelled_mid_flush(tmp_path):
    """Cancel the writer task at many points (also right at a flush); finish() must still write every row."""
    from loadgen.driver.client import request_row
    from loadgen.driver.jobs import Job
    from loadgen.driver.recorder import ArrowRunWriter, Recorder, StreamChunks
    from loadgen.rundir.io import load_run
    from loadgen.rundir.manifest import Manifest

    def job(i: int) -> Job:
        return Job(
            index=i,
            request_id=f"r{i}",
            request_class="burst",
            offset_ns=i,
            target_prompt_tokens=1,
            target_output_tokens=1,
            conversation_id=None,
            turn_index=None,
            prefix_group=None,
            cancel_after_tokens=None,
            body=b"",
            prompt_sha256="0" * 64,
            client_prompt_tokens=1,
            prompt_text=None,
        )

    for trial in range(6):
        writer = ArrowRunWriter(tmp_path / f"run{trial}", Manifest(run_kind="measured"), flush_rows=1 << 60)
        recorder = Recorder(writer, flush_interval_s=0.0, poll_s=0.001)

        async def main():
            async with anyio.create_task_group() as tg:
                await tg.start(recorder.run)
                for i in range(300):
                    row = request_row(job(i), i, status="ok")
                    recorder.submit(row, StreamChunks(array("q", [1, 2]), array("q", [1, 1]), array("q", [10, 10])))
                    if i % 7 == 0:
                        await anyio.sleep(0.0005 * trial)
                tg.cancel_scope.cancel()

        anyio.run(main)
        recorder.finish()
        writer.close()
        run = load_run(tmp_path / f"run{trial}")
        assert run.requests.num_rows == 300 and run.chunks.num_rows == 600
        assert run.manifest.status_counts["ok"] == 300 == len(recorder.recorded_ids)


# ---------------------------------------------------------------- public surface, progress


def test_driver_exports_resolve():
    import loadgen.driver as driver

    for name in driver.__all__:
        assert hasattr(driver, name), name
    assert callable(driver.run_trace) and callable(driver.run_trace_sync)


def test_run_options_validate_and_redact():
    from pydantic import ValidationError

    from loadgen.driver import RunOptions

    with pytest.raises(ValidationError):
        RunOptions(trace_path="t", target_url="ftp://x", out_dir="o")
    with pytest.raises(ValidationError):
        RunOptions(trace_path="t", target_url="http://x", out_dir="o", api_key_env="sk-abc def")
    with pytest.raises(ValidationError):
        RunOptions(trace_path="t", target_url="http://x", out_dir="o", no_such_option=1)
    o = RunOptions(trace_path="t", target_url="http://u:p4ss@x:1/v1/", out_dir="o", headers={"X-Api-Key": "secret-v"})
    m = o.manifest()
    assert m["target_url"] == "http://x:1/v1" and m["headers"] == ["X-Api-Key"] and "secret-v" not in json.dumps(m)


def test_progress_line_reports_counters():
    import io
    from types import SimpleNamespace

    from loadgen.driver.progress import Progress, context_counts

    ctx = SimpleNamespace(sent=5, in_flight=2, done=3, errors=1, recent_ttft_ns=[i * 1_000_000 for i in range(1, 101)])
    stream = io.StringIO()
    progress = Progress(lambda: context_counts(ctx), total=10, stream=stream)
    progress.draw()
    progress.close()
    text = stream.getvalue()
    assert text.startswith("\rloadgen run ")
    assert "sent 5/10" in text and "in flight 2" in text and "done 3" in text and "errors 1" in text
    assert "p99 TTFT 99 ms" in text and text.endswith("\n")


def test_progress_merges_worker_counts_with_the_worst_p99():
    import io

    from loadgen.driver.progress import Counts, Progress, merged_counts

    a, b = Counts(4, 1, 3, 0, 20_000_000), Counts(6, 2, 4, 1, 90_000_000)
    merged = merged_counts([a, b, Counts()])
    assert merged == Counts(sent=10, in_flight=3, done=7, errors=1, p99_ttft_ns=90_000_000)
    assert merged_counts([]) == Counts() and merged_counts([Counts(1, 0, 1, 0)]).p99_ttft_ns is None
    # a report round-trips through JSON; anything else is no report
    assert Counts.from_json(b.to_json()) == b
    assert Counts.from_json({"sent": "1", "in_flight": 0, "done": 0, "errors": 0}) is None
    assert Counts.from_json({"sent": 1}) is None and Counts.from_json([1, 2]) is None
    stream = io.StringIO()
    line = Progress(
        lambda: merged, 12, what="loadgen run (2 processes)", ttft_label="p99 TTFT (worst worker)", stream=stream
    )
    line.close()
    assert stream.getvalue() == ""  # never drawn: nothing to end
    line.draw()
    assert "loadgen run (2 processes)" in line.line() and "sent 10/12" in line.line()
    assert "p99 TTFT (worst worker) 90 ms" in stream.getvalue()


def test_the_token_cache_is_bounded_in_characters() -> None:
    """A server that streamed 256 KiB chunk texts, each its own (``tests/hostile_server.py --behaviour
    huge-text``), grew the run's token cache by every one: only its number of texts (200,000) was bounded. The
    cache now holds at most ``TOKEN_CACHE_MAX_CHARS`` (32 Mi) characters (measured against huge-text, 30 s: 390 MB RSS
    before, 259 MB now, 209 MB against ``ok``). Counted here by characters, so the test takes no tokenizer time."""
    from loadgen.driver.client import StreamState

    ctx = _counting_ctx()
    piece = " the" * (64 << 10)  # 256 KiB
    for i in range(512):  # 128 MiB of texts, each its own (counted off the loop, then kept: ``remember``)
        text = f" n{i}{piece}"
        assert ctx.remember(text, len(text)) == len(text) and StreamState(ctx, None, None).tokens_of(text) == len(text)
        assert sum(map(len, ctx._token_cache)) <= 64 << 20, i
    assert StreamState(ctx, None, None).tokens_of(" the") == 4 and " the" in ctx._token_cache  # counted, then kept


def test_a_long_chunk_text_is_counted_off_the_loop_in_order() -> None:
    """A chunk text past ``INLINE_COUNT_MAX_CHARS`` (with those counted before it in the same read) stops the
    read: ``feed`` holds it and the events after it; ``count_later`` counts it in a worker thread and takes them
    in order. Every chunk's tokens are as if counted on the loop."""
    from loadgen.driver.client import INLINE_COUNT_MAX_CHARS, CountOffLoop, StreamState

    ctx = _counting_ctx()
    long = "x" * (INLINE_COUNT_MAX_CHARS + 1)
    with pytest.raises(CountOffLoop):
        StreamState(ctx, None, None).tokens_of(long)
    texts = [" a", long, " b", long[:-1] + "y", " c"]
    body = b"".join(b"data: " + json.dumps({"choices": [{"index": 0, "text": t}]}).encode() + b"\n\n" for t in texts)
    lifted: list[int] = []
    state = StreamState(ctx, None, lambda: lifted.append(1))
    assert state.feed(7, body + b"data: [DONE]\n\n") is True and state.later is not None
    assert list(state.tokens) == [2] and state.first_token == 7 and lifted

    async def count() -> None:
        while state.later is not None:
            await state.count_later()

    anyio.run(count)
    assert list(state.tokens) == [len(t) for t in texts] and state.client_tokens == sum(map(len, texts))
    assert state.done_abs == 7 and state.tokens_of(long) == len(long)  # [DONE] taken; the count kept
