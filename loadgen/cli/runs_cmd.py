"""``loadgen runs index DIR... | list [--where SQL] | show RUN | pareto RUN...``: the catalog of every run and
plan directory, and the Pareto front of runs."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from . import flags


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("runs", help="catalog of every run and plan directory (DuckDB): index, list, show, pareto")
    p.add_argument("--catalog", help="catalog file (default: $LOADGEN_CATALOG or ~/.cache/loadgen/catalog.duckdb)")
    s = p.add_subparsers(dest="runs_command", required=True)
    idx = s.add_parser("index", help="record every run and plan directory under DIRs (unchanged ones are skipped)")
    idx.add_argument("dirs", nargs="+", metavar="DIR")
    idx.set_defaults(func=_index)
    ls = s.add_parser("list", help="catalogued runs, newest first")
    ls.add_argument(
        "--where", help="SQL condition over the runs columns, e.g. \"engine = 'vllm' and state = 'complete'\""
    )
    ls.add_argument("--limit", type=flags.count(1, 10**9), default=None, help="at most this many rows")
    flags.writes_json(ls.add_argument("--json", action="store_true", help="print JSON rows"), "runs-list")
    ls.set_defaults(func=_list)
    show = s.add_parser("show", help="one catalogued run: identity and headline figures per class")
    show.add_argument("run", help="its path, or a unique end of it")
    flags.writes_json(show.add_argument("--json", action="store_true", help="print JSON"), "runs-show")
    show.set_defaults(func=_show)
    par = s.add_parser("pareto", help="Pareto front of runs: completed throughput against a latency p99")
    par.add_argument("run_dirs", nargs="+", metavar="RUN_DIR")
    par.add_argument(
        "--metric",
        default="ttft_ms",
        choices=("ttft_ms", "itl_ms", "tpot_ms", "e2e_ms"),
        help="the latency whose p99 is plotted (default ttft_ms)",
    )
    par.add_argument("--class", dest="request_class", default="overall", help="a class, or overall (default)")
    par.add_argument("--html", type=flags.output_file, help="write the interactive plot to this HTML file")
    par.set_defaults(func=_pareto)


def _index(args: argparse.Namespace) -> int:
    from loadgen.runs.catalog import Catalog  # deferred: `loadgen --help` loads no library code

    with Catalog(args.catalog) as cat:
        report = cat.index(args.dirs)
    print(f"{cat.path}: {report.summary()}")
    for path in report.missing:
        moved = report.moved.get(path)
        print(f"  missing: {path}" + (f" (moved: the same run is catalogued at {moved})" if moved else ""))
    for problem in report.problems:
        print(f"  unreadable: {problem}")
    return 0


def _list(args: argparse.Namespace) -> int:
    from loadgen.runs.catalog import Catalog  # deferred: `loadgen --help` loads no library code
    from loadgen.runs.catalog_result import run_list  # deferred: as above
    from loadgen.runs.report import format_runs  # deferred: as above

    with Catalog(args.catalog, read_only=True) as cat:
        rows = cat.rows(args.where, limit=args.limit)
    if args.json:
        print(json.dumps(run_list(rows, cat.path).document(), indent=2))  # the published schema
    else:
        print(format_runs(rows))
    return 0


def _show(args: argparse.Namespace) -> int:
    from loadgen.runs.catalog import Catalog  # deferred: `loadgen --help` loads no library code
    from loadgen.runs.catalog_result import run_show  # deferred: as above
    from loadgen.runs.report import format_run  # deferred: as above

    with Catalog(args.catalog, read_only=True) as cat:
        row = cat.find(args.run)
        classes = cat.classes(row["path"])
    if args.json:
        print(json.dumps(run_show(row, classes, cat.path).document(), indent=2))  # the published schema
    else:
        print(format_run(row, classes))
    return 0


def _pareto(args: argparse.Namespace) -> int:
    from loadgen.runs.pareto import format_pareto, pareto_points, write_pareto_html  # deferred: library code

    points = pareto_points(args.run_dirs, metric=args.metric, request_class=args.request_class)
    if args.html:
        write_pareto_html(points, args.metric, args.request_class, Path(args.html))
    print(format_pareto(points, args.metric, args.request_class))
    return 0
