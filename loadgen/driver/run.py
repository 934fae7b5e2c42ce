"""run_trace: replay one trace against one target and write one run directory.

One task group per run: the recorder (files open before the first send), the optional metrics
scraper and progress display, and inside one deadline scope the request tasks started by the
open-loop (or closed-loop) scheduler. Whatever ends the run (last request, deadline, Ctrl-C, SIGTERM,
SIGHUP, a dead server, a write error, a bug), the ``finally`` block records every scheduled request
that has no row yet as ``not_sent`` (``not_due`` when the run stopped before it was due,
``run_interrupted`` when it was due) and closes the run directory, so the accounting is always exact.
Rows reach disk at least every ``flush_interval_s``, so even SIGKILL keeps every request finished
before the last flush; each flush records until which scheduled instant every request has its row.
"""

from __future__ import annotations

import contextlib
import gc
import math
import os
import resource
import sys
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, cast

import anyio
import httpx
import psutil
import pyarrow as pa
import pyarrow.compute

from loadgen.driver.bounded import PROBE_TIMEOUT_S
from loadgen.driver.probe import TargetInfo, is_credential_name, probe_target
from loadgen.rundir.identity import harness_identity, host_identity, sha256_file, utc_now_iso
from loadgen.rundir.io import RunWriter, held_run_names
from loadgen.rundir.manifest import DriverInfo, Manifest, TraceRef, WarmState, merge_manifest
from loadgen.rundir.part_process import PartProcess
from loadgen.rundir.schema import STATUS_NOT_SENT, STATUS_OK
from loadgen.util import interrupts
from loadgen.util.errors import (
    LoadgenError,
    RecordWriteError,
    RunDirError,
    TargetError,
    TraceError,
)
from loadgen.util.inputs import UNSET_API_KEY
from loadgen.util.pinning import affinity, format_cpus, parse_cpus, shared_cpus_warning
from loadgen.util.redact import basic_token, url_secrets, with_encodings
from loadgen.util.targeturl import split_target_url
from loadgen.workload.prompts import Tokenizer, get_tokenizer
from loadgen.workload.routing import Router
from loadgen.workload.scenario import Scenario, load_scenario, scenario_manifest
from loadgen.workload.sessions import ReplyWaits, reply_dependencies

from ..trace.io import read_trace, refuse_unreplayable
from .client import RunContext, execute, request_row, send_at_deadline
from .gpu_telemetry import GpuSampler, open_gpu_telemetry
from .jobs import Job, ServerTokenizer, build_jobs, resolve_tokenizer
from .metrics_scrape import MetricsScraper, scrape_counts, scrape_warning
from .options import DEFAULT_TOTAL_TIMEOUT_S, DEFAULT_TTFT_TIMEOUT_S, RunOptions
from .partition import Shard
from .progress import Progress, context_counts, shows_progress
from .recorder import ArrowRunWriter, Recorder, warm_up_arrow
from .schedule import RateGate, sleep_until
from .sse import parse_chunk
from .tasks import RequestTasks
from .transport import RawHTTP11Transport

__all__ = ["SEND_LAG_WARN_NS", "run_trace"]

#: How long the run waits, after its warm-ups, for the part writer process to be ready before its clock starts
#: (it is ready in well under a second on an idle host; on a busy one the run starts without it, and the writer
#: thread writes until it is).
PART_PROCESS_WAIT_S = 1.0

#: Warn when the send-lag p99 exceeds this (ns).
SEND_LAG_WARN_NS = 1_000_000
#: Start instant is this far after setup ends, so task-group start-up is not counted as lag.
LEAD_NS = 50_000_000
REAL_ENGINES = ("vllm", "managed", "openai-compatible")
#: Open loop: keep at least KEEP_IDLE_LOW idle keep-alive connections (refilled to KEEP_IDLE_HIGH).
KEEP_IDLE_LOW, KEEP_IDLE_HIGH = 8, 32


def _split_base(url: str) -> tuple[str, str, str]:
    """(server root for /version and /metrics, API prefix, query) from a target URL with or without /v1.

    The root carries no userinfo (credentials travel only in the one Authorization header, ``_auth_headers``);
    the query string is sent on every request the run makes (a gateway may take its key there).
    """
    root, query = split_target_url(url)
    return root, "/v1", query


def _endpoint_url(url: str, path: str) -> httpx.URL:
    """The URL a target's requests go to: its root (a provider's path prefix kept: ``https://HOST/openai/v1``
    posts to ``/openai/v1/completions``) followed by ``path``, with the target's query string."""
    root, _, query = _split_base(url)
    base = httpx.URL(root)
    endpoint = base.copy_with(path=base.path.rstrip("/") + path)
    return endpoint.copy_with(query=query.encode("ascii")) if query else endpoint


def _client_params(url: str) -> httpx.QueryParams:
    """The target's query parameters, sent with every probe, scrape and /tokenize call."""
    return httpx.QueryParams(_split_base(url)[2])


def _shared_cpus(options: RunOptions) -> str | None:
    """The shared-CPU warning when an engine loadgen launched (its manifest section records its CPUs) may
    run on the driver's cores; None for a target loadgen did not launch (where it runs is unknown)."""
    target = options.extra_manifest.get("target") if options.extra_manifest else None
    engine = target.get("engine") if isinstance(target, dict) else None
    config = engine.get("config") if isinstance(engine, dict) else None
    if not isinstance(config, dict) or "cpu_affinity" not in config:
        return None
    cpus = config["cpu_affinity"]
    return shared_cpus_warning(parse_cpus(cpus, what="cpu_affinity", check_usable=False) if cpus else None)


def _timeouts(options: RunOptions, scenario: Scenario | None, classes: set[str]) -> dict[str, tuple[int, int]]:
    """Per class (ttft_ns, total_ns): option override > class setting > scenario errors > the defaults.

    Without a scenario the defaults (``DEFAULT_TTFT_TIMEOUT_S``, ``DEFAULT_TOTAL_TIMEOUT_S``) still bound
    every request: a server that sends headers and then nothing must not hold a request open forever.
    """
    out = {}
    for name in classes:
        cls = scenario.classes.get(name) if scenario else None
        ttft = (
            options.ttft_timeout_s
            or (cls.ttft_timeout_s if cls else None)
            or (scenario.errors.ttft_timeout_s if scenario else DEFAULT_TTFT_TIMEOUT_S)
        )
        total = (
            options.total_timeout_s
            or (cls.total_timeout_s if cls else None)
            or (scenario.errors.total_timeout_s if scenario else DEFAULT_TOTAL_TIMEOUT_S)
        )
        out[name] = (int(ttft * 1e9), int(total * 1e9))
    return out


def _auth_headers(options: RunOptions) -> tuple[dict[str, str], tuple[str, ...]]:
    """Request headers (one value per name, names in lower case) and the secrets to redact.

    The credential has one source: ``--header Authorization``, the key in ``--api-key-env`` (Bearer), or the
    target URLs' ``user:password`` (Basic). Two sources that disagree are refused: merged, they reached the
    server as ``Bearer X, Basic ...`` on some requests and as one of them on others. Every request of the
    run (probes, /tokenize, scrapes, the replay) carries the same one.
    """
    extra = {name.lower(): value for name, value in options.headers.items()}
    headers = {"accept": "text/event-stream", "accept-encoding": "identity", **extra}
    sources: list[tuple[str, str]] = []
    # a header's value is redacted wherever the target echoes it: any long one, and a credential's at any length
    secrets: tuple[str, ...] = tuple(
        v for k, v in options.headers.items() if len(v) >= 8 or (len(v) >= 3 and is_credential_name(k))
    )
    if "authorization" in extra:
        sources.append(("--header Authorization", extra["authorization"]))
    if options.api_key_env:
        key = os.environ.get(options.api_key_env, "")
        if not key:
            raise TargetError(f"--api-key-env {options.api_key_env}: {UNSET_API_KEY}")
        secrets += (key,)
        sources.append((f"--api-key-env {options.api_key_env}", f"Bearer {key}"))
    for url in options.target_urls:
        secrets += url_secrets(url)
        token = basic_token(url)  # what httpx would do with URL userinfo, once, here
        if token:
            sources.append(("the target URL's user:password", f"Basic {token}"))
    if len({value for _, value in sources}) > 1:
        named = sorted({name for name, _ in sources})
        raise TargetError(
            f"credentials given twice ({' and '.join(named)}), with different values: expected one of "
            "--header Authorization, --api-key-env or the target URL's user:password"
        )
    if sources:
        headers["authorization"] = sources[0][1]
    return headers, with_encodings(secrets)  # a server may echo the key base64-encoded (``Bearer KEY`` whole)


@dataclass
class _Inputs:
    """What a run replays, read and checked before anything connects."""

    scenario: Scenario | None
    table: pa.Table
    trace_meta: dict[str, Any]
    warnings: list[str]
    mode: str  # open | closed
    concurrency: int | None
    endpoint: str
    tokenizer: str | None = None  # what sized the prompts (``resolve_tokenizer``), set when the jobs are built


def _read_inputs(options: RunOptions, shard: Shard | None = None) -> _Inputs:
    scenario = load_scenario(options.scenario_path) if options.scenario_path else None
    table, trace_meta = read_trace(options.trace_path)
    if table.num_rows == 0:
        raise TraceError(f"{options.trace_path}: trace has no requests: expected at least one row")
    refuse_unreplayable(table, options.trace_path)
    ids = table.column("request_id")
    if pa.compute.count_distinct(ids).as_py() != table.num_rows:
        raise TraceError(f"{options.trace_path}: request_id values repeat: expected one unique id per request")
    if shard is not None:  # one worker's part of a run spread over workers
        table = shard.select(table)
    warnings: list[str] = []
    if (
        scenario
        and trace_meta.get("scenario_sha256")
        and scenario.sha256
        and trace_meta["scenario_sha256"] != scenario.sha256
    ):
        warnings.append(
            f"trace was generated from scenario sha256 {trace_meta['scenario_sha256'][:12]}, "
            f"not {options.scenario_path} ({scenario.sha256[:12]})"
        )
    held = held_run_names(options.out_dir) if shard is None else []
    if held:  # before anything connects: a run or a handoff bundle is never written over
        raise RunDirError(
            f"{options.out_dir}: already holds a run or handoff bundle ({held[0]}): expected a new or empty directory"
        )
    endpoint = options.endpoint or (scenario.endpoint if scenario else "completions")
    mode = trace_meta.get("mode", "open")
    if mode == "closed":
        concurrency = options.max_concurrency or trace_meta.get("concurrency") or 1
    else:
        concurrency = options.max_concurrency or trace_meta.get("max_in_flight")
        if concurrency is None and scenario and trace_meta.get("trace_name") in scenario.traces:
            concurrency = scenario.traces[trace_meta["trace_name"]].max_in_flight
    return _Inputs(scenario, table, trace_meta, warnings, mode, int(concurrency) if concurrency else None, endpoint)


@dataclass
class _Prepared:
    """Every request of the run, built and encoded before the anchor, and what built them."""

    jobs: list[Job]
    counter: Tokenizer  # counts the tokens of what the target sends back
    build_s: float
    extensions: bool  # vLLM's request extensions sent
    timeouts: dict[str, tuple[int, int]]  # per class (ttft, total) ns


async def _prepare_jobs(
    options: RunOptions,
    inputs: _Inputs,
    info: TargetInfo,
    client: httpx.AsyncClient,
    transport: RawHTTP11Transport,
    root: str,
    path: str,
    headers: dict[str, str],
) -> _Prepared:
    """Every request built and encoded to bytes before the anchor, with its class's timeouts."""
    scenario = inputs.scenario
    extensions = options.vllm_extensions == "on" or (options.vllm_extensions == "auto" and info.kind != "managed")
    retain_prompt = bool(scenario and scenario.privacy.retain_prompt_text)
    t_build = time.perf_counter()
    model = cast(str, info.model)  # probe_target resolves the model (given, or the first served) or raises
    reported = info.version.get("tokenizer") if info.kind == "sim" and isinstance(info.version, dict) else None
    tokenizer, tokenizer_name, warning = resolve_tokenizer(
        options.tokenizer,
        root,
        model,
        {k: v for k, v in headers.items() if k == "authorization"},
        reported if isinstance(reported, str) else None,
        timeout_s=_probe_timeout_s(_ttft_cap_s(options, scenario)),
        params=_client_params(options.target_url),
    )
    if warning is not None:
        inputs.warnings.append(warning)  # recorded in the manifest
        print(f"loadgen: warning: {warning}", file=sys.stderr)
    inputs.tokenizer = tokenizer_name
    try:
        jobs = await anyio.to_thread.run_sync(
            lambda: build_jobs(
                inputs.table,
                model=model,
                endpoint=inputs.endpoint,
                tokenizer=tokenizer,
                retain_prompt_text=retain_prompt,
                vllm_extensions=extensions,
                max_tokens_field=options.max_tokens_field,
                extra_body=options.extra_body,
                prompt_salt=options.prompt_salt,
                sim_reasoning=info.kind == "sim",
                block_hash_tokens=int(inputs.trace_meta.get("block_hash_tokens") or 0),
            )
        )
    finally:
        if isinstance(tokenizer, ServerTokenizer):
            tokenizer.close()
    _encode_requests(options, jobs, client, transport, path)
    counter = get_tokenizer("cl100k_base") if isinstance(tokenizer, ServerTokenizer) else tokenizer
    build_s = time.perf_counter() - t_build
    timeouts = _timeouts(options, scenario, {job.request_class for job in jobs})
    return _Prepared(jobs, counter, build_s, extensions, timeouts)


def _encode_requests(
    options: RunOptions, jobs: list[Job], client: httpx.AsyncClient, transport: RawHTTP11Transport, path: str
) -> None:
    """The whole request, ready to write: the send path only copies bytes."""
    endpoint_url = _endpoint_url(options.target_url, path)
    base_headers = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in client.headers.items()]
    base_headers = [(k, v) for k, v in base_headers if k.lower() not in (b"content-length", b"host")]
    base_headers.insert(0, (b"host", endpoint_url.netloc))
    base_headers.append((b"content-type", b"application/json"))
    for job in jobs:
        extra = options.request_headers.get(job.request_id)
        hdrs = (
            base_headers + [(k.encode("latin-1"), v.encode("latin-1")) for k, v in extra.items()]
            if extra
            else base_headers
        )
        job.payload = transport.encode_request("POST", endpoint_url, hdrs, job.body)
        job.body = b""


def trace_ref(options: RunOptions, meta: dict[str, Any]) -> TraceRef:
    """The manifest's trace section: the replayed file, its hash and its metadata."""
    return TraceRef(
        path=str(options.trace_path),
        sha256=sha256_file(options.trace_path),
        name=meta.get("trace_name"),
        seed=meta.get("seed"),
        metadata=meta,
    )


def _start_manifest(
    options: RunOptions, inputs: _Inputs, infos: list[TargetInfo], driver: DriverInfo, scheduled: int
) -> Manifest:
    """The manifest as written when the files open (the replicas and the layers' ``extra_manifest`` merged in)."""
    meta, info = inputs.trace_meta, infos[0]
    shared = _shared_cpus(options)
    if shared and shared not in inputs.warnings:
        inputs.warnings.append(shared)
        print(f"loadgen: warning: {shared}", file=sys.stderr)
    manifest = Manifest(
        run_kind=options.run_kind,
        harness=harness_identity(),
        host=host_identity(),
        target=info.manifest(),
        scenario=scenario_manifest(inputs.scenario) if inputs.scenario else None,
        trace=trace_ref(options, meta),
        options=options.manifest(),
        warm_state=WarmState(state=options.warm_state, actions=list(options.warm_actions)),
        order_index=options.order_index,
        repeat=options.repeat,
        plan_cell=options.plan_cell,
        driver=driver,
        warnings=inputs.warnings,
        scheduled_requests=scheduled,
    )
    if options.extra_manifest:
        manifest = merge_manifest(manifest, options.extra_manifest)
    return merge_manifest(manifest, _replicas_manifest(options, infos)) if len(infos) > 1 else manifest


async def run_trace(options: RunOptions, shard: Shard | None = None) -> Path:
    """Replay ``options.trace_path`` against ``options.target_url``; returns the run directory.

    ``shard``: replay only one worker's part of the trace into a run directory shared with other
    workers (``loadgen.driver.workers``), starting at the instant its ``start_gate`` returns.
    """
    inputs = _read_inputs(options, shard)
    headers, secrets = _auth_headers(options)
    root, prefix, _ = _split_base(options.target_url)
    path = prefix + ("/chat/completions" if inputs.endpoint == "chat" else "/completions")
    transport, client = _open_client(options, inputs, root, headers)
    probe_timeout_s = _probe_timeout_s(_ttft_cap_s(options, inputs.scenario))
    async with client:
        info = await probe_target(
            client,
            root,
            options.model or (inputs.scenario.model if inputs.scenario else None),
            secrets=secrets,
            check_model=options.check_model,
            timeout_s=probe_timeout_s,
        )
        infos = [info, *await _probe_replicas(options, headers, secrets, cast(str, info.model), probe_timeout_s)]
        prepared = await _prepare_jobs(options, inputs, info, client, transport, root, path, headers)
        jobs = prepared.jobs
        scraped = _scraped_targets(options, infos)
        driver = _driver_info(options, inputs, info, path, prepared, bool(scraped))
        manifest = _start_manifest(options, inputs, infos, driver, len(jobs))
        # everything slow (SSL contexts, files, the part writer child) happens before the anchor is taken
        async with (
            _scrape_clients(options, headers, scraped) as scrape_clients,
            _recording(options, manifest, prepared.counter, shard) as (writer, recorder, gpu),
        ):
            ctx = _run_context(
                options, inputs, transport, _endpoint_url(options.target_url, path), prepared, recorder, secrets
            )
            if len(infos) > 1:
                ctx.origins, ctx.heads = _replica_origins(options, jobs, path, transport)
                ctx.router = Router(len(infos), options.route_policy, options.replica_down_after)
            recorder.progress = _Coverage(jobs, ctx, recorder, inputs.mode)
            run = _Run(options, inputs, ctx, jobs, writer, recorder, info, transport)
            try:
                await _replay(run, scrape_clients, gpu, shard)
            except BaseExceptionGroup as group:  # a task of the run failed: say what, in one line
                error = _loadgen_error(group)
                if error is not None:
                    raise error from None
                raise
    return Path(options.out_dir)


def _open_client(
    options: RunOptions, inputs: _Inputs, root: str, headers: dict[str, str]
) -> tuple[RawHTTP11Transport, httpx.AsyncClient]:
    """The run's transport (a keep-alive pool sized to its concurrency) and the client over it, not yet entered."""
    scenario = inputs.scenario
    ttft_cap = _ttft_cap_s(options, scenario)
    transport = RawHTTP11Transport(
        keepalive_expiry_s=30.0,
        max_idle=(inputs.concurrency or 4096) + KEEP_IDLE_HIGH,
        connect_timeout_s=min(30.0, ttft_cap),
    )
    client = httpx.AsyncClient(
        base_url=root,
        headers=headers,
        params=_client_params(options.target_url),
        timeout=httpx.Timeout(None, connect=min(30.0, ttft_cap)),
        transport=transport,
        trust_env=False,
    )
    return transport, client


def _scraped_targets(options: RunOptions, infos: list[TargetInfo]) -> list[int]:
    """Which targets' /metrics the run scrapes (``--scrape-metrics on``, or ``auto`` and the probe found it)."""
    return [
        i
        for i, t in enumerate(infos)
        if options.scrape_metrics == "on" or (options.scrape_metrics == "auto" and t.has_metrics)
    ]


def _driver_info(
    options: RunOptions,
    inputs: _Inputs,
    info: TargetInfo,
    path: str,
    prepared: _Prepared,
    scrape: bool,
) -> DriverInfo:
    """The manifest's ``driver`` section as the run starts (``_finish`` adds its counters)."""
    return DriverInfo(
        mode=inputs.mode,
        endpoint=inputs.endpoint,
        path=path,
        concurrency=inputs.concurrency,
        tokenizer=inputs.tokenizer if options.tokenizer != "auto" else f"auto: {inputs.tokenizer}",
        prompt_salt=options.prompt_salt or None,
        token_counter=getattr(prepared.counter, "name", str(prepared.counter)),
        vllm_extensions=prepared.extensions,
        timeouts_s={c: [t / 1e9 if t else None for t in v] for c, v in sorted(prepared.timeouts.items())},
        prompt_build_s=round(prepared.build_s, 3),
        scrape_metrics=scrape,
        timeout_origin="scheduled",
        target_notes=list(info.notes),
        cpu_affinity=format_cpus(affinity() or ()) or None,
    )


@contextlib.asynccontextmanager
async def _scrape_clients(
    options: RunOptions, headers: dict[str, str], scraped: list[int]
) -> AsyncIterator[list[tuple[int, httpx.AsyncClient]]]:
    """One /metrics client per scraped target (by its index), each closed on leaving, whatever ended the run
    (shielded, 2 s at most)."""
    clients = [
        (
            i,
            httpx.AsyncClient(
                base_url=_split_base(options.target_urls[i])[0],
                params=_client_params(options.target_urls[i]),
                headers={k: v for k, v in headers.items() if k == "authorization"},
                timeout=10.0,
                trust_env=False,
            ),
        )
        for i in scraped
    ]
    try:
        yield clients
    finally:
        for _, scrape_client in clients:
            with anyio.CancelScope(shield=True), anyio.move_on_after(2):
                await scrape_client.aclose()


@contextlib.asynccontextmanager
async def _recording(
    options: RunOptions, manifest: Manifest, counter: Tokenizer, shard: Shard | None
) -> AsyncIterator[tuple[ArrowRunWriter, Recorder, GpuSampler | None]]:
    """The run's recording side, set up before the anchor: (writer, recorder, GPU sampler or None).

    With ``--part-writer process`` (the default) the flushes are converted and written by a child at low
    priority (the loop's core stays the loop's): it starts beside the warm-ups, at normal priority, and
    lowers itself once ready. The recorder's ``finish`` ends it; leaving here ends it too (a set-up that
    failed), and shuts the GPU sampler's NVML down.
    """
    with contextlib.ExitStack() as owned:
        part_process = owned.enter_context(PartProcess()) if options.part_writer == "process" else None
        await anyio.to_thread.run_sync(warm_up_arrow)
        await _warm_up(counter)
        if part_process is not None:
            await anyio.to_thread.run_sync(part_process.wait_ready, PART_PROCESS_WAIT_S)
        gpu, gpu_section = open_gpu_telemetry(options.gpu_telemetry, options.scrape_interval_s)
        if gpu is not None:
            owned.enter_context(gpu)
        elif options.gpu_telemetry == "on":
            raise TargetError(f"--gpu-telemetry on: {gpu_section['reason']}: expected an NVIDIA GPU on this host")
        writer = ArrowRunWriter(
            options.out_dir,
            merge_manifest(manifest, {"gpu_telemetry": gpu_section}),
            flush_rows=1 << 60,
            flush_interval_s=options.flush_interval_s,
            shard=shard.name if shard else None,
        )
        yield writer, Recorder(writer, flush_interval_s=options.flush_interval_s, part_process=part_process), gpu


def _run_context(
    options: RunOptions,
    inputs: _Inputs,
    transport: RawHTTP11Transport,
    url: httpx.URL,
    prepared: _Prepared,
    recorder: Recorder,
    secrets: tuple[str, ...],
) -> RunContext:
    """What every request task shares; the anchor is taken in ``_replay``, once the run's services are up."""
    scenario = inputs.scenario
    return RunContext(
        transport=transport,
        origin=transport.origin(url),
        anchor_ns=0,
        limiter=anyio.CapacityLimiter(inputs.concurrency if inputs.concurrency else math.inf),
        rate_gate=RateGate(options.rate_limit_rps),
        count_tokens=prepared.counter.count,
        sink=recorder.submit,
        ttft_timeout_ns=None,
        total_timeout_ns=None,
        secrets=secrets,
        retain_completion_text=bool(scenario and scenario.privacy.retain_completion_text),
        warm_state=options.warm_state,
        timeouts=prepared.timeouts,
        max_sse_line_bytes=options.max_sse_line_bytes,
    )


def _ttft_cap_s(options: RunOptions, scenario: Scenario | None) -> float:
    """The run-wide TTFT timeout (the option, else the scenario's, else the default): bounds connects and probes."""
    return options.ttft_timeout_s or (scenario.errors.ttft_timeout_s if scenario else DEFAULT_TTFT_TIMEOUT_S)


def _probe_timeout_s(ttft_cap_s: float) -> float:
    """How long one probe (/version, /v1/models, /metrics, /tokenize) may take: the run's TTFT cap, at most
    PROBE_TIMEOUT_S (a target that cannot answer a probe that fast would fail every request anyway)."""
    return min(PROBE_TIMEOUT_S, ttft_cap_s)


async def _probe_replicas(
    options: RunOptions, headers: dict[str, str], secrets: tuple[str, ...], model: str, probe_timeout_s: float
) -> list[TargetInfo]:
    """Probe every replica after the first (model check, /version, /metrics): each must serve ``model``."""
    infos = []
    for url in options.replica_urls:
        root = _split_base(url)[0]
        async with httpx.AsyncClient(
            base_url=root, headers=headers, params=_client_params(url), timeout=30.0, trust_env=False
        ) as client:
            infos.append(
                await probe_target(
                    client,
                    root,
                    model,
                    secrets=secrets,
                    check_model=options.check_model,
                    timeout_s=probe_timeout_s,
                )
            )
    return infos


def _replicas_manifest(options: RunOptions, infos: list[TargetInfo]) -> dict[str, Any]:
    """The manifest's ``targets`` (every replica, redacted, in ``target_index`` order) and ``routing``."""
    return {
        "targets": [info.manifest() for info in infos],
        "routing": {
            "policy": options.route_policy,
            "sticky": "conversation",
            "down_after_connect_errors": options.replica_down_after,
        },
    }


def _replica_origins(
    options: RunOptions, jobs: list[Job], path: str, transport: RawHTTP11Transport
) -> tuple[list[tuple[bytes, str, int]], list[bytes]]:
    """Per replica: the connection key and the first bytes of its requests (every payload was encoded
    for the first replica; routing a request elsewhere swaps them)."""
    urls = [_endpoint_url(url, path) for url in options.target_urls]
    heads = [transport.request_head("POST", url) for url in urls]
    if any(not job.payload.startswith(heads[0]) for job in jobs):  # encode_request's layout changed
        raise LoadgenError("internal: a request payload does not start with its request line and Host header")
    return [transport.origin(url) for url in urls], heads


def _leaves(exc: BaseException) -> list[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for inner in exc.exceptions for leaf in _leaves(inner)]
    return [exc]


def _loadgen_error(exc: BaseException) -> LoadgenError | None:
    """The first deliberate error (a write error ...) inside an exception group, if any."""
    return next((e for e in _leaves(exc) if isinstance(e, LoadgenError)), None)


def _describe(exc: BaseException) -> str:
    """What stopped a failed run, for the manifest's ``interrupted_by``."""
    leaf = _loadgen_error(exc) or _leaves(exc)[0]
    if isinstance(leaf, RecordWriteError):
        return leaf.short
    return type(leaf).__name__


class _Coverage:
    """Per flush, what a killed run's reader needs: until which scheduled instant every request has its
    row (``covered_until_ns``: the first dispatched request still without a row, else now), and how
    many requests had been dispatched. Jobs are dispatched in trace order, so one pointer suffices."""

    def __init__(self, jobs: list[Job], ctx: RunContext, recorder: Recorder, mode: str) -> None:
        self.jobs, self.ctx, self.recorder, self.open = jobs, ctx, recorder, mode == "open"
        self.first_missing = 0

    def __call__(self) -> dict[str, Any]:
        ctx, jobs = self.ctx, self.jobs
        if not ctx.anchor_ns:
            return {}
        now = time.perf_counter_ns() - ctx.anchor_ns
        recorded, dispatched = self.recorder.recorded_ids, ctx.dispatched
        i = self.first_missing
        while i < dispatched and jobs[i].request_id in recorded:
            i += 1
        self.first_missing = i
        if i < dispatched:
            covered = jobs[i].scheduled_ns
        elif i < len(jobs) and self.open:
            covered = min(now, jobs[i].offset_ns)
        else:
            covered = now
        return {"flushed_ns": now, "covered_until_ns": covered, "dispatched": dispatched}


@contextlib.contextmanager
def replay_settings() -> Iterator[None]:
    """The interpreter as a run's replay needs it, restored after: a short GIL switch interval (a thread
    must not hold the GIL for 5 ms), and the prepared requests, which live for the whole run, kept out of
    every garbage collection, with the young generation collected less often (a full pass over 10^5 objects
    is a 10+ ms pause)."""
    old_switch, old_gc = sys.getswitchinterval(), gc.get_threshold()
    sys.setswitchinterval(min(old_switch, 0.0005))
    gc.collect()
    gc.freeze()
    gc.set_threshold(max(old_gc[0], 20_000), max(old_gc[1], 20), max(old_gc[2], 50))
    try:
        yield
    finally:
        sys.setswitchinterval(old_switch)
        gc.set_threshold(*old_gc)
        gc.unfreeze()


@dataclass
class _Run:
    """One run's parts, as ``_replay`` and ``_finish`` share them."""

    options: RunOptions
    inputs: _Inputs
    ctx: RunContext
    jobs: list[Job]
    writer: ArrowRunWriter
    recorder: Recorder
    info: TargetInfo
    transport: RawHTTP11Transport
    scrapers: list[MetricsScraper] = field(default_factory=list)  # one per scraped target, once the anchor is taken


async def _replay(
    run: _Run,
    scrape_clients: list[tuple[int, httpx.AsyncClient]],
    gpu: GpuSampler | None = None,
    shard: Shard | None = None,
) -> None:
    """The measured part: one task group from the anchor to the last request; ``_finish`` always runs."""
    ctx = run.ctx
    progress = Progress(lambda: context_counts(ctx), len(run.jobs)) if shows_progress(run.options.progress) else None
    if shard is not None:  # the worker reports these live counters to the coordinator
        shard.live = ctx
    state, interrupted_by, stop_abs = "complete", None, None
    ctx.cpu_start_s = time.process_time()
    ctx.rss_start_bytes = psutil.Process().memory_info().rss
    try:
        with replay_settings():
            stop_abs = await _measure(run, scrape_clients, gpu, progress, shard)
    except anyio.get_cancelled_exc_class():  # Ctrl-C, SIGTERM, SIGHUP (loadgen.util.interrupts) or a caller
        state, interrupted_by, stop_abs = "interrupted", interrupts.cancel_cause(), time.perf_counter_ns()
        raise
    except KeyboardInterrupt:
        state, interrupted_by, stop_abs = "interrupted", interrupts.signal_name(), time.perf_counter_ns()
        raise
    except BaseException as exc:
        state, interrupted_by, stop_abs = "failed", _describe(exc), time.perf_counter_ns()
        raise
    finally:
        if shard is not None:  # the raw lags: the coordinator's percentiles are over every worker's
            shard.lag_ns, shard.dispatched = list(ctx.lag.values), ctx.dispatched
        if progress is not None:
            progress.close()
        if gpu is not None:
            run.writer.update_manifest({"gpu_telemetry": {"samples": gpu.samples, "failed_readings": gpu.failures}})
        deadline_hit = state == "complete" and stop_abs is not None
        _finish(run, (state, interrupted_by, deadline_hit, stop_abs))


async def _measure(
    run: _Run,
    scrape_clients: list[tuple[int, httpx.AsyncClient]],
    gpu: GpuSampler | None,
    progress: Progress | None,
    shard: Shard | None,
) -> int | None:
    """The run's services, then its requests until the last one ended or the deadline passed (the instant it
    stopped the run, else None)."""
    options, ctx, recorder = run.options, run.ctx, run.recorder
    concurrency = run.inputs.concurrency
    stop_abs = None
    async with anyio.create_task_group() as outer:
        await outer.start(recorder.run)
        if run.inputs.mode == "open":  # connections ready before the deadlines, refilled in the background
            high = min(KEEP_IDLE_HIGH, int(concurrency or KEEP_IDLE_HIGH))
            for origin in ctx.origins:
                await outer.start(run.transport.keep_idle, origin, min(KEEP_IDLE_LOW, high), high)
        # the anchor is taken only now: set-up (connections, files) is never inside a request's TTFT, and
        # nothing after it waits for a disk or the target: the manifest is written in the writer thread, and
        # the baseline scrape and GPU sample start in the lead time without holding the schedule back
        _take_anchor(ctx, run.writer, recorder, await shard.start_gate() if shard is not None else None)
        scrapers = run.scrapers = [_scraper(options, ctx, recorder, index, client) for index, client in scrape_clients]
        for scraper in scrapers:
            outer.start_soon(scraper.run)
        if gpu is not None:
            outer.start_soon(gpu.run, ctx.anchor_ns, recorder.submit_metrics, options.scrape_interval_s)
        if progress is not None:
            outer.start_soon(progress.run)
        with anyio.move_on_after(options.deadline_s if options.deadline_s else math.inf) as run_scope:
            async with anyio.create_task_group() as requests:
                if run.inputs.mode == "closed":
                    await _schedule_closed(ctx, run.jobs, int(concurrency or 1), requests)
                else:
                    await _schedule_open(ctx, run.jobs, requests)
        if run_scope.cancelled_caught:
            stop_abs = time.perf_counter_ns()
        for scraper in scrapers:
            await scraper.scrape_once()
        outer.cancel_scope.cancel()
    return stop_abs


def _scraper(
    options: RunOptions, ctx: RunContext, recorder: Recorder, index: int, client: httpx.AsyncClient
) -> MetricsScraper:
    """The /metrics scraper of target ``index`` on the run's clock (labelled with its index among replicas)."""
    return MetricsScraper(
        client,
        "/metrics",
        ctx.anchor_ns,
        recorder.submit_metrics,
        options.scrape_interval_s,
        tuple(options.metrics_prefixes) if options.metrics_prefixes else None,
        labels={"target_index": str(index)} if ctx.router is not None else None,
        secrets=ctx.secrets,
    )


def _take_anchor(ctx: RunContext, writer: RunWriter, recorder: Recorder, anchor_ns: int | None = None) -> None:
    """The run's time origin: LEAD_NS from now, so starting the request tasks is not counted as lag
    (or ``anchor_ns``: a worker's shared start instant on this clock).

    The manifest on disk gets it at once, from the writer thread (a synced write that a busy disk can make
    last longer than the lead time): a killed run keeps it.
    """
    now_ns = time.perf_counter_ns()
    ctx.anchor_ns = anchor_ns if anchor_ns is not None else now_ns + LEAD_NS
    anchor_utc = datetime.now(UTC) + timedelta(microseconds=(ctx.anchor_ns - now_ns) / 1000)
    writer.update_manifest(
        {
            "started_utc": anchor_utc.isoformat(timespec="milliseconds"),
            "anchor": {"perf_counter_ns": ctx.anchor_ns, "utc": anchor_utc.isoformat(timespec="microseconds")},
        }
    )
    recorder.write_manifest_soon()


async def _warm_up(counter) -> None:
    """One-time costs (regex compiles, first thread, first JSON parse) paid before the anchor."""
    counter.count("warm up the tokenizer")
    parse_chunk(b'{"choices":[{"index":0,"text":" the"}],"usage":null}')
    await anyio.to_thread.run_sync(lambda: None)


async def _schedule_open(ctx: RunContext, jobs, requests) -> None:
    """Start each request at its fixed deadline (anchor + offset), whether or not earlier ones finished.

    A request that waits for replies (``think_after_reply_ns``: a reply-waiting turn, an agent session's step)
    is not started here: the reply it waits for last starts it, one think time after that reply ended
    (``loadgen.workload.sessions``; its ``scheduled_ns`` is then that ready instant). Returns when every
    request task has ended.
    """
    anchor = ctx.anchor_ns
    now = time.perf_counter_ns
    tasks = RequestTasks(requests)
    start = tasks.start
    waits = _reply_waits(jobs)
    waiting = waits.waiting()
    try:
        for k, job in enumerate(jobs):
            if k in waiting:
                continue
            deadline = anchor + job.offset_ns
            if deadline > now():
                await sleep_until(deadline)  # one precise waiter for the whole run, not one per request
            job.scheduled_ns = job.offset_ns
            ctx.dispatched += 1
            ctx.route(job)
            # on the wire now when a slot and an idle connection are free; the task reads the response
            if waits.has_dependents(k):
                start(_execute_then_follow, ctx, k, deadline, send_at_deadline(ctx, job), waits, jobs, tasks)
            else:
                start(execute, ctx, job, deadline, send_at_deadline(ctx, job))
    finally:
        await tasks.join()


def _reply_waits(jobs: list[Job]) -> ReplyWaits:
    """Which jobs wait for which replies (by position in ``jobs``)."""
    deps = reply_dependencies(
        [j.request_id for j in jobs],
        [j.conversation_id for j in jobs],
        [j.turn_index for j in jobs],
        [j.think_after_reply_ns for j in jobs],
        [j.wait_for_ids for j in jobs],
    )
    return ReplyWaits(deps, [j.think_after_reply_ns for j in jobs])


async def _execute_then_follow(
    ctx: RunContext, k: int, scheduled_abs_ns: int, pre, waits: ReplyWaits, jobs: list[Job], tasks: RequestTasks
) -> None:
    """Run ``jobs[k]``; when its reply has ended (whatever its status), each request it was the last wait of
    becomes ready one think time later and is started then."""
    await execute(ctx, jobs[k], scheduled_abs_ns, pre)
    # the reply ended at its recorded done instant: the next step is due a think time after that, so the loop's
    # own delay in getting here shows in the step's client queue (sent - scheduled), as an open-loop send lag does
    ended = jobs[k].done_abs_ns
    for ready_abs_ns, nxt in waits.ended(k, ended if ended is not None else time.perf_counter_ns()):
        tasks.start(_follow, ctx, nxt, ready_abs_ns, waits, jobs, tasks)


async def _follow(
    ctx: RunContext, k: int, ready_abs_ns: int, waits: ReplyWaits, jobs: list[Job], tasks: RequestTasks
) -> None:
    await sleep_until(ready_abs_ns)
    ctx.route(jobs[k])
    await _execute_then_follow(ctx, k, ready_abs_ns, None, waits, jobs, tasks)


async def _schedule_closed(ctx: RunContext, jobs, concurrency: int, requests) -> None:
    """Keep ``concurrency`` requests in flight; each is scheduled the moment a worker becomes free."""
    iterator = iter(jobs)
    await sleep_until(ctx.anchor_ns)

    async def worker() -> None:
        for job in iterator:
            scheduled = time.perf_counter_ns()
            job.scheduled_ns = scheduled - ctx.anchor_ns
            ctx.dispatched += 1
            ctx.route(job)
            await execute(ctx, job, scheduled)

    for _ in range(concurrency):
        requests.start_soon(worker)


def _record_missing(
    recorder: Recorder, ctx: RunContext, jobs: list[Job], stopped: bool, stop_abs: int | None, open_loop: bool
) -> None:
    """A row for every job without one: ``not_due`` when the run stopped before the job was due (never
    dispatched, and in open loop its deadline not passed at the stop), ``run_interrupted`` when it was
    due, ``client`` (a bug, said so) when the run did not stop."""
    for job in jobs:
        if job.request_id in recorder.recorded_ids:
            continue
        due = job.scheduled_ns is not None or (
            open_loop and bool(ctx.anchor_ns) and stop_abs is not None and ctx.anchor_ns + job.offset_ns < stop_abs
        )
        kind = ("run_interrupted" if due else "not_due") if stopped else "client"
        recorder.submit(request_row(job, job.offset_ns, STATUS_NOT_SENT, kind), None)


def _finish(run: _Run, outcome: tuple[str, str | None, bool, int | None]) -> None:
    """Record unsent requests, close the run directory with the final manifest (synchronous).

    Runs in ``finally``: whatever ended the run, every scheduled request gets exactly one row and
    the files are closed; an error while writing is re-raised only after the close.
    """
    state, interrupted_by, deadline_hit, stop_abs = outcome
    writer, recorder, ctx, jobs, warnings = run.writer, run.recorder, run.ctx, run.jobs, run.inputs.warnings
    end_ns = time.perf_counter_ns()
    cpu_s = time.process_time() - ctx.cpu_start_s
    write_error: BaseException | None = None
    try:
        try:
            _record_missing(
                recorder, ctx, jobs, state != "complete" or deadline_hit, stop_abs, run.inputs.mode == "open"
            )
        finally:  # whatever it recorded, written; the writer thread drained before the final manifest
            recorder.finish()
    except BaseException as exc:
        write_error = exc
        state = "failed"
        interrupted_by = interrupted_by or _describe(exc)
    parts_by = recorder.part_process
    if parts_by is not None and parts_by.warning:
        warnings.append(parts_by.warning)
    scrapes = scrape_counts(run.scrapers) if run.scrapers else None
    if scrapes is not None and (gaps := scrape_warning(scrapes)) is not None:
        warnings.append(gaps)
        print(f"loadgen: warning: {gaps}", file=sys.stderr)
    lag = ctx.lag.summary()
    if lag["p99"] is not None and lag["p99"] > SEND_LAG_WARN_NS:
        message = f"send lag p99 {lag['p99'] / 1e6:.2f} ms exceeds 1 ms: the client could not keep the schedule"
        warnings.append(message)
        print(f"loadgen: warning: {message}", file=sys.stderr)
    executed = run.info.kind in REAL_ENGINES and writer.status_counts.get(STATUS_OK, 0) > 0
    updates: dict[str, Any] = {
        "state": state,
        "ended_utc": utc_now_iso(),
        # 0: stopped before the anchor was taken, or before its instant came (it lies LEAD_NS ahead)
        "duration_s": round(max(0, end_ns - ctx.anchor_ns) / 1e9, 6) if ctx.anchor_ns else 0.0,
        "modelExecuted": executed,
        "benchmarkExecuted": executed,
        "send_lag_ns": lag,
        "warnings": warnings,
        "stopped_by_deadline": deadline_hit,
        "stopped_ns": stop_abs - ctx.anchor_ns if stop_abs is not None and ctx.anchor_ns else None,
        "scheduled_requests": len(jobs),
        "driver": {
            "slot_waits": ctx.slot_waits,
            "sent_at_deadline": ctx.sent_at_deadline,
            "rate_limited": ctx.rate_gate.waited,
            "process_cpu_s": round(cpu_s, 4),
            "part_writer": parts_by.kind if parts_by is not None else "thread",
            "part_writer_cpu_s": parts_by.cpu_s if parts_by is not None else None,
            "part_writer_priority": parts_by.priority if parts_by is not None else None,
            "rss_start_bytes": ctx.rss_start_bytes,
            "max_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
            "peak_in_flight": ctx.peak_in_flight,
            "connections_opened": getattr(run.transport, "opened", None),
        },
    }
    if ctx.router is not None:
        updates["routing"] = ctx.router.manifest(ctx.anchor_ns)
    if scrapes is not None:
        updates["metrics_scrapes"] = scrapes.model_dump(mode="json")
    if interrupted_by:
        updates["interrupted_by"] = interrupted_by
    try:
        writer.close(updates)
    except RecordWriteError as exc:
        write_error = write_error or exc
    if write_error is not None:
        raise write_error
