"""``loadgen analyze RUN_DIR``: per-class tails, rates, budget verdicts, stability; console/JSON/HTML."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from loadgen.util.outputfile import write_output_text

from . import flags

#: Exit code of ``--fail-on-budget`` when a hard budget (or the error-share limit) failed conclusively.
EXIT_BUDGET_FAILED = 3
#: Exit code of ``--fail-on-budget`` when no hard budget failed but one is inconclusive (its 95% interval
#: straddles the limit): more requests are needed to decide.
EXIT_BUDGET_INCONCLUSIVE = 4


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("analyze", help="analyse a run directory: per-class tails, budgets, stability, reports")
    p.add_argument("run_dir", help="run directory (measured, simulated or imported)")
    p.add_argument("--scenario", help="scenario TOML with the budgets (default: the one in the manifest)")
    flags.writes_json(
        p.add_argument(
            "--json", metavar="FILE", type=flags.output_file, help="write every number as JSON (with schema_version)"
        ),
        "analysis",
    )
    p.add_argument(
        "--html", metavar="FILE", type=flags.output_file, help="write a self-contained HTML report with plots"
    )
    p.add_argument("--window", metavar="START:END", help="measurement window in seconds on the run clock")
    p.add_argument("--include-cold", action="store_true", help="keep cold-start requests in the tables and budgets")
    p.add_argument(
        "--fail-on-budget",
        action="store_true",
        help=f"exit {EXIT_BUDGET_FAILED} when a hard budget fails conclusively, {EXIT_BUDGET_INCONCLUSIVE} when one "
        "is inconclusive (default: exit 0 and print the verdict)",
    )
    p.add_argument("--quiet", action="store_true", help="no console report (files only)")
    p.add_argument(
        "--memory-mib",
        type=float,
        metavar="MIB",
        help="memory for per-token samples before they spill to disk as sorted runs (default: "
        "$LOADGEN_ANALYZE_MEMORY_MIB or 256); percentiles stay exact",
    )
    p.add_argument(
        "--spill-dir", metavar="DIR", help="where samples spill (default: $LOADGEN_ANALYZE_SPILL_DIR or the temp dir)"
    )
    p.set_defaults(func=_analyze)


def _analyze(args: argparse.Namespace) -> int:

    from loadgen.rundir.io import persist_recovery  # deferred: loaded when it runs
    from loadgen.util.errors import RunDirError  # deferred: loaded when it runs
    from loadgen.workload.scenario import load_scenario  # deferred: `loadgen --help` loads no library code

    from ..analysis import (  # deferred: `loadgen --help` loads no library code
        analyze_run,
        parse_window,
        render_console,
        write_html,
    )
    from ..analysis.spill import SpillConfig  # deferred: loaded when it runs

    try:  # a killed run (manifest still "running", writer gone) gets its recovered manifest on disk
        if persist_recovery(Path(args.run_dir)) is not None:
            print(
                f"loadgen: {args.run_dir}: killed before closing; recovered manifest written (state killed)",
                file=sys.stderr,
            )
    except (RunDirError, OSError):
        pass  # read-only or not a run: the analysis below still reads the recovered view, or says what is wrong
    scenario = load_scenario(args.scenario) if args.scenario else None
    spill = SpillConfig.resolve(args.memory_mib, args.spill_dir)
    analysis = analyze_run(
        Path(args.run_dir),
        scenario=scenario,
        window=parse_window(args.window),
        include_cold=args.include_cold,
        spill=spill,
    )
    if not args.quiet:
        render_console(analysis)
    if args.json:
        write_output_text(args.json, json.dumps(analysis.to_dict(), indent=1) + "\n")
        print(f"wrote {args.json}")
    if args.html:
        write_html(analysis, args.html)
        print(f"wrote {args.html}")
    if args.fail_on_budget and analysis.verdict == "fail":
        return EXIT_BUDGET_FAILED
    if args.fail_on_budget and analysis.verdict == "inconclusive":
        return EXIT_BUDGET_INCONCLUSIVE
    return 0
