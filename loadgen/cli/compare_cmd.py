"""``loadgen compare RUN_DIR_OR_PLAN_DIR ... [--route interactive] [--variable NAME] [--prices FILE]``."""

from __future__ import annotations

import argparse
import json

from loadgen.util.outputfile import write_output_text

from . import flags


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "compare", help="judge serving candidates: hard budgets, then behaviour, then throughput and cost"
    )
    p.add_argument("candidates", nargs="+", help="run directories or plan directories (two or more)")
    p.add_argument("--route", default="interactive", help=flags.ROUTE_HELP)
    p.add_argument("--variable", help="the one manifest key allowed to differ (default: target.engine)")
    p.add_argument("--prices", help="price table TOML (see scenarios/prices.toml, an example)")
    p.add_argument("--allow-differences", action="store_true", help="compare even when more than the variable differs")
    p.add_argument(
        "--max-send-lag-ms",
        type=flags.send_lag_ms,
        default=None,
        help="a candidate whose client send-lag p99 exceeds this is unmeasured, its budgets not judged (default 50)",
    )
    flags.writes_json(p.add_argument("--json", action="store_true", help="print the comparison JSON"), "decision")
    flags.writes_json(
        p.add_argument("--out", type=flags.output_file, help="also write the comparison JSON to this file"), "decision"
    )
    p.set_defaults(func=_compare)


def _compare(args: argparse.Namespace) -> int:

    from ..plan import compare_candidates, format_comparison  # deferred: `loadgen --help` loads no library code

    comp = compare_candidates(
        args.candidates,
        route=args.route,
        variable=args.variable,
        prices=args.prices,
        allow_differences=args.allow_differences,
        **({} if args.max_send_lag_ms is None else {"max_send_lag_ms": args.max_send_lag_ms}),
    )
    data = comp.to_dict()
    if args.out:
        write_output_text(args.out, json.dumps(data, indent=2, default=str) + "\n")
    print(json.dumps(data, indent=2, default=str) if args.json else format_comparison(comp))
    return 0 if comp.decision.chosen else 4
