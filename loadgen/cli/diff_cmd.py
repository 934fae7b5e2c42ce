"""``loadgen diff BASE CANDIDATE [--fail-on regression]``: per class and metric, the change with its interval."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from loadgen.util.outputfile import write_output_text

from . import flags

#: Exit status of ``--fail-on`` when the diff's verdict is one it names (2 stays "bad input").
FAIL_EXIT = 3


def _threshold(text: str) -> tuple[str, float]:
    metric, sep, value = text.partition("=")
    if not sep or metric not in ("ttft_ms", "tpot_ms", "e2e_ms", "error_share"):
        raise argparse.ArgumentTypeError(
            f"{text!r}: expected METRIC=PERCENT with METRIC one of ttft_ms, tpot_ms, e2e_ms, "
            "or error_share=POINTS (percentage points)"
        )
    if metric == "error_share":
        return metric, flags.number(0.0, 100.0)(value)
    return metric, flags.number(0.0, 1000.0)(value)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("diff", help="did the candidate regress? per class and metric, with intervals")
    p.add_argument("base", help="base run directory (several repeats: a comma-separated list)")
    p.add_argument("candidate", help="candidate run directory (several repeats: a comma-separated list)")
    p.add_argument("--variable", help="the one manifest key allowed to differ (default: target.engine)")
    p.add_argument("--allow-differences", action="store_true", help="diff even when more than the variable differs")
    p.add_argument(
        "--threshold",
        type=_threshold,
        action="append",
        default=[],
        metavar="METRIC=PCT",
        help="practical threshold in percent of the base value, per metric (default 5 for each); "
        "error_share=PP: the failed-share row's threshold in percentage points (absolute, default 1)",
    )
    p.add_argument("--window", help="START:END seconds on each run's clock (default: as analyze)")
    p.add_argument(
        "--fail-on",
        choices=("regression", "inconclusive"),
        help=f"exit {FAIL_EXIT} when the verdict is regressed (or, with inconclusive, regressed or inconclusive)",
    )
    flags.writes_json(p.add_argument("--json", type=flags.output_file, help="write the diff JSON to this file"), "diff")
    p.add_argument(
        "--html", type=flags.output_file, help="write the diff report (overlaid CDFs, intervals) to this HTML file"
    )
    p.set_defaults(func=_diff)


def _diff(args: argparse.Namespace) -> int:
    from loadgen.runs.diff import diff_runs  # deferred: `loadgen --help` loads no library code
    from loadgen.runs.report import format_diff, write_diff_html  # deferred: as above

    result = diff_runs(
        [Path(p) for p in args.base.split(",") if p],
        [Path(p) for p in args.candidate.split(",") if p],
        variable=args.variable,
        thresholds_pct=dict(args.threshold),
        window=args.window,
        allow_differences=args.allow_differences,
    )
    if args.json:
        write_output_text(args.json, json.dumps(result.to_dict(), indent=2) + "\n")
    if args.html:
        write_diff_html(result, Path(args.html))
    print(format_diff(result))
    failing = {"regression": ("regressed",), "inconclusive": ("regressed", "inconclusive")}.get(args.fail_on or "", ())
    return FAIL_EXIT if result.verdict in failing else 0
