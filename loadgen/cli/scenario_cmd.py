"""``loadgen scenario check FILE``: validate a scenario and summarise it; ``scenario init DIR``: copy the presets out."""

from __future__ import annotations

import argparse
from typing import cast


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("scenario", help="validate and inspect scenario files")
    s = p.add_subparsers(dest="scenario_command", required=True)
    check = s.add_parser("check", help="validate a scenario TOML file (one-line error on the first problem)")
    check.add_argument("file")
    check.set_defaults(func=_check)
    init = s.add_parser(
        "init", help="copy the shipped presets (scenario, engines, plans, contract cases, prices) into DIR"
    )
    init.add_argument("dir", help="directory to create or fill (same layout as the source tree's scenarios/)")
    init.add_argument("--force", action="store_true", help="overwrite presets already in DIR")
    init.set_defaults(func=_init)


def _init(args: argparse.Namespace) -> int:
    from loadgen.workload.presets import copy_presets  # deferred: `loadgen --help` loads no library code

    written = copy_presets(args.dir, force=args.force)
    print(f"{args.dir}: {len(written)} preset files copied:")
    for path in written:
        print(f"  {path}")
    return 0


def _check(args: argparse.Namespace) -> int:
    from loadgen.workload.scenario import load_scenario  # deferred: `loadgen --help` loads no library code

    scenario = load_scenario(args.file)
    sha256 = cast(str, scenario.sha256)  # load_scenario always records the file's sha256
    print(f"{args.file}: ok: scenario {scenario.name!r} sha256 {sha256[:12]}")
    for name, cls in scenario.classes.items():
        budgets = []
        for metric in type(cls.budgets).model_fields:  # ttft_ms, ttfat_ms, itl_ms, e2e_ms
            budget = getattr(cls.budgets, metric)
            if budget:
                limits = ", ".join(f"{q}≤{v:g}" for q, v in budget.limits().items())
                budgets.append(f"{metric} {limits} ({'hard' if budget.hard else 'soft'})")
        reasoning = "; reasoning tokens drawn" if cls.reasoning_tokens is not None else ""
        print(f"  class {name}: share {cls.share:g}, stream {cls.stream}{reasoning}; " + "; ".join(budgets))
    for name, trace in scenario.traces.items():
        print(f"  trace {name}: {trace.process}, {trace.duration_s:g} s")
    return 0
