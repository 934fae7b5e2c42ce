"""Benchmark: runs over time (issue 37): diff false alarms, catalog indexing, diff of two large runs.

    python benchmarks/bench_runs.py false-alarms --pairs 50   # two trace seeds of one engine: how often flagged
    python benchmarks/bench_runs.py catalog --runs 10000      # index 10,000 run directories, then again unchanged
    python benchmarks/bench_runs.py diff --requests 100000    # loadgen diff of two 100k-request runs

**false-alarms**: ``2 × pairs`` worksheet runs of the interactive-small-batch preset, each on its own seed of
the canonical scenario's Poisson trace (``--trace``, default steady: 240 requests), diffed in pairs
(``--variable trace``). A pair is a false alarm when the diff's verdict is *regressed*: both runs come from one
engine and one workload. The nominal rate is the diff's α (5%, family-wise over the rows of one diff). Also
prints the verdict counts and, per row, how often a row was flagged either way.

**catalog**: builds N run directories by copying one small worksheet run (each gets its own path, its own
manifest trace seed so rows differ), indexes them (first pass), then indexes again (nothing changed).

**diff**: two worksheet runs (instant preset vs a 1.1× slower interactive preset is not needed: two seeds of
the instant-step engine) of ``--requests`` requests each, then times ``diff_runs`` (wall, best of ``--repeat``).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
import tomllib
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from loadgen.rundir.manifest import amend_manifest
from loadgen.runs.catalog import Catalog
from loadgen.runs.diff import diff_runs
from loadgen.sim import run_worksheet
from loadgen.trace.generate import generate_trace
from loadgen.trace.io import write_trace
from loadgen.workload.scenario import parse_scenario

SCENARIO = REPO / "scenarios" / "canonical.toml"
ENGINES = REPO / "scenarios" / "engines"


def _trace(path: Path, seed: int, trace: str, requests: int | None = None, duration_s: float = 600.0) -> Path:
    data = tomllib.loads(SCENARIO.read_text())
    if requests is not None:
        data["traces"] = {
            trace: {
                "process": "poisson",
                "rate_rps": requests / duration_s,
                "duration_s": duration_s,
                "max_in_flight": 4096,
            }
        }
    scenario = parse_scenario(data, "canonical")
    table, meta = generate_trace(scenario, trace, seed)
    write_trace(table, path, meta)
    return path


def _run(tmp: Path, seed: int, trace: str, engine: str, requests: int | None = None) -> Path:
    t = _trace(tmp / f"trace-{seed}.parquet", seed, trace, requests)
    out = tmp / f"run-{seed}"
    run_worksheet(t, ENGINES / f"{engine}.toml", out, scenario=SCENARIO)
    return out


def false_alarms(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        verdicts: Counter[str] = Counter()
        flagged: Counter[str] = Counter()
        t0 = time.perf_counter()
        for k in range(args.pairs):
            a = _run(tmp, 2 * k + 1, args.trace, args.engine)
            b = _run(tmp, 2 * k + 2, args.trace, args.engine)
            result = diff_runs([a], [b], variable="trace")
            verdicts[result.verdict] += 1
            for row in result.rows:
                if row.verdict in ("regressed", "improved"):
                    flagged[f"{row.request_class} {row.metric} {row.quantile} {row.verdict}"] += 1
            shutil.rmtree(a)
            shutil.rmtree(b)
        wall = time.perf_counter() - t0
    rate = verdicts["regressed"] / args.pairs
    print(f"false alarms: {verdicts['regressed']} of {args.pairs} seed pairs regressed ({rate:.1%}; nominal <= 5%)")
    print(f"verdicts: {dict(verdicts)}  ({wall:.0f} s, trace {args.trace}, engine {args.engine})")
    for key, n in flagged.most_common():
        print(f"  row flagged {n}x: {key}")


def catalog(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        one = _run(tmp, 1, "steady", "instant")
        root = tmp / "archive"
        t0 = time.perf_counter()
        for i in range(args.runs):
            dst = root / f"g{i // 1000:02d}" / f"run-{i:05d}"
            shutil.copytree(one, dst)
            amend_manifest(dst, {"trace": {"seed": i}})
        build = time.perf_counter() - t0
        with Catalog(tmp / "catalog.duckdb") as cat:
            t1 = time.perf_counter()
            first = cat.index([root])
            t2 = time.perf_counter()
            again = cat.index([root])
            t3 = time.perf_counter()
        with Catalog(tmp / "catalog.duckdb", read_only=True) as cat:
            t4 = time.perf_counter()
            listed = cat.rows()  # what `runs list` reads: every row, present and current checked on disk
            t5 = time.perf_counter()
    print(f"catalog: {args.runs} run directories (built in {build:.0f} s)")
    print(f"  first pass:    {t2 - t1:6.2f} s  ({first.summary()})   goal < 60 s")
    print(f"  unchanged:     {t3 - t2:6.2f} s  ({again.summary()})   goal < 2 s")
    print(f"  list:          {t5 - t4:6.2f} s  ({len(listed)} rows)")


def diff(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        t0 = time.perf_counter()
        a = _run(tmp, 1, "big", args.engine, args.requests)
        b = _run(tmp, 2, "big", args.engine, args.requests)
        build = time.perf_counter() - t0
        best = float("inf")
        for _ in range(args.repeat):
            t1 = time.perf_counter()
            result = diff_runs([a], [b], variable="trace")
            best = min(best, time.perf_counter() - t1)
        n = sum(r.n_base for r in result.rows if r.metric == "ttft_ms" and r.quantile == "p50")
    print(
        f"diff of two runs of {args.requests} requests ({n} ok TTFT samples on the base side; "
        f"runs built in {build:.0f} s): {best:.2f} s best of {args.repeat}   goal < 5 s; verdict {result.verdict}"
    )
    if args.json:
        print(json.dumps({"diff_s": best, "requests": args.requests}))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    s = p.add_subparsers(dest="what", required=True)
    fa = s.add_parser("false-alarms")
    fa.add_argument("--pairs", type=int, default=50)
    fa.add_argument("--trace", default="steady")
    fa.add_argument("--engine", default="interactive-small-batch")
    fa.set_defaults(func=false_alarms)
    ca = s.add_parser("catalog")
    ca.add_argument("--runs", type=int, default=10_000)
    ca.set_defaults(func=catalog)
    di = s.add_parser("diff")
    di.add_argument("--requests", type=int, default=100_000)
    di.add_argument("--engine", default="interactive-small-batch")
    di.add_argument("--repeat", type=int, default=3)
    di.add_argument("--json", action="store_true")
    di.set_defaults(func=diff)
    args = p.parse_args()
    args.func(args)


if __name__ == "__main__":
    from docs_page import recorded  # why: run as a script, benchmarks/ is on sys.path

    with recorded(__file__):  # its figures into docs/benchmarks.md
        main()
