"""An outside recompute of `loadgen analyze --json` from a run directory's Parquet and manifest alone.

It reads ``requests.parquet``, ``chunks.parquet``, ``server_metrics.parquet`` and ``manifest.json`` with
DuckDB, numpy and scipy (nothing from ``loadgen``), recomputes every figure by the definitions in
docs/metrics.md, docs/budgets.md, docs/classes-and-reasoning.md and docs/agent-sessions.md (and the
``definitions`` block the JSON carries), and compares them with the analysis JSON bit for bit:

    python benchmarks/recompute_run.py RUN_DIR ANALYSIS.json [--scenario SCENARIO.toml]

It prints one line per mismatch and a count of the figures that matched; exit 1 on any mismatch.
Covered: per class and overall, status and error-kind counts, abandonments, the window, offered / sent /
completed rates and token rates, TTFT, TTFAT, client queue, server TTFT, ITL (multi-token chunks split),
inter-chunk gaps, TPOT and E2E (p50/p95/p99, mean, max, n, low-sample flag, 95% order-statistic intervals),
reasoning token sums, TTFT by turn, agent sessions and makespans, budget checks (observed, n, failures as
+inf, interval, outcome), goodput, attainment and the error share with Wilson intervals, and the server's
prefix-cache hits. Left out: ``more_requests`` (a plug-in scan), stability, the time series and the
cold/warm split (this recompute assumes a warm run without ``--window``).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tomllib
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
from scipy.stats import binom

QUANTILES = {"p50": 0.50, "p95": 0.95, "p99": 0.99}
FAILED = ("error", "timeout", "not_sent")
STATUSES = ("ok", "error", "timeout", "cancelled", "not_sent")
CANONICAL = ("short-message", "long-thread", "burst")


def table(run: Path, name: str) -> str:
    path = run / f"{name}.parquet"
    return f"'{path}/*.parquet'" if path.is_dir() else f"'{path}'"


def rows(con: duckdb.DuckDBPyConnection, sql: str) -> list[dict[str, Any]]:
    cur = con.execute(sql)
    cols = [d[0] for d in cur.description]
    return [dict(zip(cols, r, strict=True)) for r in cur.fetchall()]


def quantile(sorted_values: np.ndarray, q: float) -> float:
    """numpy's default ('linear', type 7); a +inf neighbour gives +inf (numpy would give 0 * inf = nan)."""
    n = len(sorted_values)
    lo = math.floor((n - 1) * q)
    pair = sorted_values[lo : lo + 2]
    if np.isinf(pair).any():
        frac = (n - 1) * q - lo
        return float(pair[0]) if frac == 0 or len(pair) == 1 or np.isinf(pair[0]) else math.inf
    return float(np.quantile(sorted_values, q))


def ci_ranks(n: int, q: float, level: float = 0.95) -> tuple[int, int]:
    """1-based ranks (l, u) of [x(l), x(u)], 0 = -inf and n + 1 = +inf, by docs/metrics.md's rule.

    Coverage of [x(l), x(u)] = P(l <= B < u), B ~ Binomial(n, q) the count of samples below the quantile.
    Of the pairs covering >= level: the fewest unbounded ends; the least coverage; when both ends are
    bounded, among pairs within half a point of it, the most balanced tails P(B < l) vs P(B >= u).
    """
    cdf = np.concatenate(([0.0], binom.cdf(np.arange(0, n + 1), n, q)))  # cdf[k] = P(B < k) = P(B <= k - 1)
    cdf[-1] = 1.0
    pairs = []
    for lo in range(0, n + 1):
        up = int(np.searchsorted(cdf, cdf[lo] + level, side="left"))
        if up <= lo:
            up = lo + 1
        if up > n + 1:
            break
        c = cdf[up] - cdf[lo]
        if c >= level:
            pairs.append((int(lo == 0) + int(up == n + 1), c, abs(cdf[lo] - (1.0 - cdf[up])), lo, up))
    if not pairs:
        return 0, n + 1
    fewest = min(p[0] for p in pairs)
    pairs = [p for p in pairs if p[0] == fewest]
    least = min(p[1] for p in pairs)
    near = [p for p in pairs if p[1] <= least + (0.005 if fewest == 0 else 0.0)]
    best = min(near, key=lambda p: (round(p[2], 9), round(p[1], 9), p[3]))
    return best[3], best[4]


def interval(sorted_values: np.ndarray, q: float) -> list[float]:
    n = len(sorted_values)
    lo, up = ci_ranks(n, q)
    low = -math.inf if lo == 0 else float(sorted_values[lo - 1])
    high = math.inf if up == n + 1 else float(sorted_values[up - 1])
    return [low, high]


def summary(values: Iterable[float]) -> dict[str, Any]:
    v = np.sort(np.asarray(list(values), dtype=np.float64))
    out: dict[str, Any] = {"n": len(v), "p99_low_sample": len(v) < 100}
    if len(v) == 0:
        return out | {k: None for k in (*QUANTILES, "mean", "max")} | {"ci": dict.fromkeys(QUANTILES)}
    for name, q in QUANTILES.items():
        out[name] = quantile(v, q)
    out["mean"] = float(np.mean(v))
    out["max"] = float(v[-1])
    out["ci"] = {name: interval(v, q) for name, q in QUANTILES.items()}
    return out


def wilson(k: int, n: int) -> list[float]:
    """95% Wilson score interval; 0 and 1 exactly at k = 0 and k = n (where the formula's float noise is not)."""
    z = 1.9599639845400543  # sqrt(2) erfinv(0.95), correctly rounded (scipy: 1 ulp below, stdlib NormalDist: 3)
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z / (1 + z * z / n) * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return [0.0 if k == 0 else centre - half, 1.0 if k == n else centre + half]


class Run:
    def __init__(self, run: Path) -> None:
        self.run = run
        self.con = duckdb.connect()
        self.manifest = json.loads((run / "manifest.json").read_text())
        self.req = rows(self.con, f"select * from read_parquet({table(run, 'requests')})")
        chunks = rows(
            self.con,
            f"select request_id, seq, arrival_ns, tokens, kind from read_parquet({table(run, 'chunks')}) "
            "where tokens > 0 order by request_id, seq",
        )
        self.chunks: dict[str, list[tuple[int, int]]] = {}
        for c in chunks:
            self.chunks.setdefault(c["request_id"], []).append((c["arrival_ns"], c["tokens"]))
        scheduled = sorted(r["scheduled_ns"] for r in self.req)
        first, last = scheduled[0], scheduled[-1]
        gap = (last - first) / (len(scheduled) - 1) if len(scheduled) > 1 else 0.0
        self.start_ns, self.end_ns = first, last + gap

    def in_window(self, t: int | None) -> bool:
        return t is not None and self.start_ns <= t <= self.end_ns

    def chunk_gaps_ns(self, rid: str) -> list[int]:
        arrivals = [a for a, _ in self.chunks.get(rid, [])]
        return [b - a for a, b in zip(arrivals, arrivals[1:], strict=False)]

    def itl_gaps(self, rid: str) -> tuple[list[float], list[float]]:
        """Per-token gaps (ms) and inter-chunk gaps (ms) of one request's content chunks."""
        per_token: list[float] = []
        per_chunk: list[float] = []
        prev: int | None = None
        for arrival, k in self.chunks.get(rid, []):
            if prev is None:
                per_token += [0.0] * (k - 1)
            else:
                d = arrival - prev
                per_chunk.append(d / 1e6)
                per_token += [d / k / 1e6] * k
            prev = arrival
        return per_token, per_chunk


def abandoned(r: dict[str, Any]) -> bool:
    return r["status"] == "cancelled" and r["cancel_after_tokens"] is not None and r["first_token_ns"] is not None


def failed(r: dict[str, Any]) -> bool:
    return r["status"] in FAILED or (r["status"] == "cancelled" and not abandoned(r))


def ms(a: int | None, b: int | None) -> float | None:
    return None if a is None or b is None else (a - b) / 1e6


def latency(run: Run, reqs: list[dict[str, Any]]) -> dict[str, list[float]]:
    counted = [r for r in reqs if r["status"] == "ok" or abandoned(r)]
    out: dict[str, list[float]] = {k: [] for k in ("ttft_ms", "ttfat_ms", "client_queue_ms", "server_ttft_ms")}
    out |= {"itl_ms": [], "inter_chunk_ms": [], "tpot_ms": [], "e2e_ms": []}
    for r in counted:
        for key, a, b in (
            ("ttft_ms", "first_token_ns", "scheduled_ns"),
            ("ttfat_ms", "first_answer_token_ns", "scheduled_ns"),
            ("client_queue_ms", "sent_ns", "scheduled_ns"),
            ("server_ttft_ms", "first_token_ns", "sent_ns"),
        ):
            v = ms(r[a], r[b])
            if v is not None:
                out[key].append(v)
        per_token, per_chunk = run.itl_gaps(r["request_id"])
        out["itl_ms"] += per_token
        out["inter_chunk_ms"] += per_chunk
        n_out = r["client_output_tokens"]
        if n_out and n_out > 1 and r["last_token_ns"] is not None and r["first_token_ns"] is not None:
            out["tpot_ms"].append((r["last_token_ns"] - r["first_token_ns"]) / 1e6 / (n_out - 1))
        if r["status"] == "ok":
            out["e2e_ms"].append(ms(r["done_ns"], r["scheduled_ns"]))  # type: ignore[arg-type]
    return out


def highest(spec: dict[str, Any]) -> tuple[str, float]:
    names = [p for p in QUANTILES if p in spec]
    top = max(names, key=lambda p: QUANTILES[p])
    return top, float(spec[top])


def meets(run: Run, r: dict[str, Any], budgets: dict[str, Any]) -> bool:
    for metric, spec in budgets.items():
        if not spec.get("hard", True) or metric == "makespan_ms":
            continue
        top, limit = highest(spec)
        if metric in ("ttft_ms", "ttfat_ms", "e2e_ms"):
            a = {"ttft_ms": "first_token_ns", "ttfat_ms": "first_answer_token_ns", "e2e_ms": "done_ns"}[metric]
            v = ms(r[a], r["scheduled_ns"])
            if v is None or v > limit:
                return False
        elif metric == "itl_ms":
            gaps, _ = run.itl_gaps(r["request_id"])
            if sum(g > limit for g in gaps) > (1 - QUANTILES[top]) * len(gaps):
                return False
    return True


def sessions(reqs: list[dict[str, Any]]) -> dict[str, Any] | None:
    roots: dict[str, list[dict[str, Any]]] = {}
    for r in reqs:
        if r["conversation_id"] is not None:
            roots.setdefault(r["conversation_id"].split("/")[0], []).append(r)
    if not roots:
        return None
    spans = [
        (max(x["done_ns"] for x in rs) - min(x["scheduled_ns"] for x in rs)) / 1e6
        for rs in roots.values()
        if all(x["status"] == "ok" for x in rs)
    ]
    return {
        "n_sessions": len(roots),
        "n_incomplete": len(roots) - len(spans),
        "makespan_ms": summary(spans),
        "_spans": spans,
    }


def check(name: str, metric: str, pct: str, spec: dict[str, Any], sample: list[float], n_inf: int) -> dict[str, Any]:
    v = np.sort(np.asarray(sample + [math.inf] * n_inf, dtype=np.float64))
    limit = float(spec[pct])
    observed = quantile(v, QUANTILES[pct])
    low, high = interval(v, QUANTILES[pct])
    if high <= limit and observed <= limit:
        outcome = "pass"
    elif low > limit and observed > limit:
        outcome = "fail"
    else:
        outcome = "inconclusive"
    return {"class": name, "metric": metric, "percentile": pct, "observed": observed, "limit": limit, "n": len(v)} | {
        "failures_as_inf": n_inf,
        "ci": [low, high],
        "outcome": outcome,
        "hard": spec.get("hard", True),
    }


def group(
    run: Run, name: str, reqs: list[dict[str, Any]], budgets: dict[str, Any] | None, dur_s: float
) -> dict[str, Any]:
    inw = [r for r in reqs if run.in_window(r["scheduled_ns"])]
    out: dict[str, Any] = {"name": name, "n_scheduled": len(inw)}
    out["status_counts"] = {s: sum(r["status"] == s for r in inw) for s in STATUSES}
    kinds: dict[str, int] = {}
    for r in inw:
        if failed(r) and r["error_kind"] is not None:
            kinds[r["error_kind"]] = kinds.get(r["error_kind"], 0) + 1
    out["error_kinds"] = kinds
    out["abandoned"] = sum(abandoned(r) for r in inw)
    lat = latency(run, inw)
    out["metrics"] = {k: summary(v) for k, v in lat.items()}
    chunk_ns = [d for r in inw if r["status"] == "ok" or abandoned(r) for d in run.chunk_gaps_ns(r["request_id"])]
    if chunk_ns:  # the mean of gaps in ms: their exact integer sum in ns, in ms, over n
        out["metrics"]["inter_chunk_ms"]["mean"] = sum(chunk_ns) / 1e6 / len(chunk_ns)
    done = [r for r in reqs if r["status"] == "ok" and run.in_window(r["done_ns"])]
    out["offered_rps"] = len(inw) / dur_s
    out["send_rps"] = sum(run.in_window(r["sent_ns"]) for r in reqs) / dur_s
    out["completed_rps"] = len(done) / dur_s
    out["prompt_tok_s"] = (
        sum(first_of(r, "server_prompt_tokens", "client_prompt_tokens", "target_prompt_tokens") for r in done) / dur_s
    )
    out["output_tok_s"] = sum(first_of(r, "server_output_tokens", "client_output_tokens") for r in done) / dur_s
    if budgets is None:  # no scenario: nothing to be good against
        out |= dict.fromkeys(("goodput_rps", "n_good", "n_eligible", "n_good_completed", "attainment", "attainment_ci"))
        return rest(run, name, out, inw, lat, {})
    return rest(run, name, out, inw, lat, budgets, done, dur_s)


def first_of(r: dict[str, Any], *columns: str) -> int:
    """Token rates count the server's usage where reported, else the client's (prompt: else the target's)."""
    return next((r[c] for c in columns if r[c] is not None), 0)


def rest(
    run: Run,
    name: str,
    out: dict[str, Any],
    inw: list[dict[str, Any]],
    lat: dict[str, list[float]],
    budgets: dict[str, Any],
    done: list[dict[str, Any]] | None = None,
    dur_s: float = 0.0,
) -> dict[str, Any]:
    if done is not None:
        goodput(run, out, inw, budgets, done, dur_s)
    return tail(run, name, out, inw, lat, budgets)


def goodput(
    run: Run,
    out: dict[str, Any],
    inw: list[dict[str, Any]],
    budgets: dict[str, Any],
    done: list[dict[str, Any]],
    dur_s: float,
) -> None:
    good_done = [r for r in done if meets(run, r, budgets)]
    out["goodput_rps"] = len(good_done) / dur_s
    eligible = [r for r in inw if not abandoned(r)]
    good = [r for r in eligible if r["status"] == "ok" and meets(run, r, budgets)]
    out["n_good"], out["n_eligible"], out["n_good_completed"] = len(good), len(eligible), len(good_done)
    out["attainment"] = len(good) / len(eligible) if eligible else None
    out["attainment_ci"] = wilson(len(good), len(eligible)) if eligible else None


def tail(
    run: Run,
    name: str,
    out: dict[str, Any],
    inw: list[dict[str, Any]],
    lat: dict[str, list[float]],
    budgets: dict[str, Any],
) -> dict[str, Any]:
    ok = [r for r in inw if r["status"] == "ok"]
    out["tokens.reasoning"] = {
        "client_reasoning": float(sum(r["client_reasoning_tokens"] or 0 for r in ok)),
        "client_answer": float(sum((r["client_output_tokens"] or 0) - (r["client_reasoning_tokens"] or 0) for r in ok)),
        "server_reasoning": (
            float(sum(r["server_reasoning_tokens"] or 0 for r in ok))
            if any(r["server_reasoning_tokens"] is not None for r in ok)
            else None
        ),
        "n_requests_with_reasoning": sum((r["client_reasoning_tokens"] or 0) > 0 for r in ok),
    }
    by_turn: dict[str, list[float]] = {}
    for r in inw:
        if (r["status"] == "ok" or abandoned(r)) and r["conversation_id"] is not None and r["first_token_ns"]:
            key = str(r["turn_index"]) if r["turn_index"] < 9 else "9+"
            by_turn.setdefault(key, []).append(ms(r["first_token_ns"], r["scheduled_ns"]))  # type: ignore[arg-type]
    out["ttft_by_turn"] = {k: summary(v) for k, v in by_turn.items()}
    out["sessions"] = sessions(inw)
    checks = []
    n_fail = sum(failed(r) for r in inw)
    for metric, spec in budgets.items():
        for pct in (p for p in QUANTILES if p in spec):
            if metric == "makespan_ms":
                s = out["sessions"] or {"_spans": [], "n_incomplete": 0}
                checks.append(check(name, metric, pct, spec, s["_spans"], s["n_incomplete"]))
            elif metric == "itl_ms":
                gaps = lat["itl_ms"] + [g for r in inw if failed(r) for g in run.itl_gaps(r["request_id"])[0]]
                checks.append(check(name, metric, pct, spec, gaps, 0))
            else:
                checks.append(check(name, metric, pct, spec, lat[metric], n_fail))
    out["_checks"] = checks
    out["_n_fail"] = n_fail
    return out


def flatten(prefix: str, value: Any, into: dict[str, Any]) -> None:
    if isinstance(value, dict):
        for k, v in value.items():
            if not str(k).startswith("_"):
                flatten(f"{prefix}.{k}", v, into)
    elif isinstance(value, list) and value and not isinstance(value[0], (dict, list)):
        for i, v in enumerate(value):
            into[f"{prefix}[{i}]"] = v
    else:
        into[prefix] = value


def norm(v: Any) -> Any:
    if v == "inf":
        return math.inf
    if v == "-inf":
        return -math.inf
    return v


def same(a: Any, b: Any) -> bool:
    a, b = norm(a), norm(b)
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool):
        return float(a) == float(b) or (math.isnan(float(a)) and math.isnan(float(b)))
    return a == b


def budgets_of(scenario: dict[str, Any] | None) -> dict[str, dict[str, Any]] | None:
    if not scenario:
        return None
    out: dict[str, dict[str, Any]] = {}
    for name, c in scenario.get("classes", {}).items():
        specs = (c.get("budgets") or {}).items()
        out[name] = {m: {k: v for k, v in spec.items() if v is not None} for m, spec in specs if spec}
    return out


def mine(run: Run, budgets: dict[str, dict[str, Any]] | None) -> dict[str, Any]:
    dur_s = (run.end_ns - run.start_ns) / 1e9
    out: dict[str, Any] = {"window": {"start_s": run.start_ns / 1e9, "end_s": run.end_ns / 1e9, "duration_s": dur_s}}
    names = sorted({r["request_class"] for r in run.req})
    by_class = {n: [r for r in run.req if r["request_class"] == n] for n in names}
    classes = {n: group(run, n, by_class[n], None if budgets is None else budgets.get(n, {}), dur_s) for n in names}
    out["classes"] = classes
    overall = group(run, "overall", run.req, None, dur_s)
    if budgets is not None:
        good_done = sum(c["n_good_completed"] for c in classes.values())
        n_good = sum(c["n_good"] for c in classes.values())
        n_elig = sum(c["n_eligible"] for c in classes.values())
        overall |= {
            "goodput_rps": good_done / dur_s,
            "n_good": n_good,
            "n_eligible": n_elig,
            "n_good_completed": good_done,
        }
        overall |= {"attainment": n_good / n_elig, "attainment_ci": wilson(n_good, n_elig)}
    out["overall"] = overall
    n_all, n_fail = overall["n_scheduled"], overall["_n_fail"]
    out["verdict"] = {"error_share": n_fail / n_all, "error_share_ci": wilson(n_fail, n_all)}
    out["_checks"] = [c for k in names for c in classes[k]["_checks"]]
    prefix = server_prefix_cache(run)
    if prefix is not None:
        out["server"] = {"prefix_cache": prefix}
    return out


def server_prefix_cache(run: Run) -> dict[str, Any] | None:
    """The counters' increase over their samples from the window's start to its end, or to the last request's
    end when that is later (summed over label sets; this recompute assumes no counter reset)."""
    if not (run.run / "server_metrics.parquet").exists():
        return None
    last_done = max((r["done_ns"] for r in run.req if r["done_ns"] is not None), default=run.end_ns)
    hi = max(run.end_ns, last_done)
    inc = {
        h["name"]: h["inc"]
        for h in rows(
            run.con,
            "select name, sum(inc) as inc from (select name, labels, max(value) - min(value) as inc "
            f"from read_parquet({table(run.run, 'server_metrics')}) "
            "where name in ('vllm:prefix_cache_hits_total', 'vllm:prefix_cache_queries_total') "
            f"and time_ns between {run.start_ns} and {hi} group by name, labels) group by name",
        )
    }
    if len(inc) < 2:
        return None
    q, h = inc["vllm:prefix_cache_queries_total"], inc["vllm:prefix_cache_hits_total"]
    return {"queries": q, "hits": h, "hit_rate": h / q if q > 0 else None}


def compare(theirs: dict[str, Any], ours: dict[str, Any]) -> tuple[int, list[str]]:
    a: dict[str, Any] = {}
    b: dict[str, Any] = {}
    flatten("", ours, b)
    their_view = {"window": theirs["window"], "classes": {}, "overall": theirs["overall"], "verdict": theirs["verdict"]}
    for name, c in theirs["classes"].items():
        their_view["classes"][name] = c | {"tokens.reasoning": (c.get("tokens") or {}).get("reasoning")}
    their_view["overall"] = theirs["overall"] | {
        "tokens.reasoning": (theirs["overall"].get("tokens") or {}).get("reasoning")
    }
    if "server" in ours:
        their_view["server"] = {"prefix_cache": (theirs.get("server") or {}).get("prefix_cache")}
    flatten("", their_view, a)
    for c in ours["_checks"]:
        match = [
            t
            for t in theirs["checks"]
            if (t["class"], t["metric"], t["percentile"]) == (c["class"], c["metric"], c["percentile"])
        ]
        key = f".checks.{c['class']}.{c['metric']}.{c['percentile']}"
        flatten(key, c, b)
        flatten(key, match[0] if match else None, a)
    bad, n_ok = [], 0
    for k, v in b.items():
        if k not in a:
            bad.append(f"{k}: ours {v!r}, theirs absent")
        elif same(a[k], v):
            n_ok += 1
        else:
            bad.append(f"{k}: ours {v!r}, theirs {a[k]!r}{ulps(v, a[k])}")
    return n_ok, bad


def ulps(x: Any, y: Any) -> str:
    x, y = norm_value(x), norm_value(y)
    if isinstance(x, float) and isinstance(y, float) and math.isfinite(x) and math.isfinite(y) and x != 0:
        return f" ({abs(x - y) / math.ulp(x):.0f} ulp)"
    return ""


def norm_value(v: Any) -> Any:
    v = norm(v)
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else v


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("analysis", type=Path)
    ap.add_argument("--scenario", type=Path, help="budgets from this TOML (default: the manifest's scenario)")
    args = ap.parse_args()
    run = Run(args.run_dir)
    if args.scenario:
        scenario = tomllib.loads(args.scenario.read_text())
    else:
        scenario = (run.manifest.get("scenario") or {}).get("content") or {}
    ours = mine(run, budgets_of(scenario))
    n_ok, bad = compare(json.loads(args.analysis.read_text()), ours)
    for line in bad:
        print("MISMATCH", line)
    print(f"{args.run_dir}: {n_ok} figures match bit for bit, {len(bad)} mismatch")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
