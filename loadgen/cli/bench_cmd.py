"""``loadgen bench``: the canonical trace against a target (default: the embedded simulated engine)."""

from __future__ import annotations

import argparse
from pathlib import Path

from . import flags


def register(sub: argparse._SubParsersAction) -> None:
    from loadgen.workload.presets import canonical_scenario  # a path only: the library loads when the command runs

    p = sub.add_parser("bench", help="replay the canonical trace and print where the run stands against the budgets")
    p.add_argument(
        "--scenario", type=Path, default=canonical_scenario(), help="scenario TOML (default: the shipped canonical one)"
    )
    p.add_argument("--trace", default="steady", help="named trace of the scenario (steady, burst, ...)")
    p.add_argument("--seed", type=flags.seed, default=None, help="trace seed (default: the scenario's)")
    p.add_argument(
        "--target",
        type=flags.target_url,
        default=None,
        help="OpenAI-compatible base URL (default: launch the simulated engine)",
    )
    p.add_argument(
        "--model",
        default=None,
        help="served model name for --target (default: the scenario's, else the first of /v1/models)",
    )
    p.add_argument("--engine", default="interactive-small-batch", help="simulated engine preset or TOML (no --target)")
    p.add_argument(
        "--api-key-env",
        type=flags.api_key_env,
        default=None,
        help="name of the environment variable holding the API key",
    )
    p.add_argument(
        "--endpoint", choices=["completions", "chat"], default=None, help="default: the scenario's, else completions"
    )
    p.add_argument("--out", type=Path, default=None, help="output directory (default runs/bench-<utc>)")
    p.add_argument("--html", type=flags.output_file, default=None, help="also write the HTML report here")
    p.set_defaults(func=_bench)


def _bench(args: argparse.Namespace) -> int:
    from loadgen.canonical_run import run_bench  # deferred: `loadgen --help` loads no library code

    from ..analysis import render_console, write_html  # deferred: `loadgen --help` loads no library code

    result = run_bench(
        scenario_path=args.scenario,
        trace_name=args.trace,
        seed=args.seed,
        target_url=args.target,
        model=args.model,
        engine=args.engine,
        out_dir=args.out,
        api_key_env=args.api_key_env,
        endpoint=args.endpoint,
    )
    render_console(result.analysis)
    if args.html:
        write_html(result.analysis, args.html)
        print(f"HTML report: {args.html}")
    print(f"run directory: {result.run_dir}")
    return 0
