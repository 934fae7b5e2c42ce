"""``loadgen diff BASE CANDIDATE``: did the candidate regress? Per class, metric and quantile, with intervals.

**What is compared.** Per class, the p50, p95 and p99 of TTFT, TPOT and E2E (one value per request, the samples
behind the analysis' tables, same window and cold-start rule). Repeated runs on either side are pooled. ITL
(per-token gaps) is shown as a point change only: its gaps are correlated within a request, so an interval
that treats them as independent would be too narrow and raise false alarms; TPOT carries the decode speed.
Failed requests are no latency and are in no latency sample, so a candidate that fails more could read "improved"
on the requests that succeeded: each class therefore gets an **error-share row** (metric ``error_share``,
quantile ``share``), the share of its requests that failed on each side. "Failed" is the analysis' error share
(``loadgen analyze``): not ok and not a planned abandonment, i.e. error, timeout, not sent, an unplanned cancel,
and a planned cancel (``cancel_after_tokens``) that never got its first token; cancellations the scenario plans
after the first token count as requests that did not fail. The requests counted are those of the latency rows
(same window, cold starts apart). Where the shares differ a note also counts the failures on each side.

**The interval on a difference** is distribution-free, built from the same order-statistic intervals as every
other interval loadgen reports (``loadgen.stats.confidence``): each side's quantile gets its interval at level
``1 − α/(2K)``, and the difference ``candidate − base`` lies in ``[low_C − high_B, high_C − low_B]`` with
probability at least ``1 − α/K`` (union bound), K the number of compared rows with a verdict. So the chance that
ANY row of a diff is falsely flagged is at most α (Bonferroni), whatever the latency distribution, as long as
requests are independent draws. They are not quite: requests that queue or decode together share their fate.
Each side's interval is therefore widened by its *design effect*, the variance inflation of the share of values
at or below the quantile measured by batch means over consecutive requests in scheduled order (at least 1): the
ranks are those of an ``n / deff`` sample, scaled back to ``n``. Without it, two seeds of one engine were
flagged in 3 of 50 pairs (6%, above α); with it, 0 of 50 (``benchmarks/bench_runs.py false-alarms``). No
resampling: the result is deterministic. Quantile intervals need enough samples (a p99 needs hundreds); where a
side is unbounded the row is inconclusive, never a false alarm.

**The interval on an error-share difference** ``candidate − base`` is Newcombe's hybrid score interval
(``loadgen.stats.confidence.newcombe_interval``) from the two sides' Wilson intervals at the row level
``1 − α/K`` (each error-share row counts in K). Failures come in bursts, so each side's Wilson interval is
taken on ``k / deff`` failures of ``n / deff`` requests, ``deff`` the design effect of the failure indicator by
the same batch means (at least 1). Deterministic; its coverage is approximate (close to nominal), not a bound.

**Verdicts**, against a threshold ``t`` per metric (percent of the base value: ``--threshold``, else the base run's
scenario ``[regression] thresholds_pct``, else 5%; for ``error_share`` an absolute threshold in percentage points,
``--threshold error_share=PP``, default 1 point: a share going from 0.2% to 1.5% is a regression, although the
scenario's relative thresholds would call any change from 0 infinite): *regressed* when the
whole interval lies above ``+t``; *improved* when wholly below ``−t``; *no change* when wholly inside
``[−t, +t]``; else *inconclusive*. The diff's verdict is *regressed* if any row regressed, else *improved* if
any improved, else *no change* if every row is no change, else *inconclusive*.

Runs that differ in more than the declared variable (``--variable``, as in ``compare``) are refused, naming what
differs.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np

from loadgen.analysis.samples import class_samples, union
from loadgen.plan.compare import DEFAULT_VARIABLE, identity_differences, identity_of
from loadgen.rundir.io import read_run_manifest
from loadgen.runs.diff_result import DIFF_SCHEMA_VERSION, DiffDocument
from loadgen.stats.confidence import CONFIDENCE_LEVEL, newcombe_interval, quantile_ci_ranks
from loadgen.stats.percentiles import SortedParts
from loadgen.util.errors import RunDirError
from loadgen.workload.scenario import scenario_from_manifest

__all__ = [
    "DEFAULT_ERROR_SHARE_THRESHOLD_PP",
    "DEFAULT_THRESHOLD_PCT",
    "ERROR_SHARE",
    "DIFF_METRICS",
    "DIFF_RULE",
    "DiffResult",
    "DiffRow",
    "Verdict",
    "diff_runs",
    "design_effect",
    "difference_interval",
    "row_verdict",
]

Verdict = Literal["regressed", "improved", "no change", "inconclusive"]
#: Metrics with an interval and a verdict (one value per request), then the point-only one.
DIFF_METRICS = ("ttft_ms", "tpot_ms", "e2e_ms")
POINT_ONLY_METRICS = ("itl_ms",)
QUANTILES = {"p50": 0.50, "p95": 0.95, "p99": 0.99}
#: The default practical threshold of every metric (percent of the base value).
DEFAULT_THRESHOLD_PCT = 5.0
#: The error-share row's metric name (as the analysis names the share of failed requests).
ERROR_SHARE = "error_share"
#: The default practical threshold of the error-share row, in percentage points (absolute).
DEFAULT_ERROR_SHARE_THRESHOLD_PP = 1.0
DIFF_RULE = (
    "difference candidate - base of each quantile; interval [low_C - high_B, high_C - low_B] from "
    "order-statistic intervals at level 1 - alpha/(2K) on each side (Bonferroni over the K rows with a verdict: "
    "at most alpha chance that any row is falsely flagged), each widened by its design effect (batch means over "
    "consecutive requests); regressed/improved when the whole interval is "
    "beyond +/- threshold% of the base, no change when wholly within it; error_share: Newcombe hybrid score "
    "interval of candidate - base failed share from the two Wilson intervals at level 1 - alpha/K (counts "
    "divided by the design effect of the failure indicator), judged against +/- threshold percentage points"
)


@dataclass
class DiffRow:
    """One class × metric × quantile."""

    request_class: str
    metric: str
    quantile: str
    base: float | None
    candidate: float | None
    change: float | None  # candidate − base (ms)
    change_pct: float | None  # change / base × 100
    interval: list[float] | None  # of the change (ms); ±inf where a side is unbounded
    threshold_pct: float | None
    verdict: Verdict | None  # None: point change only (itl_ms)
    n_base: int
    n_candidate: int
    design_effect: list[float] | None = None  # (base, candidate): variance inflation from dependent neighbours
    threshold_pp: float | None = None  # error_share row: the threshold in percentage points (absolute)
    failed: list[int] | None = None  # error_share row: failed requests (base, candidate)


@dataclass
class DiffResult:
    """A whole diff: the rows, the overall verdict and what was held fixed."""

    base: list[str]
    candidate: list[str]
    variable: str
    differs_in: list[str]  # identity keys that differ, all covered by the variable
    level: float
    row_level: float
    rule: str
    rows: list[DiffRow]
    verdict: Verdict
    notes: list[str] = field(default_factory=list)
    cdfs: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)  # class -> metric -> side -> {x, y}

    def to_dict(self) -> dict[str, Any]:
        """The diff document (``loadgen diff --json``): every key named by the published schema."""
        return self.result().document()

    def result(self) -> DiffDocument:
        """The typed diff document (``loadgen schema diff``)."""

        def clean(v: Any) -> Any:
            if isinstance(v, float) and not math.isfinite(v):
                return "inf" if v > 0 else "-inf"
            if isinstance(v, list):
                return [clean(x) for x in v]
            if isinstance(v, dict):
                return {k: clean(x) for k, x in v.items()}
            return v

        return DiffDocument.from_document(
            clean({"kind": "loadgen.diff", "version": DIFF_SCHEMA_VERSION} | asdict(self))
        )

    def regressions(self) -> list[DiffRow]:
        return [r for r in self.rows if r.verdict == "regressed"]


def difference_interval(
    base: SortedParts, cand: SortedParts, q: float, side_level: float, deff: tuple[float, float] = (1.0, 1.0)
) -> tuple[float, float]:
    """``[low_C − high_B, high_C − low_B]`` from each side's order-statistic interval at ``side_level``
    (each widened by its design effect, ``deff`` = (base, candidate))."""
    b_lo, b_hi = _bounds(base, q, side_level, deff[0])
    c_lo, c_hi = _bounds(cand, q, side_level, deff[1])
    return c_lo - b_hi, c_hi - b_lo


def _bounds(sample: SortedParts, q: float, level: float, deff: float = 1.0) -> tuple[float, float]:
    """The order-statistic interval of quantile ``q``; with a design effect above 1, the ranks of an
    ``n / deff`` sample scaled back to ``n`` (outward), so dependent samples get a wider interval."""
    n = sample.n
    n_eff = max(1, int(n / max(deff, 1.0)))
    lo, hi = quantile_ci_ranks(n_eff, q, level)
    if n_eff < n:
        lo = None if lo is None else max(0, math.floor((lo + 1) * n / n_eff) - 1)
        hi = None if hi is None else min(n - 1, math.ceil((hi + 1) * n / n_eff) - 1)
    low = -math.inf if lo is None else float(sample.kth(lo)) / sample.unit
    high = math.inf if hi is None else float(sample.kth(hi)) / sample.unit
    return low, high


def design_effect(ordered: list[np.ndarray], value: float | None) -> float:
    """How much dependence between neighbouring requests inflates the variance of the share at or below
    ``value`` (a quantile estimate): batch means over each run's scheduled order (about √n batches of
    consecutive requests) against the independent p(1 − p); at least 1."""
    runs = [x for x in ordered if len(x)]
    n = sum(len(x) for x in runs)
    if value is None or n < 30:
        return 1.0
    size = max(2, int(math.sqrt(n)))
    means = [(x[i : i + size] <= value).mean() for x in runs for i in range(0, len(x) - size + 1, size)]
    p = sum(float((x <= value).sum()) for x in runs) / n
    if len(means) < 5 or p <= 0.0 or p >= 1.0:
        return 1.0
    return max(1.0, float(np.var(means, ddof=1)) * size / (p * (1.0 - p)))


def row_verdict(interval: tuple[float, float], base: float, threshold_pct: float) -> Verdict:
    """Regressed / improved / no change / inconclusive for a difference interval against ±threshold of base."""
    return _judge(interval, abs(base) * threshold_pct / 100.0)


def _judge(interval: tuple[float, float], t: float) -> Verdict:
    """Regressed / improved / no change / inconclusive for a difference interval against ±t (its unit)."""
    lo, hi = interval
    if lo > t:
        return "regressed"
    if hi < -t:
        return "improved"
    if -t <= lo and hi <= t:
        return "no change"
    return "inconclusive"


def _overall(rows: list[DiffRow]) -> Verdict:
    verdicts = [r.verdict for r in rows if r.verdict is not None]
    for v in ("regressed", "improved"):
        if v in verdicts:
            return v
    return "no change" if verdicts and all(v == "no change" for v in verdicts) else "inconclusive"


def _identity_check(base: list[Path], cand: list[Path], variable: str, allow: bool) -> tuple[list[str], list[str]]:
    idents = [identity_of(read_run_manifest(p)) for p in [*base, *cand]]
    notes: list[str] = []
    # repeats on one side may differ only in what repeats differ in; every base/candidate pair is held to the rule
    covered, other = identity_differences(idents, variable)
    if other and not allow:
        shown = ", ".join(other[:8]) + (f" (+{len(other) - 8} more)" if len(other) > 8 else "")
        raise RunDirError(
            f"diff: the runs differ in more than the declared variable {variable}: {shown}; hold everything else "
            "fixed, declare the variable with --variable, or pass --allow-differences"
        )
    if other:
        notes.append(f"--allow-differences: the runs also differ in {', '.join(other)}; not a one-variable diff")
    if not covered:
        notes.append(f"the runs do not differ in {variable}: this diff compares repeats of one configuration")
    return covered, notes


def _stopped_notes(runs: list[Path]) -> list[str]:
    """A run that did not complete is compared up to its stop, as analyze reads it: say which."""
    notes = []
    for run in runs:
        manifest = read_run_manifest(run)  # a run whose writer died reads as killed
        if manifest.state != "complete":
            notes.append(
                f"{run}: {manifest.state} run ({manifest.requests_recorded} request(s) recorded of "
                f"{manifest.scheduled_requests} scheduled): compared up to where it stopped, as analyze reads it"
            )
    return notes


def _failure_notes(failed: dict[str, tuple[list[np.ndarray], list[np.ndarray]]]) -> list[str]:
    """A class whose share of failed requests differs between the sides (``failed``: per class, each side's
    failure indicators): its quantiles compare ok requests only, so a candidate that fails more can still read
    'improved' or 'no change' on latency: say so."""
    notes = []
    for c, sides in failed.items():
        (nb, fb), (nc, fc) = ((sum(map(len, s)), int(sum(x.sum() for x in s))) for s in sides)
        if nb and nc and fb * nc != fc * nb:
            notes.append(
                f"{c}: {fc} of {nc} candidate request(s) failed vs {fb} of {nb} base: the rows compare the requests "
                "that produced tokens (E2E: ok ones) only, failures are no latency; the error_share row judges "
                "the failures"
            )
    return notes


def diff_runs(
    base: Sequence[Path | str],
    candidate: Sequence[Path | str],
    *,
    variable: str | None = None,
    thresholds_pct: dict[str, float] | None = None,
    level: float = CONFIDENCE_LEVEL,
    window: Any = None,
    allow_differences: bool = False,
) -> DiffResult:
    """Diff two runs or two groups of repeated runs (see the module docstring for the rule)."""
    bases, cands = [Path(p) for p in base], [Path(p) for p in candidate]
    if not bases or not cands:
        raise RunDirError("diff: expected at least one base and one candidate run directory")
    variable = variable or DEFAULT_VARIABLE
    covered, notes = _identity_check(bases, cands, variable, allow_differences)
    notes += _stopped_notes([*bases, *cands])
    scenario = scenario_from_manifest(read_run_manifest(bases[0]))
    from_scenario = dict(scenario.regression.thresholds_pct) if scenario is not None else {}
    thresholds = (
        {m: DEFAULT_THRESHOLD_PCT for m in DIFF_METRICS}
        | {ERROR_SHARE: DEFAULT_ERROR_SHARE_THRESHOLD_PP}
        | from_scenario
        | (thresholds_pct or {})
    )
    with ExitStack() as stack:
        b_runs = [stack.enter_context(class_samples(p, window=window)) for p in bases]
        c_runs = [stack.enter_context(class_samples(p, window=window)) for p in cands]
        b_names = [set(r.sorted) for r in b_runs]
        c_names = [set(r.sorted) for r in c_runs]
        classes = sorted(set().union(*b_names) & set().union(*c_names))
        only = sorted(set().union(*b_names, *c_names) - set(classes))
        if not classes:
            raise RunDirError(
                f"diff: no request class in common (base: {', '.join(sorted(set().union(*b_names))) or 'none'}; "
                f"candidate: {', '.join(sorted(set().union(*c_names))) or 'none'}): expected runs of one workload"
            )
        if only:
            notes.append(f"class(es) on one side only, not compared: {', '.join(only)}")
        pooled = {
            (c, m): (
                union([r.sorted[c][m] for r in b_runs if c in r.sorted]),
                union([r.sorted[c][m] for r in c_runs if c in r.sorted]),
            )
            for c in classes
            for m in (*DIFF_METRICS, *POINT_ONLY_METRICS)
        }
        ordered = {
            (c, m): (
                [r.ordered[c][m] for r in b_runs if c in r.ordered],
                [r.ordered[c][m] for r in c_runs if c in r.ordered],
            )
            for c in classes
            for m in DIFF_METRICS
        }
        failed = {
            c: (
                [r.failed_ordered[c] for r in b_runs if c in r.failed_ordered],
                [r.failed_ordered[c] for r in c_runs if c in r.failed_ordered],
            )
            for c in classes
        }
        notes += _failure_notes(failed)
        n_quantile = sum(1 for (c, m), (b, x) in pooled.items() if m in DIFF_METRICS and b.n and x.n)
        n_share = sum(1 for b, x in failed.values() if sum(map(len, b)) and sum(map(len, x)))
        k = max(1, n_quantile * len(QUANTILES) + n_share)
        side_level = 1.0 - (1.0 - level) / (2 * k)
        rows = [
            _row(c, m, qn, q, b, x, thresholds.get(m), side_level, ordered.get((c, m)))
            for (c, m), (b, x) in pooled.items()
            for qn, q in QUANTILES.items()
        ]
        rows += [_share_row(c, b, x, thresholds[ERROR_SHARE], 1.0 - (1.0 - level) / k) for c, (b, x) in failed.items()]
        cdfs: dict[str, dict[str, dict[str, Any]]] = {}
        for (c, m), (b, x) in pooled.items():
            cdfs.setdefault(c, {})[m] = {"base": _cdf(b), "candidate": _cdf(x)}
    return DiffResult(
        base=[str(p) for p in bases],
        candidate=[str(p) for p in cands],
        variable=variable,
        differs_in=covered,
        level=level,
        row_level=1.0 - (1.0 - level) / k,
        rule=DIFF_RULE,
        rows=rows,
        verdict=_overall(rows),
        notes=notes,
        cdfs=cdfs,
    )


#: Most points of a CDF kept for plotting (exact order statistics at evenly spaced ranks).
CDF_POINTS = 200


def _cdf(sample: SortedParts) -> dict[str, list[float]] | None:
    if sample.n == 0:
        return None
    ranks = np.unique(np.linspace(0, sample.n - 1, min(CDF_POINTS, sample.n)).astype(np.int64))
    values = sample.kth_many(ranks).astype(np.float64) / sample.unit
    return {"x": values.tolist(), "y": ((ranks + 1) / sample.n).tolist()}


def _row(
    cls: str,
    metric: str,
    qname: str,
    q: float,
    b: SortedParts,
    x: SortedParts,
    threshold: float | None,
    side: float,
    ordered: tuple[list[np.ndarray], list[np.ndarray]] | None,
) -> DiffRow:
    bv, xv = b.percentile(q), x.percentile(q)
    change = None if bv is None or xv is None else xv - bv
    pct = None if change is None or not bv else change / bv * 100.0
    interval, verdict, deff = None, None, None
    if ordered is not None and b.n and x.n and bv is not None and threshold is not None:
        deff = (design_effect(ordered[0], bv), design_effect(ordered[1], xv))
        lo, hi = difference_interval(b, x, q, side, deff)
        interval, verdict = [lo, hi], row_verdict((lo, hi), bv, threshold)
    effect = None if deff is None else [round(d, 3) for d in deff]
    return DiffRow(cls, metric, qname, bv, xv, change, pct, interval, threshold, verdict, b.n, x.n, effect)


def _share_row(
    cls: str, base: list[np.ndarray], cand: list[np.ndarray], threshold_pp: float, row_level: float
) -> DiffRow:
    """The error-share row of one class: each side's failed share, Newcombe's interval of the difference (counts
    divided by each side's design effect of the failure indicator), judged against ±``threshold_pp`` points."""
    (nb, kb), (nc, kc) = ((sum(map(len, s)), sum(float(x.sum()) for x in s)) for s in (base, cand))
    pb = kb / nb if nb else None
    pc = kc / nc if nc else None
    change = None if pb is None or pc is None else pc - pb
    interval, verdict, effect = None, None, None
    if pb is not None and pc is not None:
        deff = (design_effect(base, 0.5), design_effect(cand, 0.5))  # share <= 0.5: the requests that did not fail
        found = newcombe_interval(kb / deff[0], nb / deff[0], kc / deff[1], nc / deff[1], row_level)
        if found is not None:
            interval, verdict = list(found), _judge(found, threshold_pp / 100.0)
            effect = [round(d, 3) for d in deff]
    return DiffRow(
        cls,
        ERROR_SHARE,
        "share",
        pb,
        pc,
        change,
        None,
        interval,
        None,
        verdict,
        nb,
        nc,
        effect,
        threshold_pp=threshold_pp,
        failed=[int(kb), int(kc)],
    )
