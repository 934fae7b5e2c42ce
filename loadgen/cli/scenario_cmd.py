"""``loadgen scenario check FILE``: validate a scenario and summarise it."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("scenario", help="validate and inspect scenario files")
    s = p.add_subparsers(dest="scenario_command", required=True)
    check = s.add_parser("check", help="validate a scenario TOML file (one-line error on the first problem)")
    check.add_argument("file")
    check.set_defaults(func=_check)


def _check(args: argparse.Namespace) -> int:
    from ..scenario import load_scenario

    scenario = load_scenario(args.file)
    print(f"{args.file}: ok: scenario {scenario.name!r} sha256 {scenario.sha256[:12]}")
    for name, cls in scenario.classes.items():
        budgets = []
        for metric in ("ttft_ms", "itl_ms", "e2e_ms"):
            budget = getattr(cls.budgets, metric)
            if budget:
                limits = ", ".join(f"{q}≤{v:g}" for q, v in budget.limits().items())
                budgets.append(f"{metric} {limits} ({'hard' if budget.hard else 'soft'})")
        print(f"  class {name}: share {cls.share:g}, stream {cls.stream}; " + "; ".join(budgets))
    for name, trace in scenario.traces.items():
        print(f"  trace {name}: {trace.process}, {trace.duration_s:g} s")
    return 0
