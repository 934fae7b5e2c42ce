"""``loadgen run TRACE --target URL --out RUN_DIR``: replay a trace open-loop and record a run directory."""

from __future__ import annotations

import argparse

from loadgen.util.limits import MAX_RATE_RPS

from . import flags


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("run", help="replay a trace against an OpenAI-compatible endpoint and record a run directory")
    p.add_argument("trace", help="trace Parquet file (loadgen trace generate/import)")
    p.add_argument("--out", required=True, help="new run directory")
    _target_args(p.add_argument_group("target", "where the requests go, and as whom"))
    _request_args(p.add_argument_group("requests", "what is sent, and when a request gives up"))
    _record_args(p.add_argument_group("recording", "what the run directory records beside the requests"))
    _scale_args(p.add_argument_group("scale-out", "one run spread over worker processes or Ray actors"))
    p.set_defaults(func=_run)


def _target_args(g: argparse._ArgumentGroup) -> None:
    g.add_argument(
        "--target",
        type=flags.target_url,
        action="append",
        required=True,
        help="base URL, e.g. http://127.0.0.1:8000 (a trailing /v1 is fine); repeat for replicas of one model",
    )
    g.add_argument(
        "--route-policy",
        choices=("round-robin", "least-in-flight"),
        default="round-robin",
        help="with several --target: which replica a new conversation or request goes to (turns stay on theirs)",
    )
    g.add_argument(
        "--replica-down-after",
        type=flags.count(0),
        default=3,
        metavar="N",
        help="with several --target: a replica with N consecutive connect errors gets no more requests (0: never)",
    )
    g.add_argument("--model", help="served model name (default: scenario model, else the first of /v1/models)")
    g.add_argument(
        "--no-model-check",
        action="store_true",
        help="do not fail when /v1/models lists models but not --model (gateways that list other names), nor when "
        "/version and /v1/models both answer 404",
    )
    g.add_argument(
        "--api-key-env",
        type=flags.api_key_env,
        help="NAME of the environment variable holding the API key (never recorded)",
    )
    g.add_argument(
        "--header",
        type=flags.header,
        action="append",
        default=[],
        metavar="NAME:VALUE",
        help="extra request header (value not recorded)",
    )


def _request_args(g: argparse._ArgumentGroup) -> None:
    g.add_argument("--scenario", help="scenario TOML: timeouts, privacy, endpoint, budgets")
    g.add_argument("--endpoint", choices=("completions", "chat"), help="default: the scenario's, else completions")
    g.add_argument(
        "--max-concurrency", type=flags.count(), help="bound on requests in flight (default: the trace's max_in_flight)"
    )
    g.add_argument(
        "--rate-limit-rps",
        type=flags.number(0, MAX_RATE_RPS, low_open=True),
        help="client-side requests/s cap (the wait counts as client queue)",
    )
    g.add_argument(
        "--deadline-s", type=flags.DURATION, help="stop after N seconds; requests not yet sent are recorded not_sent"
    )
    g.add_argument(
        "--tokenizer",
        default="auto",
        help="auto (default: the target's /tokenize, else cl100k_base with a warning) | server | cl100k_base | "
        "hf:PATH/tokenizer.json | chars:N",
    )
    g.add_argument(
        "--prompt-salt",
        default="",
        metavar="TEXT",
        help="enters every prompt's seed: the same trace gets other texts of the same token counts, so a server's "
        "prefix cache holds none of an earlier run's prompts (recorded in the manifest; default: none)",
    )
    g.add_argument("--ttft-timeout-s", type=flags.seconds(), help="override the scenario's TTFT timeout")
    g.add_argument("--total-timeout-s", type=flags.seconds(), help="override the scenario's total timeout")
    g.add_argument(
        "--vllm-extensions",
        choices=("auto", "on", "off"),
        default="auto",
        help="send ignore_eos and continuous_usage_stats (auto: not to managed APIs)",
    )
    g.add_argument(
        "--max-tokens-field",
        choices=("max_tokens", "max_completion_tokens"),
        default="max_tokens",
        help="the request field that carries the output length (max_completion_tokens: APIs that refuse max_tokens)",
    )
    g.add_argument(
        "--max-sse-line-bytes",
        type=flags.count(1024, 1 << 30),
        default=1 << 20,
        help="longest SSE line (and event) accepted; a longer one fails that request as malformed_sse (default 1 MiB)",
    )


def _record_args(g: argparse._ArgumentGroup) -> None:
    g.add_argument(
        "--scrape-metrics",
        choices=("auto", "on", "off"),
        default="auto",
        help="sample the target's Prometheus /metrics into server_metrics.parquet (auto: when GET /metrics answers)",
    )
    g.add_argument(
        "--scrape-interval-s", type=flags.seconds(3600), default=1.0, help="/metrics and GPU sampling interval"
    )
    g.add_argument(
        "--gpu-telemetry",
        choices=("auto", "on", "off"),
        default="auto",
        help="NVML samples of this host's GPUs into server_metrics (needs loadgen[gpu]; auto: skipped with a "
        "manifest note when there is no GPU; on: fail instead)",
    )
    g.add_argument(
        "--warm-state",
        choices=("warm", "cold", "unknown"),
        default="unknown",
        help="the target's state when the run starts, recorded in the manifest (default unknown)",
    )
    g.add_argument(
        "--warm-action", action="append", default=[], help="what was done to reach the warm state (repeatable)"
    )
    g.add_argument(
        "--order-index",
        type=flags.count(0),
        help="this run's place in a series, recorded in the manifest (plans set it)",
    )
    g.add_argument(
        "--repeat", type=flags.count(0), help="this run's repeat number, recorded in the manifest (plans set it)"
    )
    g.add_argument(
        "--progress",
        choices=("auto", "on", "off"),
        default="auto",
        help="a live progress line on stderr (auto: when stderr is a terminal)",
    )
    g.add_argument(
        "--flush-interval-s",
        type=flags.number(0.001, 60),
        default=1.0,
        help="records reach disk at least this often (default 1 s; a killed run keeps everything up to the last flush)",
    )
    g.add_argument(
        "--part-writer",
        choices=("thread", "process"),
        default="process",
        help="who converts and writes the records during the run: a child process at low CPU priority "
        "(default; idle priority when the client may use one CPU only), which keeps the client's core for "
        "the schedule (send-lag p99 at 2,500 req/s on one core: 0.4-2.0 ms against 0.8-50 ms), or the "
        "writer thread",
    )


def _scale_args(g: argparse._ArgumentGroup) -> None:
    g.add_argument(
        "--workers",
        type=flags.count(1, 1024),
        default=1,
        help="spread the run over N worker processes on this host (one run directory; default 1)",
    )
    g.add_argument(
        "--ray",
        nargs="?",
        const="local",
        metavar="ADDRESS",
        help="spread the run over Ray actors (--workers of them, default 2): a local Ray, or the cluster at "
        "ADDRESS (needs pip install 'loadgen[ray]' and a run directory every node sees)",
    )


def _run(args: argparse.Namespace) -> int:
    from pydantic import ValidationError  # deferred: `loadgen --help` loads no library code

    from loadgen.rundir.manifest import read_manifest  # deferred: `loadgen --help` loads no library code
    from loadgen.util.errors import LoadgenError  # deferred: `loadgen --help` loads no library code
    from loadgen.util.validation import format_validation_error  # deferred: `loadgen --help` loads no library code

    from ..driver import RunOptions, run_trace_sync  # deferred: `loadgen --help` loads no library code

    headers = dict(args.header)
    try:
        options = RunOptions(
            trace_path=args.trace,
            target_url=args.target[0],
            replica_urls=args.target[1:],
            route_policy=args.route_policy,
            replica_down_after=args.replica_down_after,
            out_dir=args.out,
            model=args.model,
            scenario_path=args.scenario,
            endpoint=args.endpoint,
            max_concurrency=args.max_concurrency,
            tokenizer=args.tokenizer,
            prompt_salt=args.prompt_salt,
            api_key_env=args.api_key_env,
            ttft_timeout_s=args.ttft_timeout_s,
            total_timeout_s=args.total_timeout_s,
            scrape_metrics=args.scrape_metrics,
            scrape_interval_s=args.scrape_interval_s,
            gpu_telemetry=args.gpu_telemetry,
            warm_state=args.warm_state,
            warm_actions=args.warm_action,
            order_index=args.order_index,
            repeat=args.repeat,
            progress=args.progress,
            deadline_s=args.deadline_s,
            rate_limit_rps=args.rate_limit_rps,
            vllm_extensions=args.vllm_extensions,
            max_tokens_field=args.max_tokens_field,
            headers=headers,
            max_sse_line_bytes=args.max_sse_line_bytes,
            flush_interval_s=args.flush_interval_s,
            part_writer=args.part_writer,
            check_model=not args.no_model_check,
            workers=args.workers,
            ray=args.ray,
        )
    except ValidationError as exc:
        raise LoadgenError(format_validation_error("loadgen run", exc)) from None
    run_dir = run_trace_sync(options)
    manifest = read_manifest(run_dir)
    counts = ", ".join(f"{k} {v}" for k, v in manifest.status_counts.items() if v)
    lag = manifest.send_lag_ns or {}
    lag_p50, lag_p99 = lag.get("p50"), lag.get("p99")
    lag_text = (
        f"send lag p50 {lag_p50 / 1e3:.0f} µs, p99 {lag_p99 / 1e3:.0f} µs"
        if lag_p50 is not None and lag_p99 is not None  # LagStats.summary: all set, or all None
        else "send lag n/a"
    )
    print(
        f"{run_dir}: {manifest.scheduled_requests} scheduled: {counts}; {lag_text}; "
        f"{manifest.chunks_recorded} chunks in {manifest.duration_s or 0:.1f} s"
    )
    return 0
