"""Every metric formula of DESIGN.md, once, as pure functions.

Instants are int64 ns on the run clock; durations come out in ms, rates in 1/s. Each function takes
scalars (``None`` = never observed → result ``None``) or numpy arrays (float with NaN for never
observed → NaN), so the single-request known-answer tests and the vectorised analyzer run the same
code. Undefined cases (no tokens, one token, empty window) give None/NaN, never 0.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = [
    "NS_PER_MS",
    "NS_PER_S",
    "attainment",
    "client_queue_ms",
    "completed_rps",
    "e2e_ms",
    "error_share",
    "goodput_rps",
    "inter_chunk_gaps_ms",
    "itl_gaps_ms",
    "MIN_RATE_WINDOW_S",
    "UNMEASURED_RATE_RULE",
    "littles_law_rhs",
    "offered_rps",
    "rate_per_s",
    "rate_window_s",
    "unmeasurable_rate",
    "send_rps",
    "server_ttft_ms",
    "time_average_in_system",
    "token_gaps_ms",
    "tokens_per_s",
    "tpot_ms",
    "ttft_ms",
]

NS_PER_MS = 1_000_000.0
NS_PER_S = 1_000_000_000.0


def _span_ms(start: Any, end: Any) -> Any:
    """(end − start) / 1e6 for scalars (None-safe) or arrays (NaN-propagating)."""
    if isinstance(start, np.ndarray) or isinstance(end, np.ndarray):
        return (np.asarray(end, dtype=np.float64) - np.asarray(start, dtype=np.float64)) / NS_PER_MS
    if start is None or end is None:
        return None
    return (int(end) - int(start)) / NS_PER_MS


def ttft_ms(scheduled_ns: Any, first_token_ns: Any) -> Any:
    """TTFT = first_token − scheduled, in ms (client queue + network + server queue + prefill)."""
    return _span_ms(scheduled_ns, first_token_ns)


def ttfat_ms(scheduled_ns: Any, first_answer_token_ns: Any) -> Any:
    """TTFAT = first_answer_token − scheduled, in ms: time to the first answer token (content, refusal or tool
    call), after any reasoning. Equal to TTFT for a model that does not reason; None without the instant."""
    return _span_ms(scheduled_ns, first_answer_token_ns)


def client_queue_ms(scheduled_ns: Any, sent_ns: Any) -> Any:
    """Client queue = sent − scheduled, in ms (time waiting for a concurrency slot / the event loop)."""
    return _span_ms(scheduled_ns, sent_ns)


def server_ttft_ms(sent_ns: Any, first_token_ns: Any) -> Any:
    """Server-side TTFT = first_token − sent, in ms (network + server queue + prefill)."""
    return _span_ms(sent_ns, first_token_ns)


def e2e_ms(scheduled_ns: Any, done_ns: Any) -> Any:
    """E2E = done − scheduled, in ms."""
    return _span_ms(scheduled_ns, done_ns)


def makespan_ms(first_scheduled_ns: Any, last_done_ns: Any) -> Any:
    """Session makespan = the last step's done − the first step's scheduled, in ms (an agent session with its
    sub-sessions: ``loadgen.analysis.sessions``)."""
    return _span_ms(first_scheduled_ns, last_done_ns)


def tpot_ms(first_token_ns: Any, last_token_ns: Any, output_tokens: Any) -> Any:
    """TPOT = (last_token − first_token) / (output_tokens − 1), in ms; None/NaN for ≤ 1 token."""
    if isinstance(output_tokens, np.ndarray) or isinstance(first_token_ns, np.ndarray):
        n = np.asarray(output_tokens, dtype=np.float64)
        span = _span_ms(np.asarray(first_token_ns, dtype=np.float64), np.asarray(last_token_ns, dtype=np.float64))
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(n > 1, span / (n - 1), np.nan)
    span = _span_ms(first_token_ns, last_token_ns)
    if span is None or output_tokens is None or output_tokens <= 1:
        return None
    return span / (output_tokens - 1)


def token_gaps_ms(delta_ns: np.ndarray, tokens: np.ndarray, is_first: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-token ITL of content chunks as (value_ms, weight): the distribution repeats value weight times.

    A chunk carrying k tokens that arrives Δ after the previous content chunk contributes k gaps of
    Δ/k. The first content chunk has no previous chunk: its first token starts the clock and its
    other k−1 tokens arrived with it, so it contributes k−1 gaps of 0. A request with N tokens thus
    has N−1 gaps that sum to last_token − first_token, and their mean is TPOT.
    ``delta_ns`` is ignored where ``is_first``.
    """
    k = np.asarray(tokens)
    first = np.asarray(is_first, dtype=bool)
    value = np.asarray(delta_ns).astype(np.float64)
    value /= NS_PER_MS
    value /= np.maximum(k, 1)  # exact where k is 1; no per-row mask or gather
    value[first] = 0.0
    weight = k - first.astype(k.dtype)
    return value, weight


def _content(arrival_ns: list[int], tokens: list[int]) -> tuple[np.ndarray, np.ndarray]:
    arr = np.asarray(arrival_ns, dtype=np.int64)
    tok = np.asarray(tokens, dtype=np.int64)
    keep = tok > 0  # usage-only / empty chunks carry no content
    return arr[keep], tok[keep]


def itl_gaps_ms(arrival_ns: list[int], tokens: list[int]) -> list[float]:
    """Per-token inter-token gaps (ms) of one request's chunks in order; see ``token_gaps_ms``."""
    arr, tok = _content(arrival_ns, tokens)
    if len(arr) == 0:
        return []
    delta = np.diff(arr, prepend=arr[0])
    first = np.zeros(len(arr), dtype=bool)
    first[0] = True
    value, weight = token_gaps_ms(delta, tok, first)
    return [float(v) for v in np.repeat(value, weight)]


def inter_chunk_gaps_ms(arrival_ns: list[int], tokens: list[int]) -> list[float]:
    """Raw gaps (ms) between consecutive content chunks of one request: the stalls a user sees."""
    arr, _ = _content(arrival_ns, tokens)
    return [float(v) for v in np.diff(arr) / NS_PER_MS]


#: The shortest window a rate is measured over (s): below the client's scheduling precision (its send lag is
#: reported in ms), a count over it is clock resolution, not throughput (one request on an instant engine: 1e9/s).
MIN_RATE_WINDOW_S = 0.001


#: What a null rate means, for reports that show one without its run's reason.
UNMEASURED_RATE_RULE = (
    f"a rate is not measured (null, '-') over a window shorter than {MIN_RATE_WINDOW_S * 1e3:g} ms or a default "
    "window set by one request (its rate would be 1/latency)"
)


def unmeasurable_rate(window_s: float | None, n_requests: int | None = None) -> str | None:
    """Why no rate is measured over this window (None: rates are measured). The one rule for every rate.

    ``n_requests``: how many requests' instants set the window (the analysis' default window, a whole run's
    span); None for a window the user gave. A window set by one request is that request's own latency, and a
    count over it is 1/latency, not a throughput; a window shorter than ``MIN_RATE_WINDOW_S`` is not a measurement.
    """
    if n_requests is not None and n_requests < 2:
        return f"{n_requests} request(s) set the window: a rate needs at least 2 (one request's window is its latency)"
    if window_s is None or not window_s >= MIN_RATE_WINDOW_S:  # NaN compares false
        shown = "none" if window_s is None else f"{window_s * 1e3:.3g} ms"
        return f"window {shown} is shorter than {MIN_RATE_WINDOW_S * 1e3:g} ms"
    return None


def rate_window_s(window_s: float | None, n_requests: int | None = None) -> float | None:
    """``window_s`` where a rate is measured over it (``unmeasurable_rate``), else None: every rate over it None."""
    return window_s if unmeasurable_rate(window_s, n_requests) is None else None


def rate_per_s(count: float, window_s: float | None) -> float | None:
    """count / window_s; None for an empty or missing window."""
    if window_s is None or window_s <= 0:
        return None
    return float(count) / float(window_s)


def offered_rps(n_scheduled: int, window_s: float | None) -> float | None:
    """Offered load = requests scheduled in the window / window length (req/s)."""
    return rate_per_s(n_scheduled, window_s)


def send_rps(n_sent: int, window_s: float | None) -> float | None:
    """Achieved send rate = requests sent (bytes on the socket) in the window / window length (req/s)."""
    return rate_per_s(n_sent, window_s)


def completed_rps(n_completed: int, window_s: float | None) -> float | None:
    """Completed throughput = requests finishing ``ok`` in the window / window length (req/s)."""
    return rate_per_s(n_completed, window_s)


def tokens_per_s(tokens: float, window_s: float | None) -> float | None:
    """Token throughput = tokens of requests completed in the window / window length (tok/s)."""
    return rate_per_s(tokens, window_s)


def goodput_rps(n_good: int, window_s: float | None) -> float | None:
    """Goodput = requests completed ok in the window that met every hard budget / window length (req/s).

    Counted over the same completions as ``completed_rps`` (by completion instant), so goodput ≤ completed.
    """
    return rate_per_s(n_good, window_s)


def attainment(n_good: int, n_eligible: int) -> float | None:
    """Attainment = good requests / requests that count (a share 0..1); None when none count."""
    if n_eligible <= 0:
        return None
    return n_good / n_eligible


def error_share(n_failed: int, n_scheduled: int) -> float | None:
    """Share of scheduled requests that failed (error, timeout, not_sent, unplanned cancel)."""
    if n_scheduled <= 0:
        return None
    return n_failed / n_scheduled


def time_average_in_system(start_ns: np.ndarray, end_ns: np.ndarray, lo_ns: int, hi_ns: int) -> float | None:
    """L: time-average number of requests in the system over [lo, hi) = Σ overlap / (hi − lo).

    A request is in the system from scheduled to done; ``end_ns`` NaN (never done) counts up to hi.
    """
    if hi_ns <= lo_ns:
        return None
    start = np.asarray(start_ns, dtype=np.float64)
    end = np.where(np.isnan(end_ns), float(hi_ns), np.asarray(end_ns, dtype=np.float64))
    overlap = np.clip(np.minimum(end, hi_ns) - np.maximum(start, lo_ns), 0.0, None)
    return float(overlap.sum() / (hi_ns - lo_ns))


def littles_law_rhs(arrival_rate_per_s: float | None, mean_time_in_system_s: float | None) -> float | None:
    """λ·W: arrival rate (1/s) × mean time in system (s) — equals L over a stable interval."""
    if arrival_rate_per_s is None or mean_time_in_system_s is None:
        return None
    return arrival_rate_per_s * mean_time_in_system_s
