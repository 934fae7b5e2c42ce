"""``loadgen practice``: the KV ledger, both candidates on the burst trace, the decision and its owners."""

from __future__ import annotations

import argparse
import json
import sys

from loadgen.util.errors import LoadgenError

from . import flags


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "practice",
        help="the main job: which of two profiled GPU engines takes interactive traffic (reject any that violates a "
        "hard p99 budget)",
    )
    p.add_argument("--out", help="output directory (default runs/practice-<utc>)")
    p.add_argument(
        "--engine",
        choices=("sim", "vllm"),
        default="sim",
        help="sim: two simulated engines on loopback (default); vllm: two real vLLM configurations "
        "(LOADGEN_VLLM_PYTHON)",
    )
    p.add_argument(
        "--target",
        type=flags.target_url,
        action="append",
        metavar="URL",
        help="two running endpoints to compare instead (give it twice)",
    )
    p.add_argument(
        "--candidate",
        action="append",
        metavar="ENGINE",
        help="--engine sim: a simulated candidate (preset or TOML: give it twice; default the profiled, validated "
        "rtxpro6000-llama-3.1-8b-tp1 and rtx4090-llama-3.1-8b-tp1; the uncalibrated presets: interactive-small-batch "
        "and throughput-large-batch)",
    )
    p.add_argument(
        "--predict-with",
        metavar="ENGINE",
        help="--engine vllm: the simulated engine (preset or TOML) whose cost terms predict each candidate, shown "
        "beside the measured figures (default interactive-small-batch, an uncalibrated preset: the launched vLLM runs "
        "the shipped tiny model, which no profiled engine measured)",
    )
    p.add_argument("--model", help="served model name for --target")
    p.add_argument(
        "--api-key-env",
        type=flags.api_key_env,
        help="NAME of the env var holding the API key for --target (never recorded)",
    )
    p.add_argument("--scenario", help="scenario TOML (default scenarios/canonical.toml)")
    p.add_argument("--trace", help="trace Parquet (default traces/canonical-burst.parquet)")
    p.add_argument(
        "--window-s",
        type=flags.DURATION,
        default=40.0,
        help="replay the first N s of the trace (default 40: two bursts)",
    )
    p.add_argument(
        "--full-trace", action="store_true", help="replay the whole trace (60 s for the canonical burst trace)"
    )
    p.add_argument(
        "--model-config",
        default=None,
        help="model config for the KV ledger (shipped name or config.json; default: the profiled candidates' own "
        "model, else llama-3.1-8b)",
    )
    p.add_argument("--prices", help="price table TOML (default scenarios/prices.toml, an EXAMPLE)")
    p.add_argument("--route", default="interactive", help=flags.ROUTE_HELP)
    flags.writes_json(
        p.add_argument("--json", action="store_true", help="print decision.json instead of the report"), "practice"
    )
    p.add_argument(
        "--vllm-arg",
        action="append",
        default=[],
        metavar="FLAG",
        help="extra flag for both launched vLLM configurations (--engine vllm), e.g. --vllm-arg=--enforce-eager",
    )
    p.add_argument(
        "--workers",
        type=flags.count(1, 1024),
        default=1,
        help="spread each measured run over N worker processes (default 1)",
    )
    p.add_argument(
        "--max-send-lag-ms",
        type=flags.send_lag_ms,
        default=None,
        help="measure a candidate again, launched fresh (3 attempts in all), while its client send-lag p99 exceeds "
        "this; a last attempt over it is shown unmeasured (default 50)",
    )
    p.set_defaults(func=_practice)


def _practice(args: argparse.Namespace) -> int:

    from ..practice import (  # deferred: `loadgen --help` loads no library code
        DEFAULT_PREDICTOR,
        SIM_CANDIDATES,
        PracticeOptions,
        format_practice,
        run_practice,
    )

    if args.predict_with is not None and (args.engine != "vllm" or args.target):
        raise LoadgenError(
            f"--predict-with {args.predict_with!r}: applies to the launched vLLM candidates: expected --engine vllm "
            "without --target"
        )
    if args.candidate is not None and (args.engine != "sim" or args.target or len(args.candidate) != 2):
        raise LoadgenError(
            f"--candidate {args.candidate[0]!r}: given {len(args.candidate)} time(s): expected two simulated "
            "candidates, with --engine sim and without --target"
        )
    if args.vllm_arg and (args.engine != "vllm" or args.target):
        raise LoadgenError(
            f"--vllm-arg {args.vllm_arg[0]!r}: applies to the launched vLLM candidates: expected --engine vllm "
            "without --target"
        )
    options = PracticeOptions(
        candidates=tuple(args.candidate) if args.candidate else SIM_CANDIDATES,
        scenario=args.scenario,
        trace=args.trace,
        window_s=None if args.full_trace else args.window_s,
        targets=tuple(args.target or ()),
        model=args.model,
        engine=args.engine,
        model_config=args.model_config,
        prices=args.prices,
        route=args.route,
        api_key_env=args.api_key_env,
        workers=args.workers,
        predict_with=args.predict_with or DEFAULT_PREDICTOR,
        vllm_args=tuple(args.vllm_arg),
        max_send_lag_ms=PracticeOptions.max_send_lag_ms if args.max_send_lag_ms is None else args.max_send_lag_ms,
    )
    result = run_practice(args.out, options, log=lambda m: print(m, file=sys.stderr, flush=True))
    print(json.dumps(result.decision, indent=2, default=str) if args.json else format_practice(result))
    return 0
