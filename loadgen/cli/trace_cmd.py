"""``loadgen trace generate|import|stats``."""

from __future__ import annotations

import argparse
import json

from loadgen.util.errors import TraceError
from loadgen.util.limits import MAX_TRACE_REQUESTS

from . import flags


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("trace", help="generate, import and inspect traces")
    s = p.add_subparsers(dest="trace_command", required=True)

    gen = s.add_parser("generate", help="deterministic synthetic trace from a scenario")
    gen.add_argument("scenario", help="scenario TOML file")
    gen.add_argument("--trace", required=True, help="name of a [traces.NAME] section")
    gen.add_argument("--seed", type=flags.seed, default=None, help="seed (default: the scenario's)")
    gen.add_argument("--out", required=True, type=flags.output_file, help="output .parquet file")
    gen.set_defaults(func=_generate)

    imp = s.add_parser(
        "import",
        help="import a public trace (azure CSV, mooncake JSONL, llmservingsim workload JSONL, burstgpt CSV, "
        "bailian JSONL, sharegpt JSON, agentic sessions JSON)",
    )
    imp.add_argument(
        "kind",
        choices=["azure", "mooncake", "llmservingsim", "burstgpt", "bailian", "sharegpt", "agentic"],
        help="the source format (docs/traces.md)",
    )
    imp.add_argument("file", nargs="+", help="the trace file (agentic: one or more kv-cache-tester trace_*.json)")
    imp.add_argument("--out", required=True, type=flags.output_file, help="output .parquet file")
    imp.add_argument(
        "--time-scale",
        type=flags.number(0, 1e6, low_open=True),
        default=1.0,
        help="multiply gaps (0.5 = twice the rate)",
    )
    imp.add_argument(
        "--start-s",
        type=flags.seconds(flags.MAX_OFFSET_S, zero=True),
        default=0.0,
        help="window start, seconds after the first request",
    )
    imp.add_argument(
        "--duration-s", type=flags.seconds(flags.MAX_OFFSET_S), default=None, help="window length in seconds"
    )
    imp.add_argument(
        "--max-requests",
        type=flags.count(1, MAX_TRACE_REQUESTS),
        default=None,
        help="keep at most N requests of the window",
    )
    imp.add_argument(
        "--request-class",
        default=None,
        help="class given to every imported request (default: short-message; agentic: agent)",
    )
    imp.add_argument(
        "--class-by",
        choices=["model", "log-type", "type"],
        default=None,
        help="one class per value of a source field (burstgpt: model or log-type; bailian: type), named by the "
        "value's slug ('GPT-4' -> gpt-4) unless --class-map names it",
    )
    imp.add_argument(
        "--class-map",
        action="append",
        metavar="VALUE=CLASS",
        default=None,
        help="with --class-by: the class for one source value (repeat)",
    )
    imp.add_argument(
        "--tokenizer",
        default="cl100k_base",
        help="sharegpt: counts the text's tokens (give the target's: hf:PATH/tokenizer.json)",
    )
    imp.add_argument(
        "--rate-rps",
        type=flags.number(0, 1e6, low_open=True),
        default=1.0,
        help="sharegpt (no timestamps): conversations started per second, evenly spaced",
    )
    imp.set_defaults(func=_import)

    st = s.add_parser("stats", help="duration, rates, burstiness and token tails of a trace")
    st.add_argument("file")
    flags.writes_json(st.add_argument("--json", action="store_true", help="print JSON"), "trace-stats")
    st.set_defaults(func=_stats)


def _generate(args: argparse.Namespace) -> int:
    from loadgen.workload.scenario import load_scenario  # deferred: `loadgen --help` loads no library code

    from ..trace.generate import generate_trace_file  # deferred: `loadgen --help` loads no library code
    from ..trace.io import read_trace  # deferred: `loadgen --help` loads no library code

    path = generate_trace_file(load_scenario(args.scenario), args.trace, args.out, args.seed)
    table, meta = read_trace(path)
    print(f"{path}: {table.num_rows} requests, trace {meta['trace_name']!r}, seed {meta['seed']}, mode {meta['mode']}")
    return 0


def _import(args: argparse.Namespace) -> int:
    from ..trace.import_table import parse_class_map  # deferred: `loadgen --help` loads no library code
    from ..trace.importers import import_trace  # deferred: `loadgen --help` loads no library code

    if args.kind == "agentic":
        return _import_agentic(args)
    if len(args.file) != 1:
        raise TraceError(f"trace import {args.kind}: {len(args.file)} files given: expected one")
    path = import_trace(
        args.kind,
        args.file[0],
        args.out,
        time_scale=args.time_scale,
        start_s=args.start_s,
        duration_s=args.duration_s,
        max_requests=args.max_requests,
        request_class=args.request_class or "short-message",
        class_by=args.class_by,
        class_map=parse_class_map(args.class_map),
        tokenizer=args.tokenizer,
        rate_rps=args.rate_rps,
    )
    print(f"{path}: imported from {args.file[0]}")
    return 0


def _import_agentic(args: argparse.Namespace) -> int:
    from ..trace.agentic import import_agentic  # deferred: `loadgen --help` loads no library code
    from ..trace.io import read_trace  # deferred: `loadgen --help` loads no library code

    for flag, value in (
        ("--start-s", args.start_s or None),
        ("--duration-s", args.duration_s),
        ("--max-requests", args.max_requests),
    ):
        if value is not None:
            raise TraceError(f"trace import agentic: {flag} = {value}: expected none (sessions are imported whole)")
    path = import_agentic(args.file, args.out, time_scale=args.time_scale, request_class=args.request_class or "agent")
    table, meta = read_trace(path)
    print(
        f"{path}: {meta['sessions']} sessions, {table.num_rows} requests over {meta['duration_s']:g} s, imported from {len(args.file)} files"
    )
    return 0


def _stats(args: argparse.Namespace) -> int:
    from ..trace.io import read_trace  # deferred: `loadgen --help` loads no library code
    from ..trace.stats import format_stats, trace_stats  # deferred: `loadgen --help` loads no library code
    from ..trace.stats_result import trace_stats_result  # deferred: as above

    table, meta = read_trace(args.file)
    stats = trace_stats(table)
    if args.json:
        print(json.dumps(trace_stats_result(stats, meta).document(), indent=2))
    else:
        print(format_stats(stats, meta))
    return 0
