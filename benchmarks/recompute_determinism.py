"""Determinism checks from the outside: files and Parquet rows only (DuckDB), no loadgen import.

    python benchmarks/recompute_determinism.py --trace-a A.parquet --trace-b B.parquet \
        --run-a RUN1 --run-b RUN2 --trace T.parquet [--json-a X.json --json-b Y.json]

- two trace files generated in separate processes from one seed are byte for byte equal;
- two runs of one trace (e.g. ``--workers 1`` and ``--workers 2``) sent the same prompts (sha256 per request id),
  and every request that waits for no reply was scheduled at its trace offset plus the same run offset;
- in each run, every waiting request was scheduled exactly one think time after the last reply it waits for
  ended (``done_ns``; the rule of docs/agent-sessions.md), so a replay schedules the same way whatever the
  replies' timing;
- two worksheet replays of one trace with one seed (``--same-a``/``--same-b``) recorded the same request and chunk
  rows (DuckDB ``EXCEPT ALL`` both ways);
- two analyses of one run give byte-identical JSON.
Prints one line per check; exit 1 if any fails.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import duckdb


def source(path: Path) -> str:
    return f"'{path}/*.parquet'" if path.is_dir() else f"'{path}'"


def fetch(sql: str) -> list[tuple[Any, ...]]:
    return duckdb.sql(sql).fetchall()


def same_prompts(trace: Path, run_a: Path, run_b: Path) -> str:
    pairs = fetch(
        f"select a.request_id, a.prompt_sha256 = b.prompt_sha256, a.scheduled_ns - t.scheduled_offset_ns, "
        f"b.scheduled_ns - t.scheduled_offset_ns, t.think_after_reply_ns is null "
        f"from read_parquet({source(run_a / 'requests.parquet')}) a "
        f"join read_parquet({source(run_b / 'requests.parquet')}) b using (request_id) "
        f"join read_parquet({source(trace)}) t using (request_id)"
    )
    differ = [p[0] for p in pairs if not p[1]]
    open_rows = [p for p in pairs if p[4]]
    # open-loop rows: scheduled = anchor-relative trace offset + one constant per run (the start offset)
    offsets_a = {p[2] for p in open_rows}
    offsets_b = {p[3] for p in open_rows}
    ok = not differ and len(offsets_a) == 1 and len(offsets_b) == 1
    return (
        f"{'ok' if ok else 'FAIL'} same prompts and open-loop schedule: {len(pairs)} requests, "
        f"{len(differ)} prompt sha256 differ, {len(open_rows)} open-loop rows at "
        f"{len(offsets_a)} / {len(offsets_b)} distinct offsets from the trace"
    )


def waits_kept(trace: Path, run: Path) -> str:
    rows = fetch(
        f"select r.request_id, r.scheduled_ns, t.think_after_reply_ns, t.wait_for_ids, t.conversation_id, "
        f"t.turn_index from read_parquet({source(run / 'requests.parquet')}) r "
        f"join read_parquet({source(trace)}) t using (request_id) where t.think_after_reply_ns is not null"
    )
    done = dict(fetch(f"select request_id, done_ns from read_parquet({source(run / 'requests.parquet')})"))
    by_turn = {
        (c, i): rid
        for rid, c, i in fetch(f"select request_id, conversation_id, turn_index from read_parquet({source(trace)})")
    }
    off, n_exact = [], 0
    for rid, scheduled, think, wait_for, conv, turn in rows:
        deps = list(wait_for) if wait_for else [by_turn[(conv, turn - 1)]]
        ready = max(done[d] for d in deps) + think
        if scheduled == ready:
            n_exact += 1
        else:
            off.append((rid, scheduled - ready))
    worst = max((abs(d) for _, d in off), default=0)
    verdict = "ok" if not off else "FAIL"
    return f"{verdict} {run.name}: {n_exact} of {len(rows)} waiting requests scheduled at last reply end + think (worst {worst} ns)"


def same_rows(run_a: Path, run_b: Path) -> str:
    counts = []
    for name in ("requests", "chunks"):
        a, b = source(run_a / f"{name}.parquet"), source(run_b / f"{name}.parquet")
        n = fetch(f"select count(*) from read_parquet({a})")[0][0]
        differ = fetch(
            f"select count(*) from ((select * from read_parquet({a}) except all select * from read_parquet({b})) "
            f"union all (select * from read_parquet({b}) except all select * from read_parquet({a})))"
        )[0][0]
        counts.append((name, n, differ))
    ok = all(d == 0 for _, _, d in counts)
    detail = ", ".join(f"{name} {n} rows ({d} differ)" for name, n, d in counts)
    return f"{'ok' if ok else 'FAIL'} same rows {run_a.name} vs {run_b.name}: {detail}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace-a", type=Path)
    ap.add_argument("--trace-b", type=Path)
    ap.add_argument("--trace", type=Path, help="the trace the runs replayed")
    ap.add_argument("--run-a", type=Path)
    ap.add_argument("--run-b", type=Path)
    ap.add_argument("--same-a", type=Path, help="a run whose rows must equal --same-b's (worksheet, one seed)")
    ap.add_argument("--same-b", type=Path)
    ap.add_argument("--json-a", type=Path)
    ap.add_argument("--json-b", type=Path)
    args = ap.parse_args()
    lines = []
    if args.trace_a and args.trace_b:
        same = args.trace_a.read_bytes() == args.trace_b.read_bytes()
        lines.append(f"{'ok' if same else 'FAIL'} traces byte-identical: {args.trace_a.name} vs {args.trace_b.name}")
    if args.trace and args.run_a and args.run_b:
        lines.append(same_prompts(args.trace, args.run_a, args.run_b))
    if args.trace:
        lines += [waits_kept(args.trace, run) for run in (args.run_a, args.run_b) if run]
    if args.same_a and args.same_b:
        lines.append(same_rows(args.same_a, args.same_b))
    if args.json_a and args.json_b:
        same = args.json_a.read_bytes() == args.json_b.read_bytes()
        lines.append(
            f"{'ok' if same else 'FAIL'} analysis JSON byte-identical: {args.json_a.name} vs {args.json_b.name}"
        )
    print("\n".join(lines))
    return 1 if any(line.startswith("FAIL") for line in lines) else 0


if __name__ == "__main__":
    sys.exit(main())
