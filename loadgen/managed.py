"""Managed-API comparator: a local engine run and a managed endpoint run of the same trace, side by side.

Both runs come from the same driver with the same client timing boundaries (scheduled, sent, first
token, done), so only client-observable behaviour is compared: latency tails per class with sample
counts, offered/sent/completed rates and token throughput, errors and content filters, quotas (429
answers and their Retry-After, which the driver records and never hides, and any client-side rate
cap), cost per run from a user-supplied price table (per million input/output tokens), and change
controls (response model id and ``system_fingerprint`` over the run, and when they changed).
Internal memory, batching and scheduling of the managed side are unknown and are reported as such.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from loadgen.rundir.io import load_run
from loadgen.rundir.manifest import DriverInfo, Manifest, read_manifest
from loadgen.util.errors import RunDirError

from .analysis import analyze_run
from .analysis.model import json_ready
from .managed_result import MANAGED_COMPARISON_SCHEMA_VERSION, ManagedComparisonResult
from .plan.prices import PriceTable, load_prices

__all__ = [
    "UNKNOWN_INTERNALS",
    "ManagedComparison",
    "change_controls",
    "compare_managed",
    "load_price_table",
    "output_token_source",
    "quota_summary",
    "run_cost",
    "side_summary",
]

UNKNOWN_INTERNALS = (
    "unknown for the managed side: internal memory (weights, KV cache), batching and scheduling, hardware "
    "and replica count are not observable from the client; only client-observed behaviour and declared "
    "limits are compared, without claiming equivalence to open-weight internals"
)

NS = 1e9
_LAT_METRICS = ("ttft_ms", "itl_ms", "e2e_ms")


def load_price_table(path: str | Path) -> PriceTable:
    """The user's price table, in the one format loadgen uses (``loadgen.plan.prices``)::

    currency = "USD"
    [candidates."gpt-4o-mini"]                 # a managed model id (a dated id matches by prefix)
    usd_per_million_input_tokens = 0.15
    usd_per_million_output_tokens = 0.60
    [candidates.interactive-small-batch]       # a local engine config name, model, or run dir name
    usd_per_hour = 2.50
    """
    return load_prices(path)


def _match_price(prices: PriceTable, labels: list[str | None]) -> tuple[str | None, Any]:
    """Exact label first, then the longest candidate name a label starts with (dated model ids), then default."""
    for label in labels:
        if label and label in prices.candidates:
            return label, prices.candidates[label]
    for label in labels:
        if not label:
            continue
        prefixes = [name for name in prices.candidates if label.startswith(name)]
        if prefixes:
            best = max(prefixes, key=len)
            return best, prices.candidates[best]
    return ("default", prices.default) if prices.default is not None else (None, None)


def _col(table: pa.Table, name: str) -> list[Any]:
    return table.column(name).to_pylist()


def run_cost(
    requests: pa.Table,
    prices: PriceTable,
    labels: list[str | None],
    duration_s: float | None,
    *,
    per_token_only: bool = False,
) -> dict[str, Any]:
    """Cost of one run from the price table.

    ``per_token_only`` (the managed side): an hourly entry does not apply (a provider bills tokens, not the
    client's wall time), so a request whose model only matches one is unpriced.

    Per-token prices: server-reported usage per request where present, else the client's own token
    count, priced by the model id each response carried (then ``labels``: requested model, engine
    config name, run directory name). Requests that got no tokens (429, refused, connection errors) are
    not billed. Hourly prices: ``usd_per_hour`` × the run's wall time.
    """
    out: dict[str, Any] = {
        "currency": prices.currency,
        "example_prices": bool(getattr(prices, "example", False)),
        "price_table": getattr(prices, "source_path", None),
    }
    models = _col(requests, "response_model")
    first_model = next((m for m in models if m), None)
    matched, price = _match_price(prices, [first_model, *labels])
    if price is not None and price.usd_per_hour is not None and not per_token_only:
        total = price.usd_per_hour * float(duration_s) / 3600.0 if duration_s else None
        out.update(
            {
                "total": total,
                "complete": total is not None,
                "price_entry": matched,
                "basis": f"{price.usd_per_hour:g} {prices.currency}/hour × run wall time "
                f"{float(duration_s or 0):.1f} s",
            }
        )
        return out
    sp, so = _col(requests, "server_prompt_tokens"), _col(requests, "server_output_tokens")
    cp, co = _col(requests, "client_prompt_tokens"), _col(requests, "client_output_tokens")
    tp = _col(requests, "target_prompt_tokens")
    status = _col(requests, "status")
    per_model: dict[str, dict[str, Any]] = {}
    estimated = 0
    for i in range(len(status)):
        if status[i] == "not_sent" or (sp[i] is None and so[i] is None and not co[i]):
            continue
        if sp[i] is not None and so[i] is not None:
            p_tok, o_tok = sp[i], so[i]
        else:
            estimated += 1
            p_tok = sp[i] if sp[i] is not None else (cp[i] if cp[i] is not None else tp[i])
            o_tok = so[i] if so[i] is not None else (co[i] or 0)
        model = models[i] or labels[0] or "unknown"
        m = per_model.setdefault(model, {"requests": 0, "input_tokens": 0, "output_tokens": 0})
        m["requests"] += 1
        m["input_tokens"] += int(p_tok or 0)
        m["output_tokens"] += int(o_tok or 0)
    total = 0.0
    unpriced: list[str] = []
    for model, m in per_model.items():
        entry, mprice = _match_price(prices, [model, *labels])
        m["price_entry"] = entry
        if mprice is None or mprice.usd_per_hour is not None:
            m["cost"] = None
            unpriced.append(model)
            continue
        pin = mprice.usd_per_million_input_tokens or 0.0
        pout = mprice.usd_per_million_output_tokens or 0.0
        m["cost"] = m["input_tokens"] / 1e6 * pin + m["output_tokens"] / 1e6 * pout
        total += m["cost"]
    completed = sum(1 for s_ in status if s_ == "ok")
    out.update(
        {
            "total": None if unpriced else total,
            "complete": not unpriced,
            "unpriced_models": unpriced,
            "per_model": per_model,
            "billed_requests": sum(m["requests"] for m in per_model.values()),
            "requests_with_estimated_tokens": estimated,
            "per_1k_completed": (total / completed * 1000) if completed and not unpriced else None,
            "token_source": "server usage"
            if not estimated
            else f"server usage; client token counts for {estimated} request(s) without usage",
        }
    )
    return out


def _timeline_ns(requests: Any) -> np.ndarray:
    t = np.array([v if v is not None else -1 for v in _col(requests, "first_byte_ns")], dtype=np.int64)
    done = np.array([v if v is not None else -1 for v in _col(requests, "done_ns")], dtype=np.int64)
    sched = np.array(_col(requests, "scheduled_ns"), dtype=np.int64)
    return np.where(t >= 0, t, np.where(done >= 0, done, sched))


def change_controls(requests: Any, requested_model: str | None) -> dict[str, Any]:
    """Distinct response model ids and system fingerprints, their counts, and when each changed."""
    when = _timeline_ns(requests)
    order = np.argsort(when, kind="stable")
    ids = _col(requests, "request_id")
    out: dict[str, Any] = {}
    for column in ("response_model", "system_fingerprint"):
        values = _col(requests, column)
        seen: dict[str, dict[str, Any]] = {}
        changes: list[dict[str, Any]] = []
        last: str | None = None
        for i in order:
            v = values[i]
            if v is None:
                continue
            t_s = round(float(when[i]) / NS, 3)
            entry = seen.setdefault(v, {"value": v, "count": 0, "first_seen_s": t_s, "last_seen_s": t_s})
            entry["count"] += 1
            entry["last_seen_s"] = t_s
            if last is not None and v != last:
                changes.append({"at_s": t_s, "request_id": ids[i], "from": last, "to": v})
            last = v
        out[column] = {
            "distinct": len(seen),
            "values": list(seen.values()),
            "changes": changes,
            "missing": sum(1 for v in values if v is None),
        }
    models = [v["value"] for v in out["response_model"]["values"]]
    out["requested_model"] = requested_model
    out["model_differs_from_requested"] = [m for m in models if requested_model and m != requested_model]
    signals = []
    if out["response_model"]["distinct"] > 1:
        signals.append(
            f"response model id changed {len(out['response_model']['changes'])} time(s) during the run: "
            + " → ".join(models)
        )
    if out["system_fingerprint"]["distinct"] > 1:
        signals.append(f"system_fingerprint changed {len(out['system_fingerprint']['changes'])} time(s) during the run")
    if out["model_differs_from_requested"]:
        signals.append(f"answered as {', '.join(out['model_differs_from_requested'])} (requested {requested_model})")
    out["signals"] = signals
    return out


def quota_summary(requests: pa.Table, manifest: Manifest) -> dict[str, Any]:
    """429 answers, their Retry-After values, and the client-side rate cap the run declared."""
    kinds = _col(requests, "error_kind")
    http = _col(requests, "http_status")
    retry = _col(requests, "retry_after_s")
    due = [i for i in range(len(kinds)) if kinds[i] != "not_due"]  # not yet due at a stop: never asked
    n = len(due)
    limited = [i for i in due if kinds[i] == "http_429" or http[i] == 429]
    ra = np.array([retry[i] for i in limited if retry[i] is not None], dtype=np.float64)
    options = manifest.options
    return {
        "http_429": len(limited),
        "http_429_share": (len(limited) / n) if n else None,
        "retry_after_s": {
            "n": int(ra.size),
            "missing": len(limited) - int(ra.size),
            "min": float(ra.min()) if ra.size else None,
            "p50": float(np.median(ra)) if ra.size else None,
            "max": float(ra.max()) if ra.size else None,
            "mean": float(ra.mean()) if ra.size else None,
        },
        "client_rate_limit_rps": options.get("rate_limit_rps"),
        "retries": "none: each 429 is recorded as the request's outcome (the driver does not retry)",
    }


def output_token_source(requests: pa.Table) -> dict[str, Any]:
    """Where the completed requests' output token counts come from: the server's usage, else the client's count
    (the analysis takes usage where a request has it)."""
    ok = [i for i, s_ in enumerate(_col(requests, "status")) if s_ == "ok"]
    usage = _col(requests, "server_output_tokens")
    with_usage = sum(1 for i in ok if usage[i] is not None)
    source = (
        "server usage"
        if ok and with_usage == len(ok)
        else "the client's count"
        if not with_usage
        else "server usage and the client's count"
    )
    return {"source": source, "with_usage": with_usage, "completed": len(ok)}


def _latency(analysis: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    groups = {"overall": analysis.overall, **analysis.classes}
    for name, group in groups.items():
        out[name] = {
            m: {k: group.metrics.get(m, {}).get(k) for k in ("p50", "p95", "p99", "n", "p99_low_sample")}
            for m in _LAT_METRICS
        }
    return out


def _throughput(group: Any) -> dict[str, Any]:
    return {
        k: getattr(group, k)
        for k in (
            "offered_rps",
            "send_rps",
            "completed_rps",
            "prompt_tok_s",
            "output_tok_s",
            "goodput_rps",
            "attainment",
        )
    }


def side_summary(run_dir: str | Path, prices: PriceTable | None, *, label: str) -> dict[str, Any]:
    """Everything the comparison shows for one run."""
    run = load_run(Path(run_dir), chunks=False)
    analysis = analyze_run(run_dir)
    m = run.manifest
    target = m.target
    req = run.requests
    finish = _col(req, "finish_reason")
    kinds = _col(req, "error_kind")
    content_filtered = sum(
        1 for i in range(len(finish)) if finish[i] == "content_filter" or kinds[i] == "content_filter"
    )
    duration_s = m.duration_s
    is_managed = label == "managed"
    engine_config = target.engine.config if target.engine else None
    version = target.version if isinstance(target.version, dict) else {}
    engine_name = (engine_config or {}).get("name") or version.get("engine_config")
    # the managed side is priced by model id; a local engine by its config name first
    labels = ([target.model, engine_name] if is_managed else [engine_name, target.model]) + [Path(run_dir).name]
    cost = run_cost(req, prices, labels, duration_s, per_token_only=is_managed) if prices is not None else None
    server = dict(analysis.server) if (analysis.server and not is_managed) else None
    if server:
        server.pop("timeseries", None)  # per-scrape series stay in the run dir; the report keeps summaries
    return {
        "label": label,
        "run_dir": str(run_dir),
        "target": {
            "kind": target.kind,
            "base_url": target.base_url,
            "model": target.model,
            "engine": target.engine.name if target.engine else None,
        },
        "trace": {
            "name": m.trace.name if m.trace else None,
            "sha256": m.trace.sha256 if m.trace else None,
            "seed": m.trace.seed if m.trace else None,
        },
        "duration_s": duration_s,
        "verdict": analysis.verdict,
        "hard_failures": [c.reason for c in analysis.hard_failures],
        "latency_ms": _latency(analysis),
        "throughput": _throughput(analysis.overall),
        "errors": {
            "status_counts": analysis.overall.status_counts,
            "error_kinds": analysis.overall.error_kinds,
            "content_filtered": content_filtered,
            "error_share": analysis.error_share,
        },
        "output_tokens": output_token_source(req),
        "quotas": quota_summary(req, m),
        "cost": cost,
        "change_controls": change_controls(req, target.model),
        "internals": UNKNOWN_INTERNALS
        if is_managed
        else ({"server_metrics": server} if server else "local engine: see its /metrics and the memory ledger"),
    }


@dataclass
class ManagedComparison:
    local: dict[str, Any]
    managed: dict[str, Any]
    warnings: list[str]

    def to_dict(self) -> dict[str, Any]:
        """The managed comparison document (``loadgen managed compare --json``): every key the schema names."""
        return self.result().document()

    def result(self) -> ManagedComparisonResult:
        """The typed managed comparison (``loadgen schema managed``)."""
        return ManagedComparisonResult.from_document(
            json_ready(
                {
                    "kind": "loadgen.managed_comparison",
                    "version": MANAGED_COMPARISON_SCHEMA_VERSION,
                    "local": self.local,
                    "managed": self.managed,
                    "warnings": self.warnings,
                    "unknown_for_managed": UNKNOWN_INTERNALS,
                }
            )
        )

    def render_markdown(self) -> str:
        """The side-by-side report as Markdown."""
        L, M = self.local, self.managed
        rows: list[tuple[str, str, str]] = []

        def both(label: str, fn: Any) -> None:
            rows.append((label, fn(L), fn(M)))

        both("target", lambda s: f"{s['target']['kind']} {s['target']['base_url']} model {s['target']['model']}")
        both(
            "trace (sha256)",
            lambda s: f"{s['trace']['name']} seed {s['trace']['seed']} ({str(s['trace']['sha256'])[:12]})",
        )
        both("budget verdict", lambda s: s["verdict"])
        for cls in [c for c in L["latency_ms"] if c in M["latency_ms"]]:
            for metric in _LAT_METRICS:
                for q in ("p50", "p95", "p99"):
                    both(f"{cls} {metric} {q} (n)", lambda s, c=cls, m=metric, q=q: _lat(s["latency_ms"][c][m], q))
        for k in ("offered_rps", "send_rps", "completed_rps", "output_tok_s", "goodput_rps"):
            both(k, lambda s, k=k: _fmt(s["throughput"][k], 2))
        both(
            "output tokens counted by",
            lambda s: (
                f"{s['output_tokens']['source']} ({s['output_tokens']['with_usage']} of "
                f"{s['output_tokens']['completed']} completed had usage)"
            ),
        )
        both(
            "status counts",
            lambda s: ", ".join(f"{k} {v}" for k, v in s["errors"]["status_counts"].items() if v) or "none",
        )
        both(
            "error kinds", lambda s: ", ".join(f"{k} {v}" for k, v in s["errors"]["error_kinds"].items() if v) or "none"
        )
        both("content filtered", lambda s: _fmt(s["errors"]["content_filtered"]))
        both("quotas", _quota_cell)
        both("cost per run", _cost_cell)
        both("change controls", _change_cell)
        rows.append(
            ("internal memory / scheduling", "measured where the engine exposes /metrics (see JSON)", "unknown")
        )
        lines = [
            "# Local engine vs managed API (same trace, same client timing boundaries)",
            "",
            "| | local | managed |",
            "|---|---|---|",
        ]
        lines += [f"| {a} | {b} | {c} |" for a, b, c in rows]
        lines += ["", f"Internal memory and scheduling: {UNKNOWN_INTERNALS}.", ""]
        signals = M["change_controls"]["signals"]
        lines.append("Change-control signals (managed): " + ("; ".join(signals) if signals else "none observed") + ".")
        if self.warnings:
            lines += ["", "Warnings:"] + [f"- {w}" for w in self.warnings]
        lines += [
            "",
            (
                "Latency in ms over completed requests (TTFT = first token − scheduled); `*` marks a p99 from fewer "
                "than 100 samples. Failed requests (429 included) are counted under status and error kinds, and as "
                "+inf in the budget verdict; Retry-After values are reported, not hidden."
            ),
        ]
        return "\n".join(lines) + "\n"


def _fmt(v: Any, digits: int = 1) -> str:
    if v is None:
        return "n/a"
    if isinstance(v, float):
        return "inf" if math.isinf(v) else f"{v:.{digits}f}"
    return str(v)


def _lat(summary: dict[str, Any], q: str) -> str:
    flag = "*" if q == "p99" and summary.get("p99_low_sample") else ""
    return f"{_fmt(summary.get(q))}{flag} ({summary.get('n')})"


def _quota_cell(side: dict[str, Any]) -> str:
    q = side["quotas"]
    ra = q["retry_after_s"]
    return (
        f"{q['http_429']} × 429; Retry-After n={ra['n']} min {_fmt(ra['min'])} p50 {_fmt(ra['p50'])} "
        f"max {_fmt(ra['max'])} s; client cap {_fmt(q['client_rate_limit_rps'], 2)} rps"
    )


def _cost_cell(side: dict[str, Any]) -> str:
    c = side["cost"]
    if c is None:
        return "no price table"
    text = f"{_fmt(c.get('total'), 4)} {c.get('currency')}"
    if c.get("basis"):
        text += f" ({c['basis']})"
    elif c.get("billed_requests") is not None:
        text += f" ({c['billed_requests']} billed requests; {c.get('token_source')})"
    return text + ("" if c.get("complete", True) else " (incomplete)")


def _change_cell(side: dict[str, Any]) -> str:
    cc = side["change_controls"]
    models = ", ".join(v["value"] for v in cc["response_model"]["values"]) or "none"
    return (
        f"models {cc['response_model']['distinct']} ({models}); fingerprints {cc['system_fingerprint']['distinct']}; "
        f"changes {len(cc['response_model']['changes'])} model / {len(cc['system_fingerprint']['changes'])} fingerprint"
    )


def _boundary_warnings(local_run: str | Path, managed_run: str | Path) -> list[str]:
    """What differs between the two runs besides the endpoint, and what each difference does to the figures."""
    a, b = read_manifest(Path(local_run)), read_manifest(Path(managed_run))
    out: list[str] = []
    for side, m in (("local", a), ("managed", b)):
        if m.run_kind != "measured":
            out.append(
                f"the {side} run is {m.run_kind!r}, not measured over the network: its timings are not "
                "client observations"
            )
    ha, hb = (a.harness.version if a.harness else None), (b.harness.version if b.harness else None)
    if ha != hb:
        out.append(f"the runs were recorded by different loadgen versions ({ha} vs {hb})")
    if a.target.model != b.target.model:
        out.append(
            f"the sides serve different models ({a.target.model!r} vs {b.target.model!r}): every figure compares "
            "the two deployments, models included"
        )
    da, db = a.driver or DriverInfo(), b.driver or DriverInfo()
    if da.tokenizer != db.tokenizer:
        out.append(
            f"the prompts were built and the tokens counted with different tokenizers ({da.tokenizer!r} vs "
            f"{db.tokenizer!r}): each side got other texts of the trace's token counts, and each side's client token "
            "counts are its own tokenizer's"
        )
    if da.vllm_extensions != db.vllm_extensions:
        sent = "local" if da.vllm_extensions else "managed"
        out.append(
            f"ignore_eos was sent to the {sent} side only: its output lengths are the trace's, the other side's end "
            "where its model stops (output tokens and E2E are not like for like)"
        )
    oa, ob = a.options, b.options
    for key in ("ttft_timeout_s", "total_timeout_s", "max_concurrency"):
        if oa.get(key) != ob.get(key):
            out.append(
                f"client option {key} differs ({oa.get(key)!r} vs {ob.get(key)!r}): the timing boundaries may differ"
            )
    for key in ("endpoint", "max_tokens_field"):
        if oa.get(key) != ob.get(key):
            out.append(f"client option {key} differs ({oa.get(key)!r} vs {ob.get(key)!r}): the requests differ")
    return out


def _token_sources(local: dict[str, Any], managed: dict[str, Any]) -> list[str]:
    """A warning when the two sides' output tokens are counted differently (server usage vs the client's count)."""
    shown = {side["label"]: side["output_tokens"] for side in (local, managed)}
    if len({s["source"] for s in shown.values()}) < 2:
        return []
    parts = [
        f"{label}: {s['source']} ({s['with_usage']} of {s['completed']} completed had usage)"
        for label, s in shown.items()
    ]
    return ["output tokens are counted differently, " + "; ".join(parts) + ": token throughputs are not like for like"]


def _two_runs(local_run: Path, managed_run: Path) -> None:
    """Refuse one run given as both sides (the same directory, or a copy: the same manifest), whose side-by-side
    report would show identical figures and 'differences' of nothing."""
    same = local_run.resolve() == managed_run.resolve()
    if not same and (local_run / "manifest.json").is_file() and (managed_run / "manifest.json").is_file():
        same = read_manifest(local_run).model_dump() == read_manifest(managed_run).model_dump()
    if same:
        raise RunDirError(
            f"managed compare: {local_run} and {managed_run} are the same run: expected a local-engine run and a "
            "managed-endpoint run of the same trace"
        )


def compare_managed(
    local_run: str | Path, managed_run: str | Path, *, prices: PriceTable | str | Path | None = None
) -> ManagedComparison:
    """Side-by-side comparison of a local engine run and a managed endpoint run of the same trace.

    ``prices``: a price table path or a loaded ``loadgen.plan.prices.PriceTable`` (None: no cost)."""
    _two_runs(Path(local_run), Path(managed_run))
    if isinstance(prices, (str, Path)):
        prices = load_price_table(prices)
    local = side_summary(local_run, prices, label="local")
    managed = side_summary(managed_run, prices, label="managed")
    warnings: list[str] = _boundary_warnings(local_run, managed_run) + _token_sources(local, managed)
    if local["trace"]["sha256"] != managed["trace"]["sha256"]:
        warnings.append(
            f"the runs replayed different traces (sha256 {str(local['trace']['sha256'])[:12]} vs "
            f"{str(managed['trace']['sha256'])[:12]}): the comparison is not like for like"
        )
    if managed["quotas"]["http_429"]:
        warnings.append(
            f"the managed side answered 429 to {managed['quotas']['http_429']} request(s): its latency percentiles "
            "are over the requests it served, its throughput counts only those, and the budget verdict counts each "
            "429 as a failure (+inf)"
        )
    if prices is None:
        warnings.append("no price table given: cost not computed")
    else:
        for side in (local, managed):
            cost = side["cost"]
            if cost and not cost.get("complete", True):
                missing = ", ".join(cost.get("unpriced_models") or []) or "this run"
                per_token = (
                    " (a managed API is priced per token: [candidates.MODEL_ID] usd_per_million_input_tokens and "
                    "usd_per_million_output_tokens; an hourly price does not apply)"
                    if side is managed
                    else ""
                )
                warnings.append(
                    f"{side['label']}: the price table has no applicable price for {missing}: cost incomplete{per_token}"
                )
        if getattr(prices, "example", False):
            warnings.append("the price table says example = true: its prices are made up, and so is every cost above")
    return ManagedComparison(local, managed, warnings)
